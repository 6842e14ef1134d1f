"""The confluent producer's delivery reports served outside its poll thread (review F5):
librdkafka's ``commit_transaction``/``abort_transaction`` flush and serve delivery
reports on the calling thread (an ``asyncio.to_thread`` worker). Such a report is
settled directly on the loop, never appended to the list the poll thread swaps out (an
append racing the swap could be lost: the send would wait for ``send_timeout_s`` and
the batch be sent again)."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import KafkaError as AioKafkaError
from aiokafka.errors import ProducerFenced

from gateway.devstack import KafkaBroker
from plugins.kafka import KafkaPluginConfig
from plugins.kafka.clients import confluent_client, outcome_seen
from plugins.kafka.clients.confluent_client import ConfluentProducer
from plugins.kafka.sink import producer_state_is_broken
from tests.support.names import unique


class _GatedProducer:
    """A stand-in librdkafka producer: ``poll`` serves nothing and, while ``gate`` is
    clear, stalls (a poll thread busy in a long poll); ``commit_transaction`` serves
    every delivery report on the calling thread, as librdkafka's flush does."""

    gate = threading.Event()

    def __init__(self, props: dict[str, Any]) -> None:
        self.callbacks: list[Any] = []
        self.served_on: set[int] = set()

    def list_topics(self, timeout: float) -> None:
        return None

    def init_transactions(self, timeout: float) -> None:
        return None

    def begin_transaction(self) -> None:
        return None

    def produce(self, topic: str, value: Any, key: Any, *, headers: Any = None,
                on_delivery: Any = None, **extra: Any) -> None:
        self.callbacks.append(on_delivery)

    def poll(self, timeout: float) -> int:
        if self.gate.wait(timeout):
            time.sleep(0.005)
        return 0

    def commit_transaction(self, *args: Any) -> None:
        callbacks, self.callbacks = self.callbacks, []
        for cb in callbacks:
            self.served_on.add(threading.get_ident())
            cb(None, "record")

    def purge(self) -> None:
        return None

    def __len__(self) -> int:
        return len(self.callbacks)


async def test_reports_served_by_commit_transaction_are_settled_without_the_poll_thread(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(confluent_client.confluent_kafka, "Producer", _GatedProducer)
    monkeypatch.setattr(confluent_client, "_POLL_S", 30.0)  # the poll thread stalls
    _GatedProducer.gate.clear()
    config = KafkaPluginConfig.model_validate({"backend": "confluent"})
    producer = ConfluentProducer(config, "t", transactional_id="tx-gated")
    await producer.start()
    try:
        await producer.begin_transaction()
        futures = [await producer.send("t", b"%d" % i) for i in range(50)]
        assert not any(f.done() for f in futures)
        await producer.commit_transaction()
        async with asyncio.timeout(2):  # not the poll thread's 30 s poll
            results = await asyncio.gather(*futures)
        assert results == ["record"] * 50
        fake = producer._producer
        assert fake is not None and producer._poll_ident not in fake.served_on
    finally:
        _GatedProducer.gate.set()  # lets the poll thread see stop
        await producer.stop()


class _StuckConsumer:
    """A stand-in librdkafka consumer whose ``close`` hangs until ``released`` (as
    librdkafka's can while it leaves a group after a broker restart)."""

    def __init__(self, props: dict[str, Any]) -> None:
        self.released = threading.Event()
        self.closed = threading.Event()

    def close(self) -> None:
        self.released.wait(30)
        self.closed.set()


async def test_a_timed_out_consumer_stop_ends_instead_of_swallowing_the_cancellation(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The gateway's shutdown bounds each plugin's stop with a timeout; a stop that
    swallowed its cancellation (waiting for a poll still in librdkafka) went on into a
    hanging ``close`` and the process never exited. The close still runs, afterwards."""
    from plugins.kafka.clients.confluent_client import ConfluentConsumer

    monkeypatch.setattr(confluent_client.confluent_kafka, "Consumer", _StuckConsumer)
    config = KafkaPluginConfig.model_validate({"backend": "confluent"})
    consumer = ConfluentConsumer(config, ["t"], "c", group_id="g", auto_offset_reset="earliest")
    stuck = _StuckConsumer({})
    consumer._consumer = stuck
    poll_returns = threading.Event()  # a consume() still in librdkafka
    consumer._inflight = asyncio.get_running_loop().run_in_executor(
        consumer._worker, poll_returns.wait, 30
    )
    began = time.monotonic()
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.3):
            await consumer.stop()
    waited = time.monotonic() - began
    poll_returns.set()
    stuck.released.set()
    assert waited < 5, f"the stop ignored its caller's timeout for {waited:.1f} s"
    assert await asyncio.to_thread(stuck.closed.wait, 10), "the consumer was never closed"


async def _read_committed(bootstrap: str, topic: str, count: int) -> list[Any]:
    consumer = AIOKafkaConsumer(
        topic, bootstrap_servers=bootstrap, group_id=None, auto_offset_reset="earliest",
        enable_auto_commit=False, isolation_level="read_committed",
    )
    await consumer.start()
    records: list[Any] = []
    try:
        async with asyncio.timeout(60):
            while len(records) < count:
                for batch in (await consumer.getmany(timeout_ms=200)).values():
                    records.extend(batch)
        for batch in (await consumer.getmany(timeout_ms=1000)).values():
            records.extend(batch)
    finally:
        await consumer.stop()
    return records


async def test_transactions_settle_every_send_on_a_real_broker(kafka_broker: KafkaBroker) -> None:
    """Unawaited sends, then commit (its flush serves the reports on a worker thread),
    then an aborted transaction with sends still queued: every future settles at once
    and read_committed sees the committed records exactly once and none of the aborted
    ones."""
    topic = unique("confrep")
    admin = AIOKafkaAdminClient(bootstrap_servers=kafka_broker.bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(topic, 2, 1)])
    finally:
        await admin.close()
    config = KafkaPluginConfig.model_validate(
        {"bootstrap_servers": kafka_broker.bootstrap, "backend": "confluent", "linger_ms": 50}
    )
    producer = ConfluentProducer(config, "t", transactional_id=unique("tx"))
    await producer.start()
    try:
        for rnd in range(3):
            await producer.begin_transaction()
            futures = [
                await producer.send(topic, b"%d" % (rnd * 100 + i), key=b"%d" % (i % 7))
                for i in range(100)
            ]
            await producer.commit_transaction()
            async with asyncio.timeout(5):
                await asyncio.gather(*futures)
        await producer.begin_transaction()
        # One record delivered first, so the coordinator holds the transaction open when
        # the abort comes: an abort of a transaction the coordinator has not seen begin
        # (only records still queued) can fail with INVALID_TXN_STATE, librdkafka issue
        # 4849 (the sink then replaces its producer: docs/kafka-backends.md). The 20
        # queued behind it are purged by the abort and settled by its flush.
        first = await producer.send(topic, b"aborted")
        async with asyncio.timeout(30):
            await first
        aborted = [await producer.send(topic, b"aborted") for _ in range(20)]
        await producer.abort_transaction()
        async with asyncio.timeout(5):
            await asyncio.gather(*aborted, return_exceptions=True)
    finally:
        await producer.stop()
    records = await _read_committed(kafka_broker.bootstrap, topic, 300)
    assert sorted(int(r.value) for r in records) == list(range(300))


async def test_a_send_on_a_producer_in_librdkafkas_fatal_state_says_replace_it(
    kafka_broker: KafkaBroker,
) -> None:
    """Once librdkafka has raised a fatal error, every ``produce()`` fails with
    ``_FATAL`` whose ``fatal()`` is false. That failure must still read as "only a new
    producer can send" (``producer_state_is_broken``), never as an outage to retry: the
    sink would otherwise resend through a dead producer for ever. A real fatal state: a
    transactional producer fenced by a second one with the same transactional.id."""
    topic = unique("confatal")
    config = KafkaPluginConfig.model_validate(
        {"bootstrap_servers": kafka_broker.bootstrap, "backend": "confluent"}
    )
    txn_id = unique("tx")
    fenced = ConfluentProducer(config, "t", transactional_id=txn_id)
    await fenced.start()
    newer = ConfluentProducer(config, "t", transactional_id=txn_id)
    try:
        await newer.start()  # init_transactions fences ``fenced``
        await fenced.begin_transaction()
        first = await fenced.send(topic, b"fenced")
        with pytest.raises(ProducerFenced):
            await fenced.commit_transaction()
        with pytest.raises(AioKafkaError) as failure:
            await fenced.send(topic, b"after the fatal error")
        assert not failure.value.retriable
        assert producer_state_is_broken(failure.value)
        # and its poll thread still serves (the purged records' reports, the log)
        assert fenced._thread is not None and fenced._thread.is_alive()
        first.add_done_callback(outcome_seen)  # purged by the fatal error
    finally:
        await fenced.stop()
        await newer.stop()
