"""`make bench`: run every benchmarks/bench_*.py in turn, then print one summary table.

Each benchmark is a standalone script with its own bounds; this runner only sequences
them (``--only wire,embedded_qm`` picks some; never two at once) and reports which
failed, so one broken benchmark does not hide the others' figures. Each runs as a module
from the repository root (``python -m benchmarks.bench_x``), so a benchmark may reuse a
harness of ``tests/support`` (bench_neighbours starts the seed's three-process network
with it). The benchmarks record their paths (benchmarks/summary.py) in a results file
named by ``MQGW_BENCH_RESULTS``; the run ends with the table of them: path, gateway
msg/s, baseline msg/s, ratio, goal, met or not (issue 16).

``--quick`` passes small counts (:data:`QUICK_ARGS`) for a smoke run of a few minutes;
its figures are noisier and its verdicts only indicative.

Progress goes to stderr when it is a terminal or with ``--progress``: a line when each
benchmark starts and ends (``[bench 3/11, 42 s] bench_wire: ...``) and one per result a
running benchmark records (each measured batch size / path), so a long run shows where it
is; stdout keeps the benchmarks' own output and the table.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TextIO

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from benchmarks.summary import RESULTS_ENV, Row, cells, format_table, load  # noqa: E402

#: Small bounded counts for ``--quick`` (benchmarks not listed run as they are).
QUICK_ARGS: dict[str, list[str]] = {
    "bridge_kafka": ["--messages", "2000", "--batch-sizes", "256"],
    "bridge_mqtt": ["--messages", "2000", "--batch-sizes", "256"],
    "inbound": ["--messages", "2000"],
    "latency": ["--seconds", "2", "--min-messages", "0"],
    "pubsub": ["--quick"],
    "analytics": ["--records", "100000", "--produce-seconds", "30"],
    "request_reply": ["--requests", "60"],
    "neighbours": ["--messages", "300"],
    "scale_out": ["--quick"],
    "network_20": ["--quick"],
    "wire": ["--seconds", "0.5"],
    "takeover": ["--takeovers", "3"],
}


class BenchProgress:
    """Progress lines on ``stream`` (stderr): shown when it is a terminal or ``force``."""

    def __init__(self, total: int, *, force: bool = False, stream: TextIO | None = None) -> None:
        self.stream = stream if stream is not None else sys.stderr
        try:
            tty = self.stream.isatty()
        except (AttributeError, ValueError):
            tty = False
        self.enabled = tty or force
        self.total = total
        self.index = 0
        self._started = time.monotonic()

    def line(self, text: str) -> None:
        if self.enabled:
            took = time.monotonic() - self._started
            self.stream.write(f"[bench {self.index}/{self.total}, {took:.0f} s] {text}\n")
            self.stream.flush()


def _complete_rows(path: Path, seen: int) -> list[Row]:
    """Rows recorded in ``path`` after the first ``seen`` (whole lines only: a writer may
    be half-way through one)."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return []
    complete = text[: text.rfind("\n") + 1] if "\n" in text else ""
    return [Row(**json.loads(x)) for x in complete.splitlines()[seen:] if x]


def run_one(
    name: str,
    command: list[str],
    *,
    cwd: Path,
    env: dict[str, str],
    results: Path,
    progress: BenchProgress,
    poll: float = 0.5,
) -> int:
    """Run one benchmark; while it runs, a progress line per result row it records."""
    seen = len(_complete_rows(results, 0))
    proc = subprocess.Popen(command, cwd=cwd, env=env)
    try:
        while True:
            try:
                code: int | None = proc.wait(timeout=poll)
            except subprocess.TimeoutExpired:
                code = None
            for row in _complete_rows(results, seen):
                seen += 1
                path, gateway, baseline, ratio, _goal, _met = cells(row)
                detail = f"{gateway} vs {baseline}" + (f", ratio {ratio}" if ratio != "-" else "")
                progress.line(f"{name}: recorded {path}: {detail}")
            if code is not None:
                return code
    finally:
        if proc.poll() is None:  # interrupted: leave no benchmark running
            proc.kill()
            proc.wait()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help="comma-separated names, e.g. wire,pubsub")
    parser.add_argument("--quick", action="store_true", help="small counts: a smoke run")
    parser.add_argument("--progress", action="store_true",
                        help="progress lines on stderr even when it is not a terminal")
    args = parser.parse_args(argv)
    wanted = {name.strip() for name in args.only.split(",") if name.strip()}
    scripts = sorted(HERE.glob("bench_*.py"))
    if wanted:
        scripts = [s for s in scripts if s.stem.removeprefix("bench_") in wanted]
    if not scripts:
        print("no benchmark matched", file=sys.stderr)
        return 2
    failed: list[str] = []
    with tempfile.TemporaryDirectory(prefix="mqgw-bench-") as tmp:
        results = Path(tmp) / "results.jsonl"
        env = {**os.environ, RESULTS_ENV: str(results)}
        progress = BenchProgress(len(scripts), force=args.progress)
        for script in scripts:
            name = script.stem.removeprefix("bench_")
            extra = QUICK_ARGS.get(name, []) if args.quick else []
            print(f"\n=== {script.stem} {' '.join(extra)} ===", flush=True)
            progress.index += 1
            progress.line(f"{script.stem}: started")
            started = time.monotonic()
            returncode = run_one(
                script.stem,
                [sys.executable, "-m", f"benchmarks.{script.stem}", *extra],
                cwd=HERE.parent,
                env=env,
                results=results,
                progress=progress,
            )
            took = time.monotonic() - started
            print(f"--- {script.stem}: exit {returncode} in {took:.1f} s", flush=True)
            progress.line(f"{script.stem}: exit {returncode} in {took:.1f} s")
            if returncode != 0:
                failed.append(script.stem)
        print("\n" + format_table(load(results), failed), flush=True)
    if failed:
        print(f"\nfailed: {', '.join(failed)}", file=sys.stderr)
        return 1
    print(f"\nall {len(scripts)} benchmarks ran")
    return 0


if __name__ == "__main__":
    sys.exit(main())
