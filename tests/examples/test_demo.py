"""``make demo`` (examples/demo/): the bar arithmetic it checks the ohlc job against, its
summary, and the demo itself run as a process the way the README runs it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from examples.demo.bars import BarBook, Tick, expected_bars, parse_bar, put_stamp, tick_schedule
from examples.demo.exercise import gateway_config
from examples.demo.paths import OHLC_PATHS, PATHS, SYMBOLS, PathStats
from examples.demo.summary import summary_rows, summary_table

ROOT = Path(__file__).resolve().parents[2]


# ------------------------------------------------------------------ pure parts ----


def test_tick_schedule_spans_two_whole_minutes_before_now_for_both_symbols() -> None:
    now = 1_795_323_437.5  # 04:57:17.5 UTC
    ticks = tick_schedule(20, now)
    assert len(ticks) == 20
    assert [t.seq for t in ticks] == list(range(20))
    minute_now = int(now) // 60 * 60
    assert {t.minute for t in ticks} == {minute_now - 120, minute_now - 60}
    assert {(t.symbol, t.minute) for t in ticks} == {
        (s, m) for s in SYMBOLS for m in (minute_now - 120, minute_now - 60)
    }
    assert all(t.put_cs < minute_now * 100 for t in ticks)  # none in the future
    assert [t.put_cs for t in ticks] == sorted(t.put_cs for t in ticks)
    assert all(t.price > 0 and t.volume > 0 for t in ticks)
    # The same seed gives the same feed (prices are reproducible in docs/demo.md).
    assert tick_schedule(20, now) == ticks


def test_tick_text_is_the_ohlc_jobs_text_format() -> None:
    tick = Tick(0, "IBM", Decimal("131.25"), 300, 0)
    assert tick.text == "IBM 131.25 300"


def test_put_stamp_is_mqmd_put_date_and_time_in_gmt() -> None:
    # 2026-11-22 04:56:00.07 UTC
    assert put_stamp(179_532_336_007) == ("20261122", "04560007")


def test_expected_bars_by_hand() -> None:
    m0, m1 = 1_795_323_360, 1_795_323_420  # 04:56, 04:57
    ticks = [
        Tick(0, "IBM", Decimal("100.50"), 10, m0 * 100 + 100),
        Tick(1, "HPQ", Decimal("20.10"), 7, m0 * 100 + 200),
        Tick(2, "IBM", Decimal("101.25"), 5, m0 * 100 + 300),
        # same put time as seq 4: feed order decides the close
        Tick(3, "IBM", Decimal("99.75"), 20, m0 * 100 + 5000),
        Tick(4, "IBM", Decimal("99.80"), 1, m0 * 100 + 5000),
        Tick(5, "IBM", Decimal("102"), 4, m1 * 100),
    ]
    assert expected_bars(ticks) == {
        ("IBM", m0): (
            Decimal("100.50"),
            Decimal("101.25"),
            Decimal("99.75"),
            Decimal("99.80"),
            36,
            4,
        ),
        ("HPQ", m0): (Decimal("20.10"), Decimal("20.10"), Decimal("20.10"), Decimal("20.10"), 7, 1),
        ("IBM", m1): (Decimal("102"), Decimal("102"), Decimal("102"), Decimal("102"), 4, 1),
    }


def test_parse_bar_reads_the_jobs_json_and_rejects_other_data() -> None:
    payload = (
        b'{"symbol":"HPQ","start":"2026-11-22T04:56:00Z","end":"2026-11-22T04:57:00Z",'
        b'"open":"20.1","high":"20.19","low":"19.67","close":"19.67","volume":11600,'
        b'"ticks":5}'
    )
    assert parse_bar(payload) == (
        ("HPQ", 1_795_323_360),
        (Decimal("20.1"), Decimal("20.19"), Decimal("19.67"), Decimal("19.67"), 11600, 5),
    )
    assert parse_bar(b"IBM 131.25 300") is None
    assert parse_bar(b'{"path": "kafka", "seq": 1}') is None
    assert (
        parse_bar(
            b'{"symbol":"X","start":"soon","open":"1","high":"1","low":"1",'
            b'"close":"1","volume":1,"ticks":1}'
        )
        is None
    )


def test_bar_book_counts_the_latest_version_of_each_bar() -> None:
    bar = (Decimal(1), Decimal(2), Decimal(1), Decimal(2), 5, 2)
    partial = (Decimal(1), Decimal(1), Decimal(1), Decimal(1), 3, 1)
    book = BarBook(expected={("IBM", 60): bar, ("HPQ", 60): bar})
    book.receive("Q", ("IBM", 60), partial)
    assert book.matched("Q") == 0
    book.receive("Q", ("IBM", 60), bar)  # the final version replaces the partial one
    assert book.matched("Q") == 1
    assert book.matched("OTHER") == 0
    book.receive("Q", ("MSFT", 60), bar)
    problems = book.mismatches("Q")
    assert len(problems) == 2
    assert problems[0].startswith("HPQ 00:01Z: expected") and problems[0].endswith("nothing")
    assert "unexpected bar" in problems[1]


def test_summary_marks_skipped_and_short_paths() -> None:
    stats = {
        "a -> b": PathStats(sent=3, received=3, latencies=[0.001, 0.002, 0.003]),
        "c -> d": PathStats(sent=3, received=2),
        "bars -> MQ": PathStats(skipped="skipped (--no-analytics)"),
    }
    rows = {r["path"]: r for r in summary_rows(stats)}
    assert rows["a -> b"]["status"] == "ok" and rows["a -> b"]["p50_ms"] == 2.0
    assert rows["c -> d"]["status"] == "short" and rows["c -> d"]["p50_ms"] is None
    assert rows["bars -> MQ"]["status"] == "skipped"
    table = summary_table(stats).splitlines()
    assert table[0].split()[:3] == ["path", "sent", "received"]
    assert table[-1].split() == ["bars", "->", "MQ", "-", "-", "skipped", "(--no-analytics)"]
    assert table[3].split()[3:5] == ["3", "2"]


def test_examples_demo_yaml_is_the_gateway_the_demo_runs(tmp_path: Path) -> None:
    import yaml

    from gateway.mq.embedded.mqsc import parse_mqsc

    text = (ROOT / "examples" / "demo.yaml").read_text()
    text = (
        text.replace("${MQGW_KAFKA_BOOTSTRAP:-127.0.0.1:9092}", "127.0.0.1:9")
        .replace("${MQGW_MQTT_HOST:-127.0.0.1}", "127.0.0.1")
        .replace("${MQGW_MQTT_PORT:-1883}", "1883")
    )
    assert "${" not in text
    in_file = yaml.safe_load(text)
    in_code = gateway_config(tmp_path, "127.0.0.1:9", "127.0.0.1", 1883)
    assert in_file["plugins"] == in_code["plugins"]
    assert in_file["broker"]["streams"] == in_code["broker"]["streams"]
    assert in_file["id"] == in_code["id"]
    defined = {c.name for c in parse_mqsc((ROOT / "examples" / "demo.mqsc").read_text())}
    assert defined == {c.name for c in parse_mqsc((tmp_path / "demo.mqsc").read_text())}
    assert len(defined) == 5


# ------------------------------------------------------------- the demo itself ----


def _run_demo(tmp_path: Path, *args: str, timeout: float) -> tuple[dict[str, Any], str]:
    summary_path = tmp_path / "summary.json"
    proc = subprocess.run(
        [sys.executable, "-m", "examples.demo", *args, "--json-summary", str(summary_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-6000:]
    summary = json.loads(summary_path.read_text())
    return summary, output


def _group_members(pgid: int) -> list[int]:
    members = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        if int(fields[2]) == pgid:  # field 5: pgrp
            members.append(int(entry))
    return members


def _assert_nothing_left(summary: dict[str, Any], expected: set[str]) -> None:
    groups = summary["process_groups"]
    assert set(groups) == expected
    deadline = time.monotonic() + 10
    left = {name: _group_members(pgid) for name, pgid in groups.items()}
    while any(left.values()) and time.monotonic() < deadline:
        time.sleep(0.2)
        left = {name: _group_members(pgid) for name, pgid in groups.items()}
    assert not any(left.values()), f"still running after the demo: {left}"


def _assert_table_printed(output: str, summary: dict[str, Any]) -> None:
    for row in summary["paths"]:
        line = next(ln for ln in output.splitlines() if ln.startswith(row["path"] + " "))
        cells = line[len(row["path"]) :].split()
        if row["status"] == "skipped":
            assert cells[:2] == ["-", "-"] and row["note"] in line
        else:
            assert cells[:2] == [str(row["sent"]), str(row["received"])]


@pytest.mark.slow
@pytest.mark.kafka
@pytest.mark.mqtt
@pytest.mark.spark
def test_demo_closes_the_analytics_loop(tmp_path: Path) -> None:
    summary, output = _run_demo(tmp_path, "--count", "20", timeout=540)
    assert summary["ok"] is True and summary["failure"] == ""
    rows = {r["path"]: r for r in summary["paths"]}
    assert set(rows) == set(PATHS) | set(OHLC_PATHS)
    for name, row in rows.items():
        assert row["status"] == "ok", row
        assert row["sent"] > 0 and row["received"] == row["sent"], name
    for name in PATHS:
        assert rows[name]["sent"] == 20
    # 20 ticks over two minutes for two symbols: four bars, each checked value by value
    # against the ticks sent, at both the MQRFH and the MQRFH2 subscriber.
    assert summary["bars_expected"] == 4
    for name in OHLC_PATHS:
        assert rows[name]["sent"] == 4
    assert summary["ohlc_job"]["returncode"] == 0
    assert summary["ohlc_job"]["argv"][-1] == "--once"
    assert "[ohlc] done: ohlc:" in output  # the job's own progress, echoed
    assert "demo: every path delivered everything" in output
    _assert_table_printed(output, summary)
    _assert_nothing_left(summary, {"kafka", "mosquitto", "ohlc job"})


@pytest.mark.slow
@pytest.mark.kafka
@pytest.mark.mqtt
def test_demo_without_analytics_says_the_bars_were_skipped(tmp_path: Path) -> None:
    summary, output = _run_demo(tmp_path, "--count", "20", "--no-analytics", timeout=300)
    assert summary["ok"] is True
    rows = {r["path"]: r for r in summary["paths"]}
    for name in PATHS:
        assert rows[name]["status"] == "ok"
        assert rows[name]["sent"] == rows[name]["received"] == 20
    for name in OHLC_PATHS:
        assert rows[name]["status"] == "skipped"
        assert rows[name]["note"] == "skipped (--no-analytics)"
    assert summary["ohlc_job"] is None
    assert "spark |" not in output
    _assert_table_printed(output, summary)
    _assert_nothing_left(summary, {"kafka", "mosquitto"})
