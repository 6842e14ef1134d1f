"""``get_batch`` over the queue manager's local socket keeps the caller's
``max_length`` + ``accept_truncated`` for every message of the batch (review F7), not
only the first: each longer message is truncated, none ends the batch early."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.mq.embedded import qm_server
from gateway.mq.embedded.client import connect_local
from gateway.mq.port import GetOptions, OpenOption
from gateway.wire.mqmd import MQMD
from tests.support.served_qm import served_queue_manager


async def test_every_message_of_a_batch_is_truncated_as_asked(tmp_path: Path) -> None:
    async with served_queue_manager(tmp_path / "qm", "DEFINE QLOCAL(Q1)"):
        conn = await connect_local(tmp_path / "qm")
        h = await conn.open("Q1", OpenOption.INPUT_SHARED | OpenOption.OUTPUT)
        bodies = [b"a" * 50, b"b" * 5, b"c" * 300, b"d" * 11, b"e" * 1000]
        for body in bodies:
            await h.put(MQMD(), body)
        opts = GetOptions(wait_ms=0, syncpoint=True, max_length=10, accept_truncated=True)
        got = await h.get_batch(opts, 10)
        assert [m.body for m in got] == [b[:10] for b in bodies]
        await conn.backout()
        # without accept_truncated the first longer message ends the batch (stays queued)
        strict = GetOptions(wait_ms=0, syncpoint=True, max_length=60)
        got = await h.get_batch(strict, 10)
        assert [m.body for m in got] == bodies[:2]
        await conn.backout()
        await conn.disconnect()


async def test_truncation_yields_to_the_byte_budget(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(qm_server, "BATCH_BYTES", 100)
    async with served_queue_manager(tmp_path / "qm", "DEFINE QLOCAL(Q1)"):
        conn = await connect_local(tmp_path / "qm")
        h = await conn.open("Q1", OpenOption.INPUT_SHARED | OpenOption.OUTPUT)
        for _ in range(8):
            await h.put(MQMD(), b"z" * 200)
        opts = GetOptions(wait_ms=0, syncpoint=True, max_length=30, accept_truncated=True)
        got = await h.get_batch(opts, 10)
        # 30 + 30 + 30 = 90 bytes; a fourth 30 would pass the 100-byte budget
        assert [len(m.body) for m in got] == [30, 30, 30]
        await conn.backout()
        await conn.disconnect()
