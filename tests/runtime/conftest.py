"""Fixtures for the runtime: the shared in-process gateway (``tests.support.gateway``:
embedded queue manager, publish/subscribe service and plugin host, wired as ``mqgw run``
wires them) and its parts."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from gateway.mq.embedded.qmgr import EmbeddedQueueManager
from gateway.runtime.plugin_host import PluginHost
from gateway.runtime.pubsub_service import BrokerConfig, BrokerService, StreamQueueConfig
from plugins.memory import reset_buses
from tests.support.gateway import InProcessGateway, build_gateway

QUEUES = """
DEFINE QLOCAL('STOCK.STREAM') REPLACE
DEFINE QLOCAL('BULLETIN.STREAM') REPLACE
DEFINE QLOCAL(RFH.SUB) REPLACE
DEFINE QLOCAL(RFH2.SUB) REPLACE
DEFINE QLOCAL(REPLY.Q) REPLACE
"""


@pytest.fixture(autouse=True)
def _fresh_buses() -> Iterator[None]:
    reset_buses()
    yield
    reset_buses()


@pytest.fixture
def broker_config() -> BrokerConfig:
    return BrokerConfig(
        streams=[StreamQueueConfig(name="STOCK.STREAM"), StreamQueueConfig(name="BULLETIN.STREAM")],
        wait_ms=50,
        retry_delay=0.01,
        sink_retry_max_delay=0.2,
    )


@pytest.fixture
async def gateway(
    tmp_path: Path, broker_config: BrokerConfig
) -> AsyncIterator[InProcessGateway]:
    """The shared in-process gateway (not started: tests start the service and the
    instances they need)."""
    gw = build_gateway(tmp_path, mqsc=QUEUES, config=broker_config)
    try:
        yield gw
    finally:
        await gw.close()


@pytest.fixture
def qm(gateway: InProcessGateway) -> EmbeddedQueueManager:
    return gateway.qm


@pytest.fixture
def service(gateway: InProcessGateway) -> BrokerService:
    return gateway.service


@pytest.fixture
def host(gateway: InProcessGateway) -> PluginHost:
    return gateway.host
