"""The confluent producer's ``send_round`` (a sink round in one call, issue 32 row 4):
its records are settled together once the last delivery report came, yet each with its
own outcome: a record that failed in the middle of a batch is reported failed (and at
once: a transaction waits for its first failure), its neighbours delivered, and no
record of a batch is settled as delivered before its own report came."""

from __future__ import annotations

import asyncio
import threading
from typing import Any, ClassVar

import pytest
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import MessageSizeTooLargeError, RecordTooLargeError

from gateway.devstack import KafkaBroker
from plugins.kafka import KafkaPluginConfig
from plugins.kafka.clients import confluent_client
from plugins.kafka.clients.confluent_client import ConfluentProducer
from tests.plugins.kafka.kafka_harness import consume, unique


class _HeldReports:
    """A stand-in librdkafka producer whose delivery reports the test serves by hand
    (``serve``), on a thread of its own as librdkafka's poll thread would, in any order;
    ``poll`` serves nothing. ``early`` records are reported inside ``produce`` (a report
    that comes before the batch is sealed)."""

    early: ClassVar[set[bytes]] = set()

    def __init__(self, props: dict[str, Any]) -> None:
        self.callbacks: dict[bytes, Any] = {}

    def list_topics(self, timeout: float) -> None:
        return None

    def produce(self, topic: str, value: bytes, key: Any, *, headers: Any = None,
                on_delivery: Any = None, **extra: Any) -> None:
        if value in self.early:
            on_delivery(None, value)
        else:
            self.callbacks[value] = on_delivery

    def serve(self, value: bytes, err: Any) -> None:
        callback = self.callbacks.pop(value)
        thread = threading.Thread(target=callback, args=(err, value))
        thread.start()
        thread.join()

    def poll(self, timeout: float) -> int:
        threading.Event().wait(min(timeout, 0.01))
        return 0

    def purge(self) -> None:
        return None

    def __len__(self) -> int:
        return 0


async def _settled(futures: list[asyncio.Future[None]], count: int) -> None:
    async with asyncio.timeout(5):
        while sum(f.done() for f in futures) < count:
            await asyncio.sleep(0.001)


async def test_a_batch_settles_on_its_last_report_each_record_with_its_own_outcome(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(confluent_client.confluent_kafka, "Producer", _HeldReports)
    _HeldReports.early = {b"0", b"1"}  # reported before the batch is sealed
    producer = ConfluentProducer(KafkaPluginConfig.model_validate({"backend": "confluent"}), "t")
    await producer.start()
    try:
        values = [b"%d" % i for i in range(8)]
        futures, refused = await producer.send_round([("t", v, None, []) for v in values])
        assert refused is None and len(futures) == 8
        fake = producer._producer
        timed_out = confluent_client.confluent_kafka.KafkaError(
            confluent_client.confluent_kafka.KafkaError._MSG_TIMED_OUT
        )
        # reported out of order: a failure in the middle (settled at once), then all
        # but one of the rest: none of those is settled yet
        fake.serve(b"4", timed_out)
        await _settled(futures, 1)
        for value in (b"7", b"2", b"6", b"3"):
            fake.serve(value, None)
        # ``serve`` joined the reporting thread, so any hand-over it made is queued on
        # the loop already: one loop turn runs it
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        assert [f.done() for f in futures] == [False] * 4 + [True] + [False] * 3
        fake.serve(b"5", None)  # the last report: the whole batch settles
        await _settled(futures, 8)
        outcomes = [f.exception() for f in futures]
        assert [type(o).__name__ for o in outcomes] == (
            ["NoneType"] * 4 + ["KafkaTimeoutError"] + ["NoneType"] * 3
        )
    finally:
        await producer.stop()


async def test_a_batch_reported_in_full_before_it_is_sealed_settles(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(confluent_client.confluent_kafka, "Producer", _HeldReports)
    _HeldReports.early = {b"%d" % i for i in range(5)}
    producer = ConfluentProducer(KafkaPluginConfig.model_validate({"backend": "confluent"}), "t")
    await producer.start()
    try:
        futures, _ = await producer.send_round([("t", b"%d" % i, None, []) for i in range(5)])
        await _settled(futures, 5)
        assert all(f.exception() is None for f in futures)
    finally:
        await producer.stop()


@pytest.mark.kafka
async def test_records_the_broker_refuses_in_the_middle_of_a_batch_fail_alone(
    kafka_broker: KafkaBroker,
) -> None:
    """Real broker: a batch whose records 3 and 6 go to a topic whose max.message.bytes
    they exceed. Those two fail with the size refusal; the other seven are delivered
    and acknowledged as such, once each."""
    ok, small = unique("batchok"), unique("batchsmall")
    admin = AIOKafkaAdminClient(bootstrap_servers=kafka_broker.bootstrap)
    await admin.start()
    try:
        await admin.create_topics([
            NewTopic(ok, 1, 1),
            NewTopic(small, 1, 1, topic_configs={"max.message.bytes": "2000"}),
        ])
    finally:
        await admin.close()
    config = KafkaPluginConfig.model_validate(
        {"bootstrap_servers": kafka_broker.bootstrap, "backend": "confluent",
         "send_timeout_s": 30}
    )
    producer = ConfluentProducer(config, "t")
    await producer.start()
    try:
        records = [
            (small, b"x" * 5000, None, [("n", b"%d" % i)]) if i in (3, 6)
            else (ok, b"%d" % i, None, [("n", b"%d" % i)])
            for i in range(9)
        ]
        futures, refused = await producer.send_round(records)
        assert refused is None
        async with asyncio.timeout(30):
            outcomes = await asyncio.gather(*futures, return_exceptions=True)
    finally:
        await producer.stop()
    failed = [i for i, o in enumerate(outcomes) if isinstance(o, BaseException)]
    assert failed == [3, 6], outcomes
    assert all(isinstance(outcomes[i], (MessageSizeTooLargeError, RecordTooLargeError))
               for i in failed), outcomes
    on_kafka = await consume(kafka_broker.bootstrap, ok, 7, extra_wait_ms=1000)
    assert [r.value for r in on_kafka] == [b"%d" % i for i in range(9) if i not in (3, 6)]
