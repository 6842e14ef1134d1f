"""``mqgw streams check`` as an operator runs it (``main(argv)``) on a gateway's data dir
with the gateway stopped: the seed's two failure modes found, named and repaired."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path
from typing import Any

import pytest

from gateway.mq.embedded.qmgr import EmbeddedQueueManager
from gateway.runtime.cli import main
from gateway.runtime.streams.migration import MigrationRecord, write_migration
from gateway.wire.formats import FMT_RF_HEADER
from tests.runtime.streams.streams_helpers import prepare, queue_contents, write_config

B, T = "BULLETIN.STREAM", "STOCK.STREAM"
DLQ = "SYSTEM.DEAD.LETTER.QUEUE"


def check(cfg: Path, capsys: pytest.CaptureFixture[str], *extra: str) -> tuple[int, Any]:
    code = main(["streams", "check", "--config", str(cfg), "--json", *extra])
    out = capsys.readouterr().out
    return code, json.loads(out)


def test_all_well(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = write_config(tmp_path, [T])
    prepare(tmp_path, [T], {}, {})
    code = main(["streams", "check", "--config", str(cfg)])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "all well" in out and T in out


def test_missing_queue_dead_letters_reported_then_fixed_and_replayed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = write_config(tmp_path, [T, B])
    ids = prepare(tmp_path, [T], {B: 5, "OTHER.QUEUE": 2}, {})
    code, rep = check(cfg, capsys)
    assert code == 1
    (b,) = [s for s in rep["streams"] if s["stream"] == B]
    assert b["queue_exists"] is False and b["dead_lettered"] == 5
    assert any(B in p and "missing" in p for p in rep["problems"])
    assert any("5 publication(s)" in p for p in rep["problems"])

    # --fix alone defines the queue; the dead letters stay, still a problem
    code, rep = check(cfg, capsys, "--fix")
    assert code == 1 and f"defined stream queue {B}" in rep["actions"]
    (b,) = [s for s in rep["streams"] if s["stream"] == B]
    assert b["queue_exists"] is True and b["dead_lettered"] == 5

    code, rep = check(cfg, capsys, "--fix", "--replay-dlq")
    assert code == 0, rep["problems"]
    assert f"replayed 5 publication(s) from the dead-letter queue to {B}" in rep["actions"]
    replayed = queue_contents(tmp_path, B)
    assert [m.msg_id for m, _ in replayed] == ids[B]
    assert [body for _, body in replayed] == [b"RFH publication %d" % i for i in range(5)]
    for md, _ in replayed:  # the MQDLH stripped, the original MQMD restored from it
        assert (md.format, md.encoding, md.coded_char_set_id) == (FMT_RF_HEADER, 546, 819)
    # what was not a stream's publication stays on the DLQ, untouched
    left = queue_contents(tmp_path, DLQ)
    assert len(left) == 2 and [m.msg_id for m, _ in left] == ids["OTHER.QUEUE"]


def test_fix_and_replay_show_progress_on_stderr(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Repairs are counted on stderr (stdout keeps the report): live lines with
    --progress when stderr is no terminal, the summary line always, nothing for a
    check that repairs nothing."""
    cfg = write_config(tmp_path, [T, B])
    prepare(tmp_path, [T], {B: 5}, {})
    assert main(["streams", "check", "--config", str(cfg), "--json"]) == 1
    assert capsys.readouterr().err == ""  # a plain check: no progress
    code = main(["streams", "check", "--config", str(cfg), "--json", "--fix", "--replay-dlq",
                 "--progress"])
    out, err = capsys.readouterr()
    assert code == 0 and json.loads(out)["problems"] == []
    lines = err.splitlines()
    assert lines[0] == f"mqgw streams check: 1 repairs (defined {B})"
    for line in lines[1:-1]:  # batch lines, at most one per 0.2 s
        assert re.fullmatch(r"mqgw streams check: \d repairs \(replayed \d of 5\)", line)
    assert re.fullmatch(
        r"mqgw streams check: 6 repairs in \d+\.\d s "
        r"\(1 stream queue\(s\) defined, 5 publication\(s\) replayed\)",
        lines[-1],
    ), lines
    # without --progress (and no terminal): the summary only
    assert main(["streams", "check", "--config", str(cfg), "--fix"]) == 0
    (summary,) = capsys.readouterr().err.splitlines()
    assert summary.startswith("mqgw streams check: 0 repairs in ")


def test_unserviced_queue_backlog_reported_yaml_printed_then_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = write_config(tmp_path, [T])
    prepare(tmp_path, [T, B], {}, {B: 4})
    write_migration(tmp_path / "migration.json", MigrationRecord(from_q_mgr="OLD", streams=[T, B]))
    code, rep = check(cfg, capsys)
    assert code == 1
    (b,) = [s for s in rep["streams"] if s["stream"] == B]
    assert (b["serviced"], b["depth"], b["queue_exists"]) == (False, 4, True)
    assert b["oldest_age_s"] is not None and b["oldest_age_s"] < 60
    assert rep["migration"] == {"from": "OLD", "complete": False, "pending": [B]}
    assert any(p.startswith("migration incomplete") for p in rep["problems"])

    code, rep = check(cfg, capsys, "--fix")
    assert code == 1
    assert any(f"    - name: {B}" in a for a in rep["actions"])
    assert B not in cfg.read_text()

    code, rep = check(cfg, capsys, "--fix", "--write-config")
    assert code == 0, rep["problems"]
    assert rep["migration"]["complete"] is True
    assert (tmp_path / "gateway.yaml.bak").is_file()
    record = json.loads((tmp_path / "migration.json").read_text())
    assert record["complete"] is True
    # the migrated set is now fixed: removing a stream is refused at config load
    write_config(tmp_path, [T])
    assert main(["streams", "check", "--config", str(cfg)]) == 2
    err = capsys.readouterr().err
    assert f"stream '{B}' of the migration from OLD was removed" in err
    assert "mqgw migrate --restart" in err


def test_running_gateway_holds_the_lock_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = write_config(tmp_path, [T])
    prepare(tmp_path, [T], {}, {})

    async def run() -> int:
        async with EmbeddedQueueManager("GW", tmp_path / "qm"):
            return await asyncio.to_thread(main, ["streams", "check", "--config", str(cfg)])

    assert asyncio.run(run()) == 2
    err = capsys.readouterr().err
    assert "in use by another process" in err and "metrics are disabled" in err


def test_usage_errors_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = write_config(tmp_path, [T])
    assert main(["streams", "check", "--config", str(cfg)]) == 2  # never ran: no qm
    assert "no queue manager" in capsys.readouterr().err
    prepare(tmp_path, [T], {}, {})
    assert main(["streams", "check", "--config", str(cfg), "--write-config"]) == 2
    (tmp_path / "bad.yaml").write_text("broker: {streams: [{name: 'a/b'}]}\n")
    assert main(["streams", "check", "--config", str(tmp_path / "bad.yaml")]) == 2
