"""The in-memory view of one local queue: ordering, matching, browse cursors, waiters.

Why in memory: every get must pick "highest priority, then oldest" among the messages
not locked by another unit of work, match MsgId/CorrelId, skip expired messages and wake
waiting getters the moment something arrives. The store only keeps persistent messages
durable; this index is rebuilt from it at start.

Order is a heap of ``(-priority, seq)`` keys with lazy deletion (keys whose message has
left ``available`` are dropped when they reach the top), plus MsgId/CorrelId indexes so
a matching get does not scan the queue. An identifier held by one message maps to its
sequence number, only one held by several to a set: MsgIds are unique as a rule, and a
set per queued message was a third of the objects a fan-out's messages keep alive (and
the garbage collector walks).
"""

from __future__ import annotations

import asyncio
import heapq
import operator
from collections.abc import Callable
from dataclasses import dataclass

from gateway.mq.port import MQError
from gateway.wire.errors import WireError
from gateway.wire.mqmd import MQMD
from gateway.wire.reasons import Reason

Key = tuple[int, int]
#: MsgId or CorrelId -> the sequence number of the one message holding it, or the set of
#: several (never empty)
IdIndex = dict[bytes, "int | set[int]"]
_MD_SLOTS: tuple[str, ...] = tuple(MQMD.__slots__)


def pack_md_for_store(md: MQMD) -> bytes:
    """The MQMD as the store keeps it (version 2, native encoding 546); a descriptor that
    cannot be packed is MQ's 2026 MD_ERROR."""
    try:
        if md.version < 2:
            md = clone_md(md)  # as md.copy(version=2), without dataclasses.replace's cost
            md.version = 2
        return md.pack(546)
    except WireError as exc:
        raise MQError(Reason.MD_ERROR, f"the message descriptor cannot be stored: {exc}") from exc


def _compile_clone_md() -> Callable[[MQMD], MQMD]:
    """``clone_md`` as straight-line code, one attribute copy per MQMD slot (generated
    from ``MQMD.__slots__`` as ``dataclasses`` generates ``__init__``): about 8x faster
    than a loop of ``getattr``/``object.__setattr__``, and a slot added to MQMD is
    copied without an edit here."""
    lines = ["def clone_md(md):", "    out = _new(_MQMD)"]
    lines += [f"    out.{name} = md.{name}" for name in _MD_SLOTS]
    lines.append("    return out")
    scope: dict[str, object] = {"_new": object.__new__, "_MQMD": MQMD}
    exec("\n".join(lines), scope)  # the text is built from MQMD's own slot names
    fn = scope["clone_md"]
    assert callable(fn)
    return fn


#: A shallow copy of an MQMD, several times faster than ``dataclasses.replace`` (every
#: put and get copies one: callers must not share the queued descriptor).
clone_md: Callable[[MQMD], MQMD] = _compile_clone_md()


#: Every MQMD field but MsgId and CorrelId: two descriptors equal in these pack to the
#: same bytes apart from the two identifiers.
_MD_SHARED = operator.attrgetter(*(n for n in _MD_SLOTS if n not in ("msg_id", "correl_id")))


def _id_offsets() -> tuple[int, int]:
    """Where MsgId and CorrelId sit in a packed version-2 MQMD (found, not assumed)."""
    probe = MQMD(version=2, msg_id=b"\x01" * 24, correl_id=b"\x02" * 24).pack(546)
    return probe.index(b"\x01" * 24), probe.index(b"\x02" * 24)


_MSG_ID_AT, _CORREL_ID_AT = _id_offsets()


class MDPacker:
    """Packs many descriptors for the store, reusing the last packing when only MsgId
    and CorrelId differ (one publication fanned out to many subscribers): the stored
    bytes are the template's with the two identifiers patched in at their offsets,
    byte for byte what :func:`pack_md_for_store` gives."""

    __slots__ = ("_head", "_key", "_middle", "_tail")

    def __init__(self) -> None:
        self._key: tuple[object, ...] | None = None
        # the template's bytes before MsgId, between MsgId and CorrelId, after CorrelId
        self._head = self._middle = self._tail = b""

    def pack(self, md: MQMD) -> bytes:
        key = _MD_SHARED(md)
        msg_id, correl_id = md.msg_id, md.correl_id
        if key != self._key or len(msg_id) != 24 or len(correl_id) != 24:
            packed = pack_md_for_store(md)
            if len(msg_id) == 24 and len(correl_id) == 24:
                self._key = key
                self._head = packed[:_MSG_ID_AT]
                self._middle = packed[_MSG_ID_AT + 24:_CORREL_ID_AT]
                self._tail = packed[_CORREL_ID_AT + 24:]
            return packed
        return b"".join((self._head, msg_id, self._middle, correl_id, self._tail))


@dataclass(slots=True)
class Waiter:
    """A getter parked on a queue: what it would accept, and how to wake it.

    ``browse`` waiters look past a cursor, so any arrival may concern them."""

    future: asyncio.Future[None]
    msg_id: bytes | None = None
    correl_id: bytes | None = None
    browse: bool = False

    def accepts(self, msg: QueuedMessage) -> bool:
        if self.browse:
            return True
        if self.msg_id is not None and msg.md.msg_id != self.msg_id:
            return False
        return self.correl_id is None or msg.md.correl_id == self.correl_id


@dataclass(slots=True)
class QueuedMessage:
    """A message on a local queue. ``seq`` orders arrival; ``expiry_at`` is wall-clock."""

    seq: int
    md: MQMD
    body: bytes
    priority: int
    persistent: bool
    put_at: float
    expiry_at: float | None
    #: the MQMD as stored (persistent messages), packed once at put
    packed_md: bytes | None = None

    @property
    def key(self) -> Key:
        return (-self.priority, self.seq)

    def expired(self, now: float) -> bool:
        return self.expiry_at is not None and now >= self.expiry_at


def _seqs_of(index: IdIndex, ident: bytes) -> set[int]:
    """The sequence numbers of the messages holding ``ident`` (a new set)."""
    seqs = index.get(ident)
    if seqs is None:
        return set()
    return {seqs} if isinstance(seqs, int) else set(seqs)


class LocalQueue:
    """Messages of one local queue plus the bookkeeping MQ shows as attributes."""

    __slots__ = (
        "_heap",
        "available",
        "by_correl_id",
        "by_msg_id",
        "exclusive",
        "input_count",
        "locked",
        "name",
        "output_count",
        "pending_puts",
        "waiters",
    )

    def __init__(self, name: str) -> None:
        self.name = name
        self._heap: list[Key] = []
        self.available: dict[int, QueuedMessage] = {}
        self.by_msg_id: IdIndex = {}
        self.by_correl_id: IdIndex = {}
        #: messages got under syncpoint, not yet committed (still count in CURDEPTH)
        self.locked = 0
        #: messages put under syncpoint, not yet committed (count in CURDEPTH, as on MQ)
        self.pending_puts = 0
        self.input_count = 0
        self.output_count = 0
        self.exclusive = False
        self.waiters: list[Waiter] = []

    @property
    def depth(self) -> int:
        """CURDEPTH: committed messages plus those inside open units of work."""
        return len(self.available) + self.locked + self.pending_puts

    def add(self, msg: QueuedMessage) -> None:
        # every commit of a fan-out adds thousands: no set for an identifier held once
        seq, md = msg.seq, msg.md
        self.available[seq] = msg
        heapq.heappush(self._heap, (-msg.priority, seq))
        for index, ident in ((self.by_msg_id, md.msg_id), (self.by_correl_id, md.correl_id)):
            seqs = index.get(ident)
            if seqs is None:
                index[ident] = seq
            elif isinstance(seqs, int):
                index[ident] = {seqs, seq}
            else:
                seqs.add(seq)

    def remove(self, msg: QueuedMessage) -> None:
        seq = msg.seq
        del self.available[seq]
        for index, ident in (
            (self.by_msg_id, msg.md.msg_id),
            (self.by_correl_id, msg.md.correl_id),
        ):
            seqs = index.get(ident)
            if seqs is None:
                continue
            if isinstance(seqs, int):
                if seqs == seq:
                    del index[ident]
                continue
            seqs.discard(seq)
            if len(seqs) == 1:
                index[ident] = next(iter(seqs))
            elif not seqs:
                del index[ident]

    def clear(self) -> list[QueuedMessage]:
        gone = list(self.available.values())
        self.available.clear()
        self.by_msg_id.clear()
        self.by_correl_id.clear()
        self._heap.clear()
        return gone

    def first(
        self,
        now: float,
        on_expired: Callable[[QueuedMessage], None],
        msg_id: bytes | None = None,
        correl_id: bytes | None = None,
        after: Key | None = None,
    ) -> QueuedMessage | None:
        """The next message in get order (optionally matching, optionally after a browse
        cursor ``after``). Expired messages met on the way are removed and reported."""
        if msg_id is None and correl_id is None and after is None:
            return self._first_plain(now, on_expired)
        candidates: set[int] | None = None
        if msg_id is not None:
            candidates = _seqs_of(self.by_msg_id, msg_id)
        if correl_id is not None:
            seqs = _seqs_of(self.by_correl_id, correl_id)
            candidates = seqs if candidates is None else candidates & seqs
        if candidates is None:
            pool = list(self.available.values())
        else:
            pool = [self.available[s] for s in candidates if s in self.available]
        pool.sort(key=lambda m: m.key)
        for msg in pool:
            if after is not None and msg.key <= after:
                continue
            if msg.expired(now):
                self.remove(msg)
                on_expired(msg)
                continue
            return msg
        return None

    def _first_plain(
        self, now: float, on_expired: Callable[[QueuedMessage], None]
    ) -> QueuedMessage | None:
        heap = self._heap
        while heap:
            seq = heap[0][1]
            msg = self.available.get(seq)
            if msg is None or msg.key != heap[0]:
                heapq.heappop(heap)
                continue
            if msg.expired(now):
                heapq.heappop(heap)
                self.remove(msg)
                on_expired(msg)
                continue
            return msg
        return None

    def wake(self) -> None:
        """Wake every waiting getter (the queue changed state: inhibited, deleted, stop)."""
        waiters, self.waiters = self.waiters, []
        for w in waiters:
            if not w.future.done():
                w.future.set_result(None)

    def notify(self, msg: QueuedMessage) -> None:
        """A message became available: wake the oldest getter that would take it (and
        every browser), not the whole crowd. A woken getter that leaves without taking a
        message passes the wake-up on (see ``EmbeddedQueueHandle.get``)."""
        if not self.waiters:
            return
        keep: list[Waiter] = []
        woke_getter = False
        for w in self.waiters:
            if w.future.done():
                continue
            if w.browse or (not woke_getter and w.accepts(msg)):
                w.future.set_result(None)
                woke_getter = woke_getter or not w.browse
            else:
                keep.append(w)
        self.waiters = keep
