"""The demo's result: the samples each viewer saw, the bars, and the table of sent /
received / latency percentiles per path (also as JSON for ``--json-summary``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from examples.demo.bars import bar_name, bar_text
from examples.demo.exercise import DemoRun
from examples.demo.paths import OHLC_PATHS, OHLC_RFH_Q, SAMPLES, PathStats, percentile


def summary_rows(stats: dict[str, PathStats]) -> list[dict[str, Any]]:
    """The summary table as data (``--json-summary``); latencies in ms, None when none."""
    rows = []
    for name, s in stats.items():
        p = [percentile(s.latencies, q) * 1000 for q in (50, 95, 99)]
        rows.append({
            "path": name,
            "sent": s.sent,
            "received": s.received,
            "p50_ms": None if s.skipped or not s.latencies else round(p[0], 1),
            "p95_ms": None if s.skipped or not s.latencies else round(p[1], 1),
            "p99_ms": None if s.skipped or not s.latencies else round(p[2], 1),
            "status": "skipped" if s.skipped else ("ok" if s.complete else "short"),
            "note": s.skipped,
        })
    return rows


def summary_table(stats: dict[str, PathStats]) -> str:
    """The summary as an aligned text table, one row per path."""
    width = max(len(n) for n in stats)
    header = (f"{'path':<{width}} {'sent':>6} {'received':>9} "
              f"{'p50 ms':>8} {'p95 ms':>8} {'p99 ms':>8}")
    lines = [header, "-" * len(header)]
    for row in summary_rows(stats):
        if row["status"] == "skipped":
            lines.append(f"{row['path']:<{width}} {'-':>6} {'-':>9}  {row['note']}")
            continue
        p = [f"{row[k]:>8.1f}" if row[k] is not None else f"{'-':>8}"
             for k in ("p50_ms", "p95_ms", "p99_ms")]
        lines.append(f"{row['path']:<{width}} {row['sent']:>6} {row['received']:>9} "
                     + " ".join(p))
    return "\n".join(lines)


def report(run: DemoRun) -> bool:
    """Print the samples and the summary table; True when every path delivered all."""
    stats = run.stats
    print()
    for who, text in sorted(SAMPLES.items()):
        print(f"  sample, {who}: {text}")
    got = run.book.seen.get(OHLC_RFH_Q, {})
    if got:
        print(f"\n  bars received at {OHLC_RFH_Q} (= ticks sent, recomputed here):")
        for key, bar in sorted(got.items(), key=lambda kv: (kv[0][1], kv[0][0])):
            mark = "ok" if run.book.expected.get(key) == bar else "DIFFERS"
            print(f"    {bar_name(key)}  {bar_text(bar)}  {mark}")
    if run.job is not None and run.job.returncode == 0:
        for name, queue in OHLC_PATHS.items():
            if not stats[name].complete:
                for line in run.book.mismatches(queue):
                    print(f"  {queue}: {line}")
    print()
    print(summary_table(stats))
    if run.job is not None:
        state = "exit 0" if run.job.returncode == 0 else f"exit {run.job.returncode}"
        print(f"ohlc job (Spark, --once): {state}, {run.job.seconds:.1f} s; "
              f"{len(run.book.expected)} bars expected from the ticks sent")
    ok = not run.failure and all(s.complete for s in stats.values())
    print()
    print("demo: every path delivered everything" if ok else "demo: some paths fell short")
    return ok


def write_json_summary(path: Path, run: DemoRun, ok: bool, count: int, seconds: float) -> None:
    """The ``--json-summary`` file: outcome, table rows, the job and the process groups."""
    data = {
        "ok": ok,
        "count": count,
        "wall_s": round(seconds, 1),
        "failure": run.failure,
        "paths": summary_rows(run.stats),
        "bars_expected": len(run.book.expected),
        "ohlc_job": None if run.job is None else {
            "returncode": run.job.returncode, "seconds": round(run.job.seconds, 1),
            "argv": run.job.argv},
        "process_groups": run.process_groups,
    }
    path.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
