"""Issue 12 item 3, Kafka side, with the real broker: a publication Kafka can never
accept (2 MB: over the producer's max_request_size, or over the broker's
message.max.bytes) raises DeliveryRefusedError for exactly that envelope (MQ reason
2030), after its neighbours in the batch were delivered once; sending the batch (or its
rest) again does not produce them twice."""

from __future__ import annotations

import pytest

from gateway.devstack import KafkaBroker
from gateway.plugin_api import DeliveryRefusedError, Envelope
from plugins.kafka import KafkaPluginConfig
from plugins.kafka.errors import MQRC_MSG_TOO_BIG_FOR_Q
from plugins.kafka.sink import KafkaSink
from tests.plugins.kafka.kafka_harness import STOCK, consume, unique

pytestmark = [pytest.mark.kafka]


def _envelope(i: int, payload: bytes) -> Envelope:
    return Envelope(
        stream=STOCK,
        topic=f"T{i}",
        payload=payload,
        msg_id=(i + 1).to_bytes(24, "big"),  # all-zero: no MsgId
        subscription_stream=STOCK,
        subscription_filter="#",
    )


@pytest.mark.parametrize("backend", ["aiokafka", "confluent"])
@pytest.mark.parametrize("max_request_size", [1_048_576, 8_388_608], ids=["client", "broker"])
async def test_a_refused_envelope_is_reported_alone_and_its_neighbours_go_once(
    kafka_broker: KafkaBroker, max_request_size: int, backend: str
) -> None:
    p = unique("refuse")
    config = KafkaPluginConfig.model_validate(
        {
            "bootstrap_servers": kafka_broker.bootstrap,
            "backend": backend,
            "max_request_size": max_request_size,  # 8 MB: the broker's 1 MB limit refuses
            "send_timeout_s": 20,
            "outbound": {"topic_template": p + ".{stream}", "routes": [{"stream": STOCK}]},
        }
    )
    sink = KafkaSink(config, config.outbound.router(), instance="kafka", gateway_id="gw-test")
    await sink.start()
    batch = [_envelope(0, b"zero"), _envelope(1, b"x" * 2_000_000), _envelope(2, b"two")]
    try:
        with pytest.raises(DeliveryRefusedError) as refused:
            await sink.send(batch)
        assert refused.value.index == 1
        assert refused.value.reason == MQRC_MSG_TOO_BIG_FOR_Q
        # The runtime dead-letters envelope 1; whether it then considers the others done
        # or sends them again, Kafka gets each of them once.
        await sink.send([batch[0], batch[2]])
        assert sink.healthy
    finally:
        await sink.stop()
    records = await consume(kafka_broker.bootstrap, f"{p}.STOCK.STREAM", 2, extra_wait_ms=1000)
    assert [r.value for r in records] == [b"zero", b"two"]
