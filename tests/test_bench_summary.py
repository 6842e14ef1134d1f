"""The summary table of ``make bench`` (benchmarks/summary.py): pure, no brokers."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks import run
from benchmarks.summary import RESULTS_ENV, Row, format_table, load, record


def test_verdicts_of_ratio_latency_and_info_rows() -> None:
    assert Row("a", 900.0, 1000.0, 0.8).met is True
    assert Row("a", 700.0, 1000.0, 0.8).met is False
    assert Row("a", 800.0, 1000.0, 0.8).ratio == pytest.approx(0.8)
    assert Row("a", 800.0, 1000.0, 0.8).met is True  # the goal itself is met
    assert Row("a", 5.0, 0.0, 0.8).met is False  # no baseline: never met
    assert Row("lat", 19.9, 3.0, 20.0, kind="latency").met is True
    assert Row("lat", 20.0, 3.0, 20.0, kind="latency").met is False  # p99 < goal, strictly
    assert Row("lat", 19.9, 3.0, 20.0, kind="latency").ratio is None
    assert Row("i", 1.0, 2.0, None, kind="info").met is None


def test_record_appends_only_when_the_runner_names_a_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(RESULTS_ENV, raising=False)
    record(Row("nowhere", 1.0, 1.0, None))  # run alone: nothing written, no error
    target = tmp_path / "results.jsonl"
    monkeypatch.setenv(RESULTS_ENV, str(target))
    rows = [
        Row("MQ -> Kafka, batch 256", 7300.0, 9100.0, 0.8, note="vs raw"),
        Row("MQ put -> Kafka consumer", 12.5, 4.0, 20.0, kind="latency", unit="ms"),
    ]
    for row in rows:
        record(row)
    assert load(target) == rows
    assert load(tmp_path / "absent.jsonl") == []


def test_table_has_one_line_per_row_with_its_verdict() -> None:
    rows = [
        Row("MQ -> Kafka, batch 256", 7300.0, 9100.0, 0.8),
        Row("MQ -> MQTT QoS 1, batch 256", 3000.0, 6200.0, 0.8),
        Row("MQ put -> MQTT subscriber", 31.0, 6.0, 20.0, kind="latency", unit="ms"),
        Row("pub/sub service, 10 subscribers", 1205.0, 6630.0, None, unit="pub/s"),
    ]
    text = format_table(rows, failed=["bench_analytics"])
    lines = text.splitlines()
    header = lines[1].split()
    assert header == ["path", "gateway", "baseline", "ratio", "goal", "met"]
    kafka = next(line for line in lines if line.startswith("MQ -> Kafka"))
    assert "7,300 msg/s" in kafka and "9,100 msg/s" in kafka and "0.80" in kafka
    assert kafka.rstrip().endswith(" met") and ">= 0.8x" in kafka
    mqtt = next(line for line in lines if line.startswith("MQ -> MQTT"))
    assert "0.48" in mqtt and mqtt.endswith("NOT MET")
    latency = next(line for line in lines if line.startswith("MQ put -> MQTT"))
    assert "p99 31.0 ms" in latency and "p99 < 20 ms" in latency
    assert latency.endswith("NOT MET")
    assert next(line for line in lines if line.startswith("pub/sub")).endswith("info")
    assert "1 of 3 goals met" in lines
    assert lines[-1] == "bench_analytics: failed, its rows are missing"
    # columns line up: every 'met' column starts at the same offset
    assert len({len(line) - len(line.lstrip()) for line in lines[1:4]}) == 1


def test_figures_go_to_an_info_table_of_their_own() -> None:
    """A figure (a measured value with an upper bound from the issue, or none) is listed
    after the ratio table, with its unit and verdict, and is not counted among its goals."""
    rows = [
        Row("MQ -> Kafka, batch 256", 7300.0, 9100.0, 0.8),
        Row("network 20: burst settled", 3.21, 0.0, 5.0, kind="figure", unit="s"),
        Row("network 20: 5 hops p99", 61.0, 0.0, 50.0, kind="figure", unit="ms"),
        Row("network 20: per 10,000 subscriptions", 7.5, 0.0, None, kind="figure", unit="MB"),
    ]
    assert [r.met for r in rows[1:]] == [True, False, None]
    lines = format_table(rows).splitlines()
    assert "1 of 1 goals met" in lines
    start = lines.index("measured figures (info, not counted above)")
    assert lines[start + 1].split() == ["figure", "value", "goal", "met"]
    assert all(not line.startswith("network 20") for line in lines[:start])
    burst, hops, memory = lines[start + 3 : start + 6]
    assert "3.21 s" in burst and "< 5 s" in burst and burst.endswith(" met")
    assert "61.00 ms" in hops and hops.endswith("NOT MET")
    assert "7.50 MB" in memory and memory.endswith("info")


def test_empty_run_says_so() -> None:
    text = format_table([])
    assert "(no rows recorded)" in text and "0 of 0 goals met" in text


def test_quick_arguments_name_existing_benchmarks() -> None:
    names = {p.stem.removeprefix("bench_") for p in run.HERE.glob("bench_*.py")}
    assert set(run.QUICK_ARGS) <= names


def test_progress_lines_per_recorded_result_on_stderr(tmp_path: Path) -> None:
    """A running benchmark's rows show up as progress lines as they are recorded (only
    when asked for or on a terminal); the runner returns the benchmark's exit status."""
    import io
    import os
    import sys

    results = tmp_path / "results.jsonl"
    script = (
        "import time\n"
        "from benchmarks.summary import Row, record\n"
        "record(Row('MQ -> Kafka, batch 64', 7300.0, 9100.0, 0.8))\n"
        "time.sleep(0.4)\n"
        "record(Row('MQ put -> Kafka consumer', 12.5, 4.0, 20.0, kind='latency', unit='ms'))\n"
        "raise SystemExit(3)\n"
    )
    env = {**os.environ, RESULTS_ENV: str(results), "PYTHONPATH": str(run.HERE.parent)}
    shown = io.StringIO()
    progress = run.BenchProgress(2, force=True, stream=shown)
    progress.index = 1
    code = run.run_one("bench_x", [sys.executable, "-c", script], cwd=tmp_path, env=env,
                       results=results, progress=progress, poll=0.1)
    assert code == 3
    lines = shown.getvalue().splitlines()
    assert len(lines) == 2, lines
    assert lines[0].startswith("[bench 1/2, ")
    assert lines[0].endswith(
        "s] bench_x: recorded MQ -> Kafka, batch 64: 7,300 msg/s vs 9,100 msg/s, ratio 0.80"
    )
    assert lines[1].endswith(
        "s] bench_x: recorded MQ put -> Kafka consumer: p99 12.5 ms vs (p50 4.0 ms)"
    )
    quiet = io.StringIO()  # not a terminal, not forced: nothing
    run.BenchProgress(1, stream=quiet).line("hidden")
    assert quiet.getvalue() == ""
