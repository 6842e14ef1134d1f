"""Serving the embedded queue manager to local clients over a Unix socket.

Why: one process owns a queue manager's data directory (:mod:`.store`), so other local
programs (``mqgw qm``, the demo's legacy applications, an operator's scripts) connect
through it, as MQ applications with a local binding connect through the queue manager.
The socket is ``<data dir>/qm.sock``, mode 0600: only the owner of the gateway process
(and root) can connect. The peer's identity comes from the kernel (SO_PEERCRED), and
the server stamps it as the MQMD UserIdentifier of every message the peer puts, as a
queue manager does; setting context explicitly (MQPMO_SET_*_CONTEXT) is refused with
2035 unless the peer is the gateway's own user or root (MQ's ``setall`` authority), and
so is opening one of the gateway's own queues (``SYSTEM.MQGW.*``, :mod:`.authority`).

One task per client connection; one request at a time per connection (the MQI is
synchronous per hconn). Asynchronous puts (``put_async``/``put1_async``, MQPMO_ASYNC_RESPONSE)
get no reply: their outcome goes to the connection's MQSTAT record (``async_status``), and
a failed one under syncpoint makes the unit of work's ``commit`` back out and fail (2003;
the gateway's rule, not IBM's). The ``connect`` reply announces ``features`` (the client
sends asynchronous puts only to a server announcing ``put_async``).
A frame that breaks the protocol (:mod:`.qm_protocol`) gets an
error reply naming the cause, then the connection is closed; its unit of work is backed
out, as for a broken client connection on MQ.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import os
import pwd
import socket
import struct
import time
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

from gateway.mq.embedded.authority import check_gateway_queues, is_gateway_queue
from gateway.mq.embedded.connection import EmbeddedConnection
from gateway.mq.embedded.handle import EmbeddedQueueHandle
from gateway.mq.embedded.mqsc_run import MQSCResult, format_results
from gateway.mq.embedded.qm_protocol import (
    BATCH_BYTES,
    FEATURES,
    MAX_BATCH_MSGS,
    MAX_HEADER,
    NO_REPLY_OPS,
    OPS,
    PROTOCOL_VERSION,
    SOCKET_NAME,
    Frame,
    ProtocolError,
    decode_frame,
    encode_frame,
    error_reply,
    frame_length,
    get_options_from_json,
    pack_batch,
    pack_message,
    pack_messages,
    put_options_from_json,
    status_to_json,
    unpack_message,
)
from gateway.mq.embedded.qmgr import EmbeddedQueueManager
from gateway.mq.port import AsyncPutStatus, MQError, OpenOption, PutOptions, QueueAttr, reason_name
from gateway.wire.constants import CompCode, PutApplType
from gateway.wire.mqmd import MQMD
from gateway.wire.put_time import put_date_time
from gateway.wire.reasons import Reason

log = logging.getLogger(__name__)

#: Unix socket paths are limited to 107 bytes (sun_path).
MAX_SOCKET_PATH = 107
#: Clients connected at once; one more is told 2025 (MQRC_MAX_CONNS_LIMIT_REACHED).
MAX_CLIENTS = 64
#: A compact ``get_batch`` header of at most this many messages always fits
#: :data:`MAX_HEADER` (a message's changed fields take under 3,000 bytes of JSON even
#: with every field different and escaped); a longer batch's header is measured and,
#: past :data:`COMPACT_HEADER_LIMIT`, the batch is sent packed instead.
COMPACT_UNCHECKED_MSGS = 256
COMPACT_HEADER_LIMIT = MAX_HEADER - 4096
#: Seconds a client may take to send the rest of a frame it started (a stalled client
#: must not hold a frame buffer for ever; idle time between frames is not limited).
FRAME_READ_TIMEOUT_S = 60.0


def peer_identity(sock: socket.socket | None) -> tuple[int, str]:
    """(uid, user name truncated to 12 characters) of a Unix-socket peer."""
    if sock is None or not hasattr(socket, "SO_PEERCRED"):
        uid = os.getuid()
    else:
        creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        _pid, uid, _gid = struct.unpack("3i", creds)
    try:
        name = pwd.getpwuid(uid).pw_name
    except KeyError:
        name = str(uid)
    return uid, name[:12]


class QueueManagerServer:
    """The local socket of one embedded queue manager (start with :meth:`start`).

    ``status_reports``: extra DISPLAY providers (``SUB``, ``PUBSUB``, ``CHSTATUS``) the
    owner of the queue manager registers; they are installed on the queue manager.
    ``features``: what the connect reply announces (:data:`.qm_protocol.FEATURES`); a
    server without ``put_async`` refuses those frames as an older server does (tests).
    """

    def __init__(
        self, qm: EmbeddedQueueManager, path: Path | None = None, *,
        max_clients: int = MAX_CLIENTS, features: tuple[str, ...] = FEATURES,
    ) -> None:
        self.qm = qm
        self.features = features
        self.path = path if path is not None else qm.path / SOCKET_NAME
        self.max_clients = max_clients
        self._server: asyncio.AbstractServer | None = None
        self._clients: set[asyncio.Task[None]] = set()
        #: counters (protocol errors, connections) for tests and metrics
        self.connections = 0
        self.protocol_errors = 0

    async def start(self) -> None:
        if len(os.fsencode(str(self.path))) > MAX_SOCKET_PATH:
            raise OSError(
                f"the queue-manager socket path {self.path} is longer than "
                f"{MAX_SOCKET_PATH} bytes; use a shorter data_dir"
            )
        # we own the data directory (its lock), so a socket file left here is stale
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()
        old = os.umask(0o177)
        try:
            self._server = await asyncio.start_unix_server(self._serve, path=str(self.path))
        finally:
            os.umask(old)
        os.chmod(self.path, 0o600)

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            for task in list(self._clients):
                task.cancel()
            for task in list(self._clients):
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 5)
            self._server = None
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        if len(self._clients) >= self.max_clients:
            # MQ's answer to one connection too many (2025), then the connection ends
            log.warning("queue manager %s: local socket refused a client: %d clients "
                        "connected already (the limit)", self.qm.name, len(self._clients))
            reply = error_reply(MQError(Reason.MAX_CONNS_LIMIT_REACHED,
                                        f"{self.max_clients} local clients are connected"))
            reply["closing"] = True
            with contextlib.suppress(Exception):
                writer.write(encode_frame(reply))
                await writer.drain()
            writer.close()
            return
        self._clients.add(task)
        self.connections += 1
        session = _Session(self, writer.get_extra_info("socket"))
        try:
            await session.run(reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        except Exception:  # a bug must cost this client its connection, not the server
            log.exception("queue manager %s: local client %s: unexpected failure; "
                          "connection closed", self.qm.name, session.user)
        finally:
            self._clients.discard(task)
            await session.end()
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()


class _Session:
    """One client connection: its identity, hconn and open handles."""

    def __init__(self, server: QueueManagerServer, sock: socket.socket | None) -> None:
        self.server = server
        self.qm = server.qm
        self.uid, self.user = peer_identity(sock)
        self.appl_name = "mqgw-client"
        self.conn: EmbeddedConnection | None = None
        self.handles: dict[int, EmbeddedQueueHandle] = {}
        self._next = 1
        #: MQSTAT record of this connection's asynchronous puts (reset by async_status)
        self.async_status = AsyncPutStatus()
        #: the first asynchronous syncpoint put that failed in the open unit of work,
        #: with the queue it was for: the unit of work can only be backed out
        self.doomed: tuple[MQError, str] | None = None

    @property
    def may_set_context(self) -> bool:
        return self.uid in (0, os.getuid())

    def _authorise(self, name: str, q_mgr: str) -> None:
        """2035 when a peer that is not the gateway's own user names one of the
        gateway's queues, directly or through a definition (:mod:`.authority`)."""
        if self.may_set_context:
            return
        try:
            resolution = self.qm.resolve(name, q_mgr) if not is_gateway_queue(name) else None
        except MQError:
            resolution = None  # the open/put1 itself reports why the name is no good
        check_gateway_queues(name, resolution, self.user)

    async def end(self) -> None:
        self.doomed = None
        if self.conn is not None:
            with contextlib.suppress(Exception):
                await self.conn.disconnect()  # backs out an open unit of work
            self.conn = None

    async def run(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            try:
                prefix = await reader.readexactly(4)
            except asyncio.IncompleteReadError:
                return  # the client went away between requests
            try:
                length = frame_length(prefix)
                try:
                    # asyncio.timeout, not wait_for: no task per frame (pipelined
                    # asynchronous puts arrive many frames to a read)
                    async with asyncio.timeout(FRAME_READ_TIMEOUT_S):
                        payload = await reader.readexactly(length)
                except asyncio.IncompleteReadError:
                    raise ProtocolError(Reason.DATA_LENGTH_ERROR,
                                        "the connection ended inside a frame") from None
                except TimeoutError:
                    raise ProtocolError(
                        Reason.DATA_LENGTH_ERROR,
                        f"a frame was not complete after {FRAME_READ_TIMEOUT_S:.0f} s") from None
                frame = decode_frame(payload)
                if frame.header.get("op") in NO_REPLY_OPS:
                    if "put_async" not in self.server.features:
                        raise ProtocolError(Reason.UNEXPECTED_ERROR,
                                            f"unknown operation {frame.header.get('op')!r}")
                    await self.put_async(frame)
                    continue
                if frame.header.get("op") == "get" and not _at_once(frame.header):
                    done = await self._watched(self.handle(frame), reader)
                    if done is None:
                        return  # the client went away while its get waited
                    header, data = done
                else:
                    header, data = await self.handle(frame)
            except ProtocolError as exc:
                self.server.protocol_errors += 1
                log.warning("queue manager %s: local client %s (uid %d): %s; connection closed",
                            self.qm.name, self.user, self.uid, exc)
                with contextlib.suppress(Exception):
                    writer.write(encode_frame(error_reply(exc)))
                    await writer.drain()
                return
            writer.write(encode_frame(header, data))
            await writer.drain()
            if header.get("closing"):
                return

    async def _watched(
        self, call: Coroutine[Any, Any, tuple[dict[str, Any], bytes]],
        reader: asyncio.StreamReader,
    ) -> tuple[dict[str, Any], bytes] | None:
        """Run a (possibly long) get while watching the socket: a client that closes or
        sends during its own call has gone, so the get is cancelled before it takes a
        message nobody would receive (a cancelled get leaves the message queued)."""
        task = asyncio.ensure_future(call)
        peek = asyncio.ensure_future(reader.read(1))
        try:
            await asyncio.wait({task, peek}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            if not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
            if not peek.done():
                peek.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await peek
        if (peek.done() and not peek.cancelled() and peek.exception() is None
                and peek.result()):  # bytes during a call: a pipelined request
            raise ProtocolError(Reason.UNEXPECTED_ERROR,
                                "a request arrived while a get was in progress")
        if task.cancelled():
            return None
        return task.result()

    async def handle(self, frame: Frame) -> tuple[dict[str, Any], bytes]:
        req = frame.header
        op = req.get("op")
        if not isinstance(op, str) or op not in OPS:
            raise ProtocolError(Reason.UNEXPECTED_ERROR, f"unknown operation {op!r}")
        if op == "connect":
            return await self.connect(req), b""
        if self.conn is None:
            raise ProtocolError(Reason.HCONN_ERROR, f"{op} before connect")
        try:
            return await self.call(op, req, frame.data)
        except MQError as exc:
            return error_reply(exc), b""

    async def put_async(self, frame: Frame) -> None:
        """An asynchronous put: no reply; its outcome is recorded (MQSTAT) and a failed
        syncpoint put dooms the unit of work (its commit backs out and fails)."""
        if self.conn is None:
            raise ProtocolError(Reason.HCONN_ERROR, f"{frame.header.get('op')} before connect")
        req = frame.header
        op = "put" if req.get("op") == "put_async" else "put1"
        status = self.async_status
        try:
            await self.put(op, req, frame.data)
        except MQError as exc:
            if op == "put":
                hobj = req.get("hobj")
                handle = self.handles.get(hobj) if isinstance(hobj, int) else None
                names = (handle.name, "", handle.resolved_q_name,
                         handle.resolved_q_mgr_name) if handle is not None else ("",) * 4
            else:
                names = (str(req.get("q_name", "")), str(req.get("q_mgr_name", "")), "", "")
            if exc.comp_code == CompCode.WARNING:
                status.put_warning_count += 1
            else:
                status.put_failure_count += 1
            if exc.comp_code > status.comp_code:
                status.comp_code, status.reason = exc.comp_code, exc.reason
                (status.object_name, status.object_q_mgr_name, status.resolved_object_name,
                 status.resolved_q_mgr_name) = names
            options = req.get("options")
            if (exc.comp_code != CompCode.WARNING and self.doomed is None
                    and isinstance(options, dict) and options.get("syncpoint") is True):
                self.doomed = (exc, names[0])
            return
        status.put_success_count += 1

    async def connect(self, req: dict[str, Any]) -> dict[str, Any]:
        if self.conn is not None:
            raise ProtocolError(Reason.HCONN_ERROR, "connect twice on one connection")
        if req.get("version") != PROTOCOL_VERSION:
            raise ProtocolError(Reason.UNEXPECTED_ERROR,
                                f"protocol version {req.get('version')!r} is not "
                                f"{PROTOCOL_VERSION}")
        appl = req.get("appl_name")
        if isinstance(appl, str) and appl:
            self.appl_name = appl[-28:]
        try:
            self.conn = await self.qm.connect()
        except MQError as exc:
            return {**error_reply(exc), "closing": True}
        return {"ok": True, "q_mgr_name": self.qm.name, "user": self.user,
                "features": list(self.server.features)}

    def _handle(self, req: dict[str, Any]) -> EmbeddedQueueHandle:
        hobj = req.get("hobj")
        handle = self.handles.get(hobj) if isinstance(hobj, int) else None
        if handle is None:
            raise MQError(Reason.HOBJ_ERROR, f"no open queue handle {hobj!r}")
        return handle

    def _stamp(self, md: MQMD, opts: PutOptions) -> PutOptions:
        """The context a local binding gets: the peer's identity, this client's
        application name; explicit context only with the authority to set it."""
        if opts.set_all_context or opts.set_identity_context:
            if not self.may_set_context:
                raise MQError(Reason.NOT_AUTHORIZED,
                              f"user {self.user} may not set message context")
            if opts.set_all_context:
                return opts
            md.put_appl_type = PutApplType.UNIX
            md.put_appl_name = self.appl_name
        else:
            md.user_identifier = self.user
            md.accounting_token = bytes(32)
            md.appl_identity_data = ""
            md.put_appl_type = PutApplType.UNIX
            md.put_appl_name = self.appl_name
        md.put_date, md.put_time = put_date_time(time.time())
        md.appl_origin_data = ""
        opts.set_all_context, opts.set_identity_context = True, False
        return opts

    async def put(self, op: str, req: dict[str, Any], data: bytes) -> MQMD:
        """MQPUT (``put``) or MQPUT1 (``put1``) of a frame: the completed descriptor
        (packed into the reply by :meth:`call`; an asynchronous put has no reply, so
        :meth:`put_async` calls this directly and packs nothing)."""
        conn = self.conn
        assert conn is not None
        md, body = unpack_message(data)
        opts = self._stamp(md, put_options_from_json(req.get("options", {})))
        if op == "put":
            return await self._handle(req).put(md, body, opts)
        name, q_mgr = req.get("q_name"), req.get("q_mgr_name", "")
        if not isinstance(name, str) or not isinstance(q_mgr, str):
            raise ProtocolError(Reason.OPTIONS_ERROR, "put1 needs q_name")
        self._authorise(name, q_mgr)
        return await conn.put1(name, md, body, opts, q_mgr)

    async def call(self, op: str, req: dict[str, Any], data: bytes) -> tuple[dict[str, Any], bytes]:
        conn = self.conn
        assert conn is not None
        if op == "open":
            name, q_mgr = req.get("q_name"), req.get("q_mgr_name", "")
            options = req.get("options")
            if not isinstance(name, str) or not isinstance(q_mgr, str) or not isinstance(
                    options, int) or isinstance(options, bool):
                raise ProtocolError(Reason.OPTIONS_ERROR, "open needs q_name, options")
            self._authorise(name, q_mgr)
            handle = await conn.open(name, OpenOption(options), q_mgr)
            hobj, self._next = self._next, self._next + 1
            self.handles[hobj] = handle
            return {"ok": True, "hobj": hobj, "resolved_q_name": handle.resolved_q_name,
                    "resolved_q_mgr_name": handle.resolved_q_mgr_name}, b""
        if op in ("put", "put1"):
            return {"ok": True}, pack_message(await self.put(op, req, data), b"")
        if op == "get":
            gmo = get_options_from_json(req.get("options", {}))
            msg = await self._handle(req).get(gmo)
            return {"ok": True}, pack_message(msg.md, msg.body)
        if op == "get_batch":
            return await _get_batch_of(self._handle(req), req,
                                       compact="compact_batch" in self.server.features)
        if op == "inquire":
            selectors = req.get("selectors")
            if not isinstance(selectors, list) or not all(
                    isinstance(s, int) and not isinstance(s, bool) for s in selectors):
                raise ProtocolError(Reason.SELECTOR_ERROR, "selectors must be integers")
            try:
                attrs = [QueueAttr(s) for s in selectors]
            except ValueError as exc:
                raise MQError(Reason.SELECTOR_ERROR, str(exc)) from None
            values = await self._handle(req).inquire(*attrs)
            return {"ok": True, "values": {str(int(k)): v for k, v in values.items()}}, b""
        if op == "close":
            handle = self._handle(req)
            del self.handles[req["hobj"]]
            await handle.close()
            return {"ok": True}, b""
        if op == "commit":
            if self.doomed is not None:
                failed, q_name = self.doomed
                await conn.backout()
                self.doomed = None  # only once backed out: a failed backout stays doomed
                raise MQError(
                    Reason.BACKED_OUT,
                    f"an asynchronous put to {q_name or 'a queue'} failed with MQRC "
                    f"{failed.reason} ({reason_name(failed.reason)}): {failed.detail}; "
                    "the unit of work was backed out",
                    CompCode.WARNING,
                )
            await conn.commit()
            return {"ok": True}, b""
        if op == "backout":
            await conn.backout()
            self.doomed = None
            return {"ok": True}, b""
        if op == "async_status":
            status, self.async_status = self.async_status, AsyncPutStatus()
            return {"ok": True, **status_to_json(status)}, b""
        if op == "mqsc":
            script = req.get("script")
            if not isinstance(script, str):
                raise ProtocolError(Reason.UNEXPECTED_ERROR, "mqsc needs a script")
            if not self.may_set_context:  # administration: the gateway's user (mqm)
                raise MQError(Reason.NOT_AUTHORIZED, f"user {self.user} may not run MQSC")
            results = self.qm.run_mqsc(script)
            return {"ok": True, "output": format_results(self.qm.name, results),
                    "results": [_result_json(r) for r in results]}, b""
        # disconnect
        await self.end()
        return {"ok": True, "closing": True}, b""


async def _get_batch_of(
    handle: EmbeddedQueueHandle, req: dict[str, Any], *, compact: bool = True
) -> tuple[dict[str, Any], bytes]:
    """``get_batch``: the first get as asked (it may wait; 2033 when nothing came), then
    up to ``max_msgs`` - 1 more without waiting, stopping at the first empty get, at
    :data:`BATCH_BYTES` of data, or at any failure after the first (what was got is
    returned: under syncpoint it is in the unit of work, outside it is the caller's).

    A caller's ``max_length`` with ``accept_truncated`` holds for every message (each is
    truncated to it) while the remaining byte budget still has room for ``max_length``
    bytes; past that, a message longer than what is left stays on the queue and ends
    the batch.

    The reply is :func:`.qm_protocol.pack_batch`'s compact form when the request says
    ``"compact": true`` (what :class:`.client.ClientQueueHandle` asks), else a packed
    MQMD per message (``lengths``)."""
    gmo = get_options_from_json(req.get("options", {}))
    limit = req.get("max_msgs")
    if not isinstance(limit, int) or isinstance(limit, bool) or not 1 <= limit <= MAX_BATCH_MSGS:
        raise ProtocolError(Reason.OPTIONS_ERROR,
                            f"max_msgs must be an integer from 1 to {MAX_BATCH_MSGS}")
    if gmo.browse is not None:
        raise ProtocolError(Reason.GMO_ERROR, "get_batch does not browse")
    first = await handle.get(gmo)
    got = [(first.md, first.body)]
    size = len(first.body)
    cap, more = 0, gmo
    truncating = (
        dataclasses.replace(gmo, wait_ms=0)
        if gmo.accept_truncated and gmo.max_length is not None else None
    )
    while len(got) < limit:
        budget = BATCH_BYTES - size
        if budget <= 0:
            break
        if truncating is not None and gmo.max_length is not None and gmo.max_length <= budget:
            more = truncating  # truncated as the caller asked: at most max_length bytes
            cap = 0
        elif cap > budget or cap == 0:
            # a message larger than the cap stays on the queue (2080, not taken); the cap
            # is halved as the budget shrinks, so the options are made a few times only
            cap = budget // 2 or budget
            if gmo.max_length is not None:
                cap = min(cap, gmo.max_length)
            more = dataclasses.replace(gmo, wait_ms=0, max_length=cap, accept_truncated=False)
        try:
            m = await handle.get(more)
        except MQError:
            break
        got.append((m.md, m.body))
        size += len(m.body)
    if compact and req.get("compact") is True:  # one descriptor, then each one's changes
        fields, data = pack_batch(got)
        if len(got) <= COMPACT_UNCHECKED_MSGS or len(
                json.dumps(fields, separators=(",", ":"))) <= COMPACT_HEADER_LIMIT:
            return {"ok": True, **fields}, data
        # a long batch of very different descriptors: its header would pass the
        # protocol's limit, so the packed form (the client reads both)
    lengths, data = pack_messages(got)
    return {"ok": True, "lengths": lengths}, data


def _at_once(req: dict[str, Any]) -> bool:
    """A get that cannot wait and whose message a vanished client gives back (under
    syncpoint: its unit of work is backed out when the connection ends): nothing to
    watch the socket for while it runs (no task per get, as a waiting get needs)."""
    options = req.get("options")
    return (isinstance(options, dict) and options.get("wait_ms") == 0
            and options.get("syncpoint") is True and options.get("browse") is None)


def _result_json(r: MQSCResult) -> dict[str, Any]:
    return {"line": r.line, "text": r.text, "ok": r.ok, "lines": r.lines,
            "syntax_error": r.syntax_error}
