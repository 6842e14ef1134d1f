"""The sinks of the publish/subscribe service and their backlog queues.

Each registered sink (plugin instance) gets a backlog queue,
``SYSTEM.MQGW.SINK.<instance>`` (``gateway.runtime.backlog_format``): the stream batches
put its deliveries there (:meth:`SinkBacklogs.put_of`) and one
:class:`~gateway.runtime.pubsub_service.sink_forwarder.SinkForwarder` per sink takes
them to the sink. On the embedded queue manager a missing backlog queue is defined when
the sink is registered; on IBM MQ the administrator defines it and :meth:`check_defined`
fails the start with the ``DEFINE`` to run.

Direct hand-over (docs/performance.md "Direct hand-over wait"): when a sink's forwarder
is idle and its backlog queue is empty (on a queue manager that tells its depth), the
stream batch hands its deliveries to the sink itself (:meth:`SinkBacklogs.hand_over`)
while it puts its other deliveries, and waits for the acknowledgement before its commit:
``direct_ack_timeout``, then (up to :meth:`SinkBacklogs.ack_wait`: plus
``direct_ack_per_delivery`` per delivery handed over) only while no other serviced queue
has messages waiting, since the wait holds the service's lock. Acknowledged in time: no
backlog put (the sink has them before the stream messages leave the queue; a crash
before the commit re-delivers the batch: duplicates, never a loss). Otherwise — refused,
failed, slow — the deliveries are put on the backlog in the same unit of work, exactly
as without the hand-over, and the forwarder sends nothing before the hand-over's send
has ended (the sink keeps the stream's order). If that send ends acknowledged after all
(it was only slow), the forwarder commits those backlog copies away unsent, so a slow
sink sees no duplicate; at a stop, if the forwarder had not got them, the service waits
up to ``STOP_SETTLE_TIMEOUT`` for that send after its last commit and takes acknowledged
copies off then (only a send still unacknowledged by then, a stop cut short, or a crash
leaves copies the next start sends again: at-least-once); if it failed, the copies are
sent. That sink gets no hand-over for ``direct_pause_min`` seconds, doubled for each
such hand-over in a row up to ``direct_pause``.

A batch whose sink's forwarder is sending a backlog of at most one forwarder batch
first waits for it to end (:meth:`SinkBacklogs.catch_up`, within
``direct_ack_timeout``), so one late acknowledgement does not send every later batch
through the backlog while the stream keeps the forwarder busy.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from pathlib import Path

from gateway.mq.port import MQError, OpenOption, QueueManager
from gateway.plugin_api import Envelope, Sink
from gateway.pubsub.outcome import Delivery
from gateway.runtime.backlog_format import (
    BACKLOG_FORMAT,
    BACKLOG_QUEUE_PREFIX,
    EnvelopeCache,
    backlog_msg_id,
    backlog_queue_name,
    encode_backlog_message,
)
from gateway.runtime.backlog_seal import KEY_SIZE, BacklogSeal, keep_new_key, load_backlog_seal
from gateway.runtime.envelopes import envelope_of
from gateway.runtime.pubsub_service.config import BrokerConfig
from gateway.runtime.pubsub_service.counters import ServiceCounters
from gateway.runtime.pubsub_service.dead_letter import Put
from gateway.runtime.pubsub_service.errors import BrokerError
from gateway.runtime.pubsub_service.first_seal import seal_in_place
from gateway.runtime.pubsub_service.sink_forwarder import ForwarderCounters, SinkForwarder
from gateway.wire.constants import Persistence
from gateway.wire.mqmd import MQMD

__all__ = ["BACKLOG_MAXMSGL", "DIRECT_ACK_TIMEOUT", "DIRECT_PAUSE", "HandOver", "SinkBacklogs"]

log = logging.getLogger(__name__)

#: MAXMSGL of a backlog queue the gateway defines: MQ's largest, so a publication MQ
#: accepted always fits with its envelope header.
BACKLOG_MAXMSGL = 104_857_600

#: Seconds a stream batch waits, before its commit, for a sink's acknowledgement of a
#: direct hand-over, plus ``DIRECT_ACK_PER_DELIVERY`` for each delivery handed over (a
#: batch of 256 to Kafka, acks=all, takes 40-60 ms on a busy machine: a flat 50 ms sent
#: every large batch to the backlog), at most ``DIRECT_ACK_MAX``; later, the deliveries
#: go to the backlog as usual.
DIRECT_ACK_TIMEOUT = 0.05
DIRECT_ACK_PER_DELIVERY = 0.001
DIRECT_ACK_MAX = 0.3
#: Past ``DIRECT_ACK_TIMEOUT`` the wait goes on only while no other serviced queue has
#: messages (it holds the service's lock); checked this often (seconds).
DIRECT_ACK_POLL = 0.01
#: Seconds without direct hand-over to a sink after one was not acknowledged in time or
#: failed: ``DIRECT_PAUSE_MIN``, doubled for each such hand-over in a row up to
#: ``DIRECT_PAUSE``, back to the minimum after one acknowledged in time. While a sink
#: is slow its deliveries take the backlog; one slow send (a topic's first, a broker's
#: hiccup) costs half a second of backlog, not five.
DIRECT_PAUSE_MIN = 0.5
DIRECT_PAUSE = 5.0
#: At a stop, seconds a forwarder waits for a direct hand-over still sending whose
#: deliveries also went to the backlog: acknowledged by then, the copies are taken off
#: unsent (:meth:`SinkBacklogs.take_back_acknowledged`); otherwise they are sent again
#: at the next start.
STOP_SETTLE_TIMEOUT = 5.0


@dataclass(slots=True)
class HandOver:
    """Deliveries of one batch handed to sink ``name`` directly, their send in flight."""

    name: str
    deliveries: list[Delivery]
    envelopes: list[Envelope]
    fw: SinkForwarder
    task: asyncio.Task[None]
    #: acknowledged in time (:meth:`SinkBacklogs.settle`): no backlog put
    acked: bool = False


class SinkBacklogs:
    """Registered sinks, their backlog queues and forwarders (see module docstring)."""

    def __init__(
        self,
        qm: QueueManager,
        config: BrokerConfig,
        stopping: asyncio.Event,
        totals: ServiceCounters,
        seal: BacklogSeal | None = None,
    ) -> None:
        self.qm = qm
        self.config = config
        #: seals what is put on the backlogs; the forwarders check it (backlog_seal.py)
        self.seal = seal if seal is not None else _default_seal(qm)
        self._stop = stopping
        self._totals = totals
        self.sinks: dict[str, Sink] = {}
        #: backlog queue of each registered sink
        self.queues: dict[str, str] = {}
        self.forwarders: dict[str, SinkForwarder] = {}
        #: per sink: the envelopes put on its backlog by this process, by MsgId, so its
        #: forwarder need not decode them (``EnvelopeCache``)
        self.envelopes: dict[str, EnvelopeCache] = {}
        #: sinks whose forwarder runs in a worker process (gateway/runtime/workers/):
        #: their backlog is filled here, no forwarder is started for them here
        self.remote: set[str] = set()
        #: wait for a direct hand-over's acknowledgement (0: never hand over directly),
        #: plus this much per delivery handed over, at most ``direct_ack_max``
        self.direct_ack_timeout = DIRECT_ACK_TIMEOUT
        self.direct_ack_per_delivery = DIRECT_ACK_PER_DELIVERY
        self.direct_ack_max = DIRECT_ACK_MAX
        #: no hand-over to a sink for ``direct_pause_min`` after one was not acknowledged
        #: in time, doubling for each in a row up to ``direct_pause``
        self.direct_pause_min = DIRECT_PAUSE_MIN
        self.direct_pause = DIRECT_PAUSE
        #: at a stop, the wait for a hand-over still sending (take_back_acknowledged)
        self.stop_settle_timeout = STOP_SETTLE_TIMEOUT
        #: one :meth:`seal_what_is_there` at a time (the start and a sink subscription)
        self._sealing = asyncio.Lock()

    def _define_statement(self, queue: str, name: str) -> str:
        return (
            f"DEFINE QLOCAL('{queue}') DEFPSIST(YES) USAGE(NORMAL) "
            f"MAXDEPTH({self.config.sink_backlog_max_depth}) MAXMSGL({BACKLOG_MAXMSGL}) "
            f"DESCR('mqgw backlog of sink {name[:40]}')"
        )

    def register(self, name: str, sink: Sink) -> None:
        """Add (or replace) sink ``name``; defines its backlog queue on the embedded
        queue manager when missing. BrokerError when its name cannot make a queue name."""
        try:
            queue = backlog_queue_name(name)
        except ValueError as exc:
            raise BrokerError(str(exc)) from exc
        for other, q in self.queues.items():
            if q == queue and other != name:
                raise BrokerError(f"sinks {other!r} and {name!r} would share backlog {queue}")
        self.sinks[name] = sink
        self.queues[name] = queue
        self.envelopes.setdefault(name, EnvelopeCache())
        define = getattr(self.qm, "run_mqsc", None)
        catalogue = getattr(self.qm, "catalogue", None)
        if define is not None and catalogue is not None and queue not in catalogue.queues:
            define(self._define_statement(queue, name), stop_on_error=True)
            log.info("defined backlog queue %s for sink %s", queue, name)

    def put_of(self, name: str, d: Delivery, envelope: Envelope | None = None) -> Put:
        """The put of delivery ``d`` (its envelope if already made) onto sink ``name``'s
        backlog queue (a full queue is back-pressure: BacklogFullError; any other
        failure dead-letters it)."""
        msg_id = backlog_msg_id()
        if envelope is None:
            envelope = envelope_of(d)
        body = encode_backlog_message(envelope)
        md = MQMD(
            msg_id=msg_id,
            format=BACKLOG_FORMAT,
            # the seal: only the gateway's own backlog messages are forwarded
            accounting_token=self.seal.seal(body),
            persistence=(
                Persistence.PERSISTENT
                if d.md.persistence == Persistence.PERSISTENT
                else Persistence.NOT_PERSISTENT
            ),
            # One priority for the whole backlog: the queue manager gets by priority
            # first, and the sink must see the stream's order (a later retained
            # publication never overtaken by an earlier one). The envelope keeps the
            # publication's own priority.
            priority=0,
            expiry=d.md.expiry,
            put_appl_type=d.md.put_appl_type,
            put_appl_name=d.md.put_appl_name,
            put_date=d.md.put_date,
            put_time=d.md.put_time,
            user_identifier=d.md.user_identifier,
        )
        cache = self.envelopes.get(name)
        if cache is not None and name not in self.remote:  # a worker decodes its own
            cache.put(msg_id, body, envelope)
        return Put("", self.queues[name], md, body, backpressure=True)

    def backlogs_take(self, batch: Mapping[str, list[Delivery]]) -> bool:
        """Whether the backlog puts of a batch delivering ``batch`` (per sink) will be
        taken: False while the queue manager's disk is at its watermark (2056), or when
        a sink's backlog lacks room for its deliveries (2053: depth plus deliveries past
        MAXDEPTH, on a queue manager that tells both). Such a batch backs out and is
        retried, so it hands nothing over: a hand-over would be sent again with every
        retry (a duplicate each time). A forwarder freeing room meanwhile only sends a
        batch through the backlog that could have been handed over."""
        space = getattr(self.qm, "space", None)
        if space is not None and space.low:
            return False
        depth_of = getattr(self.qm, "queue_depth", None)
        catalogue = getattr(self.qm, "catalogue", None)
        if depth_of is None or catalogue is None:
            return True
        for name, deliveries in batch.items():
            queue = self.queues.get(name)
            definition = catalogue.queues.get(queue) if queue is not None else None
            if definition is None:
                continue
            try:
                if depth_of(queue) + len(deliveries) > definition.max_depth:
                    return False
            except MQError:
                continue
        return True

    def hand_over(self, name: str, deliveries: list[Delivery]) -> HandOver | None:
        """Start sending ``deliveries`` to sink ``name`` directly if its forwarder is idle
        and its backlog queue empty (see module docstring); None: put them on the
        backlog. The caller must :meth:`settle` every hand-over before its commit, and
        hands nothing over in a batch whose backlog puts will not be taken
        (:meth:`backlogs_take`)."""
        if self.direct_ack_timeout <= 0 or self._stop.is_set():
            return None
        fw = self.forwarders.get(name)
        depth_of = getattr(self.qm, "queue_depth", None)
        if fw is None or depth_of is None or not fw.idle:
            return None
        try:
            if depth_of(self.queues[name]):
                return None
        except MQError:
            return None
        envelopes = [envelope_of(d) for d in deliveries]
        return HandOver(name, deliveries, envelopes, fw, fw.send_directly(envelopes))

    async def catch_up(self, names: Collection[str]) -> None:
        """Before a batch decides its hand-overs: for each sink in ``names`` whose
        forwarder is sending a short backlog (no more than one forwarder batch, all
        in its hand or its next take) and would otherwise be ready for a hand-over,
        wait for that backlog to empty, up to ``direct_ack_timeout`` in all, so the
        batch goes to the sink directly instead of behind it on the backlog: a put,
        a get and a commit less per delivery, the same order (the sink gets the
        backlog first either way). Past the wait the sink's hand-overs pause as after
        a late acknowledgement (:meth:`SinkForwarder.pause_direct_after_miss`), so a
        slow sink costs a stream one such wait per pause. The wait holds the
        service's lock, like :meth:`settle`; a stop ends it."""
        if self.direct_ack_timeout <= 0 or self._stop.is_set():
            return
        depth_of = getattr(self.qm, "queue_depth", None)
        if depth_of is None:
            return
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.direct_ack_timeout
        for name in names:
            fw = self.forwarders.get(name)
            if fw is None or name in self.remote:
                continue
            while fw.may_hand_over_after_batch and not self._stop.is_set():
                try:
                    depth = depth_of(self.queues[name])
                except MQError:
                    break
                if not depth or depth > fw.batch_size:
                    break  # empty, or too far behind to wait for (it holds its own)
                remaining = deadline - loop.time()
                if remaining <= 0:
                    fw.pause_direct_after_miss(self.direct_pause_min, self.direct_pause)
                    break
                stopping: asyncio.Future[object] = asyncio.ensure_future(self._stop.wait())
                ended = fw.next_batch_end()
                try:
                    await asyncio.wait(
                        {ended, stopping},
                        timeout=remaining,
                        return_when=asyncio.FIRST_COMPLETED,
                    )
                finally:
                    stopping.cancel()

    def ack_wait(self, handovers: list[HandOver]) -> float:
        """How long :meth:`settle` waits: the sinks send at once, so the largest
        hand-over sets it."""
        most = max((len(h.deliveries) for h in handovers), default=0)
        return min(self.direct_ack_timeout + self.direct_ack_per_delivery * most,
                   max(self.direct_ack_max, self.direct_ack_timeout))

    async def settle(
        self, handovers: list[HandOver], others_waiting: Callable[[], bool] | None = None
    ) -> list[Put]:
        """Wait for the acknowledgements of ``handovers``; the backlog puts of those not
        acknowledged, in order. The wait holds the service's lock, so it is
        ``direct_ack_timeout``, then, up to :meth:`ack_wait` in all, only while
        ``others_waiting()`` says no other serviced queue has messages (checked every
        ``DIRECT_ACK_POLL`` s); a stop ends it (the unsettled take the backlog)."""
        tasks = {h.task for h in handovers if not h.task.done()}
        if tasks:
            loop = asyncio.get_running_loop()
            now = loop.time()
            deadline = now + self.ack_wait(handovers)
            acked = asyncio.ensure_future(asyncio.wait(tasks))
            stopping = asyncio.ensure_future(self._stop.wait())
            try:
                done, _ = await asyncio.wait(
                    {acked, stopping},
                    timeout=min(self.direct_ack_timeout, deadline - now),
                    return_when=asyncio.FIRST_COMPLETED,
                )
                while not done and loop.time() < deadline and not (
                    others_waiting is not None and others_waiting()
                ):
                    done, _ = await asyncio.wait(
                        {acked, stopping},
                        timeout=min(DIRECT_ACK_POLL, deadline - loop.time()),
                        return_when=asyncio.FIRST_COMPLETED,
                    )
            finally:
                acked.cancel()  # the wait only: the sends go on
                stopping.cancel()
        puts: list[Put] = []
        for h in handovers:
            if h.task.done() and not h.task.cancelled() and h.task.exception() is None:
                h.acked = True
                h.fw.direct_in_time()
                continue
            if not h.task.done():
                log.debug("sink %s: no acknowledgement in time: via the backlog", h.name)
            h.fw.pause_direct_after_miss(self.direct_pause_min, self.direct_pause)
            copies = [
                self.put_of(h.name, d, e) for d, e in zip(h.deliveries, h.envelopes, strict=True)
            ]
            if not h.task.done():
                # still sending: if it ends acknowledged, the forwarder takes these
                # copies off the backlog unsent (no duplicate without a failure)
                h.fw.copies_of_direct([p.md.msg_id for p in copies])
            puts.extend(copies)
        return puts

    async def take_back_acknowledged(self) -> None:
        """At a stop, once every stream batch has committed: each forwarder takes the
        backlog copies of its acknowledged hand-overs off unsent, so a graceful stop
        sends nothing twice (:meth:`SinkForwarder.take_back_acknowledged`). The sinks
        are waited for together: a stop takes ``stop_settle_timeout`` at most, not that
        per sink."""
        forwarders = list(self.forwarders.values())
        taken = await asyncio.gather(
            *(fw.take_back_acknowledged(self.stop_settle_timeout) for fw in forwarders)
        )
        for fw, n in zip(forwarders, taken, strict=True):
            if n:
                log.info("sink %s: %d acknowledged copies taken off its backlog", fw.sink_name, n)

    @staticmethod
    def delivered(handovers: list[HandOver]) -> None:
        """After the commit: count the hand-overs that needed no backlog put."""
        for h in handovers:
            if h.acked:
                h.fw.directly_delivered(len(h.deliveries))

    async def check_defined(self) -> None:
        """Every sink's backlog queue must exist (IBM MQ: the administrator defines it)."""
        if not self.queues:
            return
        conn = await self.qm.connect()
        try:
            for name, queue in self.queues.items():
                try:
                    handle = await conn.open(queue, OpenOption.OUTPUT)
                except MQError as exc:
                    raise BrokerError(
                        f"backlog queue {queue} of sink {name!r} cannot be opened "
                        f"(reason {exc.reason}); define it: {self._define_statement(queue, name)}",
                        exc.reason,
                    ) from exc
                await handle.close()
        finally:
            with contextlib.suppress(MQError):
                await conn.disconnect()

    def start_forwarder(self, name: str, dlq: str) -> asyncio.Task[None]:
        """Start the forwarder of sink ``name``; its task (the service owns it)."""
        cfg = self.config
        fw = SinkForwarder(
            self.qm,
            name,
            lambda: self.sinks.get(name),
            self.queues[name],
            dead_letter_queue=dlq or cfg.dead_letter_queue,
            batch_size=cfg.batch_size,
            wait_ms=cfg.wait_ms,
            default_backout_threshold=cfg.default_backout_threshold,
            retry_delay=cfg.retry_delay,
            retry_max_delay=cfg.sink_retry_max_delay,
            stopping=self._stop,
            totals=self._totals,
            envelopes=self.envelopes.setdefault(name, EnvelopeCache()),
            seal=self.seal,
        )
        self.forwarders[name] = fw
        return asyncio.create_task(fw.run(), name=f"sink:{name}")

    @property
    def busy(self) -> bool:
        """A sink that is up has deliveries on its backlog or in hand. A sink that is
        down does not count: its backlog waits for it."""
        depth_of = getattr(self.qm, "queue_depth", None)
        for name, fw in self.forwarders.items():
            if fw.counters.down:
                continue
            if fw.busy or fw.direct_in_flight:
                return True
            if depth_of is not None:
                with contextlib.suppress(MQError):
                    if depth_of(self.queues[name]):
                        return True
        return False

    def counters(self) -> dict[str, ForwarderCounters]:
        """Per sink: its forwarder's figures (metrics)."""
        return {name: fw.counters for name, fw in self.forwarders.items()}

    async def seal_what_is_there(self) -> None:
        """When this start made the backlog key (an upgrade from a version without the
        seal, a new install, a backlog restored without its key): seal what the backlog
        queues hold, in place, before anything is put there or forwarded, then keep the
        key (``first_seal``; once: a no-op afterwards). The queues are those of the
        registered sinks and, on the embedded queue manager, every defined
        ``SYSTEM.MQGW.SINK.*`` (a sink configured again later). BrokerError when a
        backlog cannot be sealed or the key kept: the start fails, nothing is lost."""
        async with self._sealing:
            await self._seal_what_is_there()

    async def _seal_what_is_there(self) -> None:
        seal = self.seal
        if seal.new_in is None:
            return
        queues = set(self.queues.values())
        catalogue = getattr(self.qm, "catalogue", None)
        if catalogue is not None:
            queues.update(q for q in catalogue.queues if q.startswith(BACKLOG_QUEUE_PREFIX))
        try:
            sealed = await seal_in_place(
                self.qm, sorted(queues), seal, resuming=seal.interrupted
            )
            keep_new_key(seal)
        except MQError as exc:
            raise BrokerError(
                f"cannot seal what the sink backlogs hold with the new backlog key: {exc}",
                exc.reason,
            ) from exc
        except (OSError, ValueError) as exc:
            raise BrokerError(f"cannot keep the new backlog key: {exc}") from exc
        total = sum(sealed.values())
        log.log(
            logging.WARNING if total else logging.INFO,
            "backlog key made: %d message(s) already on the sink backlogs sealed with it "
            "in place%s (%s)",
            total,
            ", finishing a start cut short" if seal.interrupted else "",
            ", ".join(f"{q} {n}" for q, n in sealed.items() if n) or "all empty",
        )


def _default_seal(qm: QueueManager) -> BacklogSeal:
    """The seal of a service given none: the key in the embedded queue manager's data
    directory (where the backlogs are kept; made there if missing, and what the backlogs
    hold then is sealed at the start: :meth:`SinkBacklogs.seal_what_is_there`); a queue
    manager without one (IBM MQ, which the app gives a key kept beside its store) gets a
    key of this process only, so its backlog messages are dead-lettered after a restart
    (2035): said once in the log."""
    path = getattr(qm, "path", None)
    if isinstance(path, Path):
        try:
            return load_backlog_seal(path)
        except (OSError, ValueError) as exc:
            raise BrokerError(f"cannot use the backlog key in {path}: {exc}") from exc
    log.warning("no backlog key directory: the sink backlogs' seal lasts this process only")
    return BacklogSeal(os.urandom(KEY_SIZE))
