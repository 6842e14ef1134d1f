"""The embedded queue manager: IBM MQ's queue semantics on SQLite, in-process and async.

Why it exists: IBM MQ cannot run everywhere the gateway does (tests, the demo, trying the
gateway out), so this implements the port (:mod:`gateway.mq.port`) with MQ's rules:
priority-then-FIFO gets, MsgId/CorrelId matching, expiry, browse cursors, units of work
per connection with BackoutCount, MAXDEPTH/MAXMSGL/GET/PUT checks with MQ's reason
codes, name resolution (aliases, remote definitions, queue-manager and reply-to aliases,
transmission queues with MQXQH) and the dead-letter queue with MQDLH.

Concurrency model: one asyncio event loop owns a queue manager (all connections are used
from that loop). Queue state is in memory; persistent messages are written through a
single writer thread (SQLite WAL, fsync at commit) so the loop never waits on the disk.
Getters waiting for a message park on a future per waiter and are woken on arrival.
One process owns a data directory at a time (see :mod:`gateway.mq.embedded.store`).
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import json
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Self, TypeVar

from gateway.mq.embedded.context import MsgIdGenerator, PutContext
from gateway.mq.embedded.mqsc_run import MQSCResult, check_script, run_script
from gateway.mq.embedded.name_resolution import (
    RemoteDirectory,
    Resolution,
    ResolutionError,
    resolve_queue,
    resolve_reply_to,
)
from gateway.mq.embedded.objects import (
    CLUSTER_COMMAND_QUEUE,
    CLUSTER_REPOSITORY_QUEUE,
    CLUSTER_TRANSMIT_QUEUE,
    ChannelDef,
    DefBind,
    ObjectCatalogue,
    QMgrAttrs,
    QType,
    QueueDef,
    default_queues,
    new_catalogue,
)
from gateway.mq.embedded.queues import LocalQueue, QueuedMessage, Waiter, clone_md
from gateway.mq.embedded.store import ChannelSync, MessageStore, StoredMessage, StoreError
from gateway.mq.port import (
    WAIT_UNLIMITED,
    Browse,
    GetOptions,
    Message,
    MQError,
    OpenOption,
    PutOptions,
    QueueAttr,
)
from gateway.wire.constants import MI_NONE, CompCode, MsgType, Persistence
from gateway.wire.dlh import wrap_for_dlq
from gateway.wire.errors import WireError
from gateway.wire.mqmd import MQMD
from gateway.wire.reasons import Reason
from gateway.wire.xqh import unwrap_from_xmitq, wrap_for_xmitq

log = logging.getLogger(__name__)

T = TypeVar("T")

#: MQ's MaxUncommittedMsgs default (the syncpoint limit per unit of work).
MAX_UNCOMMITTED_MSGS = 10_000
_INPUT = OpenOption.INPUT_AS_Q_DEF | OpenOption.INPUT_SHARED | OpenOption.INPUT_EXCLUSIVE
_MQQA_GET_INHIBITED, _MQQA_GET_ALLOWED = 1, 0
_MQQA_PUT_INHIBITED, _MQQA_PUT_ALLOWED = 1, 0
_MQRO_DISCARD_MSG = 0x8000000
#: Resolution failures a cluster repository may cure by learning the names.
_LEARNABLE = frozenset({Reason.UNKNOWN_OBJECT_NAME, Reason.UNKNOWN_ALIAS_BASE_Q,
                        Reason.UNKNOWN_REMOTE_Q_MGR})


def cluster_correl_id(q_mgr_name: str, lane: str = "") -> bytes:
    """CorrelId of a message on SYSTEM.CLUSTER.TRANSMIT.QUEUE for cluster member
    ``q_mgr_name``: the auto-defined cluster-sender to that member gets by it (IBM MQ
    likewise keys that queue by channel). ``lane`` separates repository traffic."""
    return hashlib.sha256(f"{lane}>{q_mgr_name}".encode()).digest()[:24]


class EmbeddedQueueManager:
    """One embedded queue manager, stored under ``path``.

    ``mqsc_file``: a script run once the queue manager is open (every start; use
    ``REPLACE`` to make it idempotent); an error stops the start naming its line.
    ``directory``: issue 8's view of other queue managers and clusters (optional).
    """

    def __init__(
        self,
        name: str,
        path: Path | str,
        *,
        mqsc_file: Path | str | None = None,
        directory: RemoteDirectory | None = None,
        appl_name: str | None = None,
    ) -> None:
        if not name or len(name) > 48:
            raise MQError(Reason.Q_MGR_NAME_ERROR, f"queue manager name {name!r} is not valid")
        self._name = name
        self.path = Path(path)
        self.remote_directory = directory
        try:
            self._store = MessageStore(self.path)
        except StoreError as exc:
            raise QueueManagerUnavailableError(name, str(exc)) from exc
        try:
            cat = self._store.load_catalogue()
            if cat is None:
                cat = new_catalogue(name)
                self._store.save_catalogue(cat)
            elif cat.q_mgr_name != name:
                raise QueueManagerUnavailableError(
                    name, f"{self.path} holds queue manager {cat.q_mgr_name}, not {name}"
                )
            else:
                for q in default_queues():  # objects added by later versions
                    if q.name not in cat.queues:
                        cat.queues[q.name] = q
                        self._store.save_queue(q)
            self._catalogue = cat
            self._queues: dict[str, LocalQueue] = {
                n: LocalQueue(n) for n, d in cat.queues.items() if d.qtype is QType.LOCAL
            }
            self._seq = self._store.max_seq()
            self._channel_sync = self._store.load_channel_sync()
            for row in self._store.load_messages():
                self._restore(row)
        except BaseException:
            self._store.close()
            raise
        self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"qm-{name}-store")
        self._msg_ids = MsgIdGenerator(name)
        self._context = PutContext(appl_name=appl_name)
        self._connections: set[EmbeddedConnection] = set()
        self._closed = False
        self._stopping = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._expired_persistent: list[int] = []
        self._write_queue: list[
            tuple[list[StoredMessage], list[int], list[tuple[int, int]], list[ChannelSync],
                  asyncio.Future[None]]
        ] = []
        #: Called after MQSC changed a definition (the cluster manager re-advertises).
        self.definition_listeners: list[Callable[[str, str], None]] = []
        self._writer_task: asyncio.Future[None] | None = None
        self._housekeeping: set[asyncio.Future[None]] = set()
        self.stats = QueueManagerStats()
        if mqsc_file is not None:
            try:
                self.run_mqsc(Path(mqsc_file).read_text(encoding="utf-8"), stop_on_error=True)
            except BaseException:
                self._shutdown_store()
                raise

    # ---------------------------------------------------------------- lifecycle

    @property
    def name(self) -> str:
        return self._name

    @property
    def catalogue(self) -> ObjectCatalogue:
        return self._catalogue

    @property
    def closed(self) -> bool:
        return self._closed

    async def connect(self) -> EmbeddedConnection:
        """MQCONN. Fails with 2162 once the queue manager is closed."""
        self._check_running()
        loop = asyncio.get_running_loop()
        if self._loop is None:
            self._loop = loop
        elif self._loop is not loop and not self._loop.is_closed():
            raise MQError(
                Reason.ENVIRONMENT_ERROR,
                f"queue manager {self._name} is used from another event loop; one event loop "
                "(thread) owns an embedded queue manager",
            )
        conn = EmbeddedConnection(self)
        self._connections.add(conn)
        return conn

    async def close(self) -> None:
        """End the queue manager: waiting getters get 2162 (Q_MGR_STOPPING), open units of
        work are backed out, pending store writes finish, the data directory is released."""
        if self._closed or self._stopping:
            return
        self._stopping = True
        for q in self._queues.values():
            q.wake()
        await asyncio.sleep(0)  # let woken getters see the stop
        for conn in list(self._connections):
            await conn.disconnect()
        while self._housekeeping:
            await asyncio.wait(list(self._housekeeping))
        await self._flush_expired()
        while self._writer_task is not None and not self._writer_task.done():
            await asyncio.wait([self._writer_task])
        self._closed = True
        self._shutdown_store()

    def _shutdown_store(self) -> None:
        self._closed = True
        self._writer.shutdown(wait=True)
        self._store.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    @property
    def stopping(self) -> bool:
        return self._stopping or self._closed

    def _check_running(self) -> None:
        if self.stopping:
            raise MQError(Reason.Q_MGR_STOPPING, f"queue manager {self._name} has been stopped")

    # ---------------------------------------------------------------- MQSC

    def run_mqsc(self, script: str, *, stop_on_error: bool = False) -> list[MQSCResult]:
        """Run MQSC commands against this queue manager (``runmqsc``).

        With ``stop_on_error`` (a start script) the whole script is checked first
        (:meth:`check_mqsc`), so a bad line raises MQSCError before anything changes."""
        self._check_running()
        if stop_on_error:
            self.check_mqsc(script)
        return run_script(_MQSCAdapter(self), script, stop_on_error=stop_on_error)

    def check_mqsc(self, script: str) -> None:
        """Raise MQSCError (naming the line) if ``script`` would fail against the current
        definitions; changes nothing."""
        check_script(self._catalogue, script)

    # ---------------------------------------------------------------- channels

    def channel_sync(self, key: str) -> ChannelSync | None:
        """The last committed batch of channel ``key`` on this side (None: never)."""
        return self._channel_sync.get(key)

    def _notify_definition(self, kind: str, name: str) -> None:
        for listener in list(self.definition_listeners):
            try:
                listener(kind, name)
            except Exception:  # a listener must not break MQSC
                log.exception("definition listener failed for %s %s", kind, name)

    # ---------------------------------------------------------------- queries

    def queue_depth(self, q_name: str) -> int:
        q = self._queues.get(q_name)
        if q is None:
            raise MQError(Reason.UNKNOWN_OBJECT_NAME, f"{q_name} is not a local queue")
        return q.depth

    async def sweep_expired(self) -> int:
        """Remove every expired message now (IBM MQ's periodic expiry scan, EXPRYINT).

        Gets already skip and remove expired messages; this keeps CURDEPTH honest on
        queues nobody reads. Returns how many messages were removed."""
        self._check_running()
        now = time.time()
        removed = 0
        for q in self._queues.values():
            for msg in [m for m in q.available.values() if m.expired(now)]:
                q.remove(msg)
                self._on_expired(msg)
                removed += 1
        await self._complete(self._flush_expired())
        return removed

    def resolve(
        self, q_name: str, q_mgr_name: str = "", bind_on_open: bool = False,
        cluster_lookup: bool = True,
    ) -> Resolution:
        """Name resolution against the current definitions (raises MQError)."""
        try:
            return resolve_queue(
                self._catalogue, q_name, q_mgr_name,
                directory=self.remote_directory, bind_on_open=bind_on_open,
                cluster_lookup=cluster_lookup,
            )
        except ResolutionError as exc:
            raise MQError(exc.reason, str(exc)) from None

    async def resolve_learning(
        self, q_name: str, q_mgr_name: str = "", bind_on_open: bool = False,
        cluster_lookup: bool = True,
    ) -> Resolution:
        """:meth:`resolve`, asking the cluster repositories first when the names are not
        known here yet (a partial repository learns objects on first use)."""
        try:
            return self.resolve(q_name, q_mgr_name, bind_on_open, cluster_lookup)
        except MQError as exc:
            learn = getattr(self.remote_directory, "learn", None)
            if learn is None or exc.reason not in _LEARNABLE:
                raise
            ask_q, ask_qm = q_name, q_mgr_name
            d = self._catalogue.get(q_name) if not q_mgr_name else None
            if d is not None and d.qtype is QType.ALIAS and d.target:
                ask_q = d.target  # the alias base is what is not known here
                d = self._catalogue.get(d.target)
            if d is not None and d.qtype is QType.REMOTE:
                ask_q, ask_qm = d.remote_name or ask_q, d.remote_q_mgr_name
            if not await learn(ask_q, ask_qm):
                raise
        return self.resolve(q_name, q_mgr_name, bind_on_open, cluster_lookup)

    # ---------------------------------------------------------------- internals

    def _restore(self, row: StoredMessage) -> None:
        q = self._queues.get(row.queue)
        if q is None:  # definition deleted without its messages: cannot happen, be safe
            log.warning("dropping stored message %d for undefined queue %s", row.seq, row.queue)
            return
        md = MQMD.unpack(row.md, 0, 546)
        md.backout_count = row.backout_count
        q.add(QueuedMessage(row.seq, md, row.body, row.priority, True, row.put_at, row.expiry_at))

    def _next_seq(self) -> int:
        self._seq += 1
        return self._seq

    def _local_queue(self, name: str) -> LocalQueue:
        q = self._queues.get(name)
        if q is None:
            raise MQError(Reason.Q_DELETED, f"queue {name} has been deleted")
        return q

    def _on_expired(self, msg: QueuedMessage) -> None:
        self.stats.expired += 1
        if msg.persistent:
            self._expired_persistent.append(msg.seq)

    async def _flush_expired(self) -> None:
        if self._expired_persistent:
            seqs, self._expired_persistent = self._expired_persistent, []
            await self._apply(deletes=seqs)

    async def _apply(
        self,
        inserts: list[StoredMessage] | None = None,
        deletes: list[int] | None = None,
        backouts: list[tuple[int, int]] | None = None,
        syncs: list[ChannelSync] | None = None,
    ) -> None:
        """Make message changes durable, sharing one fsync with concurrent requests.

        Group commit: while the writer thread is busy, requests queue up and the next
        transaction carries all of them, so N connections committing at once cost about
        one fsync instead of N. Returns once this request's changes are on disk.
        """
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._write_queue.append((inserts or [], deletes or [], backouts or [], syncs or [], fut))
        if self._writer_task is None or self._writer_task.done():
            self._writer_task = asyncio.ensure_future(self._drain_writes())
        await fut

    async def _drain_writes(self) -> None:
        while self._write_queue:
            batch, self._write_queue = self._write_queue, []
            ins = [m for b in batch for m in b[0]]
            dels = [s for b in batch for s in b[1]]
            bos = [c for b in batch for c in b[2]]
            sys_ = [c for b in batch for c in b[3]]
            self.stats.store_transactions += 1
            try:
                await self._write(functools.partial(self._store.apply, ins, dels, bos, sys_))
            except MQError as exc:
                for *_, fut in batch:
                    if not fut.done():
                        fut.set_exception(exc)
            else:
                for *_, fut in batch:
                    if not fut.done():
                        fut.set_result(None)

    async def _write(self, fn: Callable[[], None]) -> None:
        """Run a store write on the writer thread; a failure is MQ's 2102 resource problem."""
        loop = asyncio.get_running_loop()
        try:
            await loop.run_in_executor(self._writer, fn)
        except Exception as exc:
            raise MQError(Reason.RESOURCE_PROBLEM, f"store write failed: {exc}") from exc

    def _to_row(self, q_name: str, m: QueuedMessage) -> StoredMessage:
        return StoredMessage(
            m.seq, q_name, m.priority, m.md.msg_id, m.md.correl_id, m.put_at, m.expiry_at,
            m.md.backout_count, m.packed_md or _pack_for_store(m.md), m.body,
        )

    async def _store_put(self, q: LocalQueue, msg: QueuedMessage) -> None:
        """Harden a non-syncpoint persistent put, then make it visible (caller counted it
        in ``pending_puts``)."""
        try:
            await self._apply([self._to_row(q.name, msg)])
        finally:
            q.pending_puts -= 1
        if q is self._queues.get(q.name):
            q.add(msg)
            q.notify(msg)

    async def _give_back(
        self, q: LocalQueue, msg: QueuedMessage, delete: asyncio.Future[None]
    ) -> None:
        """Return a message whose non-syncpoint get was cancelled before the caller got it:
        wait for its delete, store it again under the same sequence, then unlock it."""
        try:
            await delete
        except MQError:
            pass  # never deleted: the stored row is still there
        else:
            try:
                await self._apply([self._to_row(q.name, msg)])
            except MQError:
                log.error("%s: message %d of %s returned after a cancelled get could not be "
                          "stored again; it is kept in memory only", self._name, msg.seq, q.name)
        q.locked -= 1
        if q is self._queues.get(q.name):
            q.add(msg)
            q.notify(msg)

    def _background(self, coro: Coroutine[Any, Any, None]) -> None:
        """Run housekeeping that must finish even though its caller has gone; close()
        waits for it."""
        task = asyncio.ensure_future(coro)
        self._housekeeping.add(task)
        task.add_done_callback(self._housekeeping.discard)

    async def _complete(self, task: Awaitable[T]) -> T:
        """Run a state change to its end even if the caller is cancelled meanwhile."""
        fut = asyncio.ensure_future(task)
        return await asyncio.shield(fut)


@dataclass(slots=True)
class QueueManagerStats:
    """Counters (never per-message logs): exposed to the runtime's metrics."""

    puts: int = 0
    gets: int = 0
    commits: int = 0
    backouts: int = 0
    expired: int = 0
    dead_lettered: int = 0
    store_transactions: int = 0


class QueueManagerUnavailableError(MQError):
    """The queue manager cannot start: data directory locked, damaged or another QM's."""

    def __init__(self, q_mgr_name: str, message: str) -> None:
        self.q_mgr_name = q_mgr_name
        super().__init__(Reason.Q_MGR_NOT_AVAILABLE, message)


class _MQSCAdapter:
    """Lets the MQSC runner change a live queue manager."""

    def __init__(self, qm: EmbeddedQueueManager) -> None:
        self._qm = qm

    @property
    def catalogue(self) -> ObjectCatalogue:
        return self._qm._catalogue

    def current_depth(self, q_name: str) -> int:
        q = self._qm._queues.get(q_name)
        return q.depth if q is not None else 0

    def open_count(self, q_name: str) -> tuple[int, int]:
        q = self._qm._queues.get(q_name)
        return (q.input_count, q.output_count) if q is not None else (0, 0)

    def uncommitted(self, q_name: str) -> int:
        q = self._qm._queues.get(q_name)
        return q.locked + q.pending_puts if q is not None else 0

    def save_queue(self, definition: QueueDef) -> None:
        qm = self._qm
        qm._store.save_queue(definition)
        qm._catalogue.queues[definition.name] = definition
        if definition.qtype is QType.LOCAL:
            q = qm._queues.setdefault(definition.name, LocalQueue(definition.name))
            q.wake()  # waiters re-check GET(DISABLED) and MAXDEPTH changes
        qm._notify_definition("QUEUE", definition.name)

    def delete_queue(self, q_name: str, purge: bool) -> None:
        qm = self._qm
        qm._store.delete_queue(q_name)
        del qm._catalogue.queues[q_name]
        q = qm._queues.pop(q_name, None)
        if q is not None:
            q.clear()
            q.wake()
        qm._notify_definition("QUEUE", q_name)

    def save_qmgr(self, attrs: QMgrAttrs) -> None:
        self._qm._store.save_qmgr(attrs)
        self._qm._catalogue.qmgr = attrs
        self._qm._notify_definition("QMGR", attrs.name)

    def save_channel(self, definition: ChannelDef) -> None:
        self._qm._store.save_channel(definition)
        self._qm._catalogue.channels[definition.name] = definition
        self._qm._notify_definition("CHANNEL", definition.name)

    def delete_channel(self, name: str) -> None:
        self._qm._store.delete_channel(name)
        self._qm._catalogue.channels.pop(name, None)
        self._qm._notify_definition("CHANNEL", name)

    def cluster_report(self, what: str, pattern: str) -> list[list[str]]:
        report = getattr(self._qm.remote_directory, "display", None)
        if report is not None:
            rows: list[list[str]] = report(what, pattern)
            return rows
        # not running in a network (e.g. `mqgw mqsc`): show the stored repository
        from gateway.mq.embedded.cluster import Repository, display_rows

        q = self._qm._queues.get(CLUSTER_REPOSITORY_QUEUE)
        stored = max(q.available.values(), key=lambda m: m.seq, default=None) if q else None
        if stored is None:
            return []
        try:
            repository = Repository.from_json(json.loads(stored.body))
        except (ValueError, TypeError, KeyError):
            log.warning("%s: the stored cluster repository cannot be read", self._qm.name)
            return []
        return display_rows(repository, what, pattern, self._qm.name)


@dataclass(slots=True, frozen=True)
class Delivery:
    """Where :meth:`EmbeddedConnection.deliver_transmission` put a message."""

    q_name: str
    q_mgr_name: str
    dead_lettered: bool = False
    discarded: bool = False
    reason: int = 0


@dataclass(slots=True)
class _UowPut:
    queue: LocalQueue
    msg: QueuedMessage


@dataclass(slots=True)
class _UowGet:
    queue: LocalQueue
    msg: QueuedMessage


class EmbeddedConnection:
    """A connection (hconn) with its own unit of work."""

    def __init__(self, qm: EmbeddedQueueManager) -> None:
        self._qm = qm
        self._puts: list[_UowPut] = []
        self._gets: list[_UowGet] = []
        self._handles: set[EmbeddedQueueHandle] = set()
        self._open = True

    @property
    def q_mgr_name(self) -> str:
        return self._qm.name

    @property
    def queue_manager(self) -> EmbeddedQueueManager:
        return self._qm

    @property
    def uncommitted(self) -> int:
        return len(self._puts) + len(self._gets)

    def _check(self) -> None:
        if self._qm.stopping:
            raise MQError(Reason.Q_MGR_STOPPING, f"queue manager {self._qm.name} is stopping")
        if not self._open:
            raise MQError(Reason.HCONN_ERROR, "the connection has been disconnected")

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
        self, q_name: str, options: OpenOption, q_mgr_name: str = "",
        *, cluster_lookup: bool = True,
    ) -> EmbeddedQueueHandle:
        """MQOPEN: resolve the name now (MQ binds at open) and check the options.

        A cluster queue opened bind-not-fixed (MQOO_BIND_NOT_FIXED, or BIND_AS_Q_DEF with
        DEFBIND(NOTFIXED)) chooses its instance again at every put.
        """
        self._check()
        qm = self._qm
        options = OpenOption(options)
        inputs = options & _INPUT
        if bin(int(inputs)).count("1") > 1:
            raise MQError(Reason.OPTIONS_ERROR, "choose one of INPUT_AS_Q_DEF/SHARED/EXCLUSIVE")
        wants = options & (_INPUT | OpenOption.BROWSE | OpenOption.OUTPUT | OpenOption.INQUIRE)
        if not wants:
            raise MQError(
                Reason.OPTIONS_ERROR, "open for at least one of input, browse, output, inquire"
            )
        local_name = not q_mgr_name or q_mgr_name == qm.name
        definition = qm.catalogue.get(q_name) if local_name else None
        resolution: Resolution | None = None
        reads = bool(inputs or options & OpenOption.BROWSE)
        if options & OpenOption.OUTPUT or reads:
            resolution = await qm.resolve_learning(
                q_name, q_mgr_name, bool(options & OpenOption.BIND_ON_OPEN), cluster_lookup
            )
        elif definition is None:
            raise MQError(
                Reason.UNKNOWN_OBJECT_NAME, f"queue {q_name} is not defined on {qm.name}"
            )
        if reads and resolution is not None and not resolution.is_local:
            raise MQError(
                Reason.OPTION_NOT_VALID_FOR_TYPE,
                f"{q_name} resolves to a remote queue ({resolution.q_name}@"
                f"{resolution.q_mgr_name}); it can only be opened for output or inquire",
            )
        target: LocalQueue | None = None
        if resolution is not None:
            target = qm._local_queue(
                resolution.q_name if resolution.is_local else resolution.xmit_q_name
            )
        if inputs and target is not None:
            exclusive = bool(inputs & OpenOption.INPUT_EXCLUSIVE)
            if target.exclusive or (exclusive and target.input_count):
                raise MQError(
                    Reason.OBJECT_IN_USE, f"queue {target.name} is open for exclusive input"
                )
            target.exclusive = exclusive
            target.input_count += 1
        if options & OpenOption.OUTPUT and target is not None:
            target.output_count += 1
        handle = EmbeddedQueueHandle(self, q_name, options, definition, resolution, target)
        if resolution is not None and resolution.via_cluster:
            if options & OpenOption.BIND_ON_OPEN:
                not_fixed = False
            elif options & OpenOption.BIND_NOT_FIXED:
                not_fixed = True
            elif definition is not None and definition.qtype is not QType.LOCAL:
                not_fixed = definition.default_bind is DefBind.NOTFIXED
            else:
                not_fixed = resolution.bind_not_fixed
            handle._not_fixed = not_fixed
            handle._q_mgr_name = q_mgr_name
        self._handles.add(handle)
        return handle

    async def put1(
        self,
        q_name: str,
        md: MQMD,
        body: bytes,
        options: PutOptions | None = None,
        q_mgr_name: str = "",
    ) -> MQMD:
        handle = await self.open(q_name, OpenOption.OUTPUT, q_mgr_name)
        try:
            return await handle.put(md, body, options)
        finally:
            await handle.close()

    async def commit(self, sync: ChannelSync | None = None) -> None:
        """MQCMIT. Persistent changes are on disk when this returns.

        ``sync`` (channels only): a channel's batch record committed in the same
        transaction as the unit of work, which is what makes channel delivery once-only.
        """
        self._check()
        if not self._puts and not self._gets and sync is None:
            return
        puts, gets = self._puts, self._gets
        self._puts, self._gets = [], []
        await self._qm._complete(self._finish_commit(puts, gets, sync))

    async def _finish_commit(
        self, puts: list[_UowPut], gets: list[_UowGet], sync: ChannelSync | None = None
    ) -> None:
        qm = self._qm
        # a queue deleted meanwhile takes nothing: its row would outlive the queue and
        # surface in a later queue of the same name after a restart
        inserts = [qm._to_row(p.queue.name, p.msg) for p in puts
                   if p.msg.persistent and p.queue is qm._queues.get(p.queue.name)]
        deletes = [g.msg.seq for g in gets if g.msg.persistent]
        deletes += qm._expired_persistent
        qm._expired_persistent = []
        syncs = [sync] if sync is not None else []
        if inserts or deletes or syncs:
            try:
                await qm._apply(inserts, deletes, syncs=syncs)
            except MQError as exc:
                self._undo(puts, gets)
                raise MQError(Reason.BACKED_OUT, f"commit failed, backed out: {exc}") from exc
        if sync is not None:
            qm._channel_sync[sync.channel] = sync
        for g in gets:
            g.queue.locked -= 1
        for p in puts:
            p.queue.pending_puts -= 1
            if p.queue is qm._queues.get(p.queue.name):
                p.queue.add(p.msg)
                p.queue.notify(p.msg)
        qm.stats.commits += 1

    async def backout(self) -> None:
        """MQBACK: syncpoint puts vanish; syncpoint gets return with BackoutCount + 1."""
        self._check()
        if not self._puts and not self._gets:
            return
        puts, gets = self._puts, self._gets
        self._puts, self._gets = [], []
        await self._qm._complete(self._finish_backout(puts, gets))

    async def _finish_backout(self, puts: list[_UowPut], gets: list[_UowGet]) -> None:
        qm = self._qm
        counts = [(g.msg.seq, g.msg.md.backout_count + 1) for g in gets if g.msg.persistent]
        if counts and not qm.closed:
            try:
                await qm._apply(backouts=counts)
            except MQError:
                log.exception("could not harden backout counts; messages are returned anyway")
        self._undo(puts, gets, count_backout=True)
        qm.stats.backouts += 1

    def _undo(self, puts: list[_UowPut], gets: list[_UowGet], count_backout: bool = False) -> None:
        for p in puts:
            p.queue.pending_puts -= 1
        for g in gets:
            g.queue.locked -= 1
            if count_backout:
                g.msg.md.backout_count += 1
            if g.queue is self._qm._queues.get(g.queue.name):
                g.queue.add(g.msg)
                g.queue.notify(g.msg)

    async def disconnect(self) -> None:
        """MQDISC: backs out an open unit of work and closes the handles."""
        if not self._open:
            return
        if self._puts or self._gets:
            puts, gets = self._puts, self._gets
            self._puts, self._gets = [], []
            await self._qm._complete(self._finish_backout(puts, gets))
        for h in list(self._handles):
            await h.close()
        self._open = False
        self._qm._connections.discard(self)

    # ------------------------------------------------------------ channels and DLQ

    async def put_dead_letter(
        self,
        md: MQMD,
        body: bytes,
        reason: int,
        dest_q_name: str,
        dest_q_mgr_name: str = "",
        *,
        syncpoint: bool = False,
    ) -> MQMD:
        """Put a message on this queue manager's dead-letter queue behind an MQDLH.

        What MQ's MCAs and the broker do with a message they cannot deliver (reference
        §6.3); the context of the original message is kept. Fails with 2085 when the
        queue manager has no DEADQ (the caller must then keep the message).
        """
        qm = self._qm
        dlq = qm.catalogue.qmgr.dead_letter_q_name
        if not dlq or qm.catalogue.get(dlq) is None:
            raise MQError(
                Reason.UNKNOWN_OBJECT_NAME,
                f"queue manager {qm.name} has no dead-letter queue (DEADQ {dlq or 'blank'})",
            )
        dl_md, dl_body = wrap_for_dlq(
            md, body, reason, dest_q_name, dest_q_mgr_name or qm.name, qm._context.appl_name,
            qmgr_ccsid=qm.catalogue.qmgr.coded_char_set_id,
        )
        handle = await self.open(dlq, OpenOption.OUTPUT | OpenOption.SET_ALL_CONTEXT)
        try:
            out = await handle.put(dl_md, dl_body, PutOptions(syncpoint=syncpoint,
                                                              set_all_context=True))
        finally:
            await handle.close()
        qm.stats.dead_lettered += 1
        return out

    async def deliver_transmission(
        self, md: MQMD, body: bytes, *, syncpoint: bool = False
    ) -> Delivery:
        """Deliver a transmission-queue message arriving here, as a receiving MCA does.

        The MQXQH names are resolved as an application supplying both names would
        (reference §7.3): a local queue receives the message, another queue manager's
        transmission queue forwards it (multi-hop), and a failure (unknown queue 2085,
        no route 2087, queue full 2053, put inhibited 2051, too big 2030, ...) puts it
        on the dead-letter queue with an MQDLH carrying that reason, unless the message
        asks for MQRO_DISCARD_MSG.
        """
        try:
            xmit = unwrap_from_xmitq(md, body)
        except WireError as exc:
            await self.put_dead_letter(md, body, exc.reason, "", "", syncpoint=syncpoint)
            return Delivery("", "", dead_lettered=True, reason=exc.reason)
        opts = PutOptions(syncpoint=syncpoint, set_all_context=True)
        try:
            handle = await self.open(
                xmit.remote_q_name, OpenOption.OUTPUT | OpenOption.SET_ALL_CONTEXT,
                xmit.remote_q_mgr_name,
                cluster_lookup=xmit.remote_q_mgr_name != self._qm.name,
            )
            try:
                await handle.put(xmit.md, xmit.body, opts)
                return Delivery(handle.resolved_q_name, handle.resolved_q_mgr_name)
            finally:
                await handle.close()
        except MQError as exc:
            if exc.reason in (Reason.CONNECTION_BROKEN, Reason.HCONN_ERROR,
                              Reason.Q_MGR_STOPPING, Reason.RESOURCE_PROBLEM):
                raise
            if xmit.md.report & _MQRO_DISCARD_MSG:
                return Delivery(xmit.remote_q_name, xmit.remote_q_mgr_name,
                                discarded=True, reason=exc.reason)
            await self.put_dead_letter(
                xmit.md, xmit.body, exc.reason, xmit.remote_q_name, xmit.remote_q_mgr_name,
                syncpoint=syncpoint,
            )
            return Delivery(xmit.remote_q_name, xmit.remote_q_mgr_name,
                            dead_lettered=True, reason=exc.reason)

    # ------------------------------------------------------------ used by handles

    def _track_put(self, q: LocalQueue, msg: QueuedMessage) -> None:
        if self.uncommitted >= MAX_UNCOMMITTED_MSGS:
            raise MQError(
                Reason.SYNCPOINT_LIMIT_REACHED,
                f"more than {MAX_UNCOMMITTED_MSGS} messages in one unit of work",
            )
        self._puts.append(_UowPut(q, msg))

    def _track_get(self, q: LocalQueue, msg: QueuedMessage) -> None:
        self._gets.append(_UowGet(q, msg))


class EmbeddedQueueHandle:
    """An open queue (hobj)."""

    def __init__(
        self,
        conn: EmbeddedConnection,
        name: str,
        options: OpenOption,
        definition: QueueDef | None,
        resolution: Resolution | None,
        target: LocalQueue | None,
    ) -> None:
        self._conn = conn
        self._name = name
        self._options = options
        self._definition = definition
        self._resolution = resolution
        self._target = target
        self._browse_cursor: tuple[int, int] | None = None
        self._open = True
        self._not_fixed = False
        self._q_mgr_name = ""

    @property
    def name(self) -> str:
        return self._name

    @property
    def options(self) -> OpenOption:
        return self._options

    @property
    def resolved_q_name(self) -> str:
        if self._resolution is None:
            return self._name
        return self._resolution.q_name

    @property
    def resolved_q_mgr_name(self) -> str:
        if self._resolution is None:
            return self._conn.q_mgr_name
        return self._resolution.q_mgr_name

    @property
    def resolution(self) -> Resolution | None:
        return self._resolution

    def _check(self) -> None:
        self._conn._check()
        if not self._open:
            raise MQError(Reason.HOBJ_ERROR, f"queue handle for {self._name} is closed")

    def _defs(self) -> list[QueueDef]:
        """The definitions whose GET/PUT/DEFPSIST/DEFPRTY apply: opened object, then target."""
        cat = self._conn.queue_manager.catalogue
        out: list[QueueDef] = []
        opened = cat.get(self._name) if self._definition is not None else None
        if opened is not None:
            out.append(opened)
        if self._target is not None:
            base = cat.get(self._target.name)
            if base is not None and (opened is None or base.name != opened.name):
                out.append(base)
        return out

    # ------------------------------------------------------------------ get

    async def get(self, options: GetOptions | None = None) -> Message:
        """MQGET (see :class:`GetOptions`)."""
        opts = options or GetOptions()
        self._check()
        qm = self._conn.queue_manager
        if opts.browse is not None:
            if not self._options & OpenOption.BROWSE:
                raise MQError(Reason.NOT_OPEN_FOR_BROWSE, f"{self._name} is not open for browse")
            if opts.syncpoint:
                raise MQError(Reason.OPTIONS_ERROR, "browse cannot be under syncpoint")
        elif not self._options & _INPUT:
            raise MQError(Reason.NOT_OPEN_FOR_INPUT, f"{self._name} is not open for input")
        if opts.wait_ms < WAIT_UNLIMITED:
            raise MQError(Reason.GMO_ERROR, f"wait interval {opts.wait_ms} is not valid")
        deadline = (
            None if opts.wait_ms == WAIT_UNLIMITED else time.monotonic() + opts.wait_ms / 1000
        )
        loop = asyncio.get_running_loop()
        while True:
            self._check()
            q = self._target
            if q is None or qm._queues.get(q.name) is not q:
                raise MQError(Reason.Q_DELETED, f"queue {self._name} has been deleted")
            for d in self._defs():
                if not d.get_enabled:
                    raise MQError(Reason.GET_INHIBITED, f"gets are inhibited on {d.name}")
            now = time.time()
            after = None
            if opts.browse is Browse.NEXT:
                after = self._browse_cursor
            msg = q.first(now, qm._on_expired, opts.match_msg_id, opts.match_correl_id, after)
            if msg is not None:
                return await self._take(q, msg, opts, now)
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                if qm._expired_persistent and not self._conn._puts and not self._conn._gets:
                    await qm._complete(qm._flush_expired())
                raise MQError(Reason.NO_MSG_AVAILABLE, f"no message available on {self._name}")
            fut: asyncio.Future[None] = loop.create_future()
            waiter = Waiter(fut, opts.match_msg_id, opts.match_correl_id, opts.browse is not None)
            q.waiters.append(waiter)
            woken = False
            try:
                async with asyncio.timeout(remaining):
                    await fut
                woken = True
            except TimeoutError:
                pass
            finally:
                if not woken:
                    if fut.done() and not fut.cancelled():
                        # woken for a message but leaving (timeout/cancel): pass it on
                        q.wake()
                    else:
                        fut.cancel()
                        if waiter in q.waiters:
                            q.waiters.remove(waiter)

    async def _take(
        self, q: LocalQueue, msg: QueuedMessage, opts: GetOptions, now: float
    ) -> Message:
        qm = self._conn.queue_manager
        body = msg.body
        if opts.max_length is not None and len(body) > opts.max_length:
            if not opts.accept_truncated:
                raise MQError(
                    Reason.TRUNCATED_MSG_FAILED,
                    f"message is {len(body)} bytes, buffer {opts.max_length}",
                    CompCode.WARNING,
                )
            body = body[: opts.max_length]
        md = clone_md(msg.md)
        if msg.expiry_at is not None:
            md.expiry = max(1, int((msg.expiry_at - now) * 10))
        if opts.browse is not None:
            self._browse_cursor = msg.key
            return Message(md, body)
        q.remove(msg)
        qm.stats.gets += 1
        if opts.syncpoint:
            q.locked += 1
            self._conn._track_get(q, msg)
            return Message(md, body)
        if msg.persistent:
            # an internal unit of work: the message stays locked until its delete is on
            # disk; a caller cancelled meanwhile never receives it, so it is put back
            q.locked += 1
            delete = asyncio.ensure_future(qm._apply(deletes=[msg.seq]))
            try:
                await asyncio.shield(delete)
            except asyncio.CancelledError:
                qm._background(qm._give_back(q, msg, delete))
                raise
            except MQError:
                q.locked -= 1
                if q is qm._queues.get(q.name):
                    q.add(msg)
                    q.notify(msg)
                raise
            q.locked -= 1
        return Message(md, body)

    # ------------------------------------------------------------------ put

    async def put(self, md: MQMD, body: bytes, options: PutOptions | None = None) -> MQMD:
        """MQPUT: returns the descriptor as completed by the queue manager."""
        opts = options or PutOptions()
        self._check()
        if not self._options & OpenOption.OUTPUT:
            raise MQError(Reason.NOT_OPEN_FOR_OUTPUT, f"{self._name} is not open for output")
        qm = self._conn.queue_manager
        res = self._resolution
        q = self._target
        if res is None or q is None or qm._queues.get(q.name) is not q:
            raise MQError(Reason.Q_DELETED, f"queue {self._name} has been deleted")
        if self._not_fixed:
            res = qm.resolve(self._name, self._q_mgr_name, False)
            if res.is_local or res.xmit_q_name != q.name:
                raise MQError(
                    Reason.CLUSTER_RESOLUTION_ERROR,
                    f"{self._name} no longer resolves through {q.name}; reopen it",
                )
        defs = self._defs()
        for d in defs:
            if not d.put_enabled:
                raise MQError(Reason.PUT_INHIBITED, f"puts are inhibited on {d.name}")
        out = clone_md(md)
        now = time.time()
        first = defs[0] if defs else None
        if out.persistence == Persistence.PERSISTENCE_AS_Q_DEF:
            out.persistence = Persistence.PERSISTENT if first and first.default_persistent \
                else Persistence.NOT_PERSISTENT
        elif out.persistence not in (Persistence.PERSISTENT, Persistence.NOT_PERSISTENT):
            raise MQError(Reason.PERSISTENCE_ERROR, f"Persistence {out.persistence} is not valid")
        if out.priority == -1:
            out.priority = first.default_priority if first else 0
        elif out.priority < 0:
            raise MQError(Reason.PRIORITY_ERROR, f"Priority {out.priority} is not valid")
        if out.expiry == 0 or out.expiry < -1:
            raise MQError(Reason.EXPIRY_ERROR, f"Expiry {out.expiry} is not valid")
        if out.msg_type == MsgType.REQUEST and not out.reply_to_q:
            raise MQError(Reason.MISSING_REPLY_TO_Q, "a request message needs a ReplyToQ")
        if opts.new_msg_id or out.msg_id == MI_NONE:
            out.msg_id = qm._msg_ids()
        if opts.new_correl_id:
            out.correl_id = qm._msg_ids()
        out.reply_to_q, out.reply_to_q_mgr = resolve_reply_to(
            qm.catalogue, out.reply_to_q, out.reply_to_q_mgr
        )
        qm._context.fill(out, now, set_all=opts.set_all_context,
                         set_identity=opts.set_identity_context)
        if len(body) > qm.catalogue.qmgr.max_msg_length:
            raise MQError(
                Reason.MSG_TOO_BIG_FOR_Q_MGR,
                f"message of {len(body)} bytes exceeds the queue manager's MAXMSGL "
                f"{qm.catalogue.qmgr.max_msg_length}",
            )
        stored_md, stored_body = out, body
        if not res.is_local:
            # bind-not-fixed: the header leaves the queue manager blank so the receiving
            # member may choose again (a bridge forwards, Fig. 2-48)
            header_q_mgr = "" if self._not_fixed and res.via_cluster else res.q_mgr_name
            try:
                stored_md, stored_body = wrap_for_xmitq(
                    out, body, res.q_name, header_q_mgr,
                    qmgr_ccsid=qm.catalogue.qmgr.coded_char_set_id, msg_id=qm._msg_ids(),
                )
            except WireError as exc:
                raise MQError(exc.reason, f"cannot build the transmission header: {exc}") from exc
            if res.xmit_q_name == CLUSTER_TRANSMIT_QUEUE:
                hop = res.hop or res.q_mgr_name
                lane = _lane_for(res.q_name)
                stored_md.correl_id = cluster_correl_id(hop, lane)
                waiting = getattr(qm.remote_directory, "message_waiting", None)
                if waiting is not None:
                    waiting(hop, lane)
        else:
            stored_md = clone_md(out)
        qdef = qm.catalogue.get(q.name)
        assert qdef is not None
        if len(stored_body) > qdef.max_msg_length:
            raise MQError(
                Reason.MSG_TOO_BIG_FOR_Q,
                f"message of {len(stored_body)} bytes exceeds MAXMSGL {qdef.max_msg_length} "
                f"of {q.name}",
            )
        if q.depth >= qdef.max_depth:
            raise MQError(Reason.Q_FULL, f"queue {q.name} is full (MAXDEPTH {qdef.max_depth})")
        priority = min(max(stored_md.priority, 0), 9)
        expiry_at = now + out.expiry / 10 if out.expiry > 0 else None
        persistent = stored_md.persistence == Persistence.PERSISTENT
        stored_md.backout_count = 0
        msg = QueuedMessage(qm._next_seq(), stored_md, bytes(stored_body), priority,
                            persistent, now, expiry_at)
        if persistent:
            # pack now so a descriptor the store cannot hold fails this put (2026), not commit
            msg.packed_md = _pack_for_store(stored_md)
        qm.stats.puts += 1
        if opts.syncpoint:
            self._conn._track_put(q, msg)
            q.pending_puts += 1
            return out
        if persistent:
            # shielded as one step: once the row is on disk the message is also in
            # memory, even if the caller is cancelled meanwhile
            q.pending_puts += 1
            await qm._complete(qm._store_put(q, msg))
        else:
            q.add(msg)
            q.notify(msg)
        return out

    # ------------------------------------------------------------------ inquire

    async def inquire(self, *selectors: QueueAttr) -> dict[QueueAttr, int | str]:
        """MQINQ. Also answers Q_MGR_NAME and DEAD_LETTER_Q_NAME (the queue manager's)."""
        self._check()
        if not self._options & OpenOption.INQUIRE:
            raise MQError(Reason.NOT_OPEN_FOR_INQUIRE, f"{self._name} is not open for inquire")
        qm = self._conn.queue_manager
        cat = qm.catalogue
        d = cat.get(self._name) if self._definition is not None else None
        if d is None and self._target is not None:
            d = cat.get(self._target.name)
        if d is None:
            raise MQError(Reason.Q_DELETED, f"queue {self._name} has been deleted")
        local = qm._queues.get(d.name) if d.qtype is QType.LOCAL else None
        out: dict[QueueAttr, int | str] = {}
        for sel in selectors:
            out[sel] = _inquire_one(sel, d, local, cat)
        return out

    async def close(self) -> None:
        """MQCLOSE."""
        if not self._open:
            return
        self._open = False
        self._conn._handles.discard(self)
        q = self._target
        if q is not None:
            if self._options & _INPUT:
                q.input_count -= 1
                if self._options & OpenOption.INPUT_EXCLUSIVE:
                    q.exclusive = False
            if self._options & OpenOption.OUTPUT:
                q.output_count -= 1


def _lane_for(q_name: str) -> str:
    """Repository traffic travels on its own cluster-sender lane, so a partial repository
    learning names while it receives a batch is never queued behind that batch."""
    return "CMD" if q_name == CLUSTER_COMMAND_QUEUE else ""


def _pack_for_store(md: MQMD) -> bytes:
    try:
        return md.copy(version=2).pack(546) if md.version < 2 else md.pack(546)
    except WireError as exc:
        raise MQError(Reason.MD_ERROR, f"the message descriptor cannot be stored: {exc}") from exc


def _inquire_one(
    sel: QueueAttr, d: QueueDef, local: LocalQueue | None, cat: ObjectCatalogue
) -> int | str:
    qa = QueueAttr
    common: dict[QueueAttr, int | str] = {
        qa.Q_TYPE: int(d.qtype),
        qa.Q_NAME: d.name,
        qa.Q_MGR_NAME: cat.q_mgr_name,
        qa.DEAD_LETTER_Q_NAME: cat.qmgr.dead_letter_q_name,
        qa.DEF_PERSISTENCE: 1 if d.default_persistent else 0,
        qa.DEF_PRIORITY: d.default_priority,
        qa.INHIBIT_PUT: _MQQA_PUT_ALLOWED if d.put_enabled else _MQQA_PUT_INHIBITED,
    }
    if d.qtype is not QType.REMOTE:
        common[qa.INHIBIT_GET] = _MQQA_GET_ALLOWED if d.get_enabled else _MQQA_GET_INHIBITED
    if d.qtype is QType.ALIAS:
        common[qa.BASE_Q_NAME] = d.target
    if d.qtype is QType.REMOTE:
        common[qa.REMOTE_Q_NAME] = d.remote_name
        common[qa.REMOTE_Q_MGR_NAME] = d.remote_q_mgr_name
        common[qa.XMIT_Q_NAME] = d.xmit_q_name
    if local is not None:
        common[qa.CURRENT_Q_DEPTH] = local.depth
        common[qa.MAX_Q_DEPTH] = d.max_depth
        common[qa.MAX_MSG_LENGTH] = d.max_msg_length
        common[qa.USAGE] = int(d.usage)
        common[qa.OPEN_INPUT_COUNT] = local.input_count
        common[qa.OPEN_OUTPUT_COUNT] = local.output_count
        common[qa.BACKOUT_THRESHOLD] = d.backout_threshold
        common[qa.BACKOUT_REQ_Q_NAME] = d.backout_queue
    if sel not in common:
        raise MQError(
            Reason.SELECTOR_NOT_FOR_TYPE, f"{sel.name} does not apply to a {d.qtype.mqsc}"
        )
    return common[sel]
