"""The ``kafka`` plugin: bridges MQ publish/subscribe streams to Kafka and back.

Records follow docs/kafka-contract.md (version 1); configuration, mapping and delivery
guarantees are in docs/kafka-plugin.md. ``plugin`` is the object the ``mqgw.plugins``
entry point ``kafka`` names.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict

from pydantic import BaseModel

from gateway.plugin_api import (
    Envelope,
    ExchangeHandler,
    PluginContext,
    PluginError,
    RouteTarget,
    Scheme,
)
from plugins.kafka.config import KafkaPluginConfig
from plugins.kafka.errors import KafkaPluginError, KafkaSecurityError, TopicCollisionError
from plugins.kafka.exchange import KafkaExchanges
from plugins.kafka.mapping import TopicRouter, TopicTemplate
from plugins.kafka.namespace import KafkaNamespace
from plugins.kafka.security import preflight
from plugins.kafka.sink import KafkaSink
from plugins.kafka.source import KafkaSource, inbound_member_id

__all__ = [
    "KafkaInstance",
    "KafkaPlugin",
    "KafkaPluginConfig",
    "KafkaPluginError",
    "TopicCollisionError",
    "plugin",
]


class KafkaInstance:
    """One configured ``kafka`` instance: an engine sink (outbound) and/or a consumer
    publishing into the engine (inbound), and request/reply exchanges (``Exchanges``,
    plugins.kafka.exchange) for the runtime's request/reply routes. The topics it keeps
    for itself: ``own_topic`` (``OwnsTopics``, plugins.kafka.namespace)."""

    def __init__(self, name: str, config: KafkaPluginConfig) -> None:
        self._name = name
        self.config = config
        # Built here (no I/O) so a colliding mapping fails before anything connects.
        self.router: TopicRouter | None = (
            config.outbound.router() if config.outbound.enabled else None
        )
        self.sink: KafkaSink | None = None
        self.source: KafkaSource | None = None
        self.exchanges: KafkaExchanges | None = None
        #: Its own topics; the exactly-once marker topic's gateway id is known at start.
        self.namespace = KafkaNamespace(config, name)
        #: The last TLS/SASL failure (one line, no secret) until a start succeeds.
        self.security_failure: str | None = None
        self.security_failures = {"tls": 0, "sasl": 0, "secret": 0}

    @property
    def name(self) -> str:
        return self._name

    def own_topic(self, topic: str) -> str:
        """Why ``topic`` is one of this instance's own topics, "" when it is not
        (``OwnsTopics``: the runtime writes no reply there)."""
        return self.namespace.own_topic(topic)

    def planned_subscriptions(self) -> list[tuple[str, Scheme]]:
        """The outbound routes' subscriptions (what start() subscribes), for the runtime
        to register before the first get (``DeclaresSubscriptions``)."""
        if self.router is None:
            return []
        return [(route.unified_topic, Scheme.TOPIC) for route in self.config.outbound.routes]

    def route_targets(self) -> list[RouteTarget]:
        """Each outbound route's Kafka topic (``{topic}`` left as a marker) and each
        consumed topic's stream (``DescribesRoutes``, for the dashboard)."""
        out: list[RouteTarget] = []
        outbound = self.config.outbound
        if outbound.enabled:
            for r in outbound.routes:
                template = TopicTemplate.parse(r.kafka_topic or outbound.topic_template)
                out.append(RouteTarget("out", r.stream, template.shape(r.stream)))
        out += [RouteTarget("in", t.stream, t.kafka_topic) for t in self.config.inbound.topics]
        return out

    async def start(self, context: PluginContext) -> None:
        try:
            # One connection with the security settings first: a refused certificate
            # or login becomes one error naming the cause (the runtime retries it with
            # capped backoff) instead of the clients' endless reconnect logging.
            await preflight(self.config.bootstrap_servers, self.config.security, self._name)
        except KafkaSecurityError as exc:
            self.security_failure = str(exc)
            self.security_failures[exc.cause] = self.security_failures.get(exc.cause, 0) + 1
            raise
        self.security_failure = None
        gateway_id = context.gateway_id
        self.namespace = KafkaNamespace(self.config, self._name, gateway_id)
        self.exchanges = KafkaExchanges(
            self.config, instance=self._name, gateway_id=gateway_id, sink=lambda: self.sink
        )
        try:
            if self.router is not None:
                self.sink = KafkaSink(
                    self.config, self.router, instance=self._name, gateway_id=gateway_id
                )
                await self.sink.start()
                for route in self.config.outbound.routes:
                    await context.subscribe(route.unified_topic)
            if self.config.inbound.topics:
                self.source = KafkaSource(
                    self.config, context.publisher, instance=self._name, gateway_id=gateway_id,
                    # a static member: the instance of a multi-instance node that takes
                    # over after a crash (or a restart) gets the partitions at once,
                    # instead of after the dead member's session timeout
                    group_instance_id=inbound_member_id(gateway_id, self._name),
                )
                await self.source.start()
        except BaseException:
            await self.stop()
            raise

    async def send(self, envelopes: Sequence[Envelope]) -> None:
        if self.sink is None:
            raise KafkaPluginError(
                f"kafka instance {self._name!r} received envelopes but outbound is disabled "
                "or not started",
                retriable=True,
            )
        await self.sink.send(envelopes)

    def _started_exchanges(self) -> KafkaExchanges:
        if self.exchanges is None:
            raise KafkaPluginError(f"kafka instance {self._name!r} is not started", retriable=True)
        return self.exchanges

    async def consume(self, route: str, sources: Sequence[str], handler: ExchangeHandler) -> None:
        """Hand records of ``sources`` to ``handler`` (consumer group
        ``<gateway_id>.rr.<route>``); idempotent per route."""
        await self._started_exchanges().consume(route, sources, handler)

    async def produce(self, envelopes: Sequence[Envelope]) -> None:
        """Produce exchange envelopes (acks=all); DeliveryRefusedError for one Kafka
        refuses for good."""
        await self._started_exchanges().produce(envelopes)

    async def flush(self) -> None:
        if self.sink is not None:
            await self.sink.flush()

    async def stop(self) -> None:
        exchanges, self.exchanges = self.exchanges, None
        if exchanges is not None:
            await exchanges.stop()
        source, self.source = self.source, None
        if source is not None:
            await source.stop()
        sink, self.sink = self.sink, None
        if sink is not None:
            await sink.stop()

    def stats(self) -> dict[str, int]:
        """Counters for metrics (``inbound_*`` from the source, e.g.
        ``inbound_commit_failures``); no per-record logging happens anywhere."""
        out: dict[str, int] = {
            f"security_failures_{cause}": n for cause, n in self.security_failures.items()
        }
        out["security_failing"] = int(self.security_failure is not None)
        if self.source is not None:
            for key, value in asdict(self.source.counters).items():
                out[f"inbound_{key}"] = value
        if self.exchanges is not None:
            out.update(self.exchanges.stats())
        return out

    def healthy(self) -> bool:
        outbound_ok = self.router is None or (self.sink is not None and self.sink.healthy)
        inbound_ok = not self.config.inbound.topics or (
            self.source is not None and self.source.healthy
        )
        exchanges_ok = self.exchanges is None or self.exchanges.healthy
        return outbound_ok and inbound_ok and exchanges_ok


class KafkaPlugin:
    """The ``kafka`` entry in the ``mqgw.plugins`` group."""

    @property
    def name(self) -> str:
        return "kafka"

    @property
    def config_model(self) -> type[BaseModel]:
        return KafkaPluginConfig

    def every_topic_own(self, instance_name: str, config: BaseModel) -> str:
        """Why an instance with ``config`` keeps every Kafka topic name for itself, or ""
        (``OwnsEveryTopic``: a template that is ``{topic}`` alone writes any name)."""
        if not isinstance(config, KafkaPluginConfig):
            return ""
        return KafkaNamespace(config, instance_name).every_topic_own()

    def create(self, instance_name: str, config: BaseModel) -> KafkaInstance:
        if not isinstance(config, KafkaPluginConfig):
            raise PluginError(
                f"kafka instance {instance_name!r}: config is a {type(config).__name__}, "
                "expected KafkaPluginConfig"
            )
        return KafkaInstance(instance_name, config)


plugin = KafkaPlugin()
