"""The running gateway: queue manager + broker service + plugin instances + metrics.

``mqgw run`` builds a :class:`GatewayApp` from a validated config and runs it until
SIGTERM/SIGINT. Tasks: one per serviced queue (the broker service's), one per plugin
instance (start with jittered retry, then watch), the embedded queue manager's expiry
sweep, a queue-depth sampler and the HTTP endpoint; the broker service runs one
forwarder per plugin instance from its backlog queue. Every route's subscription is
registered before the first get (``DeclaresSubscriptions``). Shutdown order is what makes
a stop lossless: the broker finishes (or backs out) the batches in flight — a sink
delivery is committed onto its backlog queue with its publication, and a forwarder
commits its get only after the sink acknowledged — then each plugin flushes and stops
(inbound units of work finish), then the queue manager and the store close. Before all
that, the broker takes no new batch, so the stops in front of its drain (workers, the
local socket, neighbour links, request/reply) do not let it work the streams off. The
request/reply service (gateway/runtime/request_reply/) starts after the broker service,
is handed each plugin instance with ``Exchanges`` after its start, and stops before the
broker's drain.

Over 500 lines: one process lifecycle (start order, shutdown order, plugin start retry,
health) read together; its parts already live in their own modules.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import sqlite3
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gateway.mq.port import MQError, OpenOption, QueueAttr, QueueManager
from gateway.plugin_api import (
    DeclaresSubscriptions,
    Exchanges,
    OwnsTopics,
    PluginError,
    PluginInstance,
)
from gateway.pubsub.authorisation import Authoriser
from gateway.pubsub.engine import PubSubEngine
from gateway.pubsub.errors import StoreError
from gateway.pubsub.sqlite_store import SqliteStore
from gateway.runtime.authorisation import authoriser_for
from gateway.runtime.backlog_seal import BacklogSeal, load_backlog_seal
from gateway.runtime.config import (
    EmbeddedQueueManagerConfig,
    GatewayConfig,
    IBMMQQueueManagerConfig,
    LoadedConfig,
)
from gateway.runtime.dashboard import DashboardSource
from gateway.runtime.errors import GatewayRuntimeError
from gateway.runtime.gc_policy import GcPolicy, apply_gc_policy
from gateway.runtime.instance_lock import InstanceRecord
from gateway.runtime.metrics import GatewayMetrics, HealthServer, server_ssl_context
from gateway.runtime.neighbours.attach import links_for, runs_neighbour_links, with_admin_stream
from gateway.runtime.neighbours.links import NeighbourLinks
from gateway.runtime.neighbours.state import neighbours_db_of
from gateway.runtime.neighbours.status import neighbour_status
from gateway.runtime.network_check.check import NetworkReport, check_network
from gateway.runtime.network_check.collect import node_view, sink_streams
from gateway.runtime.network_check.view import NodeView
from gateway.runtime.plugin_host import PluginHost
from gateway.runtime.pubsub_service import (
    DEAD_LETTER_QUEUE,
    BrokerConfig,
    BrokerError,
    BrokerService,
)
from gateway.runtime.pubsub_service.forgiven_backouts import ForgivenBackouts
from gateway.runtime.registry import PluginRegistry
from gateway.runtime.request_reply import RequestReplyService, reply_queue_mqsc, start_request_reply
from gateway.runtime.streams.check import StreamReport
from gateway.runtime.streams.health import DeadLetterCache, collect_report, remembered_neighbours
from gateway.runtime.streams.repair import define_stream_queue
from gateway.runtime.streams.sink_ownership import SinkDecision, SinkGate
from gateway.runtime.switch_interval import SwitchInterval, apply_switch_interval

if TYPE_CHECKING:
    from gateway.mq.embedded.network import QueueManagerNode
    from gateway.mq.embedded.qm_server import QueueManagerServer
    from gateway.runtime.workers import WorkerProcess

log = logging.getLogger(__name__)


#: Share of ``shutdown_timeout`` the broker drain may take; the rest stops the plugins.
DRAIN_SHARE = 0.6
#: Least time plugins get to stop even when the drain used the whole budget.
MIN_STOP_S = 1.0


def _own_topics(
    instances: list[PluginInstance], config: GatewayConfig
) -> Callable[[str, str], str]:
    """(instance, topic) -> why ``topic`` is kept for itself by that instance or by
    another instance of the same plugin (two Kafka instances may share a cluster, two
    MQTT instances a broker), "" when by none (docs/security.md, "Destinations named
    from outside")."""
    kind = {p.name: p.plugin for p in config.plugins}

    def own_topic(instance: str, topic: str) -> str:
        for other in instances:
            if kind.get(other.name) != kind.get(instance) or not isinstance(other, OwnsTopics):
                continue
            why = other.own_topic(topic)
            if why:
                return why if other.name == instance else f"{why} (plugin instance {other.name!r})"
        return ""

    return own_topic


def _log_task_failure(task: asyncio.Task[None]) -> None:
    """A background task must never die unnoticed."""
    if task.cancelled():
        return
    exc = task.exception()
    if exc is not None:
        log.error("task %s failed", task.get_name(), exc_info=exc)


class GatewayApp:
    """One gateway process (see module docstring)."""

    def __init__(
        self,
        loaded: LoadedConfig,
        registry: PluginRegistry,
        instance: InstanceRecord | None = None,
    ) -> None:
        self.loaded = loaded
        #: This instance of the node (``mqgw run`` holds its lock; in-process: unlocked).
        self.instance = instance or InstanceRecord.of_this_process(False)
        self.config = loaded.gateway
        self.registry = registry
        self.qm: QueueManager | None = None
        #: The embedded queue manager's network node (listener, channels), if embedded.
        self.node: QueueManagerNode | None = None
        self.store: SqliteStore | None = None
        self.service: BrokerService | None = None
        self.links: NeighbourLinks | None = None
        self.host: PluginHost | None = None
        self.metrics: GatewayMetrics | None = None
        self.http: HealthServer | None = None
        self.request_reply: RequestReplyService | None = None
        #: The embedded queue manager's local socket (``mqgw qm``, separate MQ programs).
        self.qm_server: QueueManagerServer | None = None
        #: Stream/topic/subscriber-queue authorisation (docs/security.md).
        self.authoriser: Authoriser | None = None
        self.stop_requested = asyncio.Event()
        #: Set when a plugin cannot work with its config: the process exits 1.
        self.fatal: str | None = None
        self._tasks: list[asyncio.Task[None]] = []
        #: Unexpected (non-PluginError) exceptions from plugin start, all retried.
        self.plugin_start_errors = 0
        self._depths: dict[str, int] = {}
        #: the stream union's health (docs/neighbours.md), sampled with the depths
        self.stream_report: StreamReport | None = None
        self._dead_letters = DeadLetterCache()
        #: this node as ``mqgw network check`` reads it (``/network`` on the metrics
        #: listener), and the check of its own neighbourhood (the dashboard and
        #: ``mqgw_network_problems``), sampled with the depths
        self.network_view: NodeView | None = None
        self.network_report: NetworkReport | None = None
        self._sinks_seen: tuple[int, dict[str, list[str]]] = (-1, {})
        self._network_error = ""
        self._started = False
        self._recheck_pending = False
        #: Worker processes forwarding groups of plugin instances (gateway/runtime/workers/).
        self.workers: list[WorkerProcess] = []
        #: The garbage-collector policy applied once started (``gc:``), released at shutdown.
        self.gc_policy: GcPolicy | None = None
        self.switch_interval: SwitchInterval | None = None

    # ---------------------------------------------------------------- building -------

    async def _open_queue_manager(self) -> QueueManager:
        qmc = self.config.queue_manager
        if isinstance(qmc, EmbeddedQueueManagerConfig):
            return await self._start_node(qmc)
        return self._ibmmq_queue_manager()

    async def _start_node(self, qmc: EmbeddedQueueManagerConfig) -> QueueManager:
        """The embedded queue manager as a network node (gateway/runtime/network_node.py):
        MQSC, missing stream queues, then listener and channels."""
        from gateway.mq.embedded.mqsc import MQSCError
        from gateway.mq.embedded.qmgr import EmbeddedQueueManager
        from gateway.mq.embedded.space import SpacePolicy
        from gateway.runtime.network_node import start_node

        data = self.loaded.path(qmc.data_dir)
        try:
            data.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise GatewayRuntimeError(
                f"queue_manager.data_dir {data}: cannot be created ({exc.strerror})"
            ) from None
        mqsc_path = self.loaded.path(qmc.mqsc_file) if qmc.mqsc_file else None
        mqsc = mqsc_path.read_text(encoding="utf-8") if mqsc_path is not None else ""

        def define_stream_queues(qm: EmbeddedQueueManager) -> None:
            if not qmc.define_stream_queues:
                return
            for s in self.config.broker.streams:
                if s.name not in qm.catalogue.queues:
                    define_stream_queue(qm, s.name)
                    log.info("defined stream queue %s", s.name)
            rr = self.config.request_reply
            if (rr.requests or rr.services) and rr.reply_queue not in qm.catalogue.queues:
                qm.run_mqsc(reply_queue_mqsc(rr.reply_queue), stop_on_error=True)

        try:
            self.node = await start_node(
                qmc.name,
                data,
                mqsc=mqsc,
                listener_port=qmc.listener_port,
                address_book=qmc.address_book,
                appl_name="mqgw",
                before_channels=define_stream_queues,
                space=SpacePolicy(qmc.min_free_mb * 2**20, qmc.store_reserve_mb * 2**20),
            )
        except MQSCError as exc:
            raise GatewayRuntimeError(f"queue_manager.mqsc_file {mqsc_path}: {exc}") from exc
        except sqlite3.Error as exc:
            raise GatewayRuntimeError(f"queue_manager.data_dir {data}: {exc}") from None
        except OSError as exc:
            if exc.filename is not None and Path(exc.filename).is_relative_to(data):
                raise GatewayRuntimeError(
                    f"queue_manager.data_dir {data}: {exc.filename}: {exc.strerror}"
                ) from None
            raise GatewayRuntimeError(
                f"queue_manager.listener_port {qmc.listener_port} cannot be used "
                f"({exc.strerror}); choose another port or 0 for any free port"
            ) from exc
        return self.node.qm

    def _ibmmq_queue_manager(self) -> QueueManager:
        qmc = self.config.queue_manager
        assert isinstance(qmc, IBMMQQueueManagerConfig)
        from gateway.mq.ibmmq import IBMMQConfig, IBMMQQueueManager

        try:
            where: dict[str, Any] = (
                {"conname": qmc.conname} if qmc.conname is not None
                else {"host": qmc.host, "port": qmc.port})
            config = IBMMQConfig(
                q_mgr_name=qmc.name,
                **where,
                reconnect=qmc.reconnect,
                channel=qmc.channel,
                user=qmc.user,
                password=qmc.password_secret(),
                tls_cipher_spec=qmc.tls_cipher_spec,
                key_repository=qmc.key_repository,
                key_repository_password=qmc.key_repository_password,
                cert_label=qmc.cert_label,
            )
        except ValueError as exc:
            raise GatewayRuntimeError(f"queue_manager: {exc}") from None
        return IBMMQQueueManager(config)

    def _broker_config(self) -> BrokerConfig:
        section = self.config.broker
        return BrokerConfig.model_validate(section.model_dump(exclude={"store"}))

    def _definitions_changed(self, kind: str, name: str) -> None:
        """A queue was defined, altered or deleted, or the queue manager altered (its
        DEADQ) (MQSC on the running queue manager): subscriptions whose queue now is, or
        resolves to, one of the gateway's own are removed
        (docs/security.md, "Destinations named from outside"). At most one re-check is
        pending at a time, so a long MQSC script costs one."""
        if kind not in ("QUEUE", "QMGR") or self.service is None or self._recheck_pending:
            return
        self._recheck_pending = True
        service = self.service

        async def recheck() -> None:
            self._recheck_pending = False
            removed = await service.drop_subscriptions_to_own_queues()
            if removed:
                log.warning("%d subscription(s) removed: %s %s changed so that their "
                            "queues are or resolve to the gateway's own", removed,
                            kind.lower(), name)

        task = asyncio.create_task(recheck(), name="recheck-subscriber-queues")
        task.add_done_callback(_log_task_failure)
        task.add_done_callback(self._forget_task)
        self._tasks.append(task)

    def _forget_task(self, task: asyncio.Task[None]) -> None:
        with contextlib.suppress(ValueError):
            self._tasks.remove(task)

    # ---------------------------------------------------------------- lifecycle ------

    async def start(self) -> None:
        """Open everything and start serving; raises GatewayRuntimeError on failure
        (whatever was opened is closed again)."""
        try:
            await self._start()
        except BaseException:
            await self.shutdown()
            raise

    @staticmethod
    def _backlog_seal(qm: QueueManager, store_path: Path) -> BacklogSeal:
        """The sinks' backlog seal: its key is kept where the backlogs are, the embedded
        queue manager's data directory, or beside the broker store on IBM MQ. A key made
        now is kept once the service has sealed what the backlogs hold
        (``SinkBacklogs.seal_what_is_there``, before any put to them)."""
        path = getattr(qm, "path", None)
        where = path if isinstance(path, Path) else store_path.parent
        try:
            return load_backlog_seal(where)
        except (OSError, ValueError) as exc:
            raise GatewayRuntimeError(f"cannot use the backlog key in {where}: {exc}") from exc

    async def _start(self) -> None:
        self._started = True
        try:
            self.qm = qm = await self._open_queue_manager()
        except MQError as exc:
            raise GatewayRuntimeError(f"cannot open the queue manager: {exc}") from exc
        store_path = self.loaded.path(self.config.broker.store)
        try:
            store_path.parent.mkdir(parents=True, exist_ok=True)
            self.store = SqliteStore(store_path)
        except OSError as exc:
            raise GatewayRuntimeError(
                f"broker.store {store_path}: cannot be created ({exc.strerror})"
            ) from None
        except StoreError as exc:
            raise GatewayRuntimeError(f"broker.store {store_path}: {exc}") from None
        broker = self._broker_config()
        self.authoriser = authoriser_for(self.config, qm, broker.broker_queues)
        engine = PubSubEngine(
            qm.name,
            self.store,
            broker_queues=broker.broker_queues,
            suspend_after=broker.suspend_subscription_after,
            authoriser=self.authoriser,
        )
        linked = runs_neighbour_links(self.config, store_path)
        self.service = service = BrokerService(
            qm,
            engine,
            with_admin_stream(broker) if linked else broker,
            forgiven=ForgivenBackouts(store_path),
            backlog_seal=self._backlog_seal(qm, store_path),
        )
        if linked:
            self.links = links_for(service, store_path, self.config.neighbours)
        listeners = getattr(qm, "definition_listeners", None)
        if listeners is not None:  # the embedded queue manager: MQSC may define an alias
            listeners.append(self._definitions_changed)
        self.host = host = PluginHost(
            qm, service, self.config.gateway_id, authoriser=self.authoriser
        )
        instances: list[PluginInstance] = []
        remote: dict[str, PluginInstance] = {}  # run by worker processes
        worker_of = _workers_of(self.loaded)
        for inst_cfg in self.config.plugins:
            if not inst_cfg.enabled:
                continue
            plugin = self.registry.get(inst_cfg.plugin)
            try:
                instance = plugin.create(inst_cfg.name, self.loaded.plugin_configs[inst_cfg.name])
            except PluginError as exc:
                raise GatewayRuntimeError(f"plugin instance {inst_cfg.name}: {exc}") from exc
            if inst_cfg.name in worker_of:
                from gateway.runtime.workers import RemoteSink

                # its backlog is filled here, a worker forwards it (never started here)
                service.sink_backlogs.remote.add(inst_cfg.name)
                service.register_sink(inst_cfg.name,
                                      RemoteSink(inst_cfg.name, worker_of[inst_cfg.name]))
                remote[inst_cfg.name] = instance
                continue
            host.attach(instance)  # sinks exist before the first batch is served
            instances.append(instance)
        self.metrics = GatewayMetrics(
            service,
            host,
            self._current_depths,
            lambda: self.plugin_start_errors,
            lambda: self.stream_report,
            neighbours=self.links,
            request_reply=lambda: self.request_reply,
            authoriser=self.authoriser,
            network_report=lambda: self.network_report,
            instance=self.instance,
        )
        host.observer = self.metrics.observe
        await self._sample_depths()
        try:
            await self._apply_sink_ownership()
            await self._register_planned_subscriptions([*instances, *remote.values()])
            await service.start()
            if self.stop_requested.is_set():
                service.request_stop()  # a SIGTERM during start-up: its start cleared it
            if self.links is not None:
                await self.links.start()
            self.request_reply = await start_request_reply(
                qm,
                self.config.request_reply,
                self.loaded.path(self.config.request_reply.store),
                self.config.broker.dead_letter_queue or DEAD_LETTER_QUEUE,
                self.authoriser,
                _own_topics([*instances, *remote.values()], self.config),
            )
        except BrokerError as exc:
            raise GatewayRuntimeError(str(exc)) from exc
        except MQError as exc:
            raise GatewayRuntimeError(
                f"cannot start the neighbour links: {exc} (define "
                "SYSTEM.BROKER.INTER.BROKER.COMMUNICATIONS, docs/neighbours.md)"
            ) from exc
        mc = self.config.metrics
        if mc.enabled:
            try:
                tls = server_ssl_context(mc.tls, self.loaded.path) if mc.tls else None
            except ValueError as exc:
                raise GatewayRuntimeError(str(exc)) from None
            self.http = HealthServer(
                self.metrics, self.health, mc.host, mc.port, ssl_context=tls, auth=mc.auth,
                dashboard=self._dashboard_source() if mc.dashboard else None,
                network=lambda: self.network_view,
            )
            try:
                await self.http.start()
            except OSError as exc:
                raise GatewayRuntimeError(
                    f"metrics.port {mc.port} on {mc.host} cannot be used ({exc.strerror}); "
                    "choose another metrics.port"
                ) from exc
            log.info("metrics on %s/metrics%s", self.http.url,
                     " (authentication required)" if mc.auth and mc.auth.protect_metrics else "")
        await self._serve_queue_manager(store_path)
        await self._start_workers(remote)
        for instance in instances:
            self._spawn(self._run_plugin(instance), f"plugin:{instance.name}")
        self._spawn(self._housekeeping(), "housekeeping")
        log.info(
            "gateway %s started: queue manager %s, %d stream queue(s), %d plugin instance(s)",
            self.config.gateway_id,
            qm.name,
            len(service.serviced_queues) - 1,
            len(instances),
        )
        # start-up complete (config, queue manager, store, plugins constructed)
        self.gc_policy = apply_gc_policy(self.config.gc, who=f"gateway {self.config.gateway_id}")
        self.switch_interval = apply_switch_interval(f"gateway {self.config.gateway_id}")

    def _dashboard_source(self) -> DashboardSource:
        """The live dashboard's view of this gateway (docs/dashboard.md)."""
        assert self.qm is not None and self.service is not None and self.host is not None
        return DashboardSource(
            gateway_id=self.config.gateway_id,
            q_mgr=self.qm.name,
            plugin_kinds={p.name: p.plugin for p in self.config.plugins},
            service=self.service,
            host=self.host,
            health=self.health,
            depths=self._current_depths,
            stream_report=lambda: self.stream_report,
            neighbours=self.links,
            request_reply=lambda: self.request_reply,
            dead_letter_queue=self.config.broker.dead_letter_queue or DEAD_LETTER_QUEUE,
            network_report=lambda: self.network_report,
        )

    async def _serve_queue_manager(self, store_path: Path) -> None:
        """The local socket of the embedded queue manager (docs/embedded-qm.md); the
        gateway's own traffic does not need it, so one that cannot be made is logged."""
        if self.node is None:
            return
        from gateway.runtime.qm_status import serve_local_socket

        self.qm_server = await serve_local_socket(
            self.node.qm, store_path, runner="gateway", log=log
        )

    async def _start_workers(self, instances: dict[str, PluginInstance]) -> None:
        """Spawn the ``workers:`` processes; they reach the queue manager over its local
        socket, so without that socket they cannot run (a start failure)."""
        if not self.config.workers:
            return
        from gateway.runtime.workers import WorkerCollector, WorkerProcess, worker_specs

        service = self.service
        assert service is not None
        if self.qm_server is None:
            raise GatewayRuntimeError("workers: need the queue manager's local socket, which "
                                      "could not be made (see the error above)")
        specs = worker_specs(
            self.loaded, socket=str(self.qm_server.path), backlogs=dict(service.backlogs),
            dead_letter_queue=service._dlq or self.config.broker.dead_letter_queue
            or DEAD_LETTER_QUEUE,
            serviced_queues=[q for q, _ in service.serviced_queues], instances=instances,
            backlog_key=service.sink_backlogs.seal.key,
        )
        delays = {w.name: w.restart_max_delay for w in self.config.workers}
        if self.metrics is not None:
            self.metrics.registry.register(WorkerCollector(lambda: self.workers))
        for spec in specs:
            worker = WorkerProcess(spec, restart_max_delay=delays[spec.group],
                                   on_fatal=self._worker_fatal)
            self.workers.append(worker)
            await worker.start()

    def _worker_fatal(self, message: str) -> None:
        self.fatal = message
        log.error("%s", message)
        self.request_stop()

    async def _apply_sink_ownership(self) -> None:
        """``sinks: owner`` streams: their sinks subscribe only while this node owns the
        stream by its route (docs/scaling.md, "Moving a stream"); a non-owner drops
        the sink subscriptions its store kept."""
        routes = {s.name: s.publishing_route for s in self.config.broker.streams
                  if s.sinks == "owner"}
        service, qm = self.service, self.qm
        if not routes or service is None or qm is None:
            return
        catalogue = getattr(qm, "catalogue", None)
        if catalogue is None:
            raise GatewayRuntimeError(
                f"broker.streams {', '.join(routes)}: sinks: owner reads the route on the "
                "embedded queue manager; on IBM MQ use sinks: always")

        def lookup(name: str) -> tuple[str, str, str, str] | None:
            q = catalogue.get(name)
            if q is None:
                return None
            return q.qtype.mqsc, q.target, q.remote_name, q.remote_q_mgr_name

        gate = SinkGate(qm.name, routes, lookup, lambda why: log.info("sinks: %s", why))
        for stream in routes:
            if gate(stream) is SinkDecision.WITHHOLD:
                for sub in await service.unsubscribe_sinks(stream):
                    log.info("sinks: removed sink %s's subscription to %r on %s (another "
                             "node owns the stream)", sub.destination.sink, sub.topic, stream)
        service.sink_gate = lambda stream: gate(stream) is SinkDecision.SUBSCRIBE

    async def _register_planned_subscriptions(self, instances: list[PluginInstance]) -> None:
        """Every route's subscription exists before the first get (issue 12 item 9): what
        a stream queue holds at the first start reaches the plugin's backlog even while
        the plugin itself cannot start yet. Durable and idempotent, like the plugin's own
        subscribe in start()."""
        service = self.service
        assert service is not None
        for instance in instances:
            if not isinstance(instance, DeclaresSubscriptions):
                continue
            for topic, scheme in instance.planned_subscriptions():
                await service.subscribe_sink(instance.name, topic, scheme=scheme)

    def _spawn(self, coro: Coroutine[Any, Any, None], name: str) -> None:
        task = asyncio.create_task(coro, name=name)
        task.add_done_callback(_log_task_failure)
        self._tasks.append(task)

    async def run(self) -> int:
        """Start, serve until :meth:`request_stop`, shut down; the exit status."""
        await self.start()
        try:
            await self.stop_requested.wait()
        finally:
            await self.shutdown()
        if self.fatal:
            log.error("stopped: %s", self.fatal)
            return 1
        return 0

    def request_stop(self) -> None:
        """SIGTERM/SIGINT, a fatal plugin or worker: stop. The broker takes no new
        batch from this moment, not only once :meth:`shutdown` gets going."""
        self.stop_requested.set()
        if self.service is not None:
            self.service.request_stop()

    async def shutdown(self) -> None:
        """Drain, flush, commit and close (idempotent)."""
        if not self._started:
            return
        self._started = False
        log.info("gateway %s stopping: finishing the batches in flight", self.config.gateway_id)
        # No plugin start retries from here on, and no batch is begun by the broker (a
        # get already waiting may still bring one per queue; those in progress finish).
        # The stops before the drain take their time (a neighbour link's reader ends its
        # wait) and the streams must not be worked off meanwhile. The same stop ends the
        # sink forwarders after the batch each holds, and sends the hand-overs of the
        # batches in flight through the backlog (service.stop() takes back the copies a
        # sink acknowledged).
        self.request_stop()
        if self.gc_policy is not None:  # Python's settings back (a test process goes on)
            self.gc_policy.release()
            self.gc_policy = None
        if self.switch_interval is not None:
            self.switch_interval.release()
            self.switch_interval = None
        timeout = self.config.shutdown_timeout
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        if self.workers:
            # workers first: they finish (or back out) their batches over the socket
            workers, self.workers = self.workers, []
            share = max(MIN_STOP_S, timeout * (1 - DRAIN_SHARE))
            await asyncio.gather(*(w.stop(share) for w in workers), return_exceptions=True)
        if self.qm_server is not None:
            # local clients first: their units of work are backed out before the drain
            with contextlib.suppress(Exception):
                await self.qm_server.stop()
            self.qm_server = None
        try:
            if self.links is not None:
                await self.links.stop()
            if self.request_reply is not None:
                await self.request_reply.stop()  # readers back out what they hold
            if self.service is not None:
                # The drain gets a share of the budget so plugins are always stopped
                # (flushed, disconnected) in the time that remains.
                drain = timeout * DRAIN_SHARE
                try:
                    async with asyncio.timeout(drain):
                        await self.service.stop()
                except TimeoutError:
                    log.error("broker drain took longer than %.1f s: stopping anyway", drain)
        finally:
            tasks = list(self._tasks)  # a finished re-check removes itself meanwhile
            for task in tasks:
                task.cancel()
            remaining = max(MIN_STOP_S, deadline - loop.time())
            try:
                async with asyncio.timeout(remaining):
                    for task in tasks:
                        with contextlib.suppress(asyncio.CancelledError, Exception):
                            await task
                    if self.host is not None:
                        await self.host.stop_all()
            except TimeoutError:
                log.error("shutdown took longer than %.0f s: closing anyway", timeout)
            self._tasks.clear()
        if self.http is not None:
            await self.http.stop()
        if self.node is not None:
            with contextlib.suppress(Exception):
                await self.node.stop()  # channels, listener, then the queue manager
        elif self.qm is not None:
            close = getattr(self.qm, "close", None)
            if close is not None:
                with contextlib.suppress(Exception):
                    await close()
        if self.store is not None:
            self.store.close()
        if self.request_reply is not None:
            self.request_reply.store.close()
        if self.links is not None:
            self.links.state.close()
        if self.service is not None:
            self.service.forgiven.close()
            log.info("gateway %s stopped", self.config.gateway_id)

    # ---------------------------------------------------------------- tasks ----------

    async def _run_plugin(self, instance: PluginInstance) -> None:
        """Start ``instance``, retrying retriable failures with jittered backoff."""
        host = self.host
        assert host is not None
        delay = 0.5
        while not self.stop_requested.is_set():
            try:
                await host.start(instance)
                log.info("plugin instance %s started", instance.name)
                if self.request_reply is not None and isinstance(instance, Exchanges):
                    self.request_reply.attach(instance.name, instance)
                return
            except PluginError as exc:
                if not exc.retriable:
                    self.fatal = f"plugin instance {instance.name} cannot start: {exc}"
                    log.error("%s", self.fatal)
                    self.request_stop()
                    return
                log.warning("plugin instance %s cannot start yet: %s", instance.name, exc)
            except (OSError, TimeoutError) as exc:
                log.warning("plugin instance %s cannot start yet: %r", instance.name, exc)
            except Exception:
                # A plugin bug: never end silently (its sink would hold every batch for
                # ever). Log it in full and retry with backoff like a retriable error.
                self.plugin_start_errors += 1
                log.exception(
                    "plugin instance %s failed to start (unexpected error); retrying",
                    instance.name,
                )
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(
                    self.stop_requested.wait(), timeout=delay * random.uniform(0.5, 1.5)
                )
            delay = min(30.0, delay * 2)

    async def _housekeeping(self) -> None:
        """Expiry sweep of the embedded queue manager and queue-depth sampling."""
        interval = self.config.expiry_sweep_interval
        qm = self.qm
        sweep = getattr(qm, "sweep_expired", None)
        next_sweep = time.monotonic() + interval
        while True:
            await asyncio.sleep(min(interval, 5.0))
            if sweep is not None and time.monotonic() >= next_sweep:
                next_sweep = time.monotonic() + interval
                try:
                    removed = await sweep()
                    if removed:
                        log.debug("expired %d message(s)", removed)
                except MQError as exc:
                    log.warning("expiry sweep failed: %s", exc)
            await self._sample_depths()

    def _watched_queues(self) -> list[str]:
        """Serviced queues, every sink's backlog queue and the dead-letter queue."""
        names = [q for q, _ in self.service.serviced_queues] if self.service else []
        backlogs = list(self.service.backlogs.values()) if self.service else []
        return [*names, *backlogs, self.config.broker.dead_letter_queue or DEAD_LETTER_QUEUE]

    def _current_depths(self) -> dict[str, int]:
        """Live depths for the embedded queue manager (no I/O); the last sample else."""
        depth_of = getattr(self.qm, "queue_depth", None)
        if depth_of is None or getattr(self.qm, "closed", False):
            return dict(self._depths)
        out: dict[str, int] = {}
        for q in self._watched_queues():
            with contextlib.suppress(MQError):
                out[q] = int(depth_of(q))
        return out

    async def _sample_streams(self) -> None:
        """The stream union's report for /healthz and /metrics (issue 13 item 5)."""
        qm = self.qm
        if qm is None:
            return
        try:
            conn = await qm.connect()
        except MQError:
            return
        try:
            links = self.links
            self.stream_report = await collect_report(
                conn, self.loaded, browse_limit=1, dead_letters=self._dead_letters,
                remembered=(
                    remembered_neighbours(links.state, self.config.neighbours)
                    if links is not None
                    else {}
                ),
            )
        except MQError as exc:
            log.debug("stream report unavailable: %s", exc)
        finally:
            with contextlib.suppress(MQError):
                await conn.disconnect()

    def _sample_network(self) -> None:
        """This node's view for ``mqgw network check`` and the check of what it alone
        can see (its own definitions and links): memory only, no MQ traffic."""
        service, qm = self.service, self.qm
        if service is None or qm is None:
            return
        revision = service.engine.subscriptions_revision
        if self._sinks_seen[0] != revision:
            self._sinks_seen = (revision, sink_streams(service.engine.subscriptions))
        try:
            self.network_view = view = node_view(
                q_mgr=qm.name,
                gateway_id=self.config.gateway_id,
                serviced=[q for q, _ in service.serviced_queues],
                sinks=self._sinks_seen[1],
                neighbours=self.links.state if self.links is not None else None,
                qm=qm,
            )
            self.network_report = check_network([view], neighbourhood=True)
        except Exception as exc:  # never the housekeeping task's end: the last view stays
            if repr(exc) != self._network_error:  # once per distinct error, not every sample
                log.warning("network view unavailable: %r", exc, exc_info=True)
            self._network_error = repr(exc)
        else:
            self._network_error = ""

    async def _sample_depths(self) -> None:
        qm = self.qm
        if qm is None:
            return
        await self._sample_streams()
        self._sample_network()
        depth_of = getattr(qm, "queue_depth", None)
        if depth_of is not None:  # embedded: in memory, no I/O
            for q in self._watched_queues():
                with contextlib.suppress(MQError):
                    self._depths[q] = int(depth_of(q))
            return
        try:
            conn = await qm.connect()
        except MQError:
            return
        try:
            for q in self._watched_queues():
                try:
                    h = await conn.open(q, OpenOption.INQUIRE)
                    attrs = await h.inquire(QueueAttr.CURRENT_Q_DEPTH)
                    self._depths[q] = int(attrs.get(QueueAttr.CURRENT_Q_DEPTH, 0))
                    await h.close()
                except MQError:
                    continue
        finally:
            with contextlib.suppress(MQError):
                await conn.disconnect()

    # ---------------------------------------------------------------- health ---------

    def health(self) -> tuple[bool, dict[str, object]]:
        """(healthy, detail) for /healthz: serving, every plugin instance healthy, and
        request/reply's MQ loops working."""
        plugins = self.host.healthy() if self.host is not None else {}
        for worker in self.workers:
            plugins.update(worker.healthy())
        serving = self.service is not None and self.service.running
        rr_ok = self.request_reply is None or self.request_reply.healthy
        ok = serving and all(plugins.values()) and rr_ok and not self.fatal
        return ok, {
            "status": "ok" if ok else "degraded",
            "gateway": self.config.gateway_id,
            "instance": {"role": "active", **self.instance.to_json()},
            "broker_serving": serving,
            "suspended_subscriptions": (
                self.service.engine.suspended_subscriptions if self.service is not None else 0
            ),
            "plugins": plugins,
            "queue_depths": self._current_depths(),
            "streams": self.stream_report.to_json() if self.stream_report else None,
            "neighbours": (
                neighbour_status(self.links.state, time.time()) if self.links is not None else []
            ),
            "request_reply": self.request_reply.stats() if self.request_reply else None,
        }


def _workers_of(loaded: LoadedConfig) -> dict[str, str]:
    """Plugin instance -> the worker group running it (none configured: empty)."""
    return {p: w.name for w in loaded.gateway.workers for p in w.plugins}


def node_directory(loaded: LoadedConfig) -> Path:
    """The directory whose lock makes an instance the node's active one (gateway/runtime/
    instance_lock.py): the embedded queue manager's data directory, on IBM MQ the
    directory of ``broker.store``."""
    qmc = loaded.gateway.queue_manager
    if isinstance(qmc, EmbeddedQueueManagerConfig):
        return loaded.path(qmc.data_dir)
    return loaded.path(loaded.gateway.broker.store).parent


def data_paths(loaded: LoadedConfig) -> list[Path]:
    """Every directory and file a config makes the gateway write: ``run --check``'s
    ``writes:``, which is what a backup copies (docs/operations.md)."""
    gw = loaded.gateway
    store = loaded.path(gw.broker.store)
    out = [store]
    qmc = gw.queue_manager
    if isinstance(qmc, EmbeddedQueueManagerConfig):
        out.insert(0, loaded.path(qmc.data_dir))
    if runs_neighbour_links(gw, store):
        out.append(neighbours_db_of(store))  # the links' state
    if gw.request_reply.requests or gw.request_reply.services:
        out.append(loaded.path(gw.request_reply.store))
    return out
