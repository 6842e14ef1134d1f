"""Message channels between embedded queue managers: sender and receiver MCAs over TCP.

Why: queue managers of a network (in one process or several on one host) move messages
from a transmission queue to their partner as IBM MQ's message channel agents do (IBM MQ
"Message channel agents", "Channel synchronization"). Once-only delivery across a crash
of either side comes from MQ's batch protocol:

1. the sender gets a batch from its transmission queue under syncpoint and sends it with
   the next batch sequence number;
2. the receiver delivers every message (MQXQH stripped, names resolved again; unknown
   destinations go to its DLQ behind an MQDLH) under syncpoint and commits that unit of
   work **together with** the record (channel, sequence number, transmission MsgIds);
3. only then does the sender commit its gets (removing the batch), recording the same
   sequence number on its side.

A batch whose sequence number the receiver has already committed is acknowledged
without being applied again. When a channel (re)starts, the receiver tells the sender
its last committed batch; if that is the batch the sender still holds (sender died
between 2 and 3), the sender removes exactly those MsgIds from its transmission queue.

Wire protocol (big-endian; one TCP connection per channel instance and lane)::

    frame   = length:u32  type:u8  payload[length-1]
    HELLO   (1) JSON {"channel", "sender_qm", "lane", "version": 1}
    WELCOME (2) JSON {"receiver_qm", "last_seq", "msg_ids": [hex, ...]}
    BATCH   (3) seq:u64 count:u32 then count x (md_len:u32 MQMD-v2(546) body_len:u32 body)
    ACK     (4) seq:u64
    ERROR   (5) JSON {"reason", "message"}

Encoding and decoding are pure functions; the MCAs are the only code doing I/O.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import struct
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gateway.mq.conname import ConnameError, is_conname_list, parse_conname_list
from gateway.mq.embedded.connection import EmbeddedConnection
from gateway.mq.embedded.objects import ChannelType
from gateway.mq.embedded.qmgr import EmbeddedQueueManager
from gateway.mq.embedded.store import ChannelSync
from gateway.mq.port import GetOptions, MQError, OpenOption
from gateway.wire.errors import WireError
from gateway.wire.mqmd import MQMD
from gateway.wire.reasons import Reason

log = logging.getLogger(__name__)

PROTOCOL_VERSION = 1
MAX_FRAME = 256 * 1024 * 1024
HELLO, WELCOME, BATCH, ACK, ERROR = 1, 2, 3, 4, 5
_HEAD = struct.Struct("!IB")
_BATCH_HEAD = struct.Struct("!QI")
_LEN = struct.Struct("!I")
_SEQ = struct.Struct("!Q")
_MSG_ID_LEN = 24
_CONNAME = re.compile(r"^\s*([^()\s]+)\s*\(\s*(\d{1,5})\s*\)\s*$")


class ChannelError(Exception):
    """A channel failed: protocol violation, partner error or refused start (MQRC reason)."""

    def __init__(self, reason: int, message: str) -> None:
        self.reason = int(reason)
        super().__init__(message)


# --------------------------------------------------------------------------- codec


def encode_frame(kind: int, payload: bytes) -> bytes:
    return _HEAD.pack(len(payload) + 1, kind) + payload


def encode_json(kind: int, value: dict[str, Any]) -> bytes:
    return encode_frame(kind, json.dumps(value, separators=(",", ":")).encode())


def decode_json(payload: bytes) -> dict[str, Any]:
    try:
        value = json.loads(payload)
    except ValueError as exc:
        raise ChannelError(Reason.UNEXPECTED_ERROR, f"bad channel control frame: {exc}") from None
    if not isinstance(value, dict):
        raise ChannelError(Reason.UNEXPECTED_ERROR, "channel control frame is not an object")
    return value


def encode_batch(seq: int, messages: list[tuple[MQMD, bytes]]) -> bytes:
    parts = [_BATCH_HEAD.pack(seq, len(messages))]
    for md, body in messages:
        packed = md.pack(546) if md.version >= 2 else md.copy(version=2).pack(546)
        parts += [_LEN.pack(len(packed)), packed, _LEN.pack(len(body)), body]
    return encode_frame(BATCH, b"".join(parts))


def decode_batch(payload: bytes) -> tuple[int, list[tuple[MQMD, bytes]]]:
    """Inverse of :func:`encode_batch`; raises ChannelError on a malformed batch."""
    view = memoryview(payload)
    try:
        seq, count = _BATCH_HEAD.unpack_from(view, 0)
        pos = _BATCH_HEAD.size
        out: list[tuple[MQMD, bytes]] = []
        for _ in range(count):
            (n,) = _LEN.unpack_from(view, pos)
            pos += 4
            if pos + n > len(view):
                raise ChannelError(Reason.UNEXPECTED_ERROR, "batch ends inside an MQMD")
            md = MQMD.unpack(bytes(view[pos : pos + n]), 0, 546)
            pos += n
            (n,) = _LEN.unpack_from(view, pos)
            pos += 4
            if pos + n > len(view):
                raise ChannelError(Reason.UNEXPECTED_ERROR, "batch ends inside a message")
            out.append((md, bytes(view[pos : pos + n])))
            pos += n
    except (struct.error, WireError) as exc:
        raise ChannelError(Reason.UNEXPECTED_ERROR, f"malformed batch: {exc}") from None
    if pos != len(view):
        raise ChannelError(Reason.UNEXPECTED_ERROR, "trailing bytes after a batch")
    return seq, out


async def read_frame(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    head = await reader.readexactly(_HEAD.size)
    length, kind = _HEAD.unpack(head)
    if length < 1 or length > MAX_FRAME:
        raise ChannelError(Reason.UNEXPECTED_ERROR, f"channel frame length {length} not valid")
    return kind, await reader.readexactly(length - 1)


#: A listener's address, and an address book: queue manager name -> its listener, or
#: the listeners of its instances in the order to try them (a multi-instance node).
Address = tuple[str, int]
AddressBook = Mapping[str, Address | list[Address]]


def _book_entry(conname: str, address_book: AddressBook) -> list[Address]:
    found = address_book.get(conname.strip().upper())
    if found is None:
        raise ChannelError(
            Reason.HOST_NOT_AVAILABLE,
            f"CONNAME({conname}) is neither host(port) nor a known listener",
        )
    return found if isinstance(found, list) else [found]


def parse_conname(conname: str, address_book: AddressBook) -> Address:
    """``host(port)`` as MQ writes CONNAME, or a listener name from the address book (the
    first address of an entry that lists several)."""
    m = _CONNAME.match(conname)
    if m:
        return m.group(1), int(m.group(2))
    return _book_entry(conname, address_book)[0]


def conname_addresses(conname: str, address_book: AddressBook) -> list[Address]:
    """The addresses a CONNAME names, in the order to try them: a connection list
    ``host1(port),host2(port)`` (:mod:`gateway.mq.conname`), one ``host(port)``, or a
    listener name from the address book (one address or a list). ChannelError (2538)
    naming what is wrong."""
    if is_conname_list(conname):
        try:
            return parse_conname_list(conname)
        except ConnameError as exc:
            raise ChannelError(Reason.HOST_NOT_AVAILABLE, str(exc)) from None
    return _book_entry(conname, address_book)


def sync_key_receiver(channel: str, sender_qm: str, lane: str) -> str:
    return f"{channel}|<{sender_qm}|{lane}"


def sync_key_sender(channel: str, lane: str, partner: str = "") -> str:
    return f"{channel}|>{partner}|{lane}"


# --------------------------------------------------------------------------- receiver


@dataclass(slots=True)
class ChannelStats:
    """Counters of one side (no per-message logs)."""

    batches: int = 0
    messages: int = 0
    duplicate_batches: int = 0
    in_doubt_resolved: int = 0
    errors: int = 0


class ChannelListener:
    """The receiving MCA of one queue manager: accepts every RCVR/CLUSRCVR channel on one
    127.0.0.1 port (IBM MQ's listener plus receiver channels)."""

    def __init__(self, qm: EmbeddedQueueManager) -> None:
        self.qm = qm
        self.stats = ChannelStats()
        self._server: asyncio.Server | None = None
        self._locks: dict[str, asyncio.Lock] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> int:
        self._server = await asyncio.start_server(self._serve, host, port)
        sock = self._server.sockets[0]
        return int(sock.getsockname()[1])

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            for t in list(self._tasks):
                t.cancel()
            for t in list(self._tasks):
                with contextlib.suppress(BaseException):
                    await t
            await self._server.wait_closed()
            self._server = None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        conn: EmbeddedConnection | None = None
        try:
            conn = await self.qm.connect()
            await self._session(conn, reader, writer)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass  # partner went away: whatever was not committed is backed out below
        except asyncio.CancelledError:
            pass  # listener closing (the streams callback must not see a cancelled task)
        except ChannelError as exc:
            self.stats.errors += 1
            log.warning("receiving channel on %s ended: %s", self.qm.name, exc)
            with contextlib.suppress(Exception):
                writer.write(encode_json(ERROR, {"reason": exc.reason, "message": str(exc)}))
                await writer.drain()
        except MQError as exc:
            self.stats.errors += 1
            if exc.reason != Reason.Q_MGR_STOPPING:
                log.warning("receiving channel on %s ended: %s", self.qm.name, exc)
            with contextlib.suppress(Exception):
                writer.write(encode_json(ERROR, {"reason": exc.reason, "message": str(exc)}))
                await writer.drain()
        finally:
            self._tasks.discard(task)
            if conn is not None:
                with contextlib.suppress(Exception):
                    await conn.disconnect()
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _session(
        self, conn: EmbeddedConnection, reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
    ) -> None:
        kind, payload = await read_frame(reader)
        if kind != HELLO:
            raise ChannelError(Reason.UNEXPECTED_ERROR, f"expected HELLO, got frame {kind}")
        hello = decode_json(payload)
        channel = str(hello.get("channel", "")).upper()
        sender_qm = str(hello.get("sender_qm", ""))
        lane = str(hello.get("lane", ""))
        definition = self.qm.catalogue.channels.get(channel)
        if definition is None or definition.chltype not in (ChannelType.RCVR,
                                                            ChannelType.CLUSRCVR):
            raise ChannelError(
                Reason.UNKNOWN_CHANNEL_NAME,
                f"queue manager {self.qm.name} has no receiver channel {channel} "
                f"(started by {sender_qm})",
            )
        key = sync_key_receiver(channel, sender_qm, lane)
        lock = self._locks.setdefault(key, asyncio.Lock())
        async with lock:
            sync = self.qm.channel_sync(key)
            writer.write(encode_json(WELCOME, {
                "receiver_qm": self.qm.name,
                "last_seq": sync.batch_seq if sync else 0,
                "msg_ids": _split_ids(sync.msg_ids) if sync else [],
            }))
            await writer.drain()
            while True:
                kind, payload = await read_frame(reader)
                if kind != BATCH:
                    raise ChannelError(Reason.UNEXPECTED_ERROR, f"expected BATCH, got {kind}")
                seq, messages = decode_batch(payload)
                await self._apply(conn, key, seq, messages)
                writer.write(encode_frame(ACK, _SEQ.pack(seq)))
                await writer.drain()

    async def _apply(
        self, conn: EmbeddedConnection, key: str, seq: int, messages: list[tuple[MQMD, bytes]]
    ) -> None:
        sync = self.qm.channel_sync(key)
        if sync is not None and seq <= sync.batch_seq:
            self.stats.duplicate_batches += 1  # already committed: acknowledge only
            return
        try:
            for md, body in messages:
                await conn.deliver_transmission(md, body, syncpoint=True)
            ids = b"".join(md.msg_id for md, _ in messages)
            await conn.commit(ChannelSync(key, seq, ids))
        except BaseException:
            with contextlib.suppress(Exception):
                await conn.backout()
            raise
        self.stats.batches += 1
        self.stats.messages += len(messages)


def _split_ids(blob: bytes) -> list[str]:
    return [blob[i : i + _MSG_ID_LEN].hex() for i in range(0, len(blob), _MSG_ID_LEN)]


# --------------------------------------------------------------------------- sender


@dataclass(slots=True)
class SenderSpec:
    """What a sending MCA serves: ``xmit_q_name`` filtered by ``correl_id`` (cluster
    transmission queue) and the partner's address. ``partner`` blank = learn at start."""

    channel: str
    conname: str
    xmit_q_name: str
    lane: str = ""
    partner: str = ""
    correl_for: Callable[[str], bytes | None] | None = None
    batch_size: int = 50
    on_partner: Callable[[str], None] | None = None
    address_book: AddressBook = field(default_factory=dict)


class ChannelSender:
    """A sending MCA: a task that moves batches from a transmission queue to a partner,
    reconnecting after failures (MQ's short retry). A CONNAME list is tried in order at
    every start, the first address whose listener answers wins (a standby instance of
    a multi-instance node does not listen); after a failed round the wait doubles from
    ``RETRY_S`` up to ``RETRY_MAX_S`` and starts again at ``RETRY_S`` once a session
    has been established."""

    RETRY_S = 0.2
    RETRY_MAX_S = 2.0
    #: How long one address of a CONNAME may take to accept: a host that is down drops
    #: the connection request silently, and the next address must not wait for the OS's
    #: own connect timeout (minutes).
    CONNECT_TIMEOUT_S = 5.0
    GET_WAIT_MS = 2000

    def __init__(self, qm: EmbeddedQueueManager, spec: SenderSpec) -> None:
        self.qm = qm
        self.spec = spec
        self.stats = ChannelStats()
        self.partner = spec.partner
        self.connected = asyncio.Event()
        self.retrying = False
        self.last_error = ""
        #: the address of the CONNAME (list) the current or last session went to
        self.address = ""
        self.connected_once = False
        self._task: asyncio.Task[None] | None = None

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    def start(self) -> None:
        if not self.running:
            self._task = asyncio.get_running_loop().create_task(
                self._run(), name=f"channel {self.spec.channel} on {self.qm.name}"
            )

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(BaseException):
                await self._task
            self._task = None

    async def _run(self) -> None:
        delay = self.RETRY_S
        while not self.qm.stopping:
            try:
                await self._session()
            except asyncio.CancelledError:
                raise
            except (OSError, asyncio.IncompleteReadError, ChannelError, MQError) as exc:
                if self.qm.stopping:
                    return
                self.retrying = True
                self.connected.clear()
                if str(exc) != self.last_error:
                    self.last_error = str(exc)
                    log.warning("channel %s on %s retrying: %s",
                                self.spec.channel, self.qm.name, exc)
                self.stats.errors += 1
                if self.connected_once:  # a session ran since the last wait: short again
                    self.connected_once = False
                    delay = self.RETRY_S
                await asyncio.sleep(delay)
                delay = min(delay * 2, self.RETRY_MAX_S)

    async def _open(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """A connection to the first address of the CONNAME (list) that accepts one;
        the last address's error when none does."""
        addresses = conname_addresses(self.spec.conname, self.spec.address_book)
        failure: OSError | None = None
        for host, port in addresses:
            try:
                # asyncio.timeout, not wait_for: on Python 3.11 wait_for loses a
                # cancellation that arrives as the connect fails (refused at once), and
                # the channel would then never stop
                async with asyncio.timeout(self.CONNECT_TIMEOUT_S):
                    reader, writer = await asyncio.open_connection(host, port)
            except OSError as exc:  # refused, unreachable, or TimeoutError: a host gone
                failure = exc
                continue
            self.address = f"{host}({port})"
            return reader, writer
        assert failure is not None  # conname_addresses never returns an empty list
        if len(addresses) == 1:
            raise failure
        raise OSError(failure.errno, f"no address of CONNAME({self.spec.conname}) accepts "
                                     f"a connection (last: {failure})")

    async def _session(self) -> None:
        spec = self.spec
        reader, writer = await self._open()
        conn: EmbeddedConnection | None = None
        try:
            writer.write(encode_json(HELLO, {"channel": spec.channel, "sender_qm": self.qm.name,
                                             "lane": spec.lane, "version": PROTOCOL_VERSION}))
            await writer.drain()
            kind, payload = await read_frame(reader)
            if kind == ERROR:
                err = decode_json(payload)
                raise ChannelError(int(err.get("reason", Reason.UNEXPECTED_ERROR)),
                                   str(err.get("message", "")))
            if kind != WELCOME:
                raise ChannelError(Reason.UNEXPECTED_ERROR, f"expected WELCOME, got {kind}")
            welcome = decode_json(payload)
            partner = str(welcome.get("receiver_qm", ""))
            if self.partner and partner != self.partner:
                raise ChannelError(
                    Reason.CHANNEL_NOT_AVAILABLE,
                    f"channel {spec.channel} expected queue manager {self.partner}, "
                    f"reached {partner}",
                )
            self.partner = partner
            if spec.on_partner is not None:
                spec.on_partner(partner)
            correl = spec.correl_for(partner) if spec.correl_for is not None else None
            conn = await self.qm.connect()
            q = await conn.open(spec.xmit_q_name, OpenOption.INPUT_SHARED)
            key = sync_key_sender(spec.channel, spec.lane, partner)
            next_seq = await self._resolve_in_doubt(
                conn, q, key, int(welcome.get("last_seq", 0)),
                [bytes.fromhex(h) for h in welcome.get("msg_ids", [])],
            )
            self.retrying = False
            self.last_error = ""
            self.connected_once = True
            self.connected.set()
            while True:
                batch = await self._get_batch(q, correl)
                if not batch:
                    continue
                writer.write(encode_batch(next_seq, batch))
                await writer.drain()
                kind, payload = await read_frame(reader)
                if kind == ERROR:
                    err = decode_json(payload)
                    raise ChannelError(int(err.get("reason", Reason.UNEXPECTED_ERROR)),
                                       str(err.get("message", "")))
                if kind != ACK or _SEQ.unpack(payload)[0] != next_seq:
                    raise ChannelError(Reason.UNEXPECTED_ERROR, "bad batch acknowledgement")
                ids = b"".join(md.msg_id for md, _ in batch)
                await conn.commit(ChannelSync(key, next_seq, ids))
                self.stats.batches += 1
                self.stats.messages += len(batch)
                next_seq += 1
        finally:
            self.connected.clear()
            if conn is not None:
                with contextlib.suppress(Exception):
                    await conn.disconnect()  # backs out a batch not acknowledged
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _resolve_in_doubt(
        self, conn: EmbeddedConnection, q: Any, key: str, last_seq: int, msg_ids: list[bytes]
    ) -> int:
        """Channel resynchronisation at start; returns the next batch sequence number."""
        mine = self.qm.channel_sync(key)
        sent = mine.batch_seq if mine else 0
        if last_seq == sent + 1:
            # the receiver committed our last batch, we did not remove it: remove it now
            for mid in msg_ids:
                with contextlib.suppress(MQError):
                    await q.get(GetOptions(wait_ms=0, syncpoint=True, match_msg_id=mid))
            await conn.commit(ChannelSync(key, last_seq, b"".join(msg_ids)))
            self.stats.in_doubt_resolved += 1
            return last_seq + 1
        if last_seq > sent + 1:
            log.error("channel %s on %s: partner is at batch %d, this side at %d; "
                      "continuing after the partner's number", self.spec.channel,
                      self.qm.name, last_seq, sent)
            return last_seq + 1
        return sent + 1

    async def _get_batch(self, q: Any, correl: bytes | None) -> list[tuple[MQMD, bytes]]:
        batch: list[tuple[MQMD, bytes]] = []
        wait = self.GET_WAIT_MS
        while len(batch) < self.spec.batch_size:
            try:
                msg = await q.get(GetOptions(wait_ms=wait, syncpoint=True,
                                             match_correl_id=correl))
            except MQError as exc:
                if exc.reason == Reason.NO_MSG_AVAILABLE:
                    break
                raise
            batch.append((msg.md, msg.body))
            wait = 0
        return batch
