"""The ``backend:`` setting (aiokafka | confluent): what the configuration accepts and
refuses, the security block as librdkafka properties, librdkafka's errors as the
aiokafka classes the sink's rules use (no broker needed; the real-broker runs of both
backends are in the contract, console-client, outbound, inbound and security modules)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import confluent_kafka
import pytest
from aiokafka.errors import (
    KafkaConnectionError,
    KafkaTimeoutError,
    MessageSizeTooLargeError,
    NotLeaderForPartitionError,
    ProducerFenced,
    TopicAuthorizationFailedError,
)
from pydantic import ValidationError

from plugins.kafka import KafkaPluginConfig
from plugins.kafka.clients import new_consumer, new_producer
from plugins.kafka.clients.aiokafka_client import client_args
from plugins.kafka.clients.confluent_client import (
    ConfluentConsumer,
    ConfluentProducer,
    translate,
)
from plugins.kafka.config import CONFLUENT_LINGER_MS
from plugins.kafka.errors import MQRC_MSG_TOO_BIG_FOR_Q
from plugins.kafka.security import librdkafka_security
from plugins.kafka.sink import producer_state_is_broken, refusal_reason

CK = confluent_kafka.KafkaError


def _cfg(**kw: Any) -> KafkaPluginConfig:
    return KafkaPluginConfig.model_validate(kw)


def test_aiokafka_is_the_default_backend_and_confluent_is_accepted() -> None:
    assert _cfg().backend == "aiokafka"
    cfg = _cfg(backend="confluent", client_options={"batch.num.messages": 5000})
    assert cfg.backend == "confluent"
    # librdkafka's own default linger unless the config sets one (0 included).
    assert (_cfg().linger_ms, cfg.linger_ms) == (0, CONFLUENT_LINGER_MS)
    assert _cfg(backend="confluent", linger_ms=0).linger_ms == 0
    with pytest.raises(ValidationError, match="backend"):
        _cfg(backend="kafka-python")


@pytest.mark.parametrize(
    ("options", "problem"),
    [
        ({"retry_backoff_ms": 1}, "look like aiokafka arguments"),
        ({"enable.idempotence": False}, "the plugin fixes them"),
        ({"acks": "1"}, "the plugin fixes them"),
        ({"message.timeout.ms": 1000}, "the plugin fixes them"),
        ({"transactional.id": "x"}, "the plugin fixes them"),
        ({"ssl.ca.location": "/x"}, "security: block"),
        ({"sasl.password": "x"}, "security: block"),
        ({"security.protocol": "SSL"}, "security: block"),
    ],
)
def test_confluent_refuses_what_it_cannot_map_at_config_check(
    options: dict[str, Any], problem: str
) -> None:
    with pytest.raises(ValidationError, match=problem):
        _cfg(backend="confluent", client_options=options)


def test_confluent_client_options_never_reach_the_aiokafka_admin_client() -> None:
    cfg = _cfg(backend="confluent", client_options={"batch.num.messages": 5000})
    assert "batch.num.messages" not in client_args(cfg, "x")
    aio = _cfg(client_options={"retry_backoff_ms": 50})
    assert client_args(aio, "x")["retry_backoff_ms"] == 50


@pytest.mark.parametrize(
    ("settings", "batch_bytes"),
    [({}, 262_144), ({"max_batch_size": 32_768}, 32_768),
     ({"max_request_size": 100_000}, 100_000),
     ({"backend": "confluent"}, 1_000_000),
     ({"backend": "confluent", "max_batch_size": 40_000}, 40_000)],
)
async def test_the_producer_batches_up_to_max_batch_size(
    settings: dict[str, Any], batch_bytes: int
) -> None:
    """The plugin's producer builds record batches of up to ``max_batch_size`` bytes
    (default: 256 KiB with aiokafka, whose own 16 KiB made a unit of work of 256 KiB
    wait for 16 round trips; librdkafka's 1,000,000 with confluent), never more than
    ``max_request_size``; the sink's cap (a topic's max.message.bytes) wins over both.
    ``client_options`` may set neither aiokafka's max_batch_size (it reached the consumer
    and admin client too, which refuse the argument) nor librdkafka's batch.size."""
    cfg = _cfg(**settings)
    assert cfg.producer_batch_bytes() == batch_bytes
    for cap, expected in ((None, batch_bytes), (20_000, 20_000)):
        producer = new_producer(cfg, "x", batch_bytes=cap)
        if isinstance(producer, ConfluentProducer):
            assert producer._props["batch.size"] == expected
        else:
            try:
                # aiokafka 0.14's accumulator keeps the batch size here
                assert producer._message_accumulator._batch_size == expected  # type: ignore[attr-defined]
            finally:
                await producer.stop()
    with pytest.raises(ValidationError, match=r"may not set \['max_batch_size'\]"):
        _cfg(client_options={"max_batch_size": 4096})
    with pytest.raises(ValidationError, match=r"may not set \['batch.size'\]"):
        _cfg(backend="confluent", client_options={"batch.size": 4096})


async def test_the_port_builds_the_configured_backend() -> None:
    cfg = _cfg(backend="confluent", linger_ms=3, compression_type="lz4")
    producer = new_producer(cfg, "c", transactional_id="t")
    assert isinstance(producer, ConfluentProducer)
    props = producer._props
    assert (props["acks"], props["enable.idempotence"]) == ("all", True)
    assert (props["linger.ms"], props["compression.type"]) == (3, "lz4")
    assert props["transactional.id"] == "t"
    assert props["message.max.bytes"] == cfg.max_request_size
    consumer = new_consumer(cfg, ["t1"], "c", group_id="g", auto_offset_reset="latest")
    assert isinstance(consumer, ConfluentConsumer)
    assert consumer._props["isolation.level"] == "read_committed"
    assert consumer._props["enable.auto.commit"] is False
    assert consumer._props["auto.offset.reset"] == "latest"
    aio = new_producer(_cfg(), "c")
    assert type(aio).__name__ == "AIOKafkaProducer"
    await aio.stop()


def _pem(tmp_path: Path, name: str) -> str:
    path = tmp_path / name
    path.write_text("-----BEGIN CERTIFICATE-----\n")
    return str(path)


def test_security_block_as_librdkafka_properties(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ca, cert, key = _pem(tmp_path, "ca.pem"), _pem(tmp_path, "c.pem"), _pem(tmp_path, "k.pem")
    monkeypatch.setenv("T_KEY_PW", "kpw")
    monkeypatch.setenv("T_SASL_PW", "spw")
    assert librdkafka_security(_cfg().security, "i") == {}
    ssl = _cfg(security={"protocol": "SSL", "tls": {
        "ca_file": ca, "cert_file": cert, "key_file": key,
        "key_password": {"env": "T_KEY_PW"}}}).security
    assert librdkafka_security(ssl, "i") == {
        "security.protocol": "SSL",
        "ssl.ca.location": ca,
        "ssl.endpoint.identification.algorithm": "https",
        "ssl.certificate.location": cert,
        "ssl.key.location": key,
        "ssl.key.password": "kpw",
    }
    sasl = _cfg(security={
        "protocol": "SASL_SSL", "tls": {"check_hostname": False},
        "sasl": {"mechanism": "SCRAM-SHA-512", "username": "carol",
                 "password": {"env": "T_SASL_PW"}}}).security
    assert librdkafka_security(sasl, "i") == {
        "security.protocol": "SASL_SSL",
        "ssl.ca.location": "probe",
        "ssl.endpoint.identification.algorithm": "none",
        "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.username": "carol",
        "sasl.password": "spw",
    }
    plain = _cfg(security={"protocol": "SASL_PLAINTEXT", "sasl": {
        "username": "u", "password": "p"}}).security
    assert librdkafka_security(plain, "i") == {
        "security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "PLAIN",
        "sasl.username": "u", "sasl.password": "p",
    }


def test_librdkafka_errors_keep_the_sinks_rules() -> None:
    too_big = translate(CK(CK.MSG_SIZE_TOO_LARGE))
    assert isinstance(too_big, MessageSizeTooLargeError)
    assert refusal_reason(too_big) == MQRC_MSG_TOO_BIG_FOR_Q
    assert not producer_state_is_broken(too_big)
    timed_out = translate(CK(CK._MSG_TIMED_OUT))
    assert isinstance(timed_out, KafkaTimeoutError)
    assert not producer_state_is_broken(timed_out)
    down = translate(CK(CK._ALL_BROKERS_DOWN))
    assert isinstance(down, KafkaConnectionError) and down.retriable
    assert not producer_state_is_broken(down)
    assert isinstance(translate(CK(CK.NOT_LEADER_FOR_PARTITION)), NotLeaderForPartitionError)
    acl = translate(CK(CK.TOPIC_AUTHORIZATION_FAILED))
    assert isinstance(acl, TopicAuthorizationFailedError)
    assert not producer_state_is_broken(acl)
    fatal = translate(CK(CK.OUT_OF_ORDER_SEQUENCE_NUMBER, fatal=True))
    assert producer_state_is_broken(fatal) and not fatal.retriable
    assert isinstance(translate(CK(CK._FENCED, fatal=True)), ProducerFenced)
    wrapped = translate(confluent_kafka.KafkaException(CK(CK.MSG_SIZE_TOO_LARGE)))
    assert isinstance(wrapped, MessageSizeTooLargeError)
