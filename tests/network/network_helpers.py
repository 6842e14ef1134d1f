"""Helpers of the network tests (imported by the test modules)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from gateway.mq.embedded.qmgr import EmbeddedQueueManager
from gateway.mq.port import GetOptions, Message, MQError, OpenOption
from gateway.wire.reasons import Reason

#: ``make_network({"QM1": mqsc, ...})`` -> async context manager yielding a Network.
NetworkFactory = Callable[[dict[str, str]], Any]


async def get_one(qm: EmbeddedQueueManager, q_name: str, wait_ms: int = 10_000) -> Message:
    """Get one message from ``q_name`` (waiting), failing the test after ``wait_ms``."""
    async with await qm.connect() as conn:
        q = await conn.open(q_name, OpenOption.INPUT_SHARED)
        return await q.get(GetOptions(wait_ms=wait_ms))


async def drain(qm: EmbeddedQueueManager, q_name: str, wait_ms: int = 300) -> list[Message]:
    """Every message on ``q_name`` (waits ``wait_ms`` for late arrivals)."""
    out: list[Message] = []
    async with await qm.connect() as conn:
        q = await conn.open(q_name, OpenOption.INPUT_SHARED)
        while True:
            try:
                out.append(await q.get(GetOptions(wait_ms=wait_ms)))
            except MQError as exc:
                assert exc.reason == Reason.NO_MSG_AVAILABLE
                return out


async def wait_for(predicate: Callable[[], bool], timeout: float = 10.0) -> None:
    async with asyncio.timeout(timeout):
        while not predicate():
            await asyncio.sleep(0.02)
