"""Run every wire fuzz target for a bounded share of ``--seconds`` and report findings.

``make fuzz`` calls ``python tests/fuzz/run_fuzz.py --seconds N``. Each target runs in
its own subprocess (libFuzzer via atheris) with ``-max_total_time`` = N / targets, a
per-input timeout and an RSS limit, starting from seed inputs (tests/fuzz/seeds.py) and
keeping its corpus in ``fuzz-out/corpus/<target>`` between runs. Findings (crash-*,
timeout-*, oom-*) are written to ``fuzz-out/artifacts/<target>/`` and listed; the exit
status is 1 when anything was found.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import re
import subprocess
import sys
import time

from tests.fuzz.seeds import TARGET_NAMES, seeds

ROOT = pathlib.Path(__file__).resolve().parents[2]
HERE = pathlib.Path(__file__).resolve().parent


def _parse_stats(output: str) -> tuple[int, int]:
    """(executions, coverage edges) from libFuzzer's output."""
    runs = re.findall(r"stat::number_of_executed_units:\s*(\d+)", output)
    if not runs:
        runs = re.findall(r"#(\d+)\s+(?:DONE|pulse|NEW|REDUCE|INITED)", output)
    cov = re.findall(r"cov: (\d+)", output)
    return (int(runs[-1]) if runs else 0), (int(cov[-1]) if cov else 0)


def run_target(name: str, seconds: int, out: pathlib.Path) -> dict[str, object]:
    corpus = out / "corpus" / name
    artifacts = out / "artifacts" / name
    corpus.mkdir(parents=True, exist_ok=True)
    artifacts.mkdir(parents=True, exist_ok=True)
    for i, seed in enumerate(seeds().get(name, [])):
        (corpus / f"seed-{i}").write_bytes(seed)
    before = set(artifacts.iterdir())
    cmd = [
        sys.executable,
        str(HERE / "fuzz_targets.py"),
        name,
        str(corpus),
        f"-max_total_time={seconds}",
        "-timeout=10",
        "-rss_limit_mb=2048",
        "-max_len=4096",
        "-print_final_stats=1",
        f"-artifact_prefix={artifacts}/",
    ]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), str(HERE)]))
    started = time.monotonic()
    proc = subprocess.run(
        cmd,
        capture_output=True,
        text=True,
        errors="replace",
        env=env,
        timeout=seconds + 120,
        check=False,
    )
    elapsed = time.monotonic() - started
    found = sorted(p.name for p in set(artifacts.iterdir()) - before)
    runs, cov = _parse_stats(proc.stderr + proc.stdout)
    if proc.returncode != 0 and not found:
        found = [f"exit status {proc.returncode} (see output below)"]
        sys.stderr.write(proc.stderr[-4000:])
    elif found:
        tail = proc.stderr[proc.stderr.find("=== Uncaught") :][:4000]
        sys.stderr.write(f"--- {name} ---\n{tail}\n")
    return {
        "target": name,
        "seconds": elapsed,
        "runs": runs,
        "cov": cov,
        "findings": found,
        "artifacts": str(artifacts),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=int, default=120, help="total budget (all targets)")
    parser.add_argument("--targets", nargs="*", default=list(TARGET_NAMES), choices=TARGET_NAMES)
    parser.add_argument("--out", type=pathlib.Path, default=ROOT / "fuzz-out")
    args = parser.parse_args(argv)
    share = max(1, args.seconds // len(args.targets))
    print(f"fuzzing {len(args.targets)} targets, {share} s each (budget {args.seconds} s)")
    results = []
    for name in args.targets:
        result = run_target(name, share, args.out)
        results.append(result)
        status = "no findings" if not result["findings"] else f"FOUND {result['findings']}"
        print(
            f"  {name:17s} {result['seconds']:6.1f} s  {result['runs']:>9} execs  "
            f"cov {result['cov']:>5}  {status}",
            flush=True,
        )
    total_runs = sum(int(str(r["runs"])) for r in results)
    bad = [r for r in results if r["findings"]]
    print(f"total: {total_runs} executions, {len(bad)} target(s) with findings")
    for r in bad:
        print(f"  {r['target']}: {r['findings']} in {r['artifacts']}")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
