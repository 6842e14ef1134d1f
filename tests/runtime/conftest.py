"""Fixtures for the runtime: an embedded queue manager, the broker service and the plugin
host, wired as ``mqgw run`` wires them."""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

_TESTS = Path(__file__).resolve().parent.parent
# tests/plugins/ (no __init__.py) would otherwise shadow the real plugins/ package as a
# namespace package for 'plugins.kafka'/'plugins.mqtt' (pytest puts tests/ on sys.path);
# the repository root first makes the regular package win. See the report: pyproject's
# pytest 'pythonpath = ["."]' would fix this for every test directory.
if str(_TESTS.parent) not in sys.path:
    sys.path.insert(0, str(_TESTS.parent))
if getattr(sys.modules.get("plugins"), "__file__", "") is None:
    for _name in [m for m in sys.modules if m == "plugins" or m.startswith("plugins.")]:
        del sys.modules[_name]
for sub in ("pubsub", "pubsub_service"):
    if str(_TESTS / sub) not in sys.path:
        sys.path.insert(0, str(_TESTS / sub))

from gateway.mq.embedded.qmgr import EmbeddedQueueManager  # noqa: E402
from gateway.pubsub.engine import PubSubEngine  # noqa: E402
from gateway.pubsub.sqlite_store import SqliteStore  # noqa: E402
from gateway.runtime.broker import BrokerConfig, BrokerService, StreamQueueConfig  # noqa: E402
from gateway.runtime.plugin_host import PluginHost  # noqa: E402
from plugins.memory import reset_buses  # noqa: E402

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
