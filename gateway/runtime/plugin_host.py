"""Hosting plugin instances: the :class:`~gateway.plugin_api.PluginContext` and
:class:`~gateway.plugin_api.Publisher` the runtime hands to each instance.

Outbound, the broker service hands each instance :class:`~gateway.plugin_api.Envelope`
values (made once per delivery by :mod:`gateway.runtime.envelopes`); inbound, an
instance's envelopes become MQRFH2 Publish commands (:mod:`gateway.pubsub.command_encoding`).

Why publication goes through MQ and not straight into the engine: an inbound
publication must survive a crash the moment :meth:`MQPublisher.publish` returns (the
plugin then acknowledges upstream). Putting it as an MQRFH2 ``Publish`` command under
syncpoint on a stream queue and committing gives exactly that, and the broker service
then fans it out like any legacy publisher's (reference §5.5 "Publish", MQRFH2 ``psc``
folder). The instance's name travels in an ``mqgw`` folder (``<mqgw><Origin>``), which
the engine strips and uses to keep the publication away from that instance's own
sink subscriptions (no bridging loops).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import Awaitable, Callable, Collection, Sequence
from dataclasses import dataclass, field

from gateway.mq.port import (
    Connection,
    MQError,
    OpenOption,
    PutOptions,
    QueueHandle,
    QueueManager,
    start_commit,
)
from gateway.plugin_api import (
    DeliveryRefusedError,
    Envelope,
    PluginError,
    PluginInstance,
    PublishRefusedError,
)
from gateway.pubsub.authorisation import Authoriser, Principal, PrincipalKind
from gateway.pubsub.command_encoding import CommandEncodingError, encode_publish_command
from gateway.pubsub.options import RegOpt
from gateway.pubsub.streams import DEFAULT_STREAM, prefixed_topic, split_topic
from gateway.pubsub.topics import Scheme
from gateway.runtime.pubsub_service import BrokerService
from gateway.wire.mqmd import MQMD
from gateway.wire.reasons import Reason, reason_text

__all__ = [
    "REFUSED_PUT_REASONS",
    "HostedPluginContext",
    "MQPublisher",
    "PluginHost",
    "PublishRefusedError",
    "publish_command_of",
]

log = logging.getLogger(__name__)


def publish_command_of(
    pub: Envelope, *, q_mgr: str = "", gateway_id: str = ""
) -> tuple[MQMD, bytes]:
    """The MQMD and body of the MQRFH2 Publish (or DeletePub) command for ``pub``.

    Raises :class:`PublishRefusedError` when ``pub`` cannot be expressed.
    """
    try:
        return encode_publish_command(
            pub.stream,
            pub.topic,
            pub.payload,
            payload_format=pub.payload_format,
            encoding=pub.encoding,
            ccsid=pub.ccsid,
            properties=pub.properties,
            persistent=pub.persistent,
            retain=pub.retain,
            delete=pub.delete,
            expiry=pub.expiry,
            correl_id=pub.correl_id,
            origin=pub.origin,
            gateway_id=gateway_id,
            q_mgr=q_mgr,
        )
    except CommandEncodingError as exc:
        raise PublishRefusedError(
            f"publication on {pub.stream!r}/{pub.topic!r} refused: {exc}"
        ) from exc


#: MQ reasons of a put that can never succeed *for that message*, whatever the state of
#: the queue manager: the publication is refused (the plugin dead-letters it and moves
#: on). Every other reason (Q_FULL 2053, PUT_INHIBITED 2051, a broken or quiescing
#: connection 2009/2059/2161/2162/2202, UNKNOWN_OBJECT_NAME or NOT_AUTHORIZED from a
#: configuration still being fixed, PERSISTENT_NOT_ALLOWED 2048 — a queue setting, not
#: the message's fault ...) is back-pressure: retried, never dead-lettered.
REFUSED_PUT_REASONS: frozenset[int] = frozenset(
    {
        Reason.MSG_TOO_BIG_FOR_Q,
        Reason.MSG_TOO_BIG_FOR_Q_MGR,
        Reason.DATA_LENGTH_ERROR,
        Reason.MD_ERROR,
        Reason.EXPIRY_ERROR,
        Reason.FEEDBACK_ERROR,
        Reason.MSG_TYPE_ERROR,
        Reason.MISSING_REPLY_TO_Q,
        Reason.PERSISTENCE_ERROR,
        Reason.PRIORITY_ERROR,
        Reason.REPORT_OPTIONS_ERROR,
        Reason.FORMAT_ERROR,
        Reason.HEADER_ERROR,
        Reason.RFH_ERROR,
        Reason.RFH_FORMAT_ERROR,
        Reason.RFH_HEADER_FIELD_ERROR,
        Reason.RFH_RESTRICTED_FORMAT_ERR,
        Reason.PROPERTY_NAME_ERROR,
        Reason.SOURCE_CCSID_ERROR,
        Reason.CONTENT_ERROR,
    }
)


@dataclass(slots=True)
class PublisherCounters:
    """Exported as metrics."""

    publications: int = 0
    units_of_work: int = 0
    failures: int = 0
    #: units whose puts were made while the unit before was still committing
    overlapped: int = 0
    #: publications per stream
    per_stream: dict[str, int] = field(default_factory=dict)
    #: publications refused for good, by MQ reason name (0: could not be encoded)
    refused: dict[str, int] = field(default_factory=dict)


def _ended() -> asyncio.Future[None]:
    done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    done.set_result(None)
    return done


class MQPublisher:
    """:class:`~gateway.plugin_api.Publisher` over a queue manager.

    One connection, one unit of work being put at a time (a lock): ``publish`` puts the
    batch's commands under syncpoint and commits; ``begin_publish`` lets the next batch
    be put while the last one's commit completes (units still commit in order). The
    command goes to the stream's own queue when that queue is serviced (so it is
    ordered with the stream's other publishers), else to ``SYSTEM.BROKER.DEFAULT.STREAM``
    (the ``$SYS/STREAM/`` prefix names the stream either way).
    """

    def __init__(
        self,
        qm: QueueManager,
        *,
        origin: str = "",
        gateway_id: str = "",
        serviced_queues: Collection[str] | Callable[[], Collection[str]] = (),
        authoriser: Authoriser | None = None,
    ) -> None:
        self.qm = qm
        #: Bounds what this instance (``origin``) may publish (docs/security.md).
        self.authoriser = authoriser
        self.origin = origin
        self.gateway_id = gateway_id
        self._serviced = serviced_queues
        self._conn: Connection | None = None
        #: output handles opened on ``_conn``, by queue (reused: an open per put is slow)
        self._handles: dict[str, QueueHandle] = {}
        self._lock = asyncio.Lock()
        #: the last unit's begun commit, until the next unit's commit begins
        self._front: asyncio.Future[None] | None = None
        self.counters = PublisherCounters()

    def queue_for(self, stream: str) -> str:
        """The queue a publication on ``stream`` is put to."""
        serviced = self._serviced() if callable(self._serviced) else self._serviced
        return stream if stream in serviced else DEFAULT_STREAM

    async def publish(self, publications: Sequence[Envelope]) -> None:
        """Put all of ``publications`` in one unit of work and commit (see Publisher)."""
        await (await self.begin_publish(publications))

    async def begin_publish(self, publications: Sequence[Envelope]) -> Awaitable[None]:
        """Put all of ``publications`` in one unit of work and begin its commit; the
        awaitable returned ends once it has committed (``gateway.plugin_api.begin_publish``).

        Where the queue manager can begin a commit without waiting for it
        (``gateway.mq.port.start_commit``, the embedded one), the next call's puts are
        made while this unit's commit completes; that unit's own commit begins only
        after this one has ended, and is backed out (PluginError, retriable) if this one
        failed, so units commit in order and a failure takes every later unit with it.
        Refusals (PublishRefusedError) are raised here, before anything is committed.
        """
        if not publications:
            return _ended()
        commands: list[tuple[str, MQMD, bytes]] = []
        for i, pub in enumerate(publications):
            if not pub.origin and self.origin:
                pub = dataclasses.replace(pub, origin=self.origin)
            self._authorise(pub, i)
            try:
                # Whatever cannot be encoded can never be published: refusing it (not
                # retrying) keeps one bad record from blocking its source for ever.
                md, body = publish_command_of(pub, gateway_id=self.gateway_id)
            except PublishRefusedError as exc:
                exc.index = i
                self._count_refused(exc.reason)
                raise
            commands.append((self.queue_for(pub.stream), md, body))
        async with self._lock:
            conn = self._conn
            putting = -1  # index of the put in progress (a failure there is its own)
            try:
                if conn is None:
                    conn = self._conn = await self.qm.connect()
                opts = PutOptions(syncpoint=True)
                for i, (queue, md, body) in enumerate(commands):
                    putting = -1  # an open failing is the queue's fault, not the message's
                    handle = self._handles.get(queue)
                    if handle is None:
                        handle = await conn.open(queue, OpenOption.OUTPUT)
                        self._handles[queue] = handle
                    putting = i
                    await handle.put(md, body, opts)
                putting = -1
                await self._end_front()
                committing = start_commit(conn)
                if committing is None:
                    await conn.commit()
            except MQError as exc:
                self.counters.failures += 1
                await self._end_front_quietly()
                if putting >= 0 and exc.reason in REFUSED_PUT_REASONS:
                    # This message can never be put: back the others out (they are
                    # published again by the caller) but keep the connection.
                    await self._back_out(conn)
                    self._count_refused(exc.reason)
                    pub = publications[putting]
                    raise PublishRefusedError(
                        f"publication on {pub.stream!r}/{pub.topic!r} refused by MQ: {exc}",
                        index=putting,
                        reason=exc.reason,
                    ) from exc
                await self._drop(conn)
                raise PluginError(f"cannot publish into MQ: {exc}", retriable=True) from exc
            except BaseException:
                self.counters.failures += 1
                await self._end_front_quietly()
                await self._drop(conn)
                raise
            if committing is None:
                self._committed(publications)
                return _ended()
            front = asyncio.ensure_future(self._commit_ended(committing, publications))
            self._front = front
            return front

    async def _commit_ended(
        self, committing: asyncio.Future[None],
        publications: Sequence[Envelope],
    ) -> None:
        """The end of a begun commit: counted once committed; a failed one (the queue
        manager backed the unit out) is raised as publish raises it, and the next unit,
        put meanwhile, is backed out with it (:meth:`_end_front`)."""
        try:
            await committing
        except MQError as exc:
            self.counters.failures += 1
            raise PluginError(f"cannot publish into MQ: {exc}", retriable=True) from exc
        self._committed(publications)

    async def _end_front(self) -> None:
        """Wait for the unit before's begun commit (its failure is this unit's too)."""
        front, self._front = self._front, None
        if front is None:
            return
        if not front.done():
            self.counters.overlapped += 1
        try:
            await asyncio.shield(front)
        except Exception as exc:
            raise MQError(
                Reason.BACKED_OUT, f"the unit of work before this one failed: {exc}"
            ) from exc

    async def _end_front_quietly(self) -> None:
        front, self._front = self._front, None
        if front is not None:
            with contextlib.suppress(Exception):
                await asyncio.shield(front)

    def _committed(self, publications: Sequence[Envelope]) -> None:
        self.counters.units_of_work += 1
        self.counters.publications += len(publications)
        per = self.counters.per_stream
        for pub in publications:
            per[pub.stream] = per.get(pub.stream, 0) + 1

    def _authorise(self, pub: Envelope, index: int) -> None:
        """Refuse (PublishRefusedError, MQRCCF_NOT_AUTHORIZED) a publication on a stream
        or topic the policy does not allow this instance: the plugin dead-letters it."""
        authoriser = self.authoriser
        if authoriser is None or not self.origin:
            return
        who = Principal(PrincipalKind.PLUGIN, self.origin)
        # The stream the command will name: a default-stream topic "$SYS/STREAM/S/..."
        # is stream S's (never judged by the envelope's stream alone).
        st = split_topic(prefixed_topic(pub.stream, pub.topic))
        decision = authoriser.may_publish(who, st.stream, st.topic)
        if decision.allowed:
            return
        authoriser.count(f"plugin:{self.origin}", decision)  # counted, logged summarised
        self._count_refused(Reason.CF_NOT_AUTHORIZED)
        raise PublishRefusedError(decision.detail, index=index, reason=Reason.CF_NOT_AUTHORIZED)

    def _count_refused(self, reason: int) -> None:
        key = reason_text(reason) if reason else "UNENCODABLE"
        self.counters.refused[key] = self.counters.refused.get(key, 0) + 1

    async def _back_out(self, conn: Connection | None) -> None:
        """Back the unit of work out; a failing backout drops the connection."""
        if conn is None:
            return
        try:
            await conn.backout()
        except MQError:
            await self._drop(conn)

    async def _drop(self, conn: Connection | None) -> None:
        """Back out and forget the connection (a fresh one is made on next publish)."""
        self._conn = None
        self._handles.clear()
        if conn is None:
            return
        with contextlib.suppress(MQError):
            await conn.backout()
        with contextlib.suppress(MQError):
            await conn.disconnect()

    async def close(self) -> None:
        async with self._lock:
            await self._end_front_quietly()
            conn, self._conn = self._conn, None
            handles, self._handles = list(self._handles.values()), {}
            for handle in handles:
                with contextlib.suppress(MQError):
                    await handle.close()
            if conn is not None:
                with contextlib.suppress(MQError):
                    await conn.disconnect()


class HostedPluginContext:
    """The :class:`~gateway.plugin_api.PluginContext` of one instance in a
    :class:`BrokerService` process: its sink subscriptions are the instance's name."""

    def __init__(
        self, service: BrokerService, instance_name: str, gateway_id: str, publisher: MQPublisher
    ) -> None:
        self._service = service
        self._name = instance_name
        self._gateway_id = gateway_id
        self._publisher = publisher

    @property
    def gateway_id(self) -> str:
        return self._gateway_id

    @property
    def instance_name(self) -> str:
        return self._name

    @property
    def publisher(self) -> MQPublisher:
        return self._publisher

    #: Set by PluginHost.attach: the sink wrapper whose retained sends this context marks.
    sink: _CountingSink | None = None

    async def subscribe(self, topic: str, *, scheme: Scheme = Scheme.TOPIC) -> None:
        sink = self.sink
        if sink is not None:
            sink.subscribing += 1
        try:
            await self._service.subscribe_sink(
                self._name, topic, scheme=scheme, reg_opts=RegOpt.NONE
            )
        finally:
            if sink is not None:
                sink.subscribing -= 1

    async def unsubscribe(self, topic: str, *, scheme: Scheme = Scheme.TOPIC) -> bool:
        return await self._service.unsubscribe_sink(self._name, topic, scheme=scheme)


@dataclass(slots=True)
class SinkCounters:
    """Per-instance outbound figures (exported as metrics)."""

    deliveries: int = 0
    deletions: int = 0
    units_of_work: int = 0
    failures: int = 0
    #: retained publications sent on subscribe that the instance refused for good
    retained_skipped: int = 0
    per_stream: dict[str, int] = field(default_factory=dict)


class _CountingSink:
    """Wraps an instance's ``send`` for metrics; the broker service awaits it.

    Until the instance has started (its target may be down at boot), a send fails
    *retriably*, so the broker holds the batch on MQ instead of backing it out."""

    def __init__(self, instance: PluginInstance, counters: SinkCounters, started: set[str]) -> None:
        self.instance = instance
        self.counters = counters
        self._started = started
        #: called with (instance name, deliveries) once acknowledged (metrics)
        self.observer: Callable[[str, Sequence[Envelope]], None] | None = None
        #: >0 while the instance's context subscribes (retained deliveries are sent)
        self.subscribing = 0

    async def send(self, deliveries: Sequence[Envelope]) -> None:
        items = deliveries
        if self.instance.name not in self._started:
            raise PluginError(
                f"plugin instance {self.instance.name} has not started", retriable=True
            )
        try:
            await self.instance.send(items)
        except Exception as exc:
            self.counters.failures += 1
            if (
                self.subscribing
                and not getattr(exc, "retriable", False)
                and not isinstance(exc, DeliveryRefusedError)  # the forwarder DLQs it
                and all(d.from_retained_store for d in items)
            ):
                items = await self._send_retained_one_by_one(items, exc)
            else:
                raise
        except BaseException:
            self.counters.failures += 1
            raise
        if not items:
            return
        c = self.counters
        c.units_of_work += 1
        c.deliveries += len(items)
        for d in items:
            c.per_stream[d.stream] = c.per_stream.get(d.stream, 0) + 1
            if d.delete:
                c.deletions += 1
        if self.observer is not None:
            self.observer(self.instance.name, items)

    async def _send_retained_one_by_one(
        self, deliveries: Sequence[Envelope], first: Exception
    ) -> list[Envelope]:
        """Retained deliveries on subscribe that the instance refuses for good must not
        make its start fail for ever: send them one at a time and skip the refused ones
        (logged, counted); the next publication on such a topic replaces it anyway."""
        sent: list[Envelope] = []
        for d in deliveries:
            try:
                await self.instance.send([d])
            except Exception as exc:
                if getattr(exc, "retriable", False):
                    raise
                self.counters.retained_skipped += 1
                log.error(
                    "plugin instance %s refused the retained publication on %r, skipped: %s",
                    self.instance.name,
                    d.topic,
                    exc,
                )
                continue
            sent.append(d)
        log.debug("retained batch for %s first failed with %r", self.instance.name, first)
        return sent


class PluginHost:
    """Runs plugin instances against one :class:`BrokerService`.

    :meth:`attach` registers an instance's sink *before* the broker service starts
    serving (else its deliveries would be dead-lettered as "no such sink");
    :meth:`start` then starts it with its context. ``gateway_id`` is stable across
    restarts (client ids, origins).
    """

    def __init__(
        self,
        qm: QueueManager,
        service: BrokerService,
        gateway_id: str,
        *,
        authoriser: Authoriser | None = None,
    ) -> None:
        self.qm = qm
        #: Bounds every instance's inbound publications (``authorisation.plugins``).
        self.authoriser = authoriser
        self.service = service
        self.gateway_id = gateway_id
        self.instances: dict[str, PluginInstance] = {}
        self.contexts: dict[str, HostedPluginContext] = {}
        self.sink_counters: dict[str, SinkCounters] = {}
        self.started: set[str] = set()
        self.started_at = time.time()
        #: Called with (instance name, deliveries) after each acknowledged send (metrics).
        self.observer: Callable[[str, Sequence[Envelope]], None] | None = None

    def publisher_for(self, instance_name: str) -> MQPublisher:
        return MQPublisher(
            self.qm,
            origin=instance_name,
            gateway_id=self.gateway_id,
            serviced_queues=lambda: {q for q, _ in self.service.serviced_queues},
            authoriser=self.authoriser,
        )

    def attach(self, instance: PluginInstance) -> HostedPluginContext:
        """Register ``instance`` as a sink and build its context (no I/O)."""
        name = instance.name
        if name in self.instances:
            raise PluginError(f"two plugin instances are called {name!r}; names must be unique")
        counters = SinkCounters()
        sink = _CountingSink(instance, counters, self.started)
        sink.observer = self._observe
        self.service.register_sink(name, sink)
        ctx = HostedPluginContext(self.service, name, self.gateway_id, self.publisher_for(name))
        ctx.sink = sink
        self.instances[name] = instance
        self.contexts[name] = ctx
        self.sink_counters[name] = counters
        return ctx

    async def start(self, instance: PluginInstance) -> HostedPluginContext:
        """Attach (if needed) and start ``instance``."""
        ctx = self.contexts.get(instance.name) or self.attach(instance)
        # Marked first: start() subscribes, and subscribing sends retained deliveries.
        self.started.add(instance.name)
        try:
            await instance.start(ctx)
        except BaseException:
            self.started.discard(instance.name)
            raise
        return ctx

    async def stop(self, name: str) -> None:
        """Stop one instance (flush first) and close its publisher connection."""
        instance = self.instances.get(name)
        if instance is None:
            return
        try:
            if name in self.started:
                try:
                    await instance.flush()
                finally:
                    await instance.stop()
        finally:
            self.started.discard(name)
            await self.contexts[name].publisher.close()

    async def stop_all(self) -> None:
        """Stop every instance, in reverse order of attachment; errors are logged."""
        for name in reversed(list(self.instances)):
            try:
                await self.stop(name)
            except Exception:
                log.exception("plugin instance %s did not stop cleanly", name)

    def _observe(self, name: str, deliveries: Sequence[Envelope]) -> None:
        if self.observer is not None:
            self.observer(name, deliveries)

    def healthy(self) -> dict[str, bool]:
        """Health of each attached instance (False when not started)."""
        out: dict[str, bool] = {}
        for name, inst in self.instances.items():
            try:
                out[name] = name in self.started and bool(inst.healthy())
            except Exception:
                out[name] = False
        return out
