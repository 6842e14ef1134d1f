"""A client connection to the embedded queue manager of a running process.

``await connect_local(data_dir)`` returns a :class:`ClientConnection`, a
:class:`gateway.mq.port.Connection`: code written against the port (the demo's legacy
applications, ``mqgw qm put/get/browse``, the dead-letter handler) runs unchanged over
it, in a process of its own. The server is :mod:`.qm_server`; the frames are
:mod:`.qm_protocol`. The identity the queue manager stamps on puts (UserIdentifier) is
this process's OS user, taken by the server from the socket, not from the client.

Asynchronous put (``PutOptions(async_response=True)``, MQPMO_ASYNC_RESPONSE): the put
is a ``put_async`` frame with no reply, kept in memory and written with the frames
around it (at the end of the event loop's current step, or with the next call, in one
write), so ten puts and a commit cost one write and one reply. A failure is reported by
:meth:`ClientConnection.async_status` (MQSTAT) and, under syncpoint, by the commit, which
backs the unit of work out and raises MQError 2003 (MQRC_BACKED_OUT) naming it (the
gateway's rule, not IBM's: see docs/embedded-qm.md). Only a server that announces the
``put_async`` feature at connect gets such frames; with an older server, asynchronous
puts are made synchronously (as the port allows an adapter to).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from gateway.mq.embedded.context import MsgIdGenerator, process_appl_name
from gateway.mq.embedded.qm_protocol import (
    PROTOCOL_VERSION,
    SOCKET_NAME,
    ProtocolError,
    decode_frame,
    encode_frame,
    frame_length,
    get_options_to_json,
    pack_message,
    put_options_to_json,
    status_from_json,
    unpack_batch,
    unpack_message,
    unpack_messages,
)
from gateway.mq.port import (
    AsyncPutStatus,
    GetOptions,
    Message,
    MQError,
    OpenOption,
    PutOptions,
    QueueAttr,
)
from gateway.wire.constants import MI_NONE
from gateway.wire.mqmd import MQMD
from gateway.wire.reasons import Reason

#: Bytes of asynchronous-put frames not yet taken by the socket (held here plus those in
#: the transport's write buffer) past which a put writes them and waits for the writer to
#: drain: the back-pressure that bounds the memory of a client putting faster than the
#: server reads (the put waits; it never returns beyond the bound without waiting).
ASYNC_FLUSH_BYTES = 256 * 1024


def socket_path(data_dir: Path | str) -> Path:
    """The socket of the queue manager stored in ``data_dir``."""
    return Path(data_dir) / SOCKET_NAME


async def connect_local(
    where: Path | str, *, appl_name: str | None = None
) -> ClientConnection:
    """MQCONN over the socket of a running queue manager. ``where`` is its data directory
    or the socket itself. MQError 2059 (Q_MGR_NOT_AVAILABLE) when nothing serves it."""
    path = Path(where)
    if path.name != SOCKET_NAME:  # a data directory (not stat'ed: it may not be ours)
        path = path / SOCKET_NAME
    try:
        reader, writer = await asyncio.open_unix_connection(str(path))
    except (FileNotFoundError, ConnectionRefusedError) as exc:
        raise MQError(Reason.Q_MGR_NOT_AVAILABLE,
                      f"no queue manager serves {path} ({exc.strerror})") from None
    except PermissionError:
        raise MQError(Reason.NOT_AUTHORIZED,
                      f"{path}: permission denied (the socket is the gateway user's, "
                      "mode 0600)") from None
    conn = ClientConnection(reader, writer)
    try:
        reply, _ = await conn._call({"op": "connect", "version": PROTOCOL_VERSION,
                                     "appl_name": appl_name or process_appl_name()})
    except BaseException:
        await conn._close_stream()
        raise
    conn._q_mgr_name = str(reply["q_mgr_name"])
    conn.user = str(reply["user"])
    features = reply.get("features")
    if isinstance(features, list):  # a server from before features announces none
        conn.features = frozenset(f for f in features if isinstance(f, str))
    conn._msg_ids = MsgIdGenerator(conn._q_mgr_name)
    return conn


class ClientQueueManager:
    """A :class:`gateway.mq.port.QueueManager` whose connections go over the socket of
    a running queue manager (``name`` is known after the first connect)."""

    def __init__(self, where: Path | str, *, appl_name: str | None = None) -> None:
        self.where = Path(where)
        self.appl_name = appl_name
        self._name = ""

    @property
    def name(self) -> str:
        return self._name

    async def connect(self) -> ClientConnection:
        conn = await connect_local(self.where, appl_name=self.appl_name)
        self._name = conn.q_mgr_name
        return conn


class ClientConnection:
    """An hconn over the local socket (see module docstring)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader = reader
        self._writer = writer
        self._lock = asyncio.Lock()
        self._q_mgr_name = ""
        self._open = True
        #: the OS user the queue manager identifies this connection as
        self.user = ""
        #: asynchronous-put frames not written yet, their size, the scheduled write
        self._pending: list[bytes] = []
        self._pending_bytes = 0
        self._flush_handle: asyncio.Handle | None = None
        self._msg_ids = MsgIdGenerator("")
        #: what the server announced at connect (qm_protocol.FEATURES); none: an older
        #: server, which gets synchronous puts for asynchronous ones
        self.features: frozenset[str] = frozenset()

    @property
    def async_put_supported(self) -> bool:
        return "put_async" in self.features

    @property
    def q_mgr_name(self) -> str:
        return self._q_mgr_name

    @property
    def broken(self) -> bool:
        """Closed, or the server ended the connection: its end-of-file has arrived
        (between calls nothing else can: the protocol is one reply per request), so a
        call made now would not reach the queue manager."""
        return not self._open or self._reader.at_eof() or self._writer.is_closing()

    async def _call(self, header: dict[str, Any], data: bytes = b"") -> tuple[dict[str, Any],
                                                                              bytes]:
        if not self._open:
            raise MQError(Reason.HCONN_ERROR, "the connection has been disconnected")
        async with self._lock:
            if not self._open:  # closed by the call that held the lock before us
                raise MQError(Reason.HCONN_ERROR, "the connection has been disconnected")
            try:
                out = encode_frame(header, data)
                if self._pending:  # asynchronous puts first, in one write with the call
                    self._pending.append(out)
                    out = b"".join(self._pending)
                    self._pending.clear()
                    self._pending_bytes = 0
                self._writer.write(out)
                await self._writer.drain()
                length = frame_length(await self._reader.readexactly(4), "server")
                frame = decode_frame(await self._reader.readexactly(length), "server")
            except (ConnectionError, asyncio.IncompleteReadError) as exc:
                await self._close_stream()
                raise MQError(Reason.CONNECTION_BROKEN,
                              f"connection to the queue manager lost: {exc}") from None
            except ProtocolError as exc:
                await self._close_stream()
                raise MQError(exc.reason, str(exc)) from None
        reply = frame.header
        if reply.get("closing"):
            await self._close_stream()
        if not reply.get("ok"):
            raise MQError(int(reply.get("reason", Reason.UNEXPECTED_ERROR)),
                          str(reply.get("message", "")),
                          int(reply.get("comp_code", 2)))
        return reply, frame.data

    async def _send_async(self, header: dict[str, Any], data: bytes) -> None:
        """Queue a frame that gets no reply (asynchronous put); it is written at the end
        of the loop's current step or before the next call's frame, whichever is first."""
        if not self._open:
            raise MQError(Reason.HCONN_ERROR, "the connection has been disconnected")
        frame = encode_frame(header, data)
        if self._lock.locked():  # a call is waiting for its reply: after it
            async with self._lock:
                if not self._open:  # that call closed the connection: not sent
                    raise MQError(Reason.HCONN_ERROR,
                                  "the connection has been disconnected")
                self._queue(frame)
        else:
            self._queue(frame)
        # bytes not yet taken by the socket: those held here and those the transport
        # still buffers (end-of-step flushes do not drain); past the bound, wait
        if (self._pending_bytes + self._writer.transport.get_write_buffer_size()
                >= ASYNC_FLUSH_BYTES):
            async with self._lock:
                if not self._open:
                    raise MQError(Reason.CONNECTION_BROKEN,
                                  "the connection to the queue manager was closed")
                self._flush(force=True)
                try:
                    await self._writer.drain()
                except ConnectionError as exc:
                    await self._close_stream()
                    raise MQError(Reason.CONNECTION_BROKEN,
                                  f"connection to the queue manager lost: {exc}") from None

    def _queue(self, frame: bytes) -> None:
        self._pending.append(frame)
        self._pending_bytes += len(frame)
        if self._flush_handle is None:
            self._flush_handle = asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self, force: bool = False) -> None:
        """Write the queued frames. Not while a call holds the lock (unless ``force``: the
        caller holds it): that call writes them itself, before its own frame; a frame
        written while a call waits for its reply would break the protocol."""
        if not force:
            self._flush_handle = None
        if not self._pending or not self._open:
            return
        if self._lock.locked() and not force:
            return
        data = b"".join(self._pending)
        self._pending.clear()
        self._pending_bytes = 0
        self._writer.write(data)

    def _async_md(self, md: MQMD, opts: PutOptions) -> tuple[MQMD, dict[str, Any]]:
        """The descriptor an asynchronous put returns (the caller's, with the ids the
        queue manager would generate made here) and the options it sends."""
        out = md.copy()
        if opts.new_msg_id or out.msg_id == MI_NONE:
            out.msg_id = self._msg_ids()
        if opts.new_correl_id:
            out.correl_id = self._msg_ids()
        sent = put_options_to_json(opts)
        sent["new_msg_id"] = sent["new_correl_id"] = False
        return out, sent

    async def async_status(self) -> AsyncPutStatus:
        """MQSTAT(MQSTAT_TYPE_ASYNC_ERROR): the first failure of this connection's
        asynchronous puts since the last call and their counts; resets them."""
        reply, _ = await self._call({"op": "async_status"})
        try:
            return status_from_json(reply)
        except ProtocolError as exc:
            await self._close_stream()
            raise MQError(exc.reason, str(exc)) from None

    async def _close_stream(self) -> None:
        self._open = False
        self._pending.clear()
        self._pending_bytes = 0
        self._writer.close()
        with contextlib.suppress(Exception):
            await self._writer.wait_closed()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.disconnect()

    async def open(
        self, q_name: str, options: OpenOption, q_mgr_name: str = ""
    ) -> ClientQueueHandle:
        reply, _ = await self._call({"op": "open", "q_name": q_name, "options": int(options),
                                     "q_mgr_name": q_mgr_name})
        return ClientQueueHandle(self, int(reply["hobj"]), q_name,
                                 str(reply["resolved_q_name"]),
                                 str(reply["resolved_q_mgr_name"]))

    async def put1(
        self,
        q_name: str,
        md: MQMD,
        body: bytes,
        options: PutOptions | None = None,
        q_mgr_name: str = "",
    ) -> MQMD:
        opts = options or PutOptions()
        if opts.async_response and not self.async_put_supported:
            opts = dataclasses.replace(opts, async_response=False)
        if opts.async_response:
            out, sent = self._async_md(md, opts)
            await self._send_async({"op": "put1_async", "q_name": q_name,
                                    "q_mgr_name": q_mgr_name, "options": sent},
                                   pack_message(out, body))
            return out
        _, data = await self._call(
            {"op": "put1", "q_name": q_name, "q_mgr_name": q_mgr_name,
             "options": put_options_to_json(opts)},
            pack_message(md, body),
        )
        return unpack_message(data, "server")[0]

    async def commit(self) -> None:
        await self._call({"op": "commit"})

    async def backout(self) -> None:
        await self._call({"op": "backout"})

    async def mqsc(self, script: str) -> tuple[str, list[dict[str, Any]]]:
        """Run MQSC on the queue manager: (runmqsc's output, one result per command)."""
        reply, _ = await self._call({"op": "mqsc", "script": script})
        return str(reply["output"]), list(reply["results"])

    async def disconnect(self) -> None:
        """MQDISC (an open unit of work is backed out by the server)."""
        if not self._open:
            return
        with contextlib.suppress(MQError):
            await self._call({"op": "disconnect"})
        if self._open:
            await self._close_stream()


class ClientQueueHandle:
    """An open queue over the local socket."""

    def __init__(self, conn: ClientConnection, hobj: int, name: str, resolved_q_name: str,
                 resolved_q_mgr_name: str) -> None:
        self._conn = conn
        self._hobj = hobj
        self._name = name
        self._resolved_q_name = resolved_q_name
        self._resolved_q_mgr_name = resolved_q_mgr_name
        self._open = True

    @property
    def name(self) -> str:
        return self._name

    @property
    def resolved_q_name(self) -> str:
        return self._resolved_q_name

    @property
    def resolved_q_mgr_name(self) -> str:
        return self._resolved_q_mgr_name

    async def get(self, options: GetOptions | None = None) -> Message:
        _, data = await self._conn._call(
            {"op": "get", "hobj": self._hobj,
             "options": get_options_to_json(options or GetOptions())})
        md, body = unpack_message(data, "server")
        return Message(md, body)

    async def get_batch(self, options: GetOptions | None = None,
                        max_msgs: int = 1, *, compact: bool = True) -> list[Message]:
        """Up to ``max_msgs`` messages in one round trip: the first as ``options`` say
        (it may wait; MQError 2033 when none), the rest only if already there (the
        server's ``get_batch``; under syncpoint they all join the unit of work).
        ``compact``: the reply carries one descriptor and each message's changes, not a
        packed MQMD per message (the same messages; False only to measure the two)."""
        reply, data = await self._conn._call(
            {"op": "get_batch", "hobj": self._hobj, "max_msgs": max_msgs, "compact": compact,
             "options": get_options_to_json(options or GetOptions())})
        try:
            got = (unpack_batch(reply, data, "server") if "sizes" in reply
                   else unpack_messages(reply.get("lengths"), data, "server"))
            if len(got) > max_msgs:
                raise ProtocolError(Reason.DATA_LENGTH_ERROR,
                                    f"{len(got)} messages for a get_batch of at most "
                                    f"{max_msgs}", "server")
        except ProtocolError as exc:  # the server broke the protocol: this hconn is gone
            await self._conn._close_stream()
            raise MQError(exc.reason, str(exc)) from None
        return [Message(md, body) for md, body in got]

    async def put(self, md: MQMD, body: bytes, options: PutOptions | None = None) -> MQMD:
        opts = options or PutOptions()
        if opts.async_response and not self._conn.async_put_supported:
            opts = dataclasses.replace(opts, async_response=False)  # an older server
        if opts.async_response:
            out, sent = self._conn._async_md(md, opts)
            await self._conn._send_async({"op": "put_async", "hobj": self._hobj,
                                          "options": sent}, pack_message(out, body))
            return out
        _, data = await self._conn._call(
            {"op": "put", "hobj": self._hobj, "options": put_options_to_json(opts)},
            pack_message(md, body),
        )
        return unpack_message(data, "server")[0]

    async def inquire(self, *selectors: QueueAttr) -> dict[QueueAttr, int | str]:
        reply, _ = await self._conn._call(
            {"op": "inquire", "hobj": self._hobj, "selectors": [int(s) for s in selectors]})
        values: dict[str, int | str] = reply["values"]
        return {QueueAttr(int(k)): v for k, v in values.items()}

    async def close(self) -> None:
        if not self._open:
            return
        self._open = False
        if self._conn._open:
            await self._conn._call({"op": "close", "hobj": self._hobj})
