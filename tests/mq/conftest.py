"""Fixtures of the queue-manager tests: a fresh embedded queue manager per test."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from gateway.mq.embedded.qmgr import EmbeddedQueueManager


@pytest.fixture
async def qm(tmp_path: Path) -> AsyncIterator[EmbeddedQueueManager]:
    manager = EmbeddedQueueManager("QM1", tmp_path / "qm1")
    try:
        yield manager
    finally:
        await manager.close()
