"""The port contract through the ibmmq adapter, with a stand-in MQI module.

The stand-in (tests/support/mqi_standin.py) performs MQI calls on an embedded queue manager,
so this checks the adapter's mapping of options, descriptors and reason codes and its
thread-per-connection model against the same contract as the real implementations.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path

import pytest

from gateway.mq.ibmmq import IBMMQConfig, IBMMQQueueManager
from tests.contract.port_contract import PortContract
from tests.support.mqi_standin import StandIn

_names = itertools.count(1)


class AdapterBackend:
    def __init__(self, standin: StandIn) -> None:
        self.standin = standin
        self.qm = IBMMQQueueManager(IBMMQConfig(q_mgr_name="STANDIN"), mqi=standin.module)

    async def fresh_queue(self) -> str:
        name = f"ADAPTER.Q{next(_names)}"
        results = self.standin.qm.run_mqsc(f"DEFINE QLOCAL({name})")
        assert results[0].ok, results[0].lines
        return name


@pytest.fixture
def backend(tmp_path: Path) -> Iterator[AdapterBackend]:
    standin = StandIn(tmp_path / "qm")
    try:
        yield AdapterBackend(standin)
    finally:
        standin.close()


class TestAdapterContract(PortContract):
    pass
