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
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Self, TypeVar

from gateway.mq.embedded.connection import EmbeddedConnection
from gateway.mq.embedded.context import MsgIdGenerator, PutContext
from gateway.mq.embedded.definitions import QueueManagerDefinitions
from gateway.mq.embedded.mqsc_run import MQSCResult, check_script, run_script
from gateway.mq.embedded.name_resolution import (
    RemoteDirectory,
    Resolution,
    ResolutionError,
    resolve_queue,
)
from gateway.mq.embedded.objects import (
    ObjectCatalogue,
    QType,
    default_queues,
    new_catalogue,
)
from gateway.mq.embedded.queues import LocalQueue, QueuedMessage, pack_md_for_store
from gateway.mq.embedded.reports import queue_reports
from gateway.mq.embedded.space import SpacePolicy
from gateway.mq.embedded.store import ChannelSync, MessageStore, StoredMessage, StoreError
from gateway.mq.port import (
    MQError,
)
from gateway.wire.constants import Feedback
from gateway.wire.mqmd import MQMD
from gateway.wire.reasons import Reason

log = logging.getLogger(__name__)

T = TypeVar("T")

#: One request to the writer thread: rows to insert, sequences to delete, backout
#: counts to harden, channel syncs, and the future its requester waits on.
_WriteRequest = tuple[
    list[StoredMessage], list[int], list[tuple[int, int]], list[ChannelSync], asyncio.Future[None]
]

#: Resolution failures a cluster repository may cure by learning the names.
_LEARNABLE = frozenset({Reason.UNKNOWN_OBJECT_NAME, Reason.UNKNOWN_ALIAS_BASE_Q,
                        Reason.UNKNOWN_REMOTE_Q_MGR})


class EmbeddedQueueManager:
    """One embedded queue manager, stored under ``path``.

    ``mqsc_file``: a script run once the queue manager is open (every start; use
    ``REPLACE`` to make it idempotent); an error stops the start naming its line.
    ``directory``: issue 8's view of other queue managers and clusters (optional).
    ``space``: the data directory's free-space watermark and reserve (:mod:`.space`).
    """

    def __init__(
        self,
        name: str,
        path: Path | str,
        *,
        mqsc_file: Path | str | None = None,
        directory: RemoteDirectory | None = None,
        appl_name: str | None = None,
        space: SpacePolicy | None = None,
    ) -> None:
        if not name or len(name) > 48:
            raise MQError(Reason.Q_MGR_NAME_ERROR, f"queue manager name {name!r} is not valid")
        self._name = name
        self.path = Path(path)
        self.remote_directory = directory
        try:
            self._store = MessageStore(self.path, space)
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
        #: the watermark's state (``low``: persistent puts refused, :mod:`.space`)
        self.space = self._store.space
        self._msg_ids = MsgIdGenerator(name)
        self._context = PutContext(appl_name=appl_name)
        self._connections: set[EmbeddedConnection] = set()
        self._closed = False
        self._stopping = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._expired_persistent: list[int] = []
        self._write_queue: list[_WriteRequest] = []
        #: DISPLAY CHSTATUS/SUB/PUBSUB providers (pattern -> rows of ``KEY(value)``)
        #: registered by the process that runs channels or the broker.
        self.status_reports: dict[str, Callable[[str], list[list[str]]]] = {}
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

    @property
    def definitions(self) -> QueueManagerDefinitions:
        """Where MQSC changes this queue manager's objects (also a seam for tests)."""
        return QueueManagerDefinitions(self)

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
        return run_script(self.definitions, script, stop_on_error=stop_on_error)

    def check_mqsc(self, script: str) -> None:
        """Raise MQSCError (naming the line) if ``script`` would fail against the current
        definitions and queues (a DELETE of a queue holding messages fails here too);
        changes nothing."""
        check_script(self._catalogue, script, self.definitions)

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

    def refuse_for_space(self, q_name: str, conn: EmbeddedConnection) -> None:
        """Called for a persistent put of ``conn`` while ``space.low``: MQError 2056
        unless space is back or the put is a move to the dead-letter queue (its unit of
        work got messages) (:mod:`.space`); ``conn.space_refused`` records a refusal."""
        if not self.space.recheck():
            return
        if conn._gets and q_name == self._catalogue.qmgr.dead_letter_q_name:
            return
        self.stats.space_refusals += 1
        conn.space_refused = True
        raise MQError(
            Reason.Q_SPACE_NOT_AVAILABLE,
            f"no space for {q_name} in {self.path}: the disk is full to its watermark "
            f"({self.space.room / 2**20:.1f} MB of room, min_free_mb "
            f"{self.space.policy.min_free_bytes / 2**20:.0f})",
        )

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

    @property
    def appl_name(self) -> str:
        """PutApplName of what the queue manager puts itself (reports, dead letters)."""
        return self._context.appl_name

    def _on_expired(self, msg: QueuedMessage) -> None:
        self.stats.expired += 1
        queue_reports(self, [(msg.md, msg.body, Feedback.EXPIRATION)])
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
        await self._apply_started(inserts, deletes, backouts, syncs)

    def _apply_started(
        self,
        inserts: list[StoredMessage] | None = None,
        deletes: list[int] | None = None,
        backouts: list[tuple[int, int]] | None = None,
        syncs: list[ChannelSync] | None = None,
        *,
        at_once: bool = False,
    ) -> asyncio.Future[None]:
        """:meth:`_apply` without waiting: a future of the changes being on disk.

        ``at_once``: an idle writer thread gets them now, alone, not at the event loop's
        next turn with whatever else is queued by then (a commit begun with
        ``start_commit`` is written while the loop works on). Otherwise the requests of
        one loop turn share a transaction (group commit)."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()
        self._write_queue.append((inserts or [], deletes or [], backouts or [], syncs or [], fut))
        if self._writer_task is None or self._writer_task.done():
            first: tuple[list[_WriteRequest], asyncio.Future[None]] | None = None
            if at_once:
                batch, self._write_queue = self._write_queue, []
                first = (batch, self._submit_write(loop, batch))
            self._writer_task = asyncio.ensure_future(self._drain_writes(first))
        return fut

    def _submit_write(
        self, loop: asyncio.AbstractEventLoop, batch: list[_WriteRequest]
    ) -> asyncio.Future[None]:
        """Hand ``batch``'s changes to the writer thread as one store transaction."""
        ins = [m for b in batch for m in b[0]]
        dels = [s for b in batch for s in b[1]]
        bos = [c for b in batch for c in b[2]]
        sys_ = [c for b in batch for c in b[3]]
        self.stats.store_transactions += 1
        try:
            return loop.run_in_executor(
                self._writer, functools.partial(self._store.apply, ins, dels, bos, sys_)
            )
        except Exception as exc:  # the writer is shut down: failed like a failed write
            failed: asyncio.Future[None] = loop.create_future()
            failed.set_exception(exc)
            return failed

    async def _drain_writes(
        self, first: tuple[list[_WriteRequest], asyncio.Future[None]] | None = None
    ) -> None:
        """Write the queued requests, a transaction per round, until none is left;
        ``first``: a round already handed to the writer thread."""
        loop = asyncio.get_running_loop()
        while first is not None or self._write_queue:
            if first is None:
                batch, self._write_queue = self._write_queue, []
                written = self._submit_write(loop, batch)
            else:
                (batch, written), first = first, None
            try:
                await self._write_done(written)
            except MQError as exc:
                for *_, fut in batch:
                    if not fut.done():
                        fut.set_exception(exc)
            else:
                for *_, fut in batch:
                    if not fut.done():
                        fut.set_result(None)

    @staticmethod
    async def _write_done(written: asyncio.Future[None]) -> None:
        """Wait for a store write handed to the writer thread (MQError 2102 if it failed)."""
        try:
            await written
        except Exception as exc:
            raise MQError(Reason.RESOURCE_PROBLEM, f"store write failed: {exc}") from exc

    def _to_row(self, q_name: str, m: QueuedMessage) -> StoredMessage:
        return StoredMessage(
            m.seq, q_name, m.priority, m.md.msg_id, m.md.correl_id, m.put_at, m.expiry_at,
            m.md.backout_count, m.packed_md or pack_md_for_store(m.md), m.body,
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
    reports: int = 0
    store_transactions: int = 0
    #: persistent puts refused below the free-space watermark (2056)
    space_refusals: int = 0


class QueueManagerUnavailableError(MQError):
    """The queue manager cannot start: data directory locked, damaged or another QM's."""

    def __init__(self, q_mgr_name: str, message: str) -> None:
        self.q_mgr_name = q_mgr_name
        super().__init__(Reason.Q_MGR_NOT_AVAILABLE, message)
