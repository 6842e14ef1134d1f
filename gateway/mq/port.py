"""The queue-manager port: the few async verbs the gateway needs from a queue manager.

Everything above ``gateway.mq`` talks to queue managers only through these protocols, so
the embedded queue manager (tests, demo, trying the gateway) and IBM MQ (through IBM's
``ibmmq`` package or pymqi) are interchangeable. The shape follows the MQI: a
*connection* (MQCONN's hconn) owns one unit of work; *queue handles* (MQOPEN's hobj)
get, put and inquire. Values of the option and selector enums are IBM's (cmqc.h), so an
adapter passes them through unchanged.

Lifetimes are explicit and async-with friendly::

    conn = await qm.connect()
    async with conn:
        q = await conn.open("APP.IN", OpenOption.INPUT_SHARED)
        msg = await q.get(GetOptions(wait_ms=5000, syncpoint=True))
        await conn.commit()
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Protocol, Self, runtime_checkable

from gateway.wire.constants import CompCode
from gateway.wire.mqmd import MQMD

#: MQWI_UNLIMITED: wait for ever.
WAIT_UNLIMITED = -1


class OpenOption(enum.IntFlag):
    """MQOO_* open options (cmqc.h values)."""

    BIND_AS_Q_DEF = 0
    INPUT_AS_Q_DEF = 0x1
    INPUT_SHARED = 0x2
    INPUT_EXCLUSIVE = 0x4
    BROWSE = 0x8
    OUTPUT = 0x10
    INQUIRE = 0x20
    SET = 0x40
    SAVE_ALL_CONTEXT = 0x80
    PASS_IDENTITY_CONTEXT = 0x100
    PASS_ALL_CONTEXT = 0x200
    SET_IDENTITY_CONTEXT = 0x400
    SET_ALL_CONTEXT = 0x800
    FAIL_IF_QUIESCING = 0x2000
    BIND_ON_OPEN = 0x4000
    BIND_NOT_FIXED = 0x8000


class Browse(enum.Enum):
    """Which message a browse get returns (MQGMO_BROWSE_FIRST / MQGMO_BROWSE_NEXT)."""

    FIRST = "first"
    NEXT = "next"


class QueueAttr(enum.IntEnum):
    """MQIA_* / MQCA_* selectors for :meth:`QueueHandle.inquire` (cmqc.h values)."""

    CURRENT_Q_DEPTH = 3
    DEF_PERSISTENCE = 5
    DEF_PRIORITY = 6
    INHIBIT_GET = 9
    INHIBIT_PUT = 10
    USAGE = 12
    MAX_MSG_LENGTH = 13
    MAX_Q_DEPTH = 15
    OPEN_INPUT_COUNT = 17
    OPEN_OUTPUT_COUNT = 18
    Q_TYPE = 20
    BACKOUT_THRESHOLD = 22
    BASE_Q_NAME = 2002
    DEAD_LETTER_Q_NAME = 2006
    Q_MGR_NAME = 2015
    Q_NAME = 2016
    REMOTE_Q_MGR_NAME = 2017
    REMOTE_Q_NAME = 2018
    BACKOUT_REQ_Q_NAME = 2019
    XMIT_Q_NAME = 2024


@dataclass(slots=True)
class GetOptions:
    """MQGMO, reduced to what the gateway uses.

    ``wait_ms``: 0 returns at once (2033 when empty), ``WAIT_UNLIMITED`` waits for ever.
    ``match_msg_id`` / ``match_correl_id``: MQMO_MATCH_* with the given id.
    ``browse``: browse first/next under the handle's browse cursor (queue opened BROWSE).
    """

    wait_ms: int = 0
    syncpoint: bool = False
    browse: Browse | None = None
    match_msg_id: bytes | None = None
    match_correl_id: bytes | None = None
    max_length: int | None = None
    accept_truncated: bool = False


@dataclass(slots=True)
class PutOptions:
    """MQPMO, reduced to what the gateway uses.

    ``new_msg_id``: MQPMO_NEW_MSG_ID (a blank MsgId is always replaced).
    ``set_all_context``: MQPMO_SET_ALL_CONTEXT: the caller's context fields (PutApplType,
    PutApplName, PutDate, PutTime, UserIdentifier, ...) are kept instead of being filled
    by the queue manager, as a broker or channel does when it forwards a message.
    ``set_identity_context``: MQPMO_SET_IDENTITY_CONTEXT (UserIdentifier, AccountingToken,
    ApplIdentityData kept; origin context filled by the queue manager).
    ``async_response``: MQPMO_ASYNC_RESPONSE (:data:`PMO_ASYNC_RESPONSE`): the put returns
    without waiting for the queue manager; a failure is reported later by
    :func:`async_put_status` (MQSTAT). That much is IBM's semantics. The gateway adds a
    rule of its own (IBM MQ's MQCMIT commits the puts that succeeded): under syncpoint a
    failed asynchronous put makes the unit's commit back the whole unit out and fail
    (MQRC_BACKED_OUT). The embedded queue manager applies it itself; the ibmmq adapter
    emulates it with MQSTAT before MQCMIT (a failure an earlier MQSTAT of the unit saw is
    kept). The returned descriptor is the caller's, with the MsgId (and CorrelId) set
    when they were to be generated. An adapter (or a server) that cannot put
    asynchronously puts synchronously (as MQ does for a message not eligible for it).
    """

    syncpoint: bool = False
    new_msg_id: bool = False
    new_correl_id: bool = False
    set_all_context: bool = False
    set_identity_context: bool = False
    async_response: bool = False


#: MQPMO_ASYNC_RESPONSE and MQPMO_SYNC_RESPONSE (cmqc.h): put-message options.
PMO_ASYNC_RESPONSE = 0x10000
PMO_SYNC_RESPONSE = 0x20000
#: MQSTAT_TYPE_ASYNC_ERROR (cmqc.h): the status type of :func:`async_put_status`.
STAT_TYPE_ASYNC_ERROR = 0


@dataclass(slots=True)
class AsyncPutStatus:
    """MQSTS for MQSTAT_TYPE_ASYNC_ERROR: the first failure (or warning) of the
    asynchronous puts of a connection since the last status call, and their counts.
    ``comp_code``/``reason`` are 0 when none failed; ``object_name`` names the queue of
    the first failure (as opened), ``resolved_*`` where it resolved."""

    comp_code: int = 0
    reason: int = 0
    put_success_count: int = 0
    put_warning_count: int = 0
    put_failure_count: int = 0
    object_name: str = ""
    object_q_mgr_name: str = ""
    resolved_object_name: str = ""
    resolved_q_mgr_name: str = ""

    def merge(self, later: AsyncPutStatus) -> None:
        """Add ``later``'s counts; its first failure replaces ours only when we have
        none, or ours is a warning and it is a failure (MQSTAT's rule)."""
        self.put_success_count += later.put_success_count
        self.put_warning_count += later.put_warning_count
        self.put_failure_count += later.put_failure_count
        if later.comp_code > self.comp_code:
            self.comp_code, self.reason = later.comp_code, later.reason
            self.object_name, self.object_q_mgr_name = later.object_name, later.object_q_mgr_name
            self.resolved_object_name = later.resolved_object_name
            self.resolved_q_mgr_name = later.resolved_q_mgr_name


@dataclass(slots=True)
class Message:
    """One MQ message: its descriptor and the bytes of its data (headers included)."""

    md: MQMD
    body: bytes


class MQError(Exception):
    """An MQI call failed: carries IBM's completion and reason codes.

    ``reason`` is an MQRC_* value (``gateway.wire.reasons.Reason``); ``retriable`` says
    whether trying again later can succeed (connection broken, queue full, ...).
    """

    RETRIABLE_REASONS = frozenset(
        {2009, 2059, 2161, 2162, 2202, 2053, 2056, 2051, 2016, 2538, 2543}
    )

    def __init__(self, reason: int, message: str = "", comp_code: int = CompCode.FAILED) -> None:
        self.reason = int(reason)
        self.comp_code = int(comp_code)
        self.detail = message
        super().__init__(f"MQRC {self.reason} ({reason_name(self.reason)}): {message}".rstrip(": "))

    @property
    def retriable(self) -> bool:
        return self.reason in self.RETRIABLE_REASONS


def reason_name(reason: int) -> str:
    """The MQRC_* name of a reason code, or the bare number when unknown."""
    from gateway.wire.reasons import Reason

    try:
        return f"MQRC_{Reason(reason).name}"
    except ValueError:
        return str(reason)


@runtime_checkable
class QueueHandle(Protocol):
    """An open queue (MQOPEN's object handle)."""

    @property
    def name(self) -> str:
        """The name the queue was opened by."""
        ...

    @property
    def resolved_q_name(self) -> str:
        """The queue name after name resolution (alias base, remote name, ...)."""
        ...

    @property
    def resolved_q_mgr_name(self) -> str:
        """The queue manager the resolved queue lives on."""
        ...

    async def get(self, options: GetOptions | None = None) -> Message:
        """MQGET. Raises MQError(2033) when no message arrives in the wait interval."""
        ...

    async def put(self, md: MQMD, body: bytes, options: PutOptions | None = None) -> MQMD:
        """MQPUT. Returns the descriptor as the queue manager completed it (MsgId, dates)."""
        ...

    async def inquire(self, *selectors: QueueAttr) -> dict[QueueAttr, int | str]:
        """MQINQ for the given selectors."""
        ...

    async def close(self) -> None:
        """MQCLOSE."""
        ...


@runtime_checkable
class Connection(Protocol):
    """A connection to one queue manager (MQCONN's hconn), owning one unit of work."""

    @property
    def q_mgr_name(self) -> str:
        """The name of the queue manager this connection is to."""
        ...

    async def open(
        self, q_name: str, options: OpenOption, q_mgr_name: str = ""
    ) -> QueueHandle:
        """MQOPEN, resolving ``q_name`` (at ``q_mgr_name`` when given)."""
        ...

    async def put1(
        self,
        q_name: str,
        md: MQMD,
        body: bytes,
        options: PutOptions | None = None,
        q_mgr_name: str = "",
    ) -> MQMD:
        """MQPUT1: open, put one message, close."""
        ...

    async def commit(self) -> None:
        """MQCMIT: make this connection's syncpoint puts visible and gets final."""
        ...

    async def backout(self) -> None:
        """MQBACK: undo syncpoint puts; return syncpoint gets (BackoutCount + 1)."""
        ...

    async def disconnect(self) -> None:
        """MQDISC. An open unit of work is backed out (MQ commits on normal MQDISC on
        some platforms; the gateway always commits or backs out explicitly first)."""
        ...

    async def __aenter__(self) -> Self: ...

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None: ...


@runtime_checkable
class QueueManager(Protocol):
    """Something that hands out connections to one queue manager."""

    @property
    def name(self) -> str: ...

    async def connect(self) -> Connection:
        """MQCONN(X)."""
        ...


#: One put of :func:`put_many`: queue name, its queue manager ("" for the connection's),
#: descriptor, body.
PutItem = tuple[str, str, MQMD, bytes]


async def put_many(
    conn: Connection, items: Sequence[PutItem], options: PutOptions | None = None
) -> list[MQMD | MQError]:
    """Put ``items`` in order under one call (one publication fanned out to many
    queues): the optional connection verb ``put_many`` when the adapter has one (the
    embedded queue manager's takes one pass, with no copy of the descriptors), else
    :func:`put_each`.

    One result per item: the completed descriptor, or the MQError that put failed with
    (queue full, put inhibited, unknown queue...); the other items are still put. The
    descriptors are handed over: an adapter may complete and keep them, so the caller
    must not use them again, except those whose put failed (left as they were).

    A successful result belongs to the queue manager and is read-only: on the embedded
    queue manager it is the very descriptor of the queued message (no copy), so changing
    it, or the ``md`` handed over, would change what every later get of that message
    sees while the copy on disk stays as it was. A caller that wants to change one
    copies it first (``dataclasses.replace``); :func:`put_each` returns copies, but a
    caller must not rely on that. (Copying here costs about 8 µs a put, the cost the
    embedded fast path avoids.)
    """
    native = getattr(conn, "put_many", None)
    if native is not None:
        result: list[MQMD | MQError] = await native(items, options)
        return result
    return await put_each(conn, items, options)


def puts_in_one_pass(conn: Connection) -> bool:
    """Whether ``conn``'s :func:`put_many` is one in-process pass (the embedded queue
    manager's), where a put that fails costs nothing: a caller that will give up the
    whole batch at the first failure of some kinds (a full sink backlog) may then still
    hand over the whole run. Elsewhere every put is a round trip to the queue manager,
    so such a caller puts those one at a time and stops at the first failure."""
    return bool(getattr(conn, "put_many_in_one_pass", False))


def start_commit(conn: Connection) -> asyncio.Future[None] | None:
    """MQCMIT begun without waiting for the disk: the optional connection verb
    ``start_commit`` (the embedded queue manager's), else None and the caller commits
    as usual.

    The unit of work is taken off the connection at once, so the caller may begin the
    next one (get more messages and work on them) while the commit completes; the
    future ends when it has, or raises as ``commit`` does (the unit backed out). The
    caller must let nothing of the next unit leave the process (no put, no send) before
    that future has ended, and must back the next unit out too if it failed: then every
    message of both is got again, in its order (docs/performance.md, "Commits
    overlapped with the next batch")."""
    native = getattr(conn, "start_commit", None)
    if native is None:
        return None
    started: asyncio.Future[None] = native()
    return started


async def async_put_status(conn: Connection) -> AsyncPutStatus:
    """MQSTAT(MQSTAT_TYPE_ASYNC_ERROR): the connection's asynchronous-put status since
    the last call, then reset. An adapter without the optional verb ``async_status``
    puts synchronously (every failure was raised by its put): nothing to report."""
    native = getattr(conn, "async_status", None)
    if native is None:
        return AsyncPutStatus()
    status: AsyncPutStatus = await native()
    return status


def output_options(options: PutOptions) -> OpenOption:
    """The open options a put with ``options`` needs."""
    out = OpenOption.OUTPUT
    if options.set_all_context:
        out |= OpenOption.SET_ALL_CONTEXT
    elif options.set_identity_context:
        out |= OpenOption.SET_IDENTITY_CONTEXT
    return out


async def put_each(
    conn: Connection, items: Sequence[PutItem], options: PutOptions | None = None
) -> list[MQMD | MQError]:
    """:func:`put_many` as one open per queue and one put per item (any adapter)."""
    opts = options or PutOptions()
    open_opts = output_options(opts)
    handles: dict[tuple[str, str], QueueHandle | MQError] = {}
    out: list[MQMD | MQError] = []
    try:
        for q_name, q_mgr_name, md, body in items:
            key = (q_name, q_mgr_name)
            handle = handles.get(key)
            if handle is None:
                try:
                    handle = await conn.open(q_name, open_opts, q_mgr_name)
                except MQError as exc:
                    handle = exc
                handles[key] = handle
            if isinstance(handle, MQError):
                out.append(handle)
                continue
            try:
                out.append(await handle.put(md, body, opts))
            except MQError as exc:
                out.append(exc)
    finally:
        await close_opened(handles.values())
    return out


async def close_opened(handles: Iterable[QueueHandle | MQError]) -> None:
    """Close the handles a batch of puts opened (an entry that is the reason its open
    failed is skipped); a failing close is ignored: the puts' outcomes are what count."""
    for h in handles:
        if not isinstance(h, MQError):
            with contextlib.suppress(MQError):
                await h.close()
