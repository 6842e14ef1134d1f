"""`mqgw analytics`: the in-process path with --once, and a real process stopped by Ctrl-C."""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from analytics.cli import execute, register
from analytics.jobs import traffic
from tests.analytics.bridged import Publication, hour_start_ms, produce, unique

ROOT = Path(__file__).resolve().parents[2]
MQGW = Path(sys.executable).parent / "mqgw"


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    return parser.parse_args(["analytics", *argv])


def test_execute_once_prints_progress_and_writes_tables(
    kafka_broker: Any, spark_session: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    stream = unique("CLI.")
    t0 = hour_start_ms()
    produce(kafka_broker.bootstrap, f"mqgw.{stream}",
            [Publication(stream, f"t/{i % 2}", b"abc", t0 + i) for i in range(7)])
    args = _parse(["traffic", "--bootstrap", kafka_broker.bootstrap, "--pattern",
                   rf"mqgw\.{stream}", "--out", str(tmp_path / "out"), "--once",
                   "--max-offsets-per-trigger", "3", "--console"])
    assert execute(args, spark_session) == 0
    out = capsys.readouterr().out
    assert "[traffic] traffic: batch 0: 3 rows (3 total" in out
    assert "lag 4" in out  # 7 records, 3 read by batch 0
    # 3 batches with data, then possibly one without, run for the watermark to advance
    assert re.search(r"\[traffic\] done: traffic: [34] batches, 7 rows\n", out), out
    assert "--- traffic batch 2: streams" in out
    rows = spark_session.read.schema(traffic.TOPICS_SCHEMA).parquet(
        str(tmp_path / "out" / "traffic_topics")).collect()
    assert sorted((r.topic, r.messages, r.bytes) for r in rows) == [
        ("t/0", 4, 12), ("t/1", 3, 9)]
    assert (tmp_path / "out" / "_checkpoints" / "traffic" / "traffic" / "offsets").is_dir()


@pytest.mark.slow
@pytest.mark.spark
def test_mqgw_analytics_runs_continuously_and_stops_on_ctrl_c(
    kafka_broker: Any, tmp_path: Path
) -> None:
    stream = unique("CTRLC.")
    t0 = hour_start_ms()
    produce(kafka_broker.bootstrap, f"mqgw.{stream}",
            [Publication(stream, "t", b"abcd", t0 + i) for i in range(5)])
    out_dir = tmp_path / "out"
    proc = subprocess.Popen(
        [str(MQGW), "analytics", "traffic", "--bootstrap", kafka_broker.bootstrap,
         "--topics", f"mqgw.{stream}", "--out", str(out_dir), "--trigger", "1 second"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT,
        start_new_session=True,  # its own process group: Ctrl-C goes to the whole group
    )
    lines: list[str] = []
    try:
        assert proc.stdout is not None
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            lines.append(line)
            if "5 total" in line:
                break
        assert any("5 total" in x for x in lines), "".join(lines)
        os.killpg(proc.pid, signal.SIGINT)  # what a terminal's Ctrl-C does
        rest, _ = proc.communicate(timeout=120)
        lines.append(rest)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)
    text = "".join(lines)
    assert proc.returncode == 130, text
    assert "[traffic] stopping after the current batch ..." in text
    assert "[traffic] stopped: traffic:" in text
    assert "Traceback" not in text
    assert (out_dir / "traffic_topics").is_dir()
