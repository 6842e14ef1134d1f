"""Outbound: MQ publications to Kafka records (idempotent producer, acks=all).

``send`` is awaited by the broker before the MQ unit of work commits, so it returns only
once Kafka acknowledged every record of the batch; any failure raises and the unit of
work backs out (the messages wait on their MQ queue and are offered again).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Any

from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from aiokafka.errors import (
    InvalidTopicError,
    KafkaError,
    MessageSizeTooLargeError,
    RecordTooLargeError,
    TopicAlreadyExistsError,
)

from gateway.plugin_api import Envelope
from plugins.kafka.config import KafkaPluginConfig
from plugins.kafka.errors import KafkaPluginError, KafkaSendError
from plugins.kafka.mapping import (
    OutboundRecord,
    TopicRouter,
    is_from_origin,
    outbound_records,
)

log = logging.getLogger(__name__)

_TOPIC_ALREADY_EXISTS = 36
#: Kafka refuses these records whatever the retry: holding the MQ batch would block the
#: stream for ever, so the batch backs out and MQ's backout handling moves it aside.
_REFUSALS = (MessageSizeTooLargeError, RecordTooLargeError, InvalidTopicError)


def client_args(config: KafkaPluginConfig, client_id: str) -> dict[str, Any]:
    """Connection arguments shared by producer, consumer and admin client."""
    args: dict[str, Any] = {
        "bootstrap_servers": config.bootstrap_servers,
        "client_id": config.client_id or client_id,
        "request_timeout_ms": config.request_timeout_ms,
    }
    args.update(config.client_options)
    return args


class TopicCreator:
    """Creates absent topics once (retained ones compacted); remembers what exists."""

    def __init__(self, config: KafkaPluginConfig, client_id: str) -> None:
        self._config = config
        self._client_id = client_id
        self._known: set[str] = set()
        self._lock = asyncio.Lock()

    async def ensure(self, topics: dict[str, bool]) -> None:
        """Make sure every topic exists; ``topics`` maps name -> compacted."""
        missing = {t: c for t, c in topics.items() if t not in self._known}
        if not missing or not self._config.create_topics:
            self._known.update(missing)
            return
        async with self._lock:
            admin = AIOKafkaAdminClient(**client_args(self._config, self._client_id + "-admin"))
            await admin.start()
            try:
                existing = set(await admin.list_topics())
                new = [
                    NewTopic(
                        name,
                        self._config.partitions,
                        self._config.replication_factor,
                        topic_configs={
                            **self._config.topic_configs,
                            "cleanup.policy": "compact" if compacted else "delete",
                        },
                    )
                    for name, compacted in missing.items()
                    if name not in existing
                ]
                if new:
                    await self._create(admin, new)
                await self._check_compacted(
                    admin, [t for t, c in missing.items() if c and t in existing]
                )
            finally:
                await admin.close()
            self._known.update(missing)

    async def _check_compacted(self, admin: AIOKafkaAdminClient, topics: list[str]) -> None:
        """Warn when an existing retained topic is not compacted (it would grow without
        bound and readers would see every old retained publication)."""
        if not topics:
            return
        resources = [
            ConfigResource(ConfigResourceType.TOPIC, t, configs={"cleanup.policy": None})
            for t in topics
        ]
        try:
            responses = await admin.describe_configs(resources)
            for response in responses:
                for _code, _msg, _type, name, entries in response.resources:
                    for entry in entries:
                        if entry[0] == "cleanup.policy" and "compact" not in str(entry[1]):
                            log.warning(
                                "Kafka topic %s holds retained publications but its "
                                "cleanup.policy is %s, not compact",
                                name,
                                entry[1],
                            )
        except (KafkaError, ValueError, TypeError, AttributeError) as exc:
            log.debug("cannot check cleanup.policy of %s: %s", topics, exc)

    async def _create(self, admin: AIOKafkaAdminClient, new: list[NewTopic]) -> None:
        try:
            response = await admin.create_topics(new)
        except TopicAlreadyExistsError:
            return
        for name, code, *rest in getattr(response, "topic_errors", []):
            if code not in (0, _TOPIC_ALREADY_EXISTS):
                message = rest[0] if rest else ""
                raise KafkaPluginError(
                    f"cannot create Kafka topic {name!r}: error {code} {message}".rstrip(),
                    retriable=True,
                )
        log.info("created Kafka topics %s", ", ".join(t.name for t in new))


class KafkaSink:
    """Produces the records of each MQ unit of work and waits for their acks."""

    def __init__(
        self, config: KafkaPluginConfig, router: TopicRouter, *, instance: str, gateway_id: str
    ) -> None:
        self.config = config
        self.router = router
        self.instance = instance
        self.gateway_id = gateway_id
        self.topics = TopicCreator(config, f"mqgw.{gateway_id}.{instance}")
        self.producer: AIOKafkaProducer | None = None
        self.sent = 0
        self.failed_batches = 0
        self._healthy = False

    @property
    def healthy(self) -> bool:
        return self.producer is not None and self._healthy

    async def start(self) -> None:
        args = client_args(self.config, f"mqgw.{self.gateway_id}.{self.instance}")
        producer = AIOKafkaProducer(
            **args,
            acks="all",
            enable_idempotence=True,
            linger_ms=self.config.linger_ms,
            max_request_size=self.config.max_request_size,
            compression_type=self.config.compression_type,
        )
        try:
            await producer.start()
            await self.topics.ensure(self.router.static_topics())
        except KafkaError as exc:
            await producer.stop()
            raise KafkaPluginError(
                f"kafka instance {self.instance!r}: cannot reach {self.config.bootstrap_servers}: "
                f"{exc}",
                retriable=True,
            ) from exc
        except BaseException:
            # E.g. topic creation refused (KafkaPluginError): never leak a started
            # producer (its sockets and background tasks).
            await producer.stop()
            raise
        self.producer = producer
        self._healthy = True

    async def send(self, envelopes: Sequence[Envelope]) -> None:
        """Produce every record of ``envelopes`` in order; return once all are acked."""
        producer = self.producer
        if producer is None:
            raise KafkaSendError(f"kafka instance {self.instance!r} is not started")
        records: list[OutboundRecord] = []
        for d in envelopes:
            if is_from_origin(d, self.instance):
                continue  # came in from this instance's Kafka: never echo it back
            records.extend(outbound_records(d, self.router, self.gateway_id))
        if not records:
            return
        try:
            async with asyncio.timeout(self.config.send_timeout_s):
                await self.topics.ensure({r.topic: r.compacted for r in records})
                futures = [
                    await producer.send(r.topic, r.value, key=r.key, headers=r.headers)
                    for r in records
                ]
                results = await asyncio.gather(*futures, return_exceptions=True)
        except _REFUSALS as exc:
            raise KafkaSendError(
                f"kafka instance {self.instance!r}: Kafka refuses a record ({exc!r}); raise "
                "max_request_size and the topic's max.message.bytes",
                failed=1,
                retriable=False,
            ) from exc
        except (KafkaError, TimeoutError) as exc:
            self._fail()
            raise KafkaSendError(
                f"kafka instance {self.instance!r}: batch of {len(records)} records not "
                f"acknowledged: {exc!r}",
                failed=len(records),
            ) from exc
        errors = [r for r in results if isinstance(r, BaseException)]
        if errors:
            refused = [e for e in errors if isinstance(e, _REFUSALS)]
            if refused:
                raise KafkaSendError(
                    f"kafka instance {self.instance!r}: Kafka refuses {len(refused)} of "
                    f"{len(records)} records ({refused[0]!r}); raise max_request_size and the "
                    "topic's max.message.bytes, or the MQ messages go to the backout queue",
                    failed=len(refused),
                    retriable=False,
                ) from refused[0]
            self._fail()
            raise KafkaSendError(
                f"kafka instance {self.instance!r}: {len(errors)} of {len(records)} records "
                f"not acknowledged: {errors[0]!r}",
                failed=len(errors),
            ) from errors[0]
        if not self._healthy:
            log.warning("kafka instance %r: sending again", self.instance)
        self._healthy = True
        self.sent += len(records)

    def _fail(self) -> None:
        self.failed_batches += 1
        if self._healthy:
            log.error("kafka instance %r: sends failing; MQ units of work back out", self.instance)
        self._healthy = False

    async def flush(self) -> None:
        if self.producer is not None:
            await self.producer.flush()

    async def stop(self) -> None:
        producer, self.producer = self.producer, None
        self._healthy = False
        if producer is not None:
            await producer.stop()  # flushes what is pending
