"""One sink's forwarder: its backlog queue → the sink, like an MQ sender channel.

The publish/subscribe service waits for a sink only for a direct hand-over to an idle
sink (``sink_backlogs``: 50 ms, longer, up to 0.3 s, only while no other serviced queue
has messages waiting); otherwise it puts each sink delivery onto the sink's backlog queue
(``gateway.runtime.backlog_format``) in the unit of work of the publication. Per sink,
one :class:`SinkForwarder` task gets a batch from that queue under syncpoint, decodes
the envelopes, hands them to ``sink.send`` and commits after the acknowledgement. So a
sink that is down or slow holds only its own backlog; MQ subscribers, the other sinks
and every stream keep flowing (docs/operations.md, "Delivery guarantees per path").

What happens on a failure of ``send``:

* *retriable* (``retriable = True``: target down, not started): the unit of work stays
  open and the same envelopes are sent again after a jittered backoff. Never a backout,
  so an outage — however long, however many gateway restarts — never dead-letters.
* :class:`~gateway.plugin_api.DeliveryRefusedError` (``index``, ``reason``): exactly that
  backlog message goes to the dead-letter queue behind an MQDLH with ``reason``
  (DestQName = the backlog queue), counted per reason; the rest of the batch is sent
  again (nothing of a refused batch counts as delivered: sinks check before sending).
* anything else: backout (BackoutCount + 1).

Before any send, each got message must be the gateway's own: Format ``MQGWENV1`` and
the seal of ``gateway.runtime.backlog_seal`` in its AccountingToken (checked only for a
message the envelope cache does not know). Anything else on the queue (a forged
message, another format) is moved to the dead-letter queue with MQRC_FORMAT_ERROR or
MQRC_NOT_AUTHORIZED, counted per reason, logged summarised, never sent; the rest of the
batch goes on. A message whose BackoutCount reached the
  backlog queue's BOTHRESH is then sent alone, and moved aside (its BOQNAME, or the DLQ
  with MQRC_BACKED_OUT) only if it fails *again* with such an error. A BackoutCount
  raised by restarts (a restart rolls back the held unit of work) therefore only
  isolates a message, it never dead-letters it: no state needs to be kept for that.

A commit that fails *after* the sink acknowledged the batch (the store cannot write:
disk full) is not a failure of the batch: the forwarder remembers the batch's MsgIds,
logs one summarised line, waits and gets the batch again, and commits those messages
away without sending them (at most one copy per message within a process; a crash
before the commit sends that one batch again: at-least-once).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from gateway.log_summary import SummarisedLog
from gateway.mq.port import (
    Connection,
    GetOptions,
    Message,
    MQError,
    OpenOption,
    QueueAttr,
    QueueHandle,
    QueueManager,
)
from gateway.plugin_api import DeliveryRefusedError, Envelope, Sink
from gateway.runtime.backlog_format import (
    BACKLOG_FORMAT,
    BacklogFormatError,
    EnvelopeCache,
    decode_backlog_message,
)
from gateway.runtime.backlog_seal import BacklogSeal
from gateway.runtime.pubsub_service.counters import ServiceCounters
from gateway.runtime.pubsub_service.dead_letter import Put, dead_letter, put_all
from gateway.runtime.pubsub_service.errors import CONNECTION_REASONS, AsideQueueError
from gateway.wire.reasons import Reason

__all__ = ["MAX_UNSETTLED", "ForwarderCounters", "SinkForwarder"]

log = logging.getLogger(__name__)

#: Most backlog MsgIds remembered as acknowledged by the sink but not committed off the
#: backlog (their commit failed); past it the oldest are sent again (at-least-once).
MAX_UNSETTLED = 65536


#: The reasons the forwarder itself dead-letters with (a target's refusal brings its own):
#: not in the backlog format, not sealed by this gateway, poison at BOTHRESH.
OWN_DEAD_LETTER_REASONS = (Reason.FORMAT_ERROR, Reason.NOT_AUTHORIZED, Reason.BACKED_OUT)


@dataclass(slots=True)
class ForwarderCounters:
    """One sink's forwarding figures (exported as metrics)."""

    batches: int = 0
    delivered: int = 0
    retries: int = 0
    backouts: int = 0
    #: backlog messages dead-lettered, per MQ reason (refusals, format errors, poison)
    dead_lettered: dict[int, int] = field(default_factory=dict)
    #: 1 while the sink refuses retriably (down), else 0
    down: int = 0
    #: deliveries the service handed to the idle sink directly (acknowledged before
    #: the stream's commit, so never put on the backlog); included in ``delivered``
    direct: int = 0
    #: backlog commits that failed after the sink's acknowledgement (not sent again)
    commit_failures: int = 0
    #: of ``dead_lettered``, those put to the dead-letter queue and to a backout queue
    #: (also in the service's totals, which count every dead letter of the gateway)
    to_dead_letter_queue: int = 0
    to_backout_queue: int = 0


class SinkForwarder:
    """Forwards one backlog queue to one sink (see module docstring)."""

    def __init__(
        self,
        qm: QueueManager,
        sink_name: str,
        sink: Callable[[], Sink | None],
        queue: str,
        *,
        dead_letter_queue: str,
        batch_size: int,
        wait_ms: int,
        default_backout_threshold: int,
        retry_delay: float,
        retry_max_delay: float,
        stopping: asyncio.Event,
        totals: ServiceCounters | None = None,
        envelopes: EnvelopeCache | None = None,
        seal: BacklogSeal,
    ) -> None:
        self.qm = qm
        self.sink_name = sink_name
        self._sink = sink
        self.queue = queue
        self.dlq = dead_letter_queue
        self.batch_size = batch_size
        self.wait_ms = wait_ms
        self.default_backout_threshold = default_backout_threshold
        self.retry_delay = max(retry_delay, 0.01)
        self.retry_max_delay = retry_max_delay
        self._stop = stopping
        self.counters = ForwarderCounters()
        self._isolate = 0
        #: True from a get until its commit or backout (tests, graceful stops)
        self.busy = False
        #: resolved when the batch in hand (or, with none, the next) ends: the service
        #: waits on it to catch a short backlog up (:meth:`next_batch_end`)
        self._batch_end: asyncio.Future[object] | None = None
        #: the service's counters, which count the forwarder's work too
        self.totals = totals or ServiceCounters()
        #: envelopes this process put on the backlog, by MsgId: a hit skips the decode
        self.envelopes = envelopes if envelopes is not None else EnvelopeCache(0)
        #: the service's direct hand-over still sending (:meth:`send_directly`): the
        #: forwarder sends nothing before it ends, so the sink sees the stream's order
        self._direct: asyncio.Task[None] | None = None
        #: backlog MsgIds of the copies the service put of the hand-over in flight (it
        #: was not acknowledged in time); once it ends acknowledged they are taken off
        #: the backlog unsent, so a slow acknowledgement costs no duplicate
        self._direct_copies: frozenset[bytes] = frozenset()
        #: copies whose hand-over ended acknowledged: committed away without a send
        self._acked_copies: set[bytes] = set()
        #: no direct hand-over before this time (monotonic): set after one was not
        #: acknowledged in time, so a slow sink does not get many duplicates
        self._no_direct_until = 0.0
        #: hand-overs in a row not acknowledged in time (the next pause doubles)
        self._direct_misses = 0
        #: backlog MsgIds the sink acknowledged whose backlog commit then failed (the disk
        #: full, the queue manager's store failing): when got again they are committed
        #: away unsent, so a failing commit costs no duplicate (bounded: past
        #: MAX_UNSETTLED the oldest are forgotten and would be sent again)
        self._unsettled: dict[bytes, None] = {}
        #: one line per interval while backlog commits keep failing
        self._commit_failures = SummarisedLog(log)
        #: checks that a got message is the gateway's own (backlog_seal.py)
        self.seal = seal
        #: what is dead-lettered off the backlog: anyone who can put there decides how
        #: often, so one line per kind a minute (gateway.log_summary.SummarisedLog)
        self._refusals = SummarisedLog(log)

    @property
    def idle(self) -> bool:
        """Nothing in hand, no direct hand-over in flight, not isolating a message and
        the sink not down: the service may hand deliveries over directly (if the
        backlog queue is also empty, which the caller checks)."""
        return (
            not self.busy
            and not self.counters.down
            and not self._isolate
            and (self._direct is None or self._direct.done())
            and self._sink() is not None
            and (not self._no_direct_until or time.monotonic() >= self._no_direct_until)
        )

    def pause_direct(self, seconds: float) -> None:
        """No direct hand-over for ``seconds`` (one was not acknowledged in time)."""
        self._no_direct_until = time.monotonic() + seconds

    def pause_direct_after_miss(self, shortest: float, longest: float) -> float:
        """A hand-over was not acknowledged in time: no direct hand-over for
        ``shortest`` seconds, doubled for each such miss in a row, at most ``longest``;
        returns the pause."""
        pause: float = min(shortest * 2.0 ** min(self._direct_misses, 30), longest)
        self._direct_misses += 1
        self.pause_direct(pause)
        return pause

    def direct_in_time(self) -> None:
        """A hand-over was acknowledged in time: the next miss pauses the shortest."""
        self._direct_misses = 0

    @property
    def may_hand_over_after_batch(self) -> bool:
        """:attr:`idle` but for the batch in hand and a direct send still in flight:
        once the forwarder has ended that batch (and it held all the backlog), the
        service may hand deliveries over directly again (``SinkBacklogs.catch_up``)."""
        return (
            not self.counters.down
            and not self._isolate
            and self._sink() is not None
            and (not self._no_direct_until or time.monotonic() >= self._no_direct_until)
        )

    def next_batch_end(self) -> asyncio.Future[object]:
        """A future resolved when the batch in hand ends (committed or backed out), or
        the next one when none is in hand. Only awaited with a timeout."""
        if self._batch_end is None or self._batch_end.done():
            self._batch_end = asyncio.get_running_loop().create_future()
        return self._batch_end

    @property
    def direct_in_flight(self) -> bool:
        return self._direct is not None and not self._direct.done()

    def send_directly(self, envelopes: list[Envelope]) -> asyncio.Task[None]:
        """Start ``sink.send(envelopes)`` for the service: the idle forwarder's direct
        hand-over (docs/performance.md "Direct hand-over wait"). The service commits its
        unit of work without a backlog put only if this ends without error before the commit;
        otherwise it puts the deliveries on the backlog as usual (:meth:`copies_of_direct`
        names them; they are sent only if this send fails). Until it ends, the
        forwarder waits."""
        sink = self._sink()

        async def send() -> None:
            try:
                if sink is None:
                    raise _NoSinkError(f"no sink {self.sink_name} in this process")
                await sink.send(envelopes)
            except Exception as exc:
                if getattr(exc, "retriable", False) is True:
                    # a send refused retriably, counted as the forwarder counts its own
                    self.counters.retries += 1
                    self.totals.sink_retries += 1
                raise

        task = asyncio.create_task(send(), name=f"sink-direct:{self.sink_name}")
        task.add_done_callback(_retrieve)
        self._direct = task
        # copies named for an earlier hand-over belong to a unit of work backed out
        self._direct_copies = frozenset()
        return task

    def copies_of_direct(self, msg_ids: list[bytes]) -> None:
        """The backlog copies (MsgIds) of the hand-over still sending; see
        :meth:`_direct_settled`."""
        self._direct_copies = frozenset(msg_ids)

    def directly_delivered(self, count: int) -> None:
        """Count ``count`` deliveries the service committed after a direct hand-over."""
        self.counters.delivered += count
        self.counters.direct += count

    async def _direct_settled(self) -> bool:
        """Wait for a direct hand-over still sending (the service acts on its outcome);
        False when it failed other than by a refusal and the service is stopping.

        A failed hand-over counts as this sink's first failed attempt: the forwarder
        waits ``retry_delay`` before sending the backlog's copy (as after a failed
        batch), and sends nothing if the service stops meanwhile (the unit of work is
        then backed out, BackoutCount + 1). A refusal is sent again at once: the sink
        refuses it again and the forwarder dead-letters it."""
        task, self._direct = self._direct, None
        copies, self._direct_copies = self._direct_copies, frozenset()
        if task is None:
            return True
        if not task.done():
            with contextlib.suppress(Exception):
                await asyncio.shield(task)
        if _acknowledged(task):
            # acknowledged, only too late for the service's commit: the sink has these
            if len(self._acked_copies) > 65536:  # copies of a unit of work backed out
                self._acked_copies.clear()
            self._acked_copies |= copies
            return True
        if not task.cancelled() and isinstance(task.exception(), DeliveryRefusedError):
            return True
        await self._pause(self.retry_delay * random.uniform(0.8, 1.2))
        return not self._stop.is_set()

    async def take_back_acknowledged(self, timeout: float) -> int:
        """At a stop, once the stream batches have committed: wait up to ``timeout`` s
        for a direct hand-over still sending, then take the backlog copies of
        acknowledged hand-overs off the backlog unsent (counted delivered). The
        forwarder may have stopped before it got them: left there, the next start
        would send them again, so a graceful stop would duplicate a batch. Returns
        how many it took off; on an MQ error they stay (sent again: at-least-once)."""
        task, self._direct = self._direct, None
        copies, self._direct_copies = self._direct_copies, frozenset()
        if task is not None and copies:
            if not task.done():
                await asyncio.wait({task}, timeout=timeout)
            if _acknowledged(task):
                self._acked_copies |= copies
            elif not task.done():
                log.warning(
                    "sink %s: a direct send still unacknowledged %.0f s into the stop: "
                    "its %d backlog copies are sent again at the next start",
                    self.sink_name,
                    timeout,
                    len(copies),
                )
        acked, self._acked_copies = self._acked_copies, set()
        if not acked:
            return 0
        taken: list[bytes] = []
        conn: Connection | None = None
        try:
            conn = await self.qm.connect()
            handle = await conn.open(self.queue, OpenOption.INPUT_SHARED)
            for msg_id in acked:
                try:
                    await handle.get(GetOptions(syncpoint=True, match_msg_id=msg_id))
                except MQError as exc:
                    if exc.reason != Reason.NO_MSG_AVAILABLE:
                        raise
                    continue  # its unit of work was backed out: never on the backlog
                taken.append(msg_id)
            await conn.commit()
        except MQError as exc:
            log.warning("sink %s: cannot take acknowledged copies off: %s", self.sink_name, exc)
            return 0
        finally:
            if conn is not None:
                with contextlib.suppress(MQError):
                    await conn.backout()
                with contextlib.suppress(MQError):
                    await conn.disconnect()
        self.envelopes.discard(taken)
        self.directly_delivered(len(taken))
        return len(taken)

    async def run(self) -> None:
        """Forward until the service stops; reconnects after connection failures."""
        delay = self.retry_delay
        while not self._stop.is_set():
            try:
                conn = await self.qm.connect()
            except MQError as exc:
                log.error("sink %s: cannot connect (%s)", self.sink_name, exc)
                await self._pause(delay)
                delay = min(10.0, delay * 2)
                continue
            try:
                handle = await conn.open(self.queue, OpenOption.INPUT_SHARED | OpenOption.INQUIRE)
                threshold, boq = await self._backout_settings(handle)
                while not self._stop.is_set():
                    try:
                        got = await self.forward_batch(conn, handle, threshold, boq)
                    except MQError:
                        raise
                    except asyncio.CancelledError:
                        raise
                    except _BacklogCommitError as exc:
                        self.counters.commit_failures += 1
                        self._commit_failures.log(
                            logging.WARNING, "commit",
                            "sink %s: the backlog commit after the sink's acknowledgement "
                            "failed (%s); the %d deliveries it has are taken off %s unsent "
                            "once the queue manager commits again", self.sink_name,
                            exc.error, exc.sent, self.queue,
                        )
                        with contextlib.suppress(MQError):
                            await conn.backout()
                        if exc.error.reason in CONNECTION_REASONS:
                            raise exc.error from None
                        await self._pause(delay)
                        delay = min(10.0, max(delay * 2, 0.05))
                        continue
                    except AsideQueueError as exc:
                        self.totals.dead_letter_failures += 1
                        log.error(
                            "sink %s: cannot put to dead-letter/backout queue %s (reason %d): "
                            "its backlog waits until that queue is usable",
                            self.sink_name,
                            exc.queue,
                            exc.reason,
                        )
                        with contextlib.suppress(MQError):
                            await conn.backout()
                        await self._pause(delay)
                        delay = min(10.0, max(delay * 2, 0.05))
                        continue
                    except Exception:
                        log.exception("sink %s: batch backed out", self.sink_name)
                        self.counters.backouts += 1
                        self.totals.backouts += 1
                        self._isolate = max(self._isolate, self.batch_size)
                        with contextlib.suppress(MQError):
                            await conn.backout()
                        await self._pause(delay)
                        delay = min(10.0, max(delay * 2, 0.05))
                        continue
                    delay = self.retry_delay
                    if not got and self.wait_ms < 50:
                        # The get hardly waited: do not spin. After a real wait the next
                        # get starts at once (a pause here would be latency for whatever
                        # arrives during it).
                        await self._pause(0.01)
            except MQError as exc:
                log.error(
                    "sink %s: backlog %s failed (%s): reopening", self.sink_name, self.queue, exc
                )
                await self._pause(delay)
                delay = min(10.0, max(delay * 2, 0.05))
            finally:
                with contextlib.suppress(MQError):
                    await conn.backout()
                with contextlib.suppress(MQError):
                    await conn.disconnect()

    async def _backout_settings(self, handle: QueueHandle) -> tuple[int, str]:
        threshold, boq = 0, ""
        try:
            attrs = await handle.inquire(QueueAttr.BACKOUT_THRESHOLD, QueueAttr.BACKOUT_REQ_Q_NAME)
            threshold = int(attrs.get(QueueAttr.BACKOUT_THRESHOLD, 0))
            boq = str(attrs.get(QueueAttr.BACKOUT_REQ_Q_NAME, "")).strip()
        except MQError:
            pass
        return (threshold if threshold > 0 else self.default_backout_threshold), boq

    async def _pause(self, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stop.wait(), timeout=seconds)

    async def forward_batch(
        self, conn: Connection, handle: QueueHandle, threshold: int, boq: str
    ) -> int:
        """Get, send, commit one batch; the number of backlog messages got."""
        try:
            first = await handle.get(GetOptions(wait_ms=self.wait_ms, syncpoint=True))
        except MQError as exc:
            if exc.reason == Reason.NO_MSG_AVAILABLE:
                return 0
            raise
        self.busy = True
        try:
            return await self._forward(conn, handle, threshold, boq, first)
        finally:
            self.busy = False
            end, self._batch_end = self._batch_end, None
            if end is not None and not end.done():
                end.set_result(None)

    async def _forward(
        self, conn: Connection, handle: QueueHandle, threshold: int, boq: str, first: Message
    ) -> int:
        msgs = [first]
        isolated = self._isolate > 0 or first.md.backout_count >= threshold
        limit = 1 if isolated else self.batch_size
        # the embedded handle (checks once per batch) and the local-socket client (one
        # trip) both have it
        get_batch = getattr(handle, "get_batch", None)
        if get_batch is not None and limit > 1:
            try:
                msgs += await get_batch(GetOptions(wait_ms=0, syncpoint=True), limit - 1)
            except MQError as exc:
                if exc.reason != Reason.NO_MSG_AVAILABLE:
                    raise
        while len(msgs) < limit and get_batch is None:
            try:
                m = await handle.get(GetOptions(wait_ms=0, syncpoint=True))
            except MQError as exc:
                if exc.reason != Reason.NO_MSG_AVAILABLE:
                    raise
                break
            msgs.append(m)
        q_mgr = conn.q_mgr_name
        puts: list[Put] = []
        reasons: list[int] = []
        pending: list[tuple[Message, Envelope]] = []
        take = self.envelopes.take
        for m in msgs:
            md = m.md
            # a cache hit: the body is one this process sealed and put (backlog_seal.py)
            env = take(md.msg_id, m.body) if md.format == BACKLOG_FORMAT else None
            if env is not None:
                pending.append((m, env))
                continue
            reason = self.seal.refusal(md, m.body)
            if not reason:
                try:
                    pending.append((m, decode_backlog_message(m.body)))
                    continue
                except BacklogFormatError as exc:
                    reason, why = exc.reason, str(exc)
            else:
                why = ("not in the backlog format" if reason == Reason.FORMAT_ERROR
                       else "not sealed by this gateway")
            self._refusals.log(
                logging.ERROR, f"refused {reason}",
                "sink %s: a message on its backlog %s is %s (MQRC %d; Format %r, put by "
                "%r, application %r): dead-lettered, not forwarded",
                self.sink_name, self.queue, why, reason, md.format.strip(),
                md.user_identifier.strip(), md.put_appl_name.strip(),
            )
            puts.append(self._dead_letter(m, reason, q_mgr))
            reasons.append(reason)
        if not await self._direct_settled():
            return len(msgs)  # stopping: the unit of work stays open, run() backs it out
        acked_copies = [m.md.msg_id for m, _ in pending if m.md.msg_id in self._acked_copies]
        unsettled = self._unsettled
        sent_before = [m.md.msg_id for m, _ in pending if m.md.msg_id in unsettled]
        if acked_copies or sent_before:
            skip = set(acked_copies).union(sent_before)
            pending = [(m, e) for m, e in pending if m.md.msg_id not in skip]
        try:
            await self._send(pending, puts, reasons, q_mgr)
        except Exception:
            if not self._stop.is_set() and isolated and msgs[0].md.backout_count >= threshold:
                # Failed again alone at BOTHRESH: poison for this sink, set aside.
                puts, reasons = [self._aside(msgs[0], boq, q_mgr)], [Reason.BACKED_OUT]
                log.error(
                    "sink %s: backlog message backed out %d times: moved to %s",
                    self.sink_name,
                    msgs[0].md.backout_count,
                    puts[0].queue,
                )
            else:
                raise
        if puts:
            await put_all(conn, puts, self.dlq)
        try:
            await conn.commit()
        except MQError as exc:
            # The sink has ``pending``: never send them again for this failure.
            for m, _ in pending:
                unsettled[m.md.msg_id] = None
            while len(unsettled) > MAX_UNSETTLED:
                del unsettled[next(iter(unsettled))]
            raise _BacklogCommitError(exc, len(pending) + len(sent_before)) from exc
        for msg_id in sent_before:
            unsettled.pop(msg_id, None)
        self.envelopes.discard([m.md.msg_id for m in msgs])
        if acked_copies:
            self._acked_copies.difference_update(acked_copies)
            self.directly_delivered(len(acked_copies))
        for p, reason in zip(puts, reasons, strict=True):
            self.counters.dead_lettered[reason] = self.counters.dead_lettered.get(reason, 0) + 1
            if p.kind == "backout_queue":
                self.totals.moved_to_backout_queue += 1
                self.counters.to_backout_queue += 1
            else:
                self.totals.dead_lettered += 1
                self.counters.to_dead_letter_queue += 1
        self._isolate = max(self._isolate - 1, 0)
        self.counters.batches += 1
        return len(msgs)

    async def _send(
        self,
        pending: list[tuple[Message, Envelope]],
        puts: list[Put],
        reasons: list[int],
        q_mgr: str,
    ) -> None:
        """Send until the sink has all of ``pending`` but what it refused for good."""
        delay = self.retry_delay
        failing_since = 0.0
        while pending:
            sink = self._sink()
            try:
                if sink is None:
                    raise _NoSinkError(f"no sink {self.sink_name} in this process")
                await sink.send([e for _, e in pending])
            except DeliveryRefusedError as exc:
                if not 0 <= exc.index < len(pending):
                    raise
                m, env = pending.pop(exc.index)
                log.error(
                    "sink %s refused the publication on %s/%s (reason %d): %s; dead-lettered",
                    self.sink_name,
                    env.stream,
                    env.topic,
                    exc.reason,
                    exc,
                )
                puts.append(self._dead_letter(m, exc.reason, q_mgr))
                reasons.append(exc.reason)
                continue
            except Exception as exc:
                if getattr(exc, "retriable", False) is not True or self._stop.is_set():
                    raise
                self.counters.retries += 1
                self.totals.sink_retries += 1
                if not failing_since:
                    failing_since = time.monotonic()
                    self.counters.down = 1
                    log.warning(
                        "sink %s is unavailable (%s): its backlog waits on %s",
                        self.sink_name,
                        exc,
                        self.queue,
                    )
                await self._pause(delay * random.uniform(0.8, 1.2))
                delay = min(self.retry_max_delay, delay * 2)
                continue
            if failing_since:
                self.counters.down = 0
                log.warning(
                    "sink %s is available again after %.1f s",
                    self.sink_name,
                    time.monotonic() - failing_since,
                )
            self.counters.delivered += len(pending)
            return

    def _dead_letter(self, m: Message, reason: int, q_mgr: str) -> Put:
        return dead_letter(
            m.md,
            m.body,
            reason,
            dlq=self.dlq,
            dest_queue=self.queue,
            dest_q_mgr=q_mgr,
            q_mgr=q_mgr,
            source=f"sink {self.sink_name}",
        )

    def _aside(self, m: Message, boq: str, q_mgr: str) -> Put:
        if boq:
            return Put("", boq, m.md, m.body, True, "backout_queue", self.queue, m.md.backout_count)
        return dead_letter(
            m.md,
            m.body,
            Reason.BACKED_OUT,
            dlq=self.dlq,
            dest_queue=self.queue,
            dest_q_mgr=q_mgr,
            q_mgr=q_mgr,
            kind="backout_queue",
        )


def _acknowledged(task: asyncio.Task[None]) -> bool:
    """A direct hand-over's send ended with the sink's acknowledgement."""
    return task.done() and not task.cancelled() and task.exception() is None


def _retrieve(task: asyncio.Task[None]) -> None:
    """Mark a direct hand-over's exception as seen (the service acts on it, or the
    hand-over was already given up and its deliveries went to the backlog)."""
    if not task.cancelled():
        task.exception()


class _BacklogCommitError(Exception):
    """The backlog commit after a batch the sink acknowledged failed (``sent``
    deliveries the sink has): retried after a pause, nothing sent again."""

    def __init__(self, error: MQError, sent: int) -> None:
        super().__init__(str(error))
        self.error = error
        self.sent = sent


class _NoSinkError(Exception):
    """The sink is not registered (yet): wait for it like a sink that is down."""

    retriable = True
