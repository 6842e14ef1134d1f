"""The port contract against a real IBM MQ queue manager (marked ``ibmmq``).

Runs when MQ_HOST, MQ_PORT, MQ_CHANNEL and MQ_QMGR are set (optionally MQ_USER,
MQ_PASSWORD, MQ_QUEUES = comma-separated local queues the tests may drain, default the
developer image's DEV.QUEUE.1..3). Otherwise the module is skipped as *not run*.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator

import pytest

from gateway.mq.ibmmq import IBMMQConfig, IBMMQQueueManager
from gateway.mq.port import GetOptions, MQError, OpenOption
from tests.contract.port_contract import PortContract

_REQUIRED = ("MQ_HOST", "MQ_PORT", "MQ_CHANNEL", "MQ_QMGR")
_missing = [v for v in _REQUIRED if not os.environ.get(v)]

pytestmark = pytest.mark.ibmmq
if _missing:
    pytest.skip(
        f"not run: no IBM MQ queue manager ({', '.join(_missing)} unset)",
        allow_module_level=True,
    )


class IBMMQBackend:
    def __init__(self) -> None:
        cfg = IBMMQConfig(
            q_mgr_name=os.environ["MQ_QMGR"], host=os.environ["MQ_HOST"],
            port=int(os.environ["MQ_PORT"]), channel=os.environ["MQ_CHANNEL"],
            user=os.environ.get("MQ_USER") or None, password=os.environ.get("MQ_PASSWORD") or None,
        )
        self.qm = IBMMQQueueManager(cfg)
        names = os.environ.get("MQ_QUEUES", "DEV.QUEUE.1,DEV.QUEUE.2,DEV.QUEUE.3")
        self._queues = [n.strip() for n in names.split(",") if n.strip()]
        self._next = 0

    async def fresh_queue(self) -> str:
        name = self._queues[self._next % len(self._queues)]
        self._next += 1
        async with await self.qm.connect() as conn:
            q = await conn.open(name, OpenOption.INPUT_SHARED)
            while True:
                try:
                    await q.get(GetOptions())
                except MQError:
                    break
        return name


@pytest.fixture
async def backend() -> AsyncIterator[IBMMQBackend]:
    yield IBMMQBackend()


class TestIBMMQContract(PortContract):
    pass
