"""MQ -> Kafka through a whole gateway (embedded QM, broker service, plugin host) and the
real Kafka broker: topic names, keys and headers per docs/kafka-contract.md, order per
topic, retained publications and DeletePublication tombstones."""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from pathlib import Path

import pytest
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

from gateway.devstack import KafkaBroker
from gateway.wire.folder import Element
from plugins.kafka import KafkaPluginConfig
from plugins.kafka.errors import KafkaPluginError
from tests.plugins.kafka.kafka_harness import (
    BULLETIN,
    DEFAULT,
    STOCK,
    consume,
    headers_of,
    send_command,
    start_gateway,
    unique,
)
from tests.support.pubsub_messages import rfh2_message, rfh_message

pytestmark = [pytest.mark.kafka]


def _config(bootstrap: str, prefix: str, **extra: object) -> KafkaPluginConfig:
    return KafkaPluginConfig.model_validate(
        {
            "bootstrap_servers": bootstrap,
            "outbound": {
                "topic_template": prefix + ".{stream}",
                "retained_topic_template": prefix + "-retained.{stream}",
                "routes": [{"stream": STOCK}, {"stream": BULLETIN}, {"stream": DEFAULT}],
            },
            **extra,
        }
    )


@pytest.mark.parametrize("backend", ["aiokafka", "confluent"])
async def test_mqrfh_and_mqrfh2_publications_land_per_contract(
    kafka_broker: KafkaBroker, tmp_path: Path, backend: str
) -> None:
    p = unique("c")
    gw = await start_gateway(tmp_path, _config(kafka_broker.bootstrap, p, backend=backend))
    try:
        before_ms = int(time.time() * 1000)
        # MQRFH publisher, explicit stream name, one user name/value pair.
        await send_command(
            gw.qm,
            rfh_message(
                STOCK,
                [
                    ("MQPSCommand", "Publish"),
                    ("MQPSStreamName", STOCK),
                    ("MQPSTopic", "IBM/Latest"),
                    ("MQPSSeqNum", "42"),
                    ("Exchange", "NYSE"),
                ],
                b"IBM 118.50",
                user_identifier="stockapp",
            ),
        )
        # MQRFH2 publisher using the $SYS/STREAM prefix, typed and untyped usr properties.
        usr = Element.from_pairs("usr", {"Colour": "Blue"})
        usr.add("Count", 7, dt="i4")
        await send_command(
            gw.qm,
            rfh2_message(
                DEFAULT,
                [("Command", "Publish"), ("Topic", f"$SYS/STREAM/{BULLETIN}/News/UK é")],
                b"<news>rain</news>",
                folders=[usr],
                persistence=0,
            ),
        )
        # Default stream, no stream prefix.
        await send_command(
            gw.qm,
            rfh2_message(DEFAULT, [("Command", "Publish"), ("Topic", "Weather/Today")], b"sun"),
        )
        stock = await consume(kafka_broker.bootstrap, f"{p}.STOCK.STREAM", 1)
        bulletin = await consume(kafka_broker.bootstrap, f"{p}.BULLETIN.STREAM", 1)
        default = await consume(kafka_broker.bootstrap, f"{p}.SYSTEM.BROKER.DEFAULT.STREAM", 1)
        after_ms = int(time.time() * 1000)
    finally:
        await gw.close()

    assert [r.key for r in stock] == [b"IBM/Latest"]
    assert stock[0].value == b"IBM 118.50"
    h = headers_of(stock[0])
    assert h["mq.contract"] == b"1"
    assert h["mq.stream"] == STOCK.encode()
    assert h["mq.topic"] == b"IBM/Latest"
    assert len(h["mq.msgId"]) == 24 and len(h["mq.correlId"]) == 24
    put_ms = int(h["mq.putTime"])
    assert before_ms - 1000 <= put_ms <= after_ms + 1000
    assert h["mq.format"] == b"MQSTR"
    assert h["mq.encoding"] == b"546"
    assert h["mq.ccsid"] == b"1208"
    assert h["mq.persistence"] == b"1"
    assert h["mq.pubHeader"] == b"MQRFH"
    assert h["mq.seqNum"] == b"42"
    assert h["mq.origin"] == b"gw-test"
    assert h["mq.nv.Exchange"] == b"NYSE"
    assert "mq.retain" not in h
    assert not any(k.startswith("mq.nv.MQPS") for k in h)

    # The escape is reversible: a space and é in the topic do not affect the key.
    assert [r.key for r in bulletin] == ["News/UK é".encode()]
    hb = headers_of(bulletin[0])
    assert hb["mq.stream"] == BULLETIN.encode()
    assert hb["mq.topic"] == "News/UK é".encode()
    assert hb["mq.pubHeader"] == b"MQRFH2"
    assert hb["usr.Colour"] == b"Blue"
    assert hb["usr.Count"] == b"7"
    assert hb["mq.usrType.Count"] == b"i4"
    assert "mq.usrType.Colour" not in hb
    assert hb["mq.persistence"] == b"0"
    assert bulletin[0].value == b"<news>rain</news>"

    assert [r.key for r in default] == [b"Weather/Today"]
    assert headers_of(default[0])["mq.stream"] == DEFAULT.encode()


async def test_publisher_mqmd_identity_reaches_kafka(
    kafka_broker: KafkaBroker, tmp_path: Path
) -> None:
    p = unique("m")
    gw = await start_gateway(tmp_path, _config(kafka_broker.bootstrap, p))
    correl = b"CORREL-FROM-PUBLISHER".ljust(24, b"\x00")
    try:
        msg = rfh2_message(
            DEFAULT,
            [("Command", "Publish"), ("Topic", f"$SYS/STREAM/{STOCK}/IBM/Latest")],
            b"x",
            correl_id=correl,
            user_identifier="stockapp",
        )
        msg_id = await send_command(gw.qm, msg, set_identity=True)
        records = await consume(kafka_broker.bootstrap, f"{p}.STOCK.STREAM", 1)
    finally:
        await gw.close()
    h = headers_of(records[0])
    assert h["mq.msgId"] == msg_id
    assert h["mq.correlId"] == correl
    assert h["mq.userId"] == b"stockapp"


@pytest.mark.parametrize("backend", ["aiokafka", "confluent"])
async def test_order_per_topic_is_kept_across_partitions(
    kafka_broker: KafkaBroker, tmp_path: Path, backend: str
) -> None:
    p = unique("o")
    cfg = _config(kafka_broker.bootstrap, p, partitions=3, backend=backend)
    gw = await start_gateway(tmp_path, cfg)
    n, topics = 240, ["IBM/Latest", "MSFT/Latest", "ACME/Latest", "X/Y/Z"]
    try:
        for i in range(n):
            topic = topics[i % len(topics)]
            await send_command(
                gw.qm,
                rfh2_message(
                    STOCK,
                    [("Command", "Publish"), ("Topic", f"$SYS/STREAM/{STOCK}/{topic}")],
                    str(i).encode(),
                ),
            )
        records = await consume(kafka_broker.bootstrap, f"{p}.STOCK.STREAM", n, timeout=60)
    finally:
        await gw.close()
    assert len(records) == n  # nothing lost, nothing duplicated
    by_key: dict[bytes, list[int]] = defaultdict(list)
    partitions: dict[bytes, set[int]] = defaultdict(set)
    for r in sorted(records, key=lambda r: (r.partition, r.offset)):
        by_key[r.key].append(int(r.value))
        partitions[r.key].add(r.partition)
    assert set(by_key) == {t.encode() for t in topics}
    for i, topic in enumerate(topics):
        assert by_key[topic.encode()] == list(range(i, n, len(topics)))
        assert len(partitions[topic.encode()]) == 1
    assert len({pt for s in partitions.values() for pt in s}) > 1  # spread over partitions


async def _cleanup_policy(bootstrap: str, topic: str) -> str:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        responses = await admin.describe_configs(
            [ConfigResource(ConfigResourceType.TOPIC, topic, configs={"cleanup.policy": None})]
        )
    finally:
        await admin.close()
    for response in responses:
        for _code, _msg, _type, _name, entries in response.resources:
            for entry in entries:
                if entry[0] == "cleanup.policy":
                    return str(entry[1])
    raise AssertionError(f"no cleanup.policy for {topic}")


@pytest.mark.parametrize("backend", ["aiokafka", "confluent"])
async def test_retained_publication_goes_to_compacted_topic_and_delete_writes_tombstone(
    kafka_broker: KafkaBroker, tmp_path: Path, backend: str
) -> None:
    p = unique("r")
    gw = await start_gateway(tmp_path, _config(kafka_broker.bootstrap, p, backend=backend))
    main, retained = f"{p}.STOCK.STREAM", f"{p}-retained.STOCK.STREAM"
    try:
        await send_command(
            gw.qm,
            rfh_message(
                STOCK,
                [
                    ("MQPSCommand", "Publish"),
                    ("MQPSStreamName", STOCK),
                    ("MQPSTopic", "IBM/Latest"),
                    ("MQPSPubOpts", "RetainPub"),
                ],
                b"IBM 118.50",
            ),
        )
        live = await consume(kafka_broker.bootstrap, main, 1)
        kept = await consume(kafka_broker.bootstrap, retained, 1)
        await send_command(
            gw.qm,
            rfh_message(
                STOCK,
                [
                    ("MQPSCommand", "DeletePub"),
                    ("MQPSStreamName", STOCK),
                    ("MQPSTopic", "IBM/Latest"),
                ],
            ),
        )
        after_delete = await consume(kafka_broker.bootstrap, retained, 2)
        policy_retained = await _cleanup_policy(kafka_broker.bootstrap, retained)
        policy_main = await _cleanup_policy(kafka_broker.bootstrap, main)
    finally:
        await gw.close()
    assert [(r.key, r.value) for r in live] == [(b"IBM/Latest", b"IBM 118.50")]
    assert headers_of(live[0])["mq.retain"] == b"1"
    assert [(r.key, r.value) for r in kept] == [(b"IBM/Latest", b"IBM 118.50")]
    assert [(r.key, r.value) for r in after_delete] == [
        (b"IBM/Latest", b"IBM 118.50"),
        (b"IBM/Latest", None),
    ]
    tomb = headers_of(after_delete[1])
    assert tomb["mq.stream"] == STOCK.encode() and tomb["mq.topic"] == b"IBM/Latest"
    assert "mq.msgId" not in tomb
    assert policy_retained == "compact"
    assert policy_main == "delete"


async def test_unreachable_kafka_fails_start_clearly(tmp_path: Path) -> None:
    cfg = KafkaPluginConfig(bootstrap_servers="127.0.0.1:1", request_timeout_ms=2000)
    with pytest.raises(KafkaPluginError, match=r"127\.0\.0\.1:1") as info:
        await start_gateway(tmp_path, cfg)
    assert info.value.retriable


async def test_routes_pick_the_template_of_the_matching_subscription(
    kafka_broker: KafkaBroker, tmp_path: Path
) -> None:
    p = unique("route")
    cfg = KafkaPluginConfig.model_validate(
        {
            "bootstrap_servers": kafka_broker.bootstrap,
            "outbound": {
                "topic_template": p + ".{stream}",
                "routes": [
                    {"stream": STOCK, "topic": "IBM/#", "kafka_topic": p + ".ibm.{topic}"},
                    {"stream": STOCK, "topic": "MSFT/#"},
                ],
            },
        }
    )
    gw = await start_gateway(tmp_path, cfg)
    try:
        for topic in ("IBM/Latest", "MSFT/Latest", "ACME/Latest"):
            await send_command(
                gw.qm,
                rfh2_message(
                    STOCK,
                    [("Command", "Publish"), ("Topic", f"$SYS/STREAM/{STOCK}/{topic}")],
                    topic.encode(),
                ),
            )
        ibm = await consume(kafka_broker.bootstrap, f"{p}.ibm.IBM_2FLatest", 1)
        msft = await consume(kafka_broker.bootstrap, f"{p}.STOCK.STREAM", 1)
    finally:
        await gw.close()
    assert [(r.key, r.value) for r in ibm] == [(b"IBM/Latest", b"IBM/Latest")]
    # ACME/Latest matches no route: not subscribed, not bridged.
    assert [(r.key, r.value) for r in msft] == [(b"MSFT/Latest", b"MSFT/Latest")]


async def test_existing_retained_topic_that_is_not_compacted_is_reported(
    kafka_broker: KafkaBroker, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    p = unique("nc")
    admin = AIOKafkaAdminClient(bootstrap_servers=kafka_broker.bootstrap)
    await admin.start()
    try:
        await admin.create_topics(
            [
                NewTopic(
                    f"{p}-retained.STOCK.STREAM", 1, 1, topic_configs={"cleanup.policy": "delete"}
                )
            ]
        )
    finally:
        await admin.close()
    with caplog.at_level(logging.WARNING, logger="plugins.kafka.sink"):
        gw = await start_gateway(tmp_path, _config(kafka_broker.bootstrap, p))
        await gw.close()
    warnings = [r.getMessage() for r in caplog.records if r.name == "plugins.kafka.sink"]
    assert any(f"{p}-retained.STOCK.STREAM" in w and "not compact" in w for w in warnings)
    assert not any(f"{p}-retained.BULLETIN.STREAM" in w for w in warnings)
