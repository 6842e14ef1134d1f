"""Request/reply exchanges of the kafka plugin (``Exchanges``) on the real broker, driven
by Kafka's own console producer/consumer where they can carry headers
(docs/kafka-contract.md "Request/reply records")."""

from __future__ import annotations

import asyncio
import hashlib
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any, cast

import pytest
from aiokafka import AIOKafkaConsumer, ConsumerRecord, TopicPartition

from gateway.devstack import KafkaBroker, console_tool_command
from gateway.plugin_api import (
    DeliveryRefusedError,
    Envelope,
    Exchanges,
    PluginError,
    PublishRefusedError,
    Scheme,
)
from plugins.kafka import KafkaInstance, KafkaPluginConfig
from plugins.kafka.errors import KafkaPluginError
from plugins.kafka.exchange import exchange_envelope, exchange_record
from plugins.kafka.mapping import SkippedRecord
from plugins.kafka.sink import TopicCreator
from tests.plugins.kafka.kafka_harness import consume, headers_of, produce, unique

pytestmark = [pytest.mark.kafka]

GATEWAY_ID = "gw-rr"


def _run_tool(tool: str, *args: str, stdin: bytes = b"", timeout: float = 90) -> str:
    proc = subprocess.run(
        console_tool_command(tool, *args),
        input=stdin,
        capture_output=True,
        timeout=timeout,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")[-2000:]
    return proc.stdout.decode(errors="replace")


@dataclass
class _Publisher:
    async def publish(self, publications: Sequence[Envelope]) -> None:
        raise AssertionError("exchanges never publish into the engine")


@dataclass
class _Context:
    """What start() needs of a PluginContext for an instance without pub/sub routes."""

    gateway_id: str = GATEWAY_ID
    publisher: _Publisher = field(default_factory=_Publisher)
    subscriptions: list[str] = field(default_factory=list)

    async def subscribe(self, topic: str, *, scheme: Scheme = Scheme.TOPIC) -> None:
        self.subscriptions.append(topic)

    async def unsubscribe(self, topic: str, *, scheme: Scheme = Scheme.TOPIC) -> bool:
        raise AssertionError("no pub/sub routes configured")


@dataclass
class _Recorder:
    """An exchange handler that records every batch and can fail on cue."""

    batches: list[list[Envelope]] = field(default_factory=list)
    failures: list[BaseException] = field(default_factory=list)

    async def __call__(self, envelopes: Sequence[Envelope]) -> None:
        self.batches.append(list(envelopes))
        if self.failures:
            raise self.failures.pop(0)

    @property
    def payloads(self) -> list[bytes]:
        return [e.payload for batch in self.batches for e in batch]

    async def wait_for(self, count: int, timeout: float = 60) -> None:
        async with asyncio.timeout(timeout):
            while len(self.payloads) < count:
                await asyncio.sleep(0.05)


def _config(kafka_broker: KafkaBroker, **extra: Any) -> KafkaPluginConfig:
    return KafkaPluginConfig.model_validate(
        {
            "bootstrap_servers": kafka_broker.bootstrap,
            "outbound": {"enabled": False},
            "inbound": {"retry_initial_s": 0.1, "retry_max_s": 8.0, **extra.pop("inbound", {})},
            **extra,
        }
    )


async def _started(config: KafkaPluginConfig, name: str = "kafka") -> KafkaInstance:
    instance = KafkaInstance(name, config)
    await instance.start(_Context())
    return instance


async def _committed(kafka_broker: KafkaBroker, group: str, topic: str) -> int | None:
    consumer = AIOKafkaConsumer(bootstrap_servers=kafka_broker.bootstrap, group_id=group)
    await consumer.start()
    try:
        return await consumer.committed(TopicPartition(topic, 0))
    finally:
        await consumer.stop()


def test_kafka_instance_implements_exchanges() -> None:
    assert isinstance(KafkaInstance("kafka", KafkaPluginConfig()), Exchanges)


def _record(headers: list[tuple[str, bytes]], key: bytes | None = None) -> Any:
    return ConsumerRecord("t", 0, 7, 1_700_000_000_000, 0, key, None, None, 0, 0, headers)


@pytest.mark.parametrize(
    ("headers", "why"),
    [
        ([("mq.expiry", b"soon")], "not a whole number"),
        ([("mq.reply.topic", b"\xff")], "not UTF-8"),
        ([("colour", b"\xc3")], "not UTF-8"),
    ],
)
def test_unreadable_reply_headers_refuse_the_record(
    headers: list[tuple[str, bytes]], why: str
) -> None:
    with pytest.raises(SkippedRecord, match=why):
        exchange_envelope(_record(headers), origin="kafka")


def test_record_round_trip_keeps_reply_information_and_repeated_properties() -> None:
    env = exchange_envelope(
        _record(
            [("a", b"1"), ("a", b"2"), ("mq.correlation", b"\x00\xff"), ("mq.expiry", b"0")],
            key=b"k",
        ),
        origin="kafka",
    )
    assert (env.payload, env.expiry, env.correlation_data) == (b"", -1, b"\x00\xff")
    assert env.property_items() == (("a", "1"), ("a", "2"))
    assert env.put_time_ms == 1_700_000_000_000
    record = exchange_record(env, origin=GATEWAY_ID)
    assert (record.topic, record.key, record.value) == ("t", b"\x00\xff", b"")
    assert record.headers == [
        ("a", b"1"),
        ("a", b"2"),
        ("mq.correlation", b"\x00\xff"),
        ("mq.origin", GATEWAY_ID.encode()),
    ]
    bare = exchange_record(Envelope(stream="", topic="t", payload=b"p"), origin=GATEWAY_ID)
    assert (bare.key, bare.headers) == (None, [("mq.origin", GATEWAY_ID.encode())])


def test_a_property_named_like_the_origin_header_never_reaches_the_record() -> None:
    """An MQ reply's usr property ``mq.origin`` (``<mq><origin>``) would forge the
    marker: the record carries one ``mq.origin``, the gateway's own."""
    env = Envelope(
        stream="",
        topic="t",
        payload=b"p",
        property_list=(("mq.origin", "gw-other"), ("mq.feedback", "0"), ("mq.origin", "x")),
    )
    record = exchange_record(env, origin=GATEWAY_ID)
    assert record.headers == [("mq.feedback", b"0"), ("mq.origin", GATEWAY_ID.encode())]
    # A request forwarded to a responder carries no origin, forged or not.
    request = exchange_record(replace(env, reply_topic="svc.replies"), origin=GATEWAY_ID)
    assert request.headers == [("mq.feedback", b"0"), ("mq.reply.topic", b"svc.replies")]


def test_a_record_of_the_gateways_own_origin_is_no_request() -> None:
    own = _record([("mq.reply.topic", b"r"), ("mq.origin", GATEWAY_ID.encode())])
    with pytest.raises(SkippedRecord, match="own origin") as refused:
        exchange_envelope(own, origin="kafka", gateway_id=GATEWAY_ID)
    assert refused.value.reason == 2035
    other = _record([("mq.origin", b"gw-other")])
    assert exchange_envelope(other, origin="kafka", gateway_id=GATEWAY_ID).topic == "t"


@pytest.mark.parametrize("backend", ["aiokafka", "confluent"])
async def test_console_producer_headers_reach_the_handler(
    kafka_broker: KafkaBroker, backend: str
) -> None:
    source = unique("rr-req")
    instance = await _started(_config(kafka_broker, backend=backend))
    handler = _Recorder()
    try:
        await instance.consume("quotes", [source], handler)
        lines = (
            b"mq.reply.topic:rr.replies,mq.correlation:req-1,colour:blue,mq.expiry:600"
            b"|key-1|IBM?\n"
            b"mq.reply.topic:rr.replies,shade:dark|key-2|HUR?\n"
            b"trace:t-3|key-3|plain\n"
        )
        await asyncio.to_thread(
            _run_tool,
            "kafka-console-producer",
            "--bootstrap-server", kafka_broker.bootstrap,
            "--topic", source,
            "--reader-property", "parse.headers=true",
            "--reader-property", "parse.key=true",
            "--reader-property", "headers.delimiter=|",
            "--reader-property", "key.separator=|",
            stdin=lines,
        )  # fmt: skip
        await handler.wait_for(3)
    finally:
        await instance.stop()
    first, second, third = [e for batch in handler.batches for e in batch]
    assert (first.stream, first.topic, first.payload) == ("", source, b"IBM?")
    assert first.reply_topic == "rr.replies"
    assert first.correlation_data == b"req-1"  # the header wins over the key
    assert dict(first.properties) == {"colour": "blue"}  # mq.* headers are not properties
    assert first.expiry == 600
    assert first.msg_id == hashlib.sha256(f"{source}:0:0".encode()).digest()[:24]
    assert first.persistent
    assert second.correlation_data == b"key-2"  # no mq.correlation: the key stands in
    assert dict(second.properties) == {"shade": "dark"}
    assert second.expiry == -1
    assert (third.reply_topic, third.correlation_data, dict(third.properties)) == (
        "",
        b"key-3",
        {"trace": "t-3"},
    )
    assert len({first.msg_id, second.msg_id, third.msg_id}) == 3
    # Committed only after the handler returned: the group's offset is past all three.
    assert await _committed(kafka_broker, f"{GATEWAY_ID}.rr.quotes", source) == 3


@pytest.mark.parametrize("backend", ["aiokafka", "confluent"])
async def test_produce_is_read_with_headers_by_the_console_consumer(
    kafka_broker: KafkaBroker, backend: str
) -> None:
    target = unique("rr-out")
    instance = await _started(_config(kafka_broker, backend=backend))
    try:
        await instance.produce(
            [
                Envelope(
                    stream="",
                    topic=target,
                    payload=b"119.00",
                    properties={"colour": "blue"},
                    reply_topic="rr.back",
                    correlation_data=b"corr-7",
                    expiry=300,
                ),
                Envelope(stream="", topic=target, payload=b"no reply info"),
            ]
        )
    finally:
        await instance.stop()
    out = await asyncio.to_thread(
        _run_tool,
        "kafka-console-consumer",
        "--bootstrap-server", kafka_broker.bootstrap,
        "--topic", target,
        "--from-beginning",
        "--max-messages", "2",
        "--timeout-ms", "60000",
        "--formatter-property", "print.headers=true",
        "--formatter-property", "print.key=true",
        "--formatter-property", "key.separator=|",
        "--formatter-property", "headers.separator=,",
        "--formatter-property", "headers.key.separator=:",
    )  # fmt: skip
    # A record asking for no answer (a reply) carries the gateway's origin; a request
    # forwarded to a responder does not (responders may copy its headers back).
    assert [ln for ln in out.splitlines() if ln] == [
        "colour:blue,mq.reply.topic:rr.back,mq.correlation:corr-7,mq.expiry:300|corr-7|119.00",
        f"mq.origin:{GATEWAY_ID}|null|no reply info",
    ]


async def test_retriable_handler_failure_redelivers_without_commit(
    kafka_broker: KafkaBroker,
) -> None:
    source = unique("rr-retry")
    await produce(kafka_broker.bootstrap, source, [(b"k", b"one", []), (b"k", b"two", [])])
    # A long first backoff (2..6 s with jitter) leaves time to look at the commit.
    instance = await _started(_config(kafka_broker, inbound={"retry_initial_s": 4.0}))
    handler = _Recorder(failures=[PluginError("MQ down", retriable=True)])
    try:
        await instance.consume("retry", [source], handler)
        await handler.wait_for(2)
        # The failed batch was not committed; it comes again.
        assert await _committed(kafka_broker, f"{GATEWAY_ID}.rr.retry", source) is None
        await handler.wait_for(4)
        async with asyncio.timeout(30):
            while await _committed(kafka_broker, f"{GATEWAY_ID}.rr.retry", source) != 2:
                await asyncio.sleep(0.1)
        assert instance.stats()["exchange_handler_failures"] == 1
    finally:
        await instance.stop()
    assert handler.payloads == [b"one", b"two", b"one", b"two"]


async def test_refused_record_is_dead_lettered_and_the_rest_handled(
    kafka_broker: KafkaBroker,
) -> None:
    source, dead = unique("rr-refuse"), unique("rr-dlq")
    await produce(
        kafka_broker.bootstrap,
        source,
        [
            (b"a", b"first", []),
            (b"b", b"refused", []),
            (b"c", b"third", []),
            (b"d", b"bad header", [("colour", b"\xff\xfe")]),
            (b"e", b"fifth", []),
        ],
    )
    instance = await _started(_config(kafka_broker, inbound={"dead_letter_topic": dead}))
    handler = _Recorder(failures=[PublishRefusedError("2085 unknown queue", index=1, reason=2085)])
    try:
        await instance.consume("refuse", [source], handler)
        dead_letters = await consume(kafka_broker.bootstrap, dead, 2)
        async with asyncio.timeout(30):
            while await _committed(kafka_broker, f"{GATEWAY_ID}.rr.refuse", source) != 5:
                await asyncio.sleep(0.1)
    finally:
        await instance.stop()
    # first batch: everything mappable; the refusal at index 1 -> first was handled,
    # "refused" dead-lettered, the rest offered again without "first".
    assert [e.payload for e in handler.batches[0]] == [b"first", b"refused", b"third", b"fifth"]
    assert [e.payload for batch in handler.batches[1:] for e in batch] == [b"third", b"fifth"]
    by_value = {r.value: headers_of(r) for r in dead_letters}
    assert set(by_value) == {b"refused", b"bad header"}
    assert by_value[b"refused"]["mq.dlh.reason"] == b"2085"
    assert by_value[b"refused"]["kafka.offset"] == b"1"
    assert by_value[b"bad header"]["kafka.offset"] == b"3"
    assert b"not UTF-8" in by_value[b"bad header"]["mqgw.error"]


@pytest.mark.parametrize("backend", ["aiokafka", "confluent"])
async def test_restart_loses_nothing_and_handles_nothing_twice(
    kafka_broker: KafkaBroker, backend: str
) -> None:
    source = unique("rr-restart")
    config = _config(kafka_broker, backend=backend)
    await produce(kafka_broker.bootstrap, source, [(None, b"r%d" % i, []) for i in range(3)])
    instance = await _started(config)
    before = _Recorder()
    try:
        await instance.consume("restart", [source], before)
        await before.wait_for(3)
        async with asyncio.timeout(30):
            while await _committed(kafka_broker, f"{GATEWAY_ID}.rr.restart", source) != 3:
                await asyncio.sleep(0.1)
    finally:
        await instance.stop()
    assert not instance.exchanges  # stop() ended the consumers
    # Sent while the gateway is down.
    await produce(kafka_broker.bootstrap, source, [(None, b"r%d" % i, []) for i in range(3, 5)])
    again = await _started(config)
    after = _Recorder()
    try:
        await again.consume("restart", [source], after)
        await after.wait_for(2)
        await asyncio.sleep(1.0)  # nothing else may come
    finally:
        await again.stop()
    assert before.payloads == [b"r0", b"r1", b"r2"]
    assert after.payloads == [b"r3", b"r4"]


async def test_consume_twice_for_one_route_is_idempotent(kafka_broker: KafkaBroker) -> None:
    source = unique("rr-twice")
    instance = await _started(_config(kafka_broker))
    handler, other = _Recorder(), _Recorder()
    try:
        await instance.consume("twice", [source], handler)
        await instance.consume("twice", [source], other)
        assert instance.exchanges is not None
        assert list(instance.exchanges.consumers) == ["twice"]
        await produce(kafka_broker.bootstrap, source, [(None, b"once", [])])
        await handler.wait_for(1)
        await asyncio.sleep(1.0)
    finally:
        await instance.stop()
    assert handler.payloads == [b"once"]
    assert other.payloads == []


async def test_record_larger_than_max_request_size_is_refused_with_2030(
    kafka_broker: KafkaBroker,
) -> None:
    target = unique("rr-big")
    instance = await _started(_config(kafka_broker, max_request_size=4096))
    envelopes = [
        Envelope(stream="", topic=target, payload=b"small-1", correlation_data=b"c1"),
        Envelope(stream="", topic=target, payload=b"x" * 20_000, correlation_data=b"c2"),
        Envelope(stream="", topic=target, payload=b"small-3", correlation_data=b"c3"),
    ]
    try:
        with pytest.raises(DeliveryRefusedError) as refused:
            await instance.produce(envelopes)
        assert instance.stats()["exchange_refused"] == 1
    finally:
        await instance.stop()
    assert (refused.value.index, refused.value.reason) == (1, 2030)
    records = await consume(kafka_broker.bootstrap, target, 2)
    assert [(r.key, r.value) for r in records] == [(b"c1", b"small-1"), (b"c3", b"small-3")]


@pytest.mark.parametrize("delivery", ["at_least_once", "exactly_once"])
async def test_produce_shares_the_outbound_producer_unless_it_is_transactional(
    kafka_broker: KafkaBroker, delivery: str
) -> None:
    target, prefix = unique("rr-shared"), unique("rr-pubsub")
    config = _config(
        kafka_broker,
        delivery=delivery,
        outbound={"topic_template": prefix + ".{stream}"},
    )
    instance = await _started(config)
    try:
        await instance.produce([Envelope(stream="", topic=target, payload=b"r", reply_topic="x")])
        exchanges = instance.exchanges
        assert exchanges is not None and instance.sink is not None
        if delivery == "at_least_once":
            assert exchanges.own_sink is None  # the outbound sink's producer did it
        else:  # never inside (or fencing) the outbound sink's transactions
            assert exchanges.own_sink is not None and exchanges.own_sink.ledger is None
            assert exchanges.own_sink.producer is not instance.sink.producer
        assert exchanges.stats()["exchange_produced"] == 1
    finally:
        await instance.stop()
    [record] = await consume(kafka_broker.bootstrap, target, 1)
    assert (record.value, headers_of(record)) == (b"r", {"mq.reply.topic": b"x"})


async def test_reply_topic_kafka_cannot_name_is_refused_before_sending(
    kafka_broker: KafkaBroker,
) -> None:
    """A reply topic with "/" (an MQTT-style template) is refused for good with 2085,
    not retried forever as a topic-creation failure."""
    target = unique("rr-name")
    instance = await _started(_config(kafka_broker))
    envelopes = [
        Envelope(stream="", topic=target, payload=b"ok", correlation_data=b"c1"),
        Envelope(stream="", topic=f"{target}/reply", payload=b"bad", correlation_data=b"c2"),
    ]
    try:
        with pytest.raises(DeliveryRefusedError) as refused:
            await instance.produce(envelopes)
        assert instance.stats()["exchange_refused"] == 1
    finally:
        await instance.stop()
    assert (refused.value.index, refused.value.reason) == (1, 2085)


async def test_topic_creation_kafka_refuses_for_good_is_not_retriable() -> None:
    class _Admin:
        async def create_topics(self, new: list[Any]) -> Any:
            return type("R", (), {"topic_errors": [("bad", 17, "Invalid topic")]})()

    creator = TopicCreator(KafkaPluginConfig(), "test")
    with pytest.raises(KafkaPluginError) as failed:
        await creator._create(cast(Any, _Admin()), [])
    assert not failed.value.retriable

    class _Down(_Admin):
        async def create_topics(self, new: list[Any]) -> Any:
            return type("R", (), {"topic_errors": [("t", 7, "Request timed out")]})()

    with pytest.raises(KafkaPluginError) as timed_out:
        await creator._create(cast(Any, _Down()), [])
    assert timed_out.value.retriable


# ---------------------------------------------- the gateway's own records (issue 29) -----


@dataclass
class _Collector:
    """A publisher into MQ that records what the inbound route publishes."""

    published: list[Envelope] = field(default_factory=list)

    async def publish(self, publications: Sequence[Envelope]) -> None:
        self.published.extend(publications)


def _console_produce(kafka_broker: KafkaBroker, topic: str, line: bytes) -> None:
    """One record written by Kafka's own console producer (an outside party)."""
    _run_tool(
        "kafka-console-producer",
        "--bootstrap-server", kafka_broker.bootstrap,
        "--topic", topic,
        "--reader-property", "parse.key=true",
        "--reader-property", "key.separator=|",
        stdin=line + b"\n",
    )  # fmt: skip


async def test_an_inbound_route_never_takes_a_reply_back_into_mq(
    kafka_broker: KafkaBroker,
) -> None:
    """A requester named the inbound route's topic as its reply topic: the reply the
    gateway writes there carries its origin, so the route does not publish it into MQ
    (the outsider's record behind it is published)."""
    inbound = unique("rr-inbound")
    config = _config(kafka_broker, inbound={"topics": [{"kafka_topic": inbound}]})
    instance = KafkaInstance("kafka", config)
    collector = _Collector()
    await instance.start(_Context(publisher=cast(Any, collector)))
    try:
        await instance.produce(
            [Envelope(stream="", topic=inbound, payload=b"a reply", correlation_data=b"c1")]
        )
        await asyncio.to_thread(_console_produce, kafka_broker, inbound, b"news/1|outsider")
        async with asyncio.timeout(60):
            while not any(p.payload == b"outsider" for p in collector.published):
                await asyncio.sleep(0.05)
        stats = instance.stats()
    finally:
        await instance.stop()
    # One partition, in order: the reply was read (and skipped) before the outsider's.
    assert [(p.topic, p.payload) for p in collector.published] == [("news/1", b"outsider")]
    assert stats["inbound_skipped_own"] == 1


async def test_an_exchange_source_refuses_the_gateways_own_records(
    kafka_broker: KafkaBroker,
) -> None:
    """A requester named a request source as its reply topic: the reply written there is
    dead-lettered (reason 2035), never handled as a request."""
    source, dead = unique("rr-own-src"), unique("rr-own-dlq")
    instance = await _started(_config(kafka_broker, inbound={"dead_letter_topic": dead}))
    handler = _Recorder()
    try:
        await instance.consume("own", [source], handler)
        await instance.produce(
            [Envelope(stream="", topic=source, payload=b"a reply", correlation_data=b"c1")]
        )
        await asyncio.to_thread(_console_produce, kafka_broker, source, b"k|a request")
        await handler.wait_for(1)
        [dead_letter] = await consume(kafka_broker.bootstrap, dead, 1)
        stats = instance.stats()
    finally:
        await instance.stop()
    assert handler.payloads == [b"a request"]
    assert dead_letter.value == b"a reply"
    headers = headers_of(dead_letter)
    assert headers["mq.dlh.reason"] == b"2035"
    assert b"own origin" in headers["mqgw.error"]
    assert headers["kafka.topic"] == source.encode()
    assert (stats["exchange_own_origin_refused"], stats["exchange_dead_lettered"]) == (1, 1)
