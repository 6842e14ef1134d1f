"""Takeover time of a multi-instance node (docs/operations.md, "High availability").

examples/multi-instance run as two ``mqgw run --multi-instance`` processes on 127.0.0.1
with a Kafka and a Mosquitto broker of its own; the active instance is SIGKILLed
``--takeovers`` times under steady traffic on four paths (MQ -> Kafka, MQ -> MQTT,
Kafka -> MQ, a Kafka requester's request/reply route to an MQ echo service; one message
every 50 ms each), the killed one started again at once as the next standby
(tests/support/takeover.py, the harness of tests/examples/test_multi_instance.py). The
time from each SIGKILL to the first message sent after it arriving at its reader is one
sample; p50 and p99 per path are the summary's latency rows (goal: p99 < 10 s, the
issue's).

Bounded: ``--takeovers`` rounds of a few seconds each, every wait bounded by 60 s.
Run: .venv/bin/python -m benchmarks.bench_takeover (``make bench`` runs it).
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import sys
import tempfile
from pathlib import Path

from benchmarks.summary import Row, record
from gateway.devstack import KafkaBroker, MosquittoBroker
from tests.support.takeover import TakeoverRun, percentiles

#: The issue's goal for the takeover's p99 (ms).
GOAL_P99_MS = 10_000.0


async def run(takeovers: int) -> None:
    work = Path(tempfile.mkdtemp(prefix="bench-takeover-"))
    kafka, mqtt = KafkaBroker(work / "kafka"), MosquittoBroker(work / "mosquitto")
    try:
        kafka.start()
        mqtt.start()
        node = TakeoverRun(work, kafka, mqtt)
        try:
            await node.run(takeovers)
        finally:
            await node.close()
        for p in node.paths:
            p50, p99 = percentiles(node.takeovers[p.name])
            print(f"takeover, SIGKILL -> {p.name} flowing again: p50 {p50:.2f} s, p99 "
                  f"{p99:.2f} s over {takeovers} takeovers; {len(p.sender.committed)} sent, "
                  f"all delivered, {p.count - len(p.arrived)} duplicate deliveries",
                  flush=True)
            record(Row(f"takeover, SIGKILL -> {p.name} flowing again", p99 * 1000,
                       p50 * 1000, GOAL_P99_MS, kind="latency",
                       note=f"{takeovers} SIGKILLs, multi-instance node"))
    finally:
        mqtt.stop()
        kafka.stop()
        shutil.rmtree(work, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--takeovers", type=int, default=20,
                        help="SIGKILLs of the active instance (default 20, the issue's)")
    args = parser.parse_args(argv)
    if args.takeovers < 1:
        parser.error("--takeovers must be at least 1")
    asyncio.run(run(args.takeovers))
    return 0


if __name__ == "__main__":
    sys.exit(main())
