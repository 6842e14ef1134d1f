"""The broker's default batch grows with the backlog and stays small when idle (issue
32): with no ``batch_size`` configured, a backlog is drained in a few units of work,
and a publication on an idle stream goes alone, at once, not waiting for others."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from gateway.plugin_api import Envelope
from gateway.pubsub.topics import Scheme
from gateway.runtime.pubsub_service import BrokerConfig, BrokerService, StreamQueueConfig
from tests.support.gateway import InProcessGateway, build_gateway
from tests.support.pubsub_messages import rfh_message
from tests.support.service_client import put, put_at_once, settle

STREAM = "StreamX"


class Recording:
    """A sink that keeps what it got, in order, and the size of each send."""

    def __init__(self) -> None:
        self.payloads: list[bytes] = []
        self.sends: list[int] = []

    async def send(self, deliveries: Sequence[Envelope]) -> None:
        self.payloads += [d.payload for d in deliveries]
        self.sends.append(len(deliveries))


@pytest.fixture
async def gateway(tmp_path: Path) -> Any:
    # the default batch settings: no batch_size, no max_puts_per_unit
    config = BrokerConfig(streams=[StreamQueueConfig(name=STREAM)], wait_ms=50)
    gw = build_gateway(tmp_path, mqsc=f"DEFINE QLOCAL('{STREAM}') DEFPSIST(YES) REPLACE",
                       config=config)
    try:
        yield gw
    finally:
        await gw.close()


def _publication(i: int) -> Any:
    return rfh_message(STREAM, [("MQPSCommand", "Publish"), ("MQPSTopic", f"t/{i}")], b"%d" % i)


async def _subscribed(gw: InProcessGateway) -> tuple[BrokerService, Recording]:
    service = gw.service
    sink = Recording()
    service.register_sink("rec", sink)
    await service.start()
    await service.subscribe_sink("rec", f"$SYS/STREAM/{STREAM}/#", scheme=Scheme.TOPIC)
    await settle(gw.qm, service)
    return service, sink


async def test_a_backlog_is_drained_in_a_few_units_of_work_by_default(
    gateway: InProcessGateway,
) -> None:
    service, sink = await _subscribed(gateway)
    await service.stop()
    await put_at_once(gateway.qm, [_publication(i) for i in range(200)])
    batches = service.counters.batches
    await service.start()
    await settle(gateway.qm, service)
    assert sink.payloads == [b"%d" % i for i in range(200)]  # all, once, in order
    # one unit of work takes what is waiting (200 publications, 400 messages in the
    # unit with their sink deliveries): at most one more while the service starts
    assert service.counters.batches - batches <= 2, service.counters.batches - batches
    assert service.counters.backouts == 0


async def test_a_publication_on_an_idle_stream_goes_alone_and_at_once(
    gateway: InProcessGateway,
) -> None:
    service, sink = await _subscribed(gateway)
    for i in range(3):
        batches, messages = service.counters.batches, service.counters.messages
        started = time.monotonic()
        await put(gateway.qm, _publication(i))
        deadline = started + 10
        while len(sink.payloads) <= i:
            assert time.monotonic() < deadline, "not delivered"
            await asyncio.sleep(0.005)
        await settle(gateway.qm, service)
        # its own unit of work, sent alone: the batch did not wait to fill
        assert (service.counters.batches - batches, service.counters.messages - messages) == (
            1, 1)
        assert sink.sends[-1] == 1
    assert sink.payloads == [b"0", b"1", b"2"]
