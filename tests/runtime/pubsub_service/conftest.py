"""Fixtures for the publish/subscribe service on the embedded queue manager (the shared
in-process gateway of ``tests.support.gateway``, its service started, no plugins)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from gateway.mq.embedded.qmgr import EmbeddedQueueManager
from gateway.runtime.pubsub_service import BrokerConfig, BrokerService, StreamQueueConfig
from tests.support.gateway import InProcessGateway, build_gateway

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
async def gateway(tmp_path: Path, config: BrokerConfig) -> AsyncIterator[InProcessGateway]:
    gw = build_gateway(tmp_path, mqsc=QUEUES, config=config)
    try:
        yield gw
    finally:
        await gw.close()


@pytest.fixture
def qm(gateway: InProcessGateway) -> EmbeddedQueueManager:
    return gateway.qm


@pytest.fixture
async def service(gateway: InProcessGateway) -> BrokerService:
    await gateway.service.start()
    return gateway.service
