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
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from benchmarks.summary import RESULTS_ENV, format_table, load  # noqa: E402

#: Small bounded counts for ``--quick`` (benchmarks not listed run as they are).
QUICK_ARGS: dict[str, list[str]] = {
    "bridge_kafka": ["--messages", "2000", "--batch-sizes", "256"],
    "bridge_mqtt": ["--messages", "2000", "--batch-sizes", "256"],
    "inbound": ["--messages", "2000"],
    "latency": ["--seconds", "2"],
    "pubsub": ["--quick"],
    "analytics": ["--records", "100000", "--produce-seconds", "30"],
    "request_reply": ["--requests", "60"],
    "neighbours": ["--messages", "300"],
    "wire": ["--seconds", "0.5"],
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help="comma-separated names, e.g. wire,pubsub")
    parser.add_argument("--quick", action="store_true", help="small counts: a smoke run")
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
        for script in scripts:
            name = script.stem.removeprefix("bench_")
            extra = QUICK_ARGS.get(name, []) if args.quick else []
            print(f"\n=== {script.stem} {' '.join(extra)} ===", flush=True)
            started = time.monotonic()
            result = subprocess.run(
                [sys.executable, "-m", f"benchmarks.{script.stem}", *extra],
                cwd=HERE.parent,
                check=False,
                env=env,
            )
            took = time.monotonic() - started
            print(f"--- {script.stem}: exit {result.returncode} in {took:.1f} s", flush=True)
            if result.returncode != 0:
                failed.append(script.stem)
        print("\n" + format_table(load(results), failed), flush=True)
    if failed:
        print(f"\nfailed: {', '.join(failed)}", file=sys.stderr)
        return 1
    print(f"\nall {len(scripts)} benchmarks ran")
    return 0


if __name__ == "__main__":
    sys.exit(main())
