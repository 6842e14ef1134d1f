"""The running gateway's DLQ scan: only when the DLQ changed, never over a deep DLQ."""

from __future__ import annotations

import asyncio
from pathlib import Path

from gateway.mq.embedded.qmgr import EmbeddedQueueManager
from gateway.runtime.streams.health import DeadLetterCache
from gateway.wire.mqmd import MQMD
from gateway.wire.reasons import Reason
from tests.runtime.streams.streams_helpers import prepare

B = "BULLETIN.STREAM"
DLQ = "SYSTEM.DEAD.LETTER.QUEUE"


def test_counts_refreshed_when_the_dlq_changes_kept_when_too_deep(tmp_path: Path) -> None:
    prepare(tmp_path, [], {B: 3}, {})

    async def run() -> None:
        async with EmbeddedQueueManager("GW", tmp_path / "qm") as qm:
            conn = await qm.connect()
            cache = DeadLetterCache(max_depth=5)
            assert await cache.counts_for(conn, DLQ, [B]) == ""
            assert cache.counts == {B: 3}
            await conn.put_dead_letter(MQMD(), b"x", Reason.UNKNOWN_OBJECT_NAME, B)
            assert await cache.counts_for(conn, DLQ, [B]) == ""
            assert cache.counts == {B: 4}
            await conn.put_dead_letter(MQMD(), b"y", Reason.Q_FULL, B)  # not a 2085
            await conn.put_dead_letter(MQMD(), b"z", Reason.UNKNOWN_OBJECT_NAME, B)
            note = await cache.counts_for(conn, DLQ, [B])
            assert "holds 6 messages" in note and "mqgw streams check" in note
            assert cache.counts == {B: 4}  # the last scan's
            assert await cache.counts_for(conn, DLQ, ["OTHER"]) != ""
            await conn.disconnect()

    asyncio.run(run())
