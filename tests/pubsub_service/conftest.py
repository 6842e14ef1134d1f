"""Fixtures for the broker service on the embedded queue manager."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from gateway.mq.embedded.qmgr import EmbeddedQueueManager
from gateway.pubsub.engine import PubSubEngine
from gateway.pubsub.sqlite_store import SqliteStore
from gateway.runtime.pubsub_service import BrokerConfig, BrokerService, StreamQueueConfig

QUEUES = """
DEFINE QLOCAL('StreamX') DEFPSIST(YES) REPLACE
DEFINE QLOCAL(PLAIN.IN) REPLACE
DEFINE QLOCAL(SUB.SAME) REPLACE
DEFINE QLOCAL(SUB.OTHER) REPLACE
DEFINE QLOCAL(SUB.Q) REPLACE
DEFINE QLOCAL(SUB2.Q) REPLACE
DEFINE QLOCAL(REPLY.Q) REPLACE
DEFINE QLOCAL(PUB.BACKOUT) REPLACE
"""


@pytest.fixture
async def qm(tmp_path: Path) -> AsyncIterator[EmbeddedQueueManager]:
    qmgr = EmbeddedQueueManager("QM1", tmp_path / "qm")
    qmgr.run_mqsc(QUEUES, stop_on_error=True)
    try:
        yield qmgr
    finally:
        await qmgr.close()


@pytest.fixture
def config() -> BrokerConfig:
    return BrokerConfig(
        streams=[
            StreamQueueConfig(name="StreamX", implicit_stream_naming=True),
            StreamQueueConfig(name="PLAIN.IN", implicit_stream_naming=False),
        ],
        wait_ms=50,
        retry_delay=0.01,
    )


@pytest.fixture
async def service(
    qm: EmbeddedQueueManager, config: BrokerConfig, tmp_path: Path
) -> AsyncIterator[BrokerService]:
    store = SqliteStore(tmp_path / "pubsub.db", synchronous="NORMAL")
    svc = BrokerService(qm, PubSubEngine(qm.name, store), config)
    await svc.start()
    try:
        yield svc
    finally:
        await svc.stop()
        store.close()
