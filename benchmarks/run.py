"""`make bench`: run every benchmarks/bench_*.py in turn and print their figures.

Each benchmark is a standalone script with its own bounds; this runner only sequences
them (``--only wire,embedded_qm`` picks some) and reports which failed, so one broken
benchmark does not hide the others' figures. Each runs as a module from the repository
root (``python -m benchmarks.bench_x``), so a benchmark may reuse a harness of
``tests/support`` (bench_neighbours starts the seed's three-process network with it).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help="comma-separated names, e.g. wire,pubsub")
    args = parser.parse_args(argv)
    wanted = {name.strip() for name in args.only.split(",") if name.strip()}
    scripts = sorted(HERE.glob("bench_*.py"))
    if wanted:
        scripts = [s for s in scripts if s.stem.removeprefix("bench_") in wanted]
    if not scripts:
        print("no benchmark matched", file=sys.stderr)
        return 2
    failed: list[str] = []
    for script in scripts:
        print(f"\n=== {script.stem} ===", flush=True)
        started = time.monotonic()
        result = subprocess.run(
            [sys.executable, "-m", f"benchmarks.{script.stem}"], cwd=HERE.parent, check=False
        )
        print(f"--- {script.stem}: exit {result.returncode} in {time.monotonic() - started:.1f} s")
        if result.returncode != 0:
            failed.append(script.stem)
    if failed:
        print(f"\nfailed: {', '.join(failed)}", file=sys.stderr)
        return 1
    print(f"\nall {len(scripts)} benchmarks ran")
    return 0


if __name__ == "__main__":
    sys.exit(main())
