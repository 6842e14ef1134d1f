"""A batch's MQ commit completes while the next batch is got and handled
(``gateway.mq.port.start_commit``, docs/performance.md "Commits overlapped with the next
batch"): nothing of the next batch leaves before that commit has ended, and when it
fails the next batch is backed out with it, so every message comes again in order.

The embedded queue manager's writer is held (or made to fail) at the stream batch's
transaction, so what happens meanwhile can be observed."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from gateway.mq.embedded.qmgr import EmbeddedQueueManager
from gateway.plugin_api import Envelope
from gateway.pubsub.topics import Scheme
from gateway.runtime.pubsub_service import BrokerConfig, BrokerService, StreamQueueConfig
from tests.support.gateway import InProcessGateway, build_gateway
from tests.support.pubsub_messages import rfh_message
from tests.support.service_client import put, settle

STREAM = "StreamX"


class Recording:
    """A sink that keeps what it got, in order."""

    def __init__(self) -> None:
        self.payloads: list[bytes] = []

    async def send(self, deliveries: Sequence[Envelope]) -> None:
        self.payloads += [d.payload for d in deliveries]


class HeldWriter:
    """Wraps the queue manager's store: the first transaction that deletes ``count``
    stream messages waits for :attr:`release` (or fails when ``fail``)."""

    def __init__(self, qm: EmbeddedQueueManager, count: int, *, fail: bool = False) -> None:
        self.store = qm._store
        self.real = self.store.apply
        self.count, self.fail = count, fail
        self.held = threading.Event()
        self.release = threading.Event()
        self.armed = True
        self.store.apply = self.apply  # type: ignore[method-assign]

    def apply(self, inserts: Any = (), deletes: Any = (), *rest: Any) -> None:
        deletes = list(deletes)
        if self.armed and len(deletes) == self.count:
            self.armed = False
            self.held.set()
            assert self.release.wait(10)
            if self.fail:
                raise OSError("disk gone")
        self.real(inserts, deletes, *rest)


async def _until(check: Any, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.01)


@pytest.fixture
async def gateway(tmp_path: Path) -> Any:
    config = BrokerConfig(
        streams=[StreamQueueConfig(name=STREAM)], batch_size=3, wait_ms=50, retry_delay=0.01
    )
    # BOTHRESH 1: a backout counted against a message moves it aside at its next get
    mqsc = (
        "DEFINE QLOCAL(PUB.BACKOUT) REPLACE\n"
        f"DEFINE QLOCAL('{STREAM}') DEFPSIST(YES) BOTHRESH(1) BOQNAME(PUB.BACKOUT) REPLACE"
    )
    gw = build_gateway(tmp_path, mqsc=mqsc, config=config)
    try:
        yield gw
    finally:
        await gw.close()


async def _prepared(gw: InProcessGateway, publications: int) -> tuple[BrokerService, Recording]:
    service, qm = gw.service, gw.qm
    # the first batch goes to the sink directly (acknowledged before its commit), even
    # on a loaded machine
    service.sink_backlogs.direct_ack_timeout = service.sink_backlogs.direct_ack_max = 10.0
    sink = Recording()
    service.register_sink("rec", sink)
    await service.start()
    await service.subscribe_sink("rec", f"$SYS/STREAM/{STREAM}/#", scheme=Scheme.TOPIC)
    await settle(qm, service)
    await service.stop()
    for i in range(publications):
        await put(
            qm,
            rfh_message(STREAM, [("MQPSCommand", "Publish"), ("MQPSTopic", f"t/{i}")], b"%d" % i),
        )
    return service, sink


async def test_the_next_batch_is_handled_during_the_commit_but_sent_only_after_it(
    gateway: InProcessGateway,
) -> None:
    service, sink = await _prepared(gateway, 6)
    writer = HeldWriter(gateway.qm, 3)
    handled = service.engine.counters.commands
    await service.start()
    try:
        await asyncio.to_thread(writer.held.wait, 10)  # the first batch's commit runs
        # the second batch is got and handled meanwhile ...
        await _until(lambda: service.engine.counters.commands - handled == 6)
        await asyncio.sleep(0.1)
        # ... but none of it is sent before that commit has ended
        assert sink.payloads == [b"0", b"1", b"2"]
        assert service.busy
        assert service.counters.batches == 0  # counted once committed
        writer.release.set()
        await settle(gateway.qm, service)
    finally:
        writer.release.set()
    assert sink.payloads == [b"%d" % i for i in range(6)]
    assert service.counters.batches == 2 and service.counters.messages == 6
    assert service.counters.backouts == 0


async def test_a_failed_commit_backs_the_next_batch_out_too_and_order_is_kept(
    gateway: InProcessGateway,
) -> None:
    service, sink = await _prepared(gateway, 6)
    writer = HeldWriter(gateway.qm, 3, fail=True)
    handled = service.engine.counters.commands
    await service.start()
    try:
        await asyncio.to_thread(writer.held.wait, 10)
        await _until(lambda: service.engine.counters.commands - handled == 6)
        writer.release.set()  # the first batch's commit fails now
        await settle(gateway.qm, service)
    finally:
        writer.release.set()
    # the first batch was sent before its commit, and again after it came back; the
    # second batch was never sent before that
    assert sink.payloads == [b"%d" % i for i in (0, 1, 2, 0, 1, 2, 3, 4, 5)]
    assert gateway.qm.queue_depth(STREAM) == 0
    assert service.counters.backouts >= 2  # the failed batch and the one behind it
    assert service.counters.messages == 6
    # neither batch's messages were taken for poison (BOTHRESH 1): the failed commit
    # counted no backout, the batch behind it had its backout forgiven
    assert gateway.qm.queue_depth("PUB.BACKOUT") == 0
    assert service.counters.moved_to_backout_queue == 0


async def test_without_overlap_each_commit_ends_before_the_next_get(
    gateway: InProcessGateway,
) -> None:
    service, sink = await _prepared(gateway, 6)
    service.overlap_commits = False
    writer = HeldWriter(gateway.qm, 3)
    handled = service.engine.counters.commands
    await service.start()
    try:
        await asyncio.to_thread(writer.held.wait, 10)
        await asyncio.sleep(0.2)
        assert service.engine.counters.commands - handled == 3
        writer.release.set()
        await settle(gateway.qm, service)
    finally:
        writer.release.set()
    assert sink.payloads == [b"%d" % i for i in range(6)]
    assert service.counters.batches == 2


async def test_a_stop_waits_for_the_commit_in_flight_and_counts_its_batch(
    gateway: InProcessGateway,
) -> None:
    service, sink = await _prepared(gateway, 3)
    writer = HeldWriter(gateway.qm, 3)
    await service.start()
    try:
        await asyncio.to_thread(writer.held.wait, 10)
        stopping = asyncio.create_task(service.stop())
        await asyncio.sleep(0.2)
        assert not stopping.done()  # the batch's commit is still being written
        writer.release.set()
        await asyncio.wait_for(stopping, 10)
    finally:
        writer.release.set()
    assert sink.payloads == [b"0", b"1", b"2"]
    assert service.counters.batches == 1 and service.counters.messages == 3
    assert gateway.qm.queue_depth(STREAM) == 0 and not service.busy
