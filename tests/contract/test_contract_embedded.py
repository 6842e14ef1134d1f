"""The port contract against the embedded queue manager (always runs)."""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from gateway.mq.embedded.qmgr import EmbeddedQueueManager
from tests.contract.port_contract import PortContract

_names = itertools.count(1)


class EmbeddedBackend:
    def __init__(self, qm: EmbeddedQueueManager) -> None:
        self.qm = qm

    async def fresh_queue(self) -> str:
        name = f"CONTRACT.Q{next(_names)}"
        results = self.qm.run_mqsc(f"DEFINE QLOCAL({name})")
        assert results[0].ok, results[0].lines
        return name


@pytest.fixture
async def backend(tmp_path: Path) -> AsyncIterator[EmbeddedBackend]:
    qm = EmbeddedQueueManager("CONTRACT.QM", tmp_path / "qm")
    try:
        yield EmbeddedBackend(qm)
    finally:
        await qm.close()


class TestEmbeddedContract(PortContract):
    pass
