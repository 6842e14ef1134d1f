"""The publish/subscribe service: the main MQ → engine → MQ/sink loop (the I/O around
the sans-I/O engine).

``BrokerService`` services ``SYSTEM.BROKER.CONTROL.QUEUE``, ``SYSTEM.BROKER.DEFAULT.STREAM``
and every configured stream queue through the queue-manager port. Per queue, one task
and one connection (a connection owns one unit of work):

1. get a small batch under syncpoint;
2. a message whose BackoutCount reached the queue's BOTHRESH is moved, as is, to its
   BOQNAME (or to the dead-letter queue behind an MQDLH, reason MQRC_BACKED_OUT) and
   not processed again — never dropped, never blocking the queue;
3. the engine handles each message; its deliveries, responses and dead-letter
   actions are put under the same unit of work (a delivery that cannot be put — unknown
   queue, queue full, put inhibited — goes to the dead-letter queue with that reason,
   so a publication reaches every matching subscriber or the DLQ on its behalf);
4. sink deliveries (the gateway's Kafka/MQTT plugins) are turned into envelopes
   (``gateway.runtime.envelopes``) and put, encoded (``gateway.runtime.backlog_format``),
   onto each sink's backlog queue under the same unit of work — never awaited: one
   ``SinkForwarder`` task per sink (``sink_forwarder.py``) takes them from there, so a
   sink that is down holds only its own backlog. When that forwarder is idle and the
   backlog empty, the batch hands them to the sink directly and skips the backlog put
   only if the sink acknowledged them before the commit (``sink_backlogs.py``; a
   forwarder sending a backlog of at most one batch is waited for, briefly, first);
5. the engine's store mutations are committed, then the MQ unit of work. Where the
   queue manager can begin a commit without waiting for it (the embedded one), the
   next batch is got and handled while it completes, and waits for it before any put
   or sink hand-over of its own (:meth:`BrokerService.process_batch`). Once the MQ
   commit has ended, the neighbours' retained copies the batch stored are settled
   (``PubSubEngine.settle_retained``): until then the same forward coming again is
   delivered, not taken for a replay (docs/neighbours.md).

Anything failing in 1-5 backs the batch out (MQ and engine), so the messages come back
with BackoutCount + 1; a full backlog queue (MQRC 2053) is back-pressure, not poison:
the batch backs out without counting against BOTHRESH and the stream waits. A crash
between the store commit and the MQ commit re-delivers the batch; the store's idempotent
upserts and command journal make that harmless (docs/pubsub.md, "Ordering of commits").
Sinks see at-least-once delivery.

Batches of all queues share the engine, so the engine part of a batch runs under one
lock; waiting for messages does not hold it.

Over 500 lines on purpose: the serving loop, the batch (get, handle, put, commit, and
the backout with its forgive bookkeeping for back-pressure) share the per-queue state
and the engine lock; split, that bookkeeping would have to become a public seam. The put
phase and setting messages aside live in ``dead_letter.py``, the sinks and their
backlog queues in ``sink_backlogs.py``, forwarding to sinks in ``sink_forwarder.py``, the
settings in ``config.py``, the CLI in ``cli.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from pathlib import Path

from gateway.mq.port import (
    Connection,
    GetOptions,
    Message,
    MQError,
    OpenOption,
    QueueAttr,
    QueueHandle,
    QueueManager,
    start_commit,
)
from gateway.plugin_api import Sink
from gateway.pubsub.engine import PubSubEngine
from gateway.pubsub.options import RegOpt
from gateway.pubsub.outcome import Delivery, InboundMessage
from gateway.pubsub.records import RetainedPublication, Subscription
from gateway.pubsub.streams import CONTROL_QUEUE, DEFAULT_STREAM, split_subscription_topic
from gateway.pubsub.topics import Scheme
from gateway.runtime.backlog_seal import BacklogSeal
from gateway.runtime.pubsub_service.config import BrokerConfig
from gateway.runtime.pubsub_service.counters import ServiceCounters
from gateway.runtime.pubsub_service.dead_letter import (
    Put,
    dead_letter,
    dead_letter_queue_of,
    put_all,
)
from gateway.runtime.pubsub_service.errors import (
    CONNECTION_REASONS,
    AsideQueueError,
    BacklogFullError,
    BrokerError,
)
from gateway.runtime.pubsub_service.forgiven_backouts import ForgivenBackouts
from gateway.runtime.pubsub_service.sink_backlogs import HandOver, SinkBacklogs
from gateway.runtime.pubsub_service.sink_forwarder import ForwarderCounters
from gateway.runtime.sink_command_seal import SinkCommandCheck
from gateway.wire.reasons import Reason

__all__ = ["BrokerService", "ServiceCounters"]

log = logging.getLogger(__name__)


@dataclass(slots=True)
class _InputQueue:
    name: str
    implicit_stream_naming: bool
    handle: QueueHandle
    backout_threshold: int
    backout_queue: str
    #: Units of work still to run one message each after a batch failed, so the
    #: message that failed it is found alone and its innocent neighbours do not
    #: collect backouts with it (they would reach BOTHRESH and be moved aside).
    isolate: int = 0
    #: The last batch's MQ commit, still completing while the next batch is got and
    #: handled (``gateway.mq.port.start_commit``); None when there is none.
    committing: _Committing | None = None
    #: The last batch was held back (BacklogFullError) and none has committed since:
    #: its retry hands nothing over to a sink (each retry would send it again).
    held_back: bool = False


class _FrontCommitFailedError(MQError):
    """The begun commit of the batch in front failed (it is backed out): the batch
    behind it is backed out too, through no fault of its messages (its backouts are
    forgiven, as for a full backlog)."""


@dataclass(slots=True)
class _Batch:
    """What a batch leaves for after its commit: its size, the moves and dead-letters
    to count, the direct hand-overs to count as delivered, the neighbours' retained
    copies to settle."""

    count: int
    done: list[Put]
    handovers: list[HandOver]
    ids: list[bytes]
    heard: set[str]
    unsettled: list[RetainedPublication]


@dataclass(slots=True)
class _Committing:
    """A batch whose MQ commit was begun, not yet ended."""

    batch: _Batch
    done: asyncio.Future[None]


class BrokerService:
    """Runs a :class:`PubSubEngine` against a queue manager (see module docstring)."""

    def __init__(
        self,
        qm: QueueManager,
        engine: PubSubEngine,
        config: BrokerConfig | None = None,
        sinks: Mapping[str, Sink] | None = None,
        forgiven: ForgivenBackouts | None = None,
        backlog_seal: BacklogSeal | None = None,
    ) -> None:
        self.qm = qm
        self.engine = engine
        self.config = config or BrokerConfig()
        self.counters = ServiceCounters()
        self._lock = asyncio.Lock()
        #: Backouts caused by a full backlog queue, per MsgId: back-pressure, not held
        #: against the message when checking its BackoutCount against BOTHRESH (durable
        #: when the caller gives a database: restarts keep them).
        self.forgiven = forgiven if forgiven is not None else ForgivenBackouts()
        #: the connection retained deliveries of a new sink subscription are put with
        self._sub_conn: Connection | None = None
        #: sink subscriptions made since this process started: subscribing again within
        #: a run changes nothing (no second replay of the retained publications)
        self._sink_subs: dict[tuple[str, str, Scheme, RegOpt], Subscription] = {}
        #: per stream, whether a sink may subscribe to it here now (None: always); the
        #: runtime sets it for ``sinks: owner`` streams (gateway/runtime/streams/
        #: sink_ownership.py)
        self.sink_gate: Callable[[str], bool] | None = None
        #: the dead-letter queue, once known (asked of the queue manager at start)
        self._dlq = ""
        self._batch_ids: list[bytes] = []
        #: Messages got in the batch being processed (the batch's size if it fails).
        self._batch_got = 0
        #: ReplyToQMgr of the messages of the batch being processed (who we heard from).
        self._batch_heard: set[str] = set()
        #: Called after every committed unit of work with the queue managers its
        #: messages came from: the neighbour links sync their proxy subscriptions then.
        self.after_commit: list[Callable[[Collection[str]], None]] = []
        #: Begin a batch's MQ commit and get the next batch while it completes, where the
        #: queue manager can (:meth:`process_batch`); False: wait for every commit.
        self.overlap_commits = True
        #: batches whose begun commit has not ended yet (one per serviced queue at most)
        self._commits_in_flight = 0
        self._stop = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        #: set while a stop runs; later stops wait for it (see :meth:`stop`)
        self._stopping: asyncio.Event | None = None
        #: ``backlog_seal``: the key of the sinks' backlogs (None: the embedded queue
        #: manager's, kept in its data directory; gateway/runtime/backlog_seal.py)
        self.sink_backlogs = SinkBacklogs(
            qm, self.config, self._stop, self.counters, seal=backlog_seal
        )
        for name, sink in (sinks or {}).items():
            self.register_sink(name, sink)
        # a RegSub/DeregSub naming a sink's backlog queue is taken only sealed with the
        # backlog key, which ``mqgw streams move`` reads beside the embedded queue
        # manager's data; on IBM MQ (its key beside the store) none is taken
        if isinstance(getattr(qm, "path", None), Path):
            engine.sink_command_check = SinkCommandCheck(self.sink_backlogs.seal.key)
        engine.sink_owner_streams = frozenset(
            s.name for s in self.config.streams if s.sinks == "owner")

    # ---------------------------------------------------------------- lifecycle -----

    @property
    def busy(self) -> bool:
        """True while a batch is being handled or committed, or a sink that is up has
        deliveries on its backlog or in hand (health checks, tests, graceful stops)."""
        return self._lock.locked() or self._commits_in_flight > 0 or self.sink_backlogs.busy

    @property
    def running(self) -> bool:
        """True between :meth:`start` and :meth:`stop` (health checks)."""
        return bool(self._tasks)

    @property
    def sinks(self) -> dict[str, Sink]:
        """The registered sinks by name."""
        return self.sink_backlogs.sinks

    @property
    def backlogs(self) -> dict[str, str]:
        """The backlog queue of each registered sink."""
        return self.sink_backlogs.queues

    def register_sink(self, name: str, sink: Sink) -> None:
        """Make ``sink`` receive the deliveries of subscriptions whose destination is it.

        Its backlog queue is defined on the embedded queue manager when missing (on IBM
        MQ the administrator defines it: :meth:`start` checks it exists)."""
        self.sink_backlogs.register(name, sink)
        # a RegSub/DeregSub naming this backlog queue (the gateway's own) is about it
        self.engine.sink_queues[self.sink_backlogs.queues[name]] = name
        if (self._tasks and name not in self.sink_backlogs.forwarders
                and name not in self.sink_backlogs.remote):
            self._tasks.append(self.sink_backlogs.start_forwarder(name, self._dlq))

    def forwarder_counters(self) -> dict[str, ForwarderCounters]:
        """Per sink: its forwarder's figures (metrics)."""
        return self.sink_backlogs.counters()

    async def subscribe_sink(
        self,
        sink: str,
        topic: str,
        *,
        scheme: Scheme = Scheme.TOPIC,
        reg_opts: RegOpt = RegOpt.NONE,
    ) -> Subscription | None:
        """Subscribe a registered sink to ``topic`` (unified form: ``$SYS/STREAM/<s>/...``
        for a named stream), durably; the retained publications it matches are sent to
        the sink before this returns (unless NewPubsOnly/PubOnReqOnly). None when
        :attr:`sink_gate` says no sink subscribes to that stream here now (another node
        owns it: none is made; a move holds it: the stored one, if any, is kept)."""
        if sink not in self.sinks:
            raise BrokerError(f"no sink called {sink!r} is registered")
        if self.sink_gate is not None:
            stream = split_subscription_topic(topic, scheme, "Topic").stream
            if not self.sink_gate(stream):
                return None
        key = (sink, topic, scheme, reg_opts)
        made = self._sink_subs.get(key)
        if made is not None:
            # Already made in this run (a route's planned subscription, then the
            # plugin's own subscribe at start): its retained ones are already queued.
            return made
        async with self._lock:
            try:
                # a key made by this start: what an older version left on the backlogs
                # is sealed before the retained publications are put behind it
                await self.sink_backlogs.seal_what_is_there()
                sub, retained = self.engine.subscribe_sink(
                    sink, topic, scheme=scheme, reg_opts=reg_opts
                )
                conn = None
                if retained:
                    # Through the backlog like every delivery: ordered with the live
                    # ones, and never waiting for the sink (which may not run yet).
                    conn = self._sub_conn = self._sub_conn or await self.qm.connect()
                    puts = [self.sink_backlogs.put_of(sink, d) for d in retained]
                    try:
                        await put_all(conn, puts, self._dlq or self.config.dead_letter_queue)
                    except BacklogFullError:
                        # The backlog is full (its sink has been away a while, and has
                        # had these before): subscribe now, hand the retained over at
                        # the next subscription rather than fail the start.
                        with contextlib.suppress(MQError):
                            await conn.backout()
                        conn = None
                        log.warning(
                            "%d retained publication(s) for sink %s not handed over now: "
                            "its backlog queue is full",
                            len(puts),
                            sink,
                        )
                self.engine.commit()
                if conn is not None:
                    await conn.commit()
                self._sink_subs[key] = sub
                self._committed(())
            except BaseException:
                self.engine.rollback()
                if self._sub_conn is not None:
                    conn, self._sub_conn = self._sub_conn, None
                    with contextlib.suppress(MQError):
                        await conn.backout()
                    with contextlib.suppress(MQError):
                        await conn.disconnect()
                raise
        return sub

    async def unsubscribe_sinks(self, stream: str) -> list[Subscription]:
        """Remove every sink subscription to ``stream`` durably (a ``sinks: owner``
        stream another node owns); those removed."""
        async with self._lock:
            try:
                gone = self.engine.unsubscribe_sinks(stream)
                self.engine.commit()
                self._committed(())
            except BaseException:
                self.engine.rollback()
                raise
        for key in [k for k, v in self._sink_subs.items() if v.stream == stream]:
            del self._sink_subs[key]
        return gone

    async def unsubscribe_sink(
        self, sink: str, topic: str, *, scheme: Scheme = Scheme.TOPIC
    ) -> bool:
        """Remove a sink subscription durably; False when there was none."""
        for key in [k for k in self._sink_subs if k[:3] == (sink, topic, scheme)]:
            del self._sink_subs[key]
        async with self._lock:
            try:
                existed = self.engine.unsubscribe_sink(sink, topic, scheme=scheme)
                self.engine.commit()
                self._committed(())
            except BaseException:
                self.engine.rollback()
                raise
        return existed

    @property
    def serviced_queues(self) -> list[tuple[str, bool]]:
        """(queue, implicit stream naming) of every serviced queue, control queue first."""
        queues = [
            (CONTROL_QUEUE, False),
            (DEFAULT_STREAM, self.config.default_stream_implicit_naming),
        ]
        queues += [
            (s.name, s.implicit_stream_naming)
            for s in self.config.streams
            if s.name not in (CONTROL_QUEUE, DEFAULT_STREAM)
        ]
        return queues

    async def start(self) -> None:
        """Open every serviced queue (failing clearly if one is missing) and start.
        First, if this start made the backlog key, what the sink backlogs hold is
        sealed with it (``first_seal.py``): nothing is put there or forwarded before."""
        if self._tasks:
            return
        self._stop.clear()
        await self.sink_backlogs.seal_what_is_there()
        opened: list[tuple[Connection, _InputQueue]] = []
        try:
            for name, isn in self.serviced_queues:
                conn = await self.qm.connect()
                try:
                    opened.append((conn, await self._open_input(conn, name, isn)))
                except BaseException:
                    await conn.disconnect()
                    raise
            if opened:
                self._dlq, _ = await dead_letter_queue_of(
                    opened[0][1].handle, self.config.dead_letter_queue
                )
            await self.sink_backlogs.check_defined()
        except MQError as exc:
            for conn, _ in opened:
                await conn.disconnect()
            raise BrokerError(f"cannot open serviced queue: {exc}", exc.reason) from exc
        except BaseException:
            for conn, _ in opened:
                await conn.disconnect()
            raise
        for conn, q in opened:
            self._tasks.append(asyncio.create_task(self._serve(conn, q), name=f"broker:{q.name}"))
        for name in self.sinks:
            if name not in self.sink_backlogs.remote:  # a worker process forwards those
                self._tasks.append(self.sink_backlogs.start_forwarder(name, self._dlq))

    def request_stop(self) -> None:
        """Stop taking batches (returns at once): each serve loop and sink forwarder
        ends after the batch in hand. :meth:`stop` must still be awaited: it takes back
        the acknowledged hand-over copies and closes the subscription connection."""
        self._stop.set()

    async def stop(self) -> None:
        """Finish the batches in progress, close queues and connections. A stop called
        while another runs waits for that one (it alone knows when the batches are
        done: the acknowledged hand-over copies are taken off only then)."""
        self._stop.set()
        if self._stopping is not None:
            await self._stopping.wait()
            return
        self._stopping = stopped = asyncio.Event()
        tasks, self._tasks = self._tasks, []
        try:
            await asyncio.gather(*tasks, return_exceptions=True)
            await self.sink_backlogs.take_back_acknowledged()  # after the batches' commits
            await self._write_settles()
        finally:
            self.sink_backlogs.forwarders.clear()
            conn, self._sub_conn = self._sub_conn, None
            try:
                if conn is not None:
                    with contextlib.suppress(MQError):
                        await conn.disconnect()
            finally:
                self._stopping = None
                stopped.set()

    async def _write_settles(self) -> None:
        """At a stop, the neighbours' retained copies settled since the last batch was
        written (no batch comes to carry them); not written, each would cost a
        duplicate at a later replay, never a loss: a failure is only logged."""
        async with self._lock:
            try:
                self.engine.write_settles()
            except Exception:
                log.exception("cannot write the settled retained copies at stop")

    async def run(self) -> None:
        """Start and serve until :meth:`stop` is called (or the task is cancelled)."""
        await self.start()
        try:
            await self._stop.wait()
        finally:
            await self.stop()

    async def __aenter__(self) -> BrokerService:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def _open_input(self, conn: Connection, name: str, isn: bool) -> _InputQueue:
        handle = await conn.open(name, OpenOption.INPUT_SHARED | OpenOption.INQUIRE)
        threshold, boq = 0, ""
        try:
            attrs = await handle.inquire(QueueAttr.BACKOUT_THRESHOLD, QueueAttr.BACKOUT_REQ_Q_NAME)
            threshold = int(attrs.get(QueueAttr.BACKOUT_THRESHOLD, 0))
            boq = str(attrs.get(QueueAttr.BACKOUT_REQ_Q_NAME, "")).strip()
        except MQError as exc:
            log.warning("cannot inquire BOTHRESH/BOQNAME of %s (%s): using defaults", name, exc)
        if threshold <= 0:
            threshold = self.config.default_backout_threshold
        return _InputQueue(name, isn, handle, threshold, boq)

    # ---------------------------------------------------------------- serving -------

    async def _serve(self, conn: Connection, q: _InputQueue) -> None:
        delay = self.config.retry_delay
        dlq, origin = await dead_letter_queue_of(q.handle, self.config.dead_letter_queue)
        log.info("serving %s; dead-letter queue %s (%s)", q.name, dlq, origin)
        try:
            while not self._stop.is_set():
                try:
                    done = await self.process_batch(conn, q, dlq)
                    delay = self.config.retry_delay
                    if not done:
                        # Never rely on the port suspending on an empty get: let the
                        # other tasks run (a port that returns at once would spin).
                        await self._pause(0.01)
                        continue
                except AsideQueueError as exc:
                    self.counters.dead_letter_failures += 1
                    log.error(
                        "batch on %s backed out: cannot put to dead-letter/backout queue %s "
                        "(reason %d): the queue stays blocked until that queue is usable",
                        q.name,
                        exc.queue,
                        exc.reason,
                    )
                    await self._pause(delay)
                    delay = min(10.0, max(delay * 2, 0.05))
                except MQError as exc:
                    if exc.reason in CONNECTION_REASONS:
                        log.error("connection for %s lost (%s): reconnecting", q.name, exc)
                        conn, q = await self._reconnect(conn, q)
                    else:
                        log.warning(
                            "batch on %s backed out (reason %d): %s", q.name, exc.reason, exc
                        )
                    await self._pause(delay)
                    delay = min(10.0, max(delay * 2, 0.05))
                except BacklogFullError as exc:
                    self.counters.backlog_full += 1
                    log.debug("%s", exc)
                    await self._pause(delay)
                    delay = min(2.0, max(delay * 2, 0.05))
                except Exception:
                    log.exception("batch on %s backed out", q.name)
                    await self._pause(delay)
                    delay = min(10.0, max(delay * 2, 0.05))
        finally:
            await self._end_commit_quietly(q)
            with contextlib.suppress(MQError):
                await conn.backout()
            with contextlib.suppress(MQError):
                await q.handle.close()
            with contextlib.suppress(MQError):
                await conn.disconnect()

    async def _pause(self, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stop.wait(), timeout=seconds)

    async def _reconnect(self, conn: Connection, q: _InputQueue) -> tuple[Connection, _InputQueue]:
        with contextlib.suppress(MQError):
            await conn.disconnect()
        while not self._stop.is_set():
            try:
                new = await self.qm.connect()
            except MQError as exc:
                log.error("reconnect for %s failed: %s", q.name, exc)
                await self._pause(self.config.reconnect_delay)
                continue
            try:
                return new, await self._open_input(new, q.name, q.implicit_stream_naming)
            except BaseException as exc:
                with contextlib.suppress(MQError):
                    await new.disconnect()
                if not isinstance(exc, MQError):
                    raise
                log.error("reopening %s after reconnect failed: %s", q.name, exc)
                await self._pause(self.config.reconnect_delay)
                log.error("reconnect for %s failed: %s", q.name, exc)
                await self._pause(self.config.reconnect_delay)
        return conn, q

    async def drop_neighbour_subscriptions(self, q_mgr: str) -> int:
        """Between batches: remove, durably, the proxy subscriptions neighbour ``q_mgr``
        registered here (it was cleared: engine.drop_neighbour_subscriptions). How many."""
        async with self._lock:
            try:
                dropped = self.engine.drop_neighbour_subscriptions(q_mgr)
            except BaseException:
                self.engine.rollback()
                raise
        if dropped:
            self._committed(())
        return dropped

    async def drop_subscriptions_to_own_queues(self) -> int:
        """Between batches: remove the subscriptions whose queue now resolves to one of
        the gateway's own (the queue manager's definitions changed: an alias defined
        after the subscription). How many were removed."""
        async with self._lock:
            try:
                return self.engine.drop_subscriptions_to_own_queues()
            except BaseException:
                self.engine.rollback()
                raise

    async def process_batch(self, conn: Connection, q: _InputQueue, dlq: str) -> int:
        """Get, handle, put and commit one batch; returns the number of messages got.

        Where the queue manager can begin a commit without waiting for it
        (``gateway.mq.port.start_commit``, the embedded queue manager), the batch's MQ
        commit is only begun here and completes while the next batch is got and
        handled; that batch waits for it before anything of its own leaves (puts,
        sends to sinks), and is backed out with it if it failed (docs/performance.md,
        "Commits overlapped with the next batch"). Counters, logs and after-commit hooks
        of a batch follow its commit's end.
        """
        try:
            first = await self._first_message(q)
        except BaseException:
            await self._end_commit_quietly(q)
            raise
        if first is None:
            return 0
        async with self._lock:
            try:
                batch = await self._process(conn, q, dlq, first)
                committing = start_commit(conn) if self.overlap_commits else None
                if committing is None:
                    await conn.commit()
            except BaseException as exc:
                self.engine.rollback()
                self.counters.backouts += 1
                try:
                    if isinstance(exc, BacklogFullError | _FrontCommitFailedError):
                        # no fault of these messages: the backout does not count
                        q.held_back = q.held_back or isinstance(exc, BacklogFullError)
                        self.forgiven.forgive(self._batch_ids)
                    else:
                        q.isolate = max(q.isolate - 1, self._batch_got)
                except Exception:  # the backout below must happen whatever this does
                    log.exception("cannot record the forgiven backouts of %s", q.name)
                try:
                    await self._end_commit_quietly(q)
                finally:
                    with contextlib.suppress(MQError):
                        await conn.backout()
                raise
            finally:
                ids, self._batch_ids = self._batch_ids, []
                heard, self._batch_heard = self._batch_heard, set()
        batch.ids, batch.heard = ids, heard
        if committing is None:
            self._after_commit(q, batch)
        else:
            q.committing = _Committing(batch, committing)
            self._commits_in_flight += 1
        return batch.count

    async def _first_message(self, q: _InputQueue) -> Message | None:
        """The first message of a batch, None when none came within ``wait_ms``. While
        the last batch's commit completes, only a message already there is taken;
        otherwise that commit is ended before waiting."""
        if q.committing is not None:
            first = await self._get_first(q, 0)
            if first is not None:
                return first
            await self._end_commit(q)
        return await self._get_first(q, self.config.wait_ms)

    @staticmethod
    async def _get_first(q: _InputQueue, wait_ms: int) -> Message | None:
        try:
            return await q.handle.get(GetOptions(wait_ms=wait_ms, syncpoint=True))
        except MQError as exc:
            if exc.reason == Reason.NO_MSG_AVAILABLE:
                return None
            raise

    async def _end_commit(self, q: _InputQueue) -> None:
        """Wait for the last batch's begun commit; then its after-commit work. Raises
        the commit's failure (the batch was backed out: counted as a backout)."""
        committing, q.committing = q.committing, None
        if committing is None:
            return
        try:
            await committing.done
        except MQError as exc:
            self.counters.backouts += 1
            q.isolate = max(q.isolate - 1, committing.batch.count)
            raise _FrontCommitFailedError(exc.reason, f"commit of the batch before: {exc}") from exc
        finally:
            self._commits_in_flight -= 1
        self._after_commit(q, committing.batch)

    async def _end_commit_quietly(self, q: _InputQueue) -> None:
        """:meth:`_end_commit` where a failure is already on its way (a batch backing
        out, a stop): the begun commit's own failure is logged, not raised."""
        try:
            await self._end_commit(q)
        except MQError as exc:
            log.warning(
                "batch on %s backed out: its commit failed (reason %d): %s",
                q.name,
                exc.reason,
                exc,
            )
        except Exception:
            log.exception("batch on %s: its commit ended in an unexpected error", q.name)

    def _after_commit(self, q: _InputQueue, batch: _Batch) -> None:
        """What follows a batch's commit: counters, logs of its moves and dead-letters,
        the forgiven-backout bookkeeping and the after-commit hooks."""
        if batch.handovers:
            self.sink_backlogs.delivered(batch.handovers)
        if batch.unsettled:
            # its neighbours' retained copies: a replay of one is a replay from now on
            self.engine.settle_retained(batch.unsettled)
        self._account(batch.done)
        self._committed(batch.heard)
        try:
            self.forgiven.settle(batch.ids)
        except Exception:  # committed already: a stale entry only forgives too much once
            log.exception("cannot clear the forgiven backouts of %s", q.name)
        q.isolate = max(q.isolate - 1, 0)
        q.held_back = False
        self.counters.batches += 1
        self.counters.messages += batch.count

    async def _process(
        self, conn: Connection, q: _InputQueue, dlq: str, first: Message
    ) -> _Batch:
        """Handle ``first`` and more messages (gotten as the batch grows), put, and
        commit the engine's store (the caller commits the unit of work).

        The batch ends at ``batch_size`` messages or once the unit of work holds
        ``max_puts_per_unit`` messages (its gets, the puts due and the sink deliveries,
        which may become backlog puts), so it stays below the queue manager's
        MaxUncommittedMsgs, which counts gets and puts alike.

        On the embedded queue manager the gets after ``first`` go through the handle's
        ``syncpoint_taker`` (its checks made once a batch, as ``get_batch``'s): still one
        message at a time, each got only after the one before was handled and the limits
        allow another, so the batch is exactly the one single gets make. Nothing here is
        awaited between those gets (``_handle_one`` is synchronous), as the taker needs.
        """
        puts: list[Put] = []
        to_sinks: dict[str, list[Delivery]] = {}
        handovers: list[HandOver] = []
        engine = self.engine
        q_mgr = conn.q_mgr_name
        count = 0
        sunk = 0  # sink deliveries so far
        limit = 1 if q.isolate else self.config.batch_size
        max_puts = self.config.max_puts_per_unit
        more = GetOptions(wait_ms=0, syncpoint=True)
        # the handle's synchronous getter (None: none, or its checks failed: get raises)
        taker = None
        if limit > 1:
            make_taker = getattr(q.handle, "syncpoint_taker", None)
            if make_taker is not None:
                taker = make_taker(more)
        zero_id = bytes(24)
        m: Message | None = first
        while m is not None:
            count += 1
            self._batch_got = count
            if m.md.msg_id != zero_id:
                self._batch_ids.append(m.md.msg_id)
            if m.md.reply_to_q_mgr.strip():
                self._batch_heard.add(m.md.reply_to_q_mgr.strip())
            sunk += self._handle_one(q, dlq, q_mgr, m, puts, to_sinks)
            m = None
            # the unit's messages so far: gets, puts, and the sink deliveries that may
            # become backlog puts (MaxUncommittedMsgs counts them all)
            if count < limit and count + len(puts) + sunk < max_puts:
                try:
                    m = taker() if taker is not None else await q.handle.get(more)
                except MQError as exc:
                    if exc.reason != Reason.NO_MSG_AVAILABLE:
                        raise
        if q.committing is not None:
            # nothing of this batch leaves before the last batch's commit has ended
            await self._end_commit(q)
        if to_sinks and not q.held_back:
            # a sink finishing a short backlog: wait for it, then hand over directly
            await self.sink_backlogs.catch_up([n for n in to_sinks if n in self.sinks])
        # no hand-over in a batch that is backed out for back-pressure: its retries
        # would send it again and again (sink_backlogs.backlogs_take)
        handing = bool(to_sinks) and not q.held_back and self.sink_backlogs.backlogs_take(
            {n: d for n, d in to_sinks.items() if n in self.sinks}
        )
        for name, deliveries in to_sinks.items():
            if name not in self.sinks:
                # No such sink in this process (plugin not loaded): keep the data on the DLQ.
                for d in deliveries:
                    puts.append(
                        dead_letter(
                            d.md,
                            d.body,
                            Reason.UNKNOWN_OBJECT_NAME,
                            dlq=dlq,
                            dest_queue=f"sink:{name}",
                            dest_q_mgr="",
                            q_mgr=q_mgr,
                        )
                    )
            else:
                self.counters.sink_deliveries += len(deliveries)
                handover = self.sink_backlogs.hand_over(name, deliveries) if handing else None
                if handover is not None:
                    handovers.append(handover)  # acknowledged before the commit, or backlog
                else:
                    puts.extend(self.sink_backlogs.put_of(name, d) for d in deliveries)
        try:
            done = await put_all(conn, puts, dlq, self.engine)
        finally:
            # Whatever happens, a hand-over's send ends (or is given up) before the
            # unit of work does; the forwarder waits for it before sending anything.
            late = (
                await self.sink_backlogs.settle(
                    handovers, functools.partial(self._others_waiting, q.name)
                )
                if handovers
                else []
            )
        if late:
            done += await put_all(conn, late, dlq, self.engine)
        # the store's commit off the loop, still before MQ's
        unsettled = await engine.commit_async()
        return _Batch(count, done, handovers, [], set(), unsettled)

    def _others_waiting(self, name: str) -> bool:
        """Whether another serviced queue holds messages (a batch waiting for the lock
        holds its first one). A direct hand-over waits for the sink's acknowledgement
        with the service's lock held, which holds those queues too: past its first
        ``direct_ack_timeout`` it waits only while this is false (review 19b, F1). True
        where the queue manager does not tell depths (no hand-over there anyway)."""
        depth_of = getattr(self.qm, "queue_depth", None)
        if depth_of is None:
            return True
        for other, _ in self.serviced_queues:
            if other != name:
                try:
                    if depth_of(other):
                        return True
                except MQError:
                    return True  # an alias or remote name: its depth unknown, assume busy
        return False

    def _committed(self, heard: Collection[str]) -> None:
        for hook in self.after_commit:
            try:
                hook(heard)
            except Exception:  # committed already: a hook never undoes it
                log.exception("after-commit hook %r failed", hook)

    def _account(self, done: list[Put]) -> None:
        """Count and log moves and dead-letters once they are committed (never before)."""
        for p in done:
            if p.kind == "backout_queue":
                self.counters.moved_to_backout_queue += 1
                log.warning(
                    "message on %s backed out %d times: moved to %s",
                    p.source,
                    p.backout_count,
                    p.queue,
                )
            elif p.kind == "dead_letter":
                self.counters.dead_lettered += 1
                log.warning("message from %s dead-lettered to %s", p.source, p.queue)

    def _handle_one(
        self,
        q: _InputQueue,
        dlq: str,
        q_mgr: str,
        m: Message,
        puts: list[Put],
        to_sinks: dict[str, list[Delivery]],
    ) -> int:
        """Add ``m``'s puts to ``puts`` and its sink deliveries to ``to_sinks``; returns
        how many sink deliveries it added (the batch's unit-of-work count)."""
        engine = self.engine
        backouts = m.md.backout_count - self.forgiven.get(m.md.msg_id)
        if backouts >= q.backout_threshold:
            # Poison message: move it aside untouched, never process it again.
            if q.backout_queue:
                puts.append(
                    Put(
                        "",
                        q.backout_queue,
                        m.md,
                        m.body,
                        True,
                        "backout_queue",
                        q.name,
                        m.md.backout_count,
                    )
                )
            else:
                puts.append(
                    dead_letter(
                        m.md,
                        m.body,
                        Reason.BACKED_OUT,
                        dlq=dlq,
                        dest_queue=q.name,
                        dest_q_mgr=q_mgr,
                        q_mgr=q_mgr,
                        kind="backout_queue",
                    )
                )
            return 0
        outcome = engine.handle(InboundMessage(q.name, m.md, m.body, q.implicit_stream_naming))
        sunk = 0
        for d in outcome.deliveries:
            if d.destination.is_sink:
                to_sinks.setdefault(d.destination.sink, []).append(d)
                sunk += 1
            else:
                puts.append(Put(d.destination.q_mgr, d.destination.queue, d.md, d.body))
        # DeletePub passed on to neighbours (docs/neighbours.md), same unit of work.
        puts.extend(Put(f.q_mgr, f.queue, f.md, f.body) for f in outcome.forwards)
        if outcome.response is not None:
            r = outcome.response
            puts.append(Put(r.q_mgr, r.queue, r.md, r.body))
        if outcome.dead_letter is not None:
            reason = outcome.dead_letter.reason
            puts.append(
                dead_letter(
                    m.md, m.body, reason, dlq=dlq, dest_queue=q.name, dest_q_mgr=q_mgr, q_mgr=q_mgr
                )
            )
        return sunk
