"""Fixtures for the runtime: an embedded queue manager, the broker service and the plugin
host, wired as ``mqgw run`` wires them."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from gateway.mq.embedded.qmgr import EmbeddedQueueManager
from gateway.pubsub.engine import PubSubEngine
from gateway.pubsub.sqlite_store import SqliteStore
from gateway.runtime.plugin_host import PluginHost
from gateway.runtime.pubsub_service import BrokerConfig, BrokerService, StreamQueueConfig
from plugins.memory import reset_buses

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
async def qm(tmp_path: Path) -> AsyncIterator[EmbeddedQueueManager]:
    qmgr = EmbeddedQueueManager("QM1", tmp_path / "qm")
    qmgr.run_mqsc(QUEUES, stop_on_error=True)
    try:
        yield qmgr
    finally:
        await qmgr.close()


@pytest.fixture
def broker_config() -> BrokerConfig:
    return BrokerConfig(
        streams=[StreamQueueConfig(name="STOCK.STREAM"), StreamQueueConfig(name="BULLETIN.STREAM")],
        wait_ms=50,
        retry_delay=0.01,
        sink_retry_max_delay=0.2,
    )


@pytest.fixture
async def service(
    qm: EmbeddedQueueManager, broker_config: BrokerConfig, tmp_path: Path
) -> AsyncIterator[BrokerService]:
    store = SqliteStore(tmp_path / "pubsub.db", synchronous="NORMAL")
    svc = BrokerService(qm, PubSubEngine(qm.name, store), broker_config)
    try:
        yield svc
    finally:
        await svc.stop()
        store.close()


@pytest.fixture
async def host(qm: EmbeddedQueueManager, service: BrokerService) -> AsyncIterator[PluginHost]:
    h = PluginHost(qm, service, "gw-test")
    try:
        yield h
    finally:
        await service.stop()
        await h.stop_all()
