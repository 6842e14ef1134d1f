"""``--replay-dlq`` moves each batch in one unit of work: a failure or a SIGKILL at any
point leaves every publication on the DLQ or on its stream queue, never both or neither."""

from __future__ import annotations

import asyncio
import random
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gateway.mq.embedded.qmgr import EmbeddedQueueManager
from gateway.runtime.cli import main
from gateway.runtime.streams.observe import browse_dead_lettered
from gateway.runtime.streams.repair import replay_dead_lettered
from tests.runtime.streams.streams_helpers import prepare, queue_contents, write_config

B, T = "BULLETIN.STREAM", "STOCK.STREAM"
DLQ = "SYSTEM.DEAD.LETTER.QUEUE"


def test_full_stream_queue_backs_the_batch_out(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = write_config(tmp_path, [T, B])
    ids = prepare(tmp_path, [T], {B: 5}, {})

    async def shrink() -> None:
        async with EmbeddedQueueManager("GW", tmp_path / "qm") as qm:
            qm.run_mqsc(f"DEFINE QLOCAL('{B}') MAXDEPTH(3)")

    asyncio.run(shrink())
    assert main(["streams", "check", "--config", str(cfg), "--fix", "--replay-dlq"]) == 1
    out = capsys.readouterr().out
    assert "replay stopped" in out and "backed out" in out
    assert queue_contents(tmp_path, B) == []  # the whole batch backed out
    assert [m.msg_id for m, _ in queue_contents(tmp_path, DLQ)] == ids[B]


def test_committed_batches_stay_moved_the_failed_one_does_not(tmp_path: Path) -> None:
    ids = prepare(tmp_path, [T, B], {B: 5}, {})

    async def run() -> tuple[int, bool]:
        async with EmbeddedQueueManager("GW", tmp_path / "qm") as qm:
            qm.run_mqsc(f"ALTER QLOCAL('{B}') MAXDEPTH(3)")
            conn = await qm.connect()
            items = await browse_dead_lettered(conn, DLQ, [B])
            moved, error = await replay_dead_lettered(conn, DLQ, items, batch=2)
            await conn.disconnect()
            return moved[B], error is not None

    assert asyncio.run(run()) == (2, True)
    assert [m.msg_id for m, _ in queue_contents(tmp_path, B)] == ids[B][:2]
    assert [m.msg_id for m, _ in queue_contents(tmp_path, DLQ)] == ids[B][2:]


@pytest.mark.slow
def test_sigkill_during_replay_loses_and_duplicates_nothing(tmp_path: Path) -> None:
    rng = random.Random(13)
    n = 600
    killed_mid = 0
    for trial in range(5):
        tmp = tmp_path / f"t{trial}"
        tmp.mkdir()
        cfg = write_config(tmp, [T, B])
        ids = prepare(tmp, [T, B], {B: n}, {})[B]
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "gateway.runtime.cli",
                "-v",
                "streams",
                "check",
                "--config",
                str(cfg),
                "--replay-dlq",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        # kill after a random number of committed batches, at a random moment of the next
        assert proc.stderr is not None
        wanted = rng.randint(1, 5)
        seen = 0
        for line in proc.stderr:
            seen += "replay: committed a batch" in line
            if seen >= wanted:
                break
        time.sleep(rng.uniform(0.0, 0.05))
        proc.kill()
        proc.wait()
        proc.stderr.close()
        on_stream = [m.msg_id for m, _ in queue_contents(tmp, B)]
        on_dlq = [m.msg_id for m, _ in queue_contents(tmp, DLQ)]
        assert len(set(on_stream)) == len(on_stream)  # none twice
        assert sorted(on_stream + on_dlq) == sorted(ids)  # none lost, none duplicated
        assert len(on_stream) % 100 == 0 or len(on_dlq) == 0  # whole batches only
        killed_mid += 0 < len(on_stream) < n
    assert killed_mid >= 1, "no kill came in the middle of a replay"
