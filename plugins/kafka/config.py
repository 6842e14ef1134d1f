"""The ``config:`` section of one ``kafka`` plugin instance (validated with pydantic).

Defaults follow docs/kafka-contract.md: one topic per stream (``mqgw.{stream}``), a
compacted ``mqgw-retained.{stream}`` topic for retained publications, the whole default
stream bridged out, nothing consumed in until ``inbound.topics`` names Kafka topics.
"""

from __future__ import annotations

import importlib.util
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from gateway.plugin_api import DEFAULT_STREAM
from plugins.kafka.errors import KafkaPluginError, TopicNameError
from plugins.kafka.mapping import InboundRoute, Route, TopicRouter, TopicTemplate
from plugins.kafka.security import SECURITY_CLIENT_OPTIONS, KafkaSecurityConfig

DEFAULT_TOPIC_TEMPLATE = "mqgw.{stream}"
DEFAULT_RETAINED_TEMPLATE = "mqgw-retained.{stream}"
#: aiokafka arguments the delivery guarantees or other config keys own.
_FIXED_CLIENT_OPTIONS = frozenset(
    {
        "acks",
        "enable_idempotence",
        "enable_auto_commit",
        "isolation_level",
        "group_id",
        "bootstrap_servers",
        "client_id",
        "linger_ms",
        "max_request_size",
        "max_batch_size",
        "request_timeout_ms",
        "compression_type",
        "auto_offset_reset",
        "transactional_id",
    }
)
#: ``linger_ms`` of backend ``confluent`` when the config does not set it: librdkafka
#: then builds one produce request per MQ unit of work instead of waking its broker
#: thread for every record (docs/kafka-backends.md).
CONFLUENT_LINGER_MS = 2
#: ``max_batch_size`` when the config does not set it, per backend (docs/kafka-plugin.md).
AIOKAFKA_BATCH_BYTES = 262_144
CONFLUENT_BATCH_BYTES = 1_000_000
#: The batch size when a topic refused a batch as too large and its max.message.bytes
#: cannot be read: aiokafka's own default, what the plugin used before it batched more.
FALLBACK_BATCH_BYTES = 16_384
#: librdkafka properties (backend ``confluent``) the guarantees or other config keys own.
_FIXED_RDKAFKA_PROPERTIES = frozenset(
    {
        "acks",
        "request.required.acks",
        "enable.idempotence",
        "enable.auto.commit",
        "enable.auto.offset.store",
        "isolation.level",
        "group.id",
        "bootstrap.servers",
        "metadata.broker.list",
        "client.id",
        "linger.ms",
        "queue.buffering.max.ms",
        "message.max.bytes",
        "request.timeout.ms",
        "socket.timeout.ms",
        "message.timeout.ms",
        "delivery.timeout.ms",
        "compression.type",
        "compression.codec",
        "auto.offset.reset",
        "transactional.id",
        "batch.size",
        "max.in.flight.requests.per.connection",
        "max.in.flight",
        "retries",
        "message.send.max.retries",
        "enable.gapless.guarantee",
        "error_cb",
        "logger",
        "on_delivery",
        "delivery.report.only.error",
    }
)
#: librdkafka property prefixes only the ``security:`` block may set.
_RDKAFKA_SECURITY_PREFIXES = ("security.protocol", "ssl.", "ssl_", "sasl.", "ssl_key")


def _check_template(value: str | None) -> str | None:
    if value is not None:
        try:
            TopicTemplate.parse(value)
        except TopicNameError as exc:
            raise ValueError(str(exc)) from exc
    return value


class OutboundRoute(BaseModel):
    """One MQ subscription of the plugin and where its publications go in Kafka."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    stream: str = Field(default=DEFAULT_STREAM, min_length=1, max_length=48)
    """The stream to forward."""
    topic: str = Field(default="#", min_length=1)
    """MQ topic-scheme filter within the stream (``#`` all, ``+`` one level)."""
    kafka_topic: str | None = None
    """Template of the Kafka topic ({stream}, {topic}); default: outbound.topic_template."""
    retained_topic: str | None = None
    """Template of the compacted retained topic; default: outbound.retained_topic_template."""

    _templates = field_validator("kafka_topic", "retained_topic")(_check_template)

    @field_validator("topic")
    @classmethod
    def _topic_filter(cls, value: str) -> str:
        """MQ topic-scheme rules: ``#`` only as the whole last level, ``+`` only as a
        whole level (the broker would refuse ``a/#/b`` when the plugin subscribes)."""
        levels = value.split("/")
        for i, level in enumerate(levels):
            if "#" in level and (level != "#" or i != len(levels) - 1):
                raise ValueError(f"{value!r}: '#' must be the whole last level (e.g. 'a/b/#')")
            if "+" in level and level != "+":
                raise ValueError(f"{value!r}: '+' must be a whole level (e.g. 'a/+/c')")
        return value

    @property
    def unified_topic(self) -> str:
        """The engine subscription topic (``$SYS/STREAM/<s>/...`` for named streams)."""
        if self.stream == DEFAULT_STREAM:
            return self.topic
        return f"$SYS/STREAM/{self.stream}/{self.topic}"


class OutboundConfig(BaseModel):
    """MQ -> Kafka."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    enabled: bool = True
    """Forward MQ publications to Kafka."""
    topic_template: str = DEFAULT_TOPIC_TEMPLATE
    """Kafka topic of a publication: ``{stream}`` and ``{topic}`` are replaced (docs/kafka-
    contract.md)."""
    retained_topic_template: str = DEFAULT_RETAINED_TEMPLATE
    """Compacted Kafka topic of retained publications (keyed by MQ topic)."""
    routes: list[OutboundRoute] = Field(default_factory=lambda: [OutboundRoute()])
    """Which streams and MQ topics are forwarded; default: every topic of the default stream."""

    _templates = field_validator("topic_template", "retained_topic_template")(_check_template)

    @model_validator(mode="after")
    def _unique_routes(self) -> OutboundConfig:
        seen: set[tuple[str, str]] = set()
        for r in self.routes:
            if (r.stream, r.topic) in seen:
                raise ValueError(
                    f"outbound.routes lists stream {r.stream!r} topic {r.topic!r} twice; "
                    "keep one entry per (stream, topic)"
                )
            seen.add((r.stream, r.topic))
        return self

    def router(self) -> TopicRouter:
        """The topic router; raises TopicCollisionError/TopicNameError on a bad mapping."""
        main = TopicTemplate.parse(self.topic_template)
        retained = TopicTemplate.parse(self.retained_topic_template)
        routes = [
            Route(
                r.stream,
                r.topic,
                TopicTemplate.parse(r.kafka_topic) if r.kafka_topic else main,
                TopicTemplate.parse(r.retained_topic) if r.retained_topic else retained,
            )
            for r in self.routes
        ]
        return TopicRouter(routes, Route("", "", main, retained))


class InboundTopic(BaseModel):
    """One consumed Kafka topic and the MQ stream/topic its records are published on
    when the record itself does not say (headers ``mq.stream``/``mq.topic``, key)."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    kafka_topic: str = Field(min_length=1, max_length=249, pattern=r"^[A-Za-z0-9._-]+$")
    """The Kafka topic consumed."""
    stream: str = Field(default=DEFAULT_STREAM, min_length=1, max_length=48)
    """The stream its records are published on when a record has no ``mq.stream`` header."""
    topic: str = ""
    """MQ topic for records with neither an ``mq.topic`` header nor a key."""
    retain: bool = False
    """Publish as retained publications; a tombstone then deletes the retained one."""
    persistent: bool = True
    """Publish as persistent MQ messages."""
    allowed_streams: list[str] | None = None
    """Streams a record of this topic may choose (``mq.stream`` header or a
    ``$SYS/STREAM/<stream>/`` topic); default: only ``stream``. Any other is refused
    (dead-letter topic, reason 3081 MQRCCF_NOT_AUTHORIZED; docs/security.md)."""

    @field_validator("allowed_streams")
    @classmethod
    def _stream_names(cls, value: list[str] | None) -> list[str] | None:
        for name in value or ():
            if not 1 <= len(name) <= 48 or name != name.strip():
                raise ValueError(f"{name!r} is no stream name (1 to 48 characters, no blanks)")
        return value

    def route(self) -> InboundRoute:
        allowed = (self.stream, *(self.allowed_streams or ()))
        return InboundRoute(
            self.kafka_topic,
            self.stream,
            self.topic,
            self.retain,
            self.persistent,
            allowed_streams=frozenset(allowed),
        )


class InboundConfig(BaseModel):
    """Kafka -> MQ."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    topics: list[InboundTopic] = Field(default_factory=list)
    """The Kafka topics consumed and published into MQ."""
    group_id: str | None = None
    """Consumer group; default ``mqgw.<gateway id>.<instance>``."""
    auto_offset_reset: Literal["earliest", "latest"] = "earliest"
    """Where a new consumer group starts: ``earliest`` loses nothing."""
    max_batch: int = Field(default=200, ge=1, le=10_000)
    """Records per MQ unit of work."""
    poll_timeout_ms: int = Field(default=200, ge=1, le=60_000)
    """Longest wait of one poll for records (milliseconds)."""
    retry_initial_s: float = Field(default=0.2, gt=0)
    """Back-off after a failed publish (doubles, with jitter, up to retry_max_s)."""
    retry_max_s: float = Field(default=10.0, gt=0)
    """Longest back-off (seconds, with jitter) between attempts to publish a batch MQ refused
    for now."""
    dead_letter_topic: str = Field(
        default="mqgw-deadletter", max_length=249, pattern=r"^[A-Za-z0-9._-]*$"
    )
    """Where a record MQ can never take goes (docs/kafka-contract.md "Dead-letter
    records"), before its offset is committed; "" logs and skips it instead."""

    @model_validator(mode="after")
    def _unique_topics(self) -> InboundConfig:
        names = [t.kafka_topic for t in self.topics]
        dup = {n for n in names if names.count(n) > 1}
        if dup:
            raise ValueError(f"inbound.topics lists {sorted(dup)} more than once")
        return self


class KafkaPluginConfig(BaseModel):
    """One ``kafka`` plugin instance (see docs/kafka-plugin.md)."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    bootstrap_servers: str | list[str] = "127.0.0.1:9092"
    """The Kafka cluster's bootstrap servers: ``host:port`` or a list of them."""
    client_id: str | None = None
    """Kafka client id; default ``mqgw.<gateway id>.<instance>``."""
    create_topics: bool = True
    """Create absent topics at start-up/first use (retained ones with cleanup.policy=compact)."""
    partitions: int = Field(default=1, ge=1)
    """Partitions of the topics the plugin creates."""
    replication_factor: int = Field(default=1, ge=1)
    """Replication factor of the topics the plugin creates (3 on a production cluster)."""
    topic_configs: dict[str, str] = Field(default_factory=dict)
    """Extra topic configs for topics the plugin creates (e.g. retention.ms)."""
    linger_ms: int = Field(default=0, ge=0)
    """0: the sink hands Kafka a whole MQ unit of work at once and waits for its acks,
    so lingering would only add latency to every unit of work. With backend
    confluent the default is CONFLUENT_LINGER_MS instead (librdkafka wakes its
    broker thread per record at 0: about twice the CPU per record, measured)."""
    compression_type: Literal["gzip", "snappy", "lz4", "zstd"] | None = None
    """Producer compression; none: uncompressed."""
    max_request_size: int = Field(default=1_048_576, ge=1024)
    """Largest produce request (bytes); a bigger MQ publication is refused by Kafka
    (raise it together with the broker's message.max.bytes)."""
    max_batch_size: int | None = Field(default=None, ge=1024)
    """Largest record batch per partition the producer builds (bytes; aiokafka's
    ``max_batch_size``, librdkafka's ``batch.size``). Default: 262,144 with aiokafka,
    whose own 16 KiB made an MQ unit of work of 256 × 1 KiB wait for 16 produce
    round trips before it could commit (aiokafka keeps one request in flight per
    broker, with one batch per partition); 1,000,000 (librdkafka's) with confluent.
    Never above max_request_size, nor above the smallest max.message.bytes of the
    topics the plugin writes (the sink reads them: docs/kafka-plugin.md, "Batches")."""
    request_timeout_ms: int = Field(default=30_000, ge=1000)
    """Kafka client request timeout (milliseconds)."""
    send_timeout_s: float = Field(default=60.0, gt=0)
    """Longest a batch may wait for acks before the MQ unit of work backs out."""
    delivery: Literal["at_least_once", "exactly_once"] = "at_least_once"
    """``exactly_once``: each MQ unit of work is one Kafka transaction that also records
    its envelopes as committed (docs/kafka-plugin.md, "Exactly-once"); readers need
    isolation.level=read_committed. Default at-least-once."""
    exactly_once_topic_name: str | None = Field(
        default=None, min_length=1, max_length=249, pattern=r"^[A-Za-z0-9._-]+$"
    )
    """Compacted topic of the committed-envelope markers; default
    ``mqgw-eos.<gateway id>.<instance>``."""
    security: KafkaSecurityConfig = Field(default_factory=KafkaSecurityConfig)
    """TLS and SASL of every client (docs/security.md, "Kafka: TLS and SASL")."""
    backend: Literal["aiokafka", "confluent"] = "aiokafka"
    """The Kafka client library: ``aiokafka`` (default) or ``confluent`` (librdkafka via
    confluent-kafka, the optional ``rdkafka`` extra; docs/kafka-backends.md). Same
    configuration, records and guarantees."""
    client_options: dict[str, Any] = Field(default_factory=dict)
    """Passed to the client as is: aiokafka arguments (backend aiokafka) or librdkafka
    properties (backend confluent); never security_protocol, ssl_context, sasl_*,
    ssl.*, sasl.*: those are ``security``."""
    outbound: OutboundConfig = Field(default_factory=OutboundConfig)
    """MQ to Kafka: which streams and topics go to which Kafka topics."""
    inbound: InboundConfig = Field(default_factory=InboundConfig)
    """Kafka to MQ: which Kafka topics are published into which streams."""

    def producer_batch_bytes(self) -> int:
        """The producer's batch size before any topic's limit is known: max_batch_size
        or the backend's default, at most max_request_size."""
        default = CONFLUENT_BATCH_BYTES if self.backend == "confluent" else AIOKAFKA_BATCH_BYTES
        chosen = self.max_batch_size if self.max_batch_size is not None else default
        return min(chosen, self.max_request_size)

    def exactly_once_topic(self, gateway_id: str, instance: str) -> str:
        """The marker topic of exactly-once delivery for this instance."""
        return self.exactly_once_topic_name or f"mqgw-eos.{gateway_id}.{instance}"

    @field_validator("client_options")
    @classmethod
    def _no_guarantee_overrides(cls, value: dict[str, Any]) -> dict[str, Any]:
        fixed = sorted(set(value) & _FIXED_CLIENT_OPTIONS)
        if fixed:
            raise ValueError(
                f"client_options may not set {fixed}: the plugin fixes them (idempotent "
                "producer with acks=all, offsets committed after MQ) or they have their own "
                "key (bootstrap_servers, client_id, max_batch_size, inbound.group_id, ...)"
            )
        security = sorted(set(value) & SECURITY_CLIENT_OPTIONS)
        if security:
            raise ValueError(
                f"client_options may not set {security}: TLS and SASL are configured in "
                "the security: block (protocol, tls: {ca_file, cert_file, key_file, "
                "key_password, check_hostname}, sasl: {mechanism, username, password})"
            )
        return value

    @model_validator(mode="after")
    def _backend_can_do_it(self) -> KafkaPluginConfig:
        """With ``confluent``, client_options are librdkafka properties: refuse an
        aiokafka argument (it would be ignored or fail only at start) and any property
        the guarantees or the security block own; refuse it all at config-check time
        when confluent-kafka is not installed."""
        if self.backend != "confluent":
            return self
        if "linger_ms" not in self.model_fields_set:
            self.linger_ms = CONFLUENT_LINGER_MS
        aiokafka_style = sorted(k for k in self.client_options if "." not in k and "_" in k)
        if aiokafka_style:
            raise ValueError(
                f"backend confluent: client_options {aiokafka_style} look like aiokafka "
                "arguments; with backend confluent client_options are librdkafka "
                "properties (dotted names, e.g. batch.num.messages)"
            )
        fixed = sorted(set(self.client_options) & _FIXED_RDKAFKA_PROPERTIES)
        if fixed:
            raise ValueError(
                f"client_options may not set {fixed}: the plugin fixes them (idempotent "
                "producer with acks=all, offsets committed after MQ) or they have their own "
                "key (bootstrap_servers, client_id, linger_ms, max_request_size, "
                "max_batch_size, ...)"
            )
        security = sorted(
            k for k in self.client_options if k.startswith(_RDKAFKA_SECURITY_PREFIXES)
        )
        if security:
            raise ValueError(
                f"client_options may not set {security}: TLS and SASL are configured in "
                "the security: block (protocol, tls: {ca_file, cert_file, key_file, "
                "key_password, check_hostname}, sasl: {mechanism, username, password})"
            )
        if importlib.util.find_spec("confluent_kafka") is None:
            raise ValueError(
                "backend confluent needs the confluent-kafka package, which is not "
                "installed: install the gateway with the rdkafka extra "
                "(pip install 'mq-stream-gateway[rdkafka]') or use backend aiokafka"
            )
        return self

    @model_validator(mode="after")
    def _mapping_is_sound(self) -> KafkaPluginConfig:
        # Collisions are a config error: report them at validation time, naming both.
        if self.outbound.enabled:
            try:
                self.outbound.router()
            except KafkaPluginError as exc:
                raise ValueError(str(exc)) from exc
        return self
