"""A publisher of benchmarks/bench_scale_out.py: an MQ application in a process of its own.

Why a process: the benchmark sets each gateway's CPU against the work it did, so the
publications must be put by someone else, as MQ applications on the gateway's machine
do: through the embedded queue manager's local socket (``<data dir>/qm.sock``).

It connects, builds its MQRFH2 Publish commands (1 KiB persistent payload, 16 topics
in turn), prints ``READY``, waits for a line on stdin (the benchmark starts every
publisher at once), puts them under syncpoint with asynchronous puts, committing every
``--unit`` messages, and prints one JSON line: ``{"sent", "seconds", "cpu"}`` (its own
CPU seconds, user + system, from the GO line to the last commit).

Run: python -m benchmarks.scale_out_publisher --qm-dir D --queue Q --stream S --count N
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import sys
import time
from pathlib import Path

from gateway.mq.embedded.client import connect_local
from gateway.mq.port import OpenOption, PutOptions
from gateway.plugin_api import Envelope
from gateway.runtime.plugin_host import publish_command_of

PAYLOAD = b"x" * 1024


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def publish(qm_dir: Path, queue: str, stream: str, count: int, unit: int) -> dict[str, float]:
    messages = [publish_command_of(Envelope(stream, f"T{i % 16}", PAYLOAD))
                for i in range(count)]
    conn = await connect_local(qm_dir)
    try:
        handle = await conn.open(queue, OpenOption.OUTPUT)
        print("READY", flush=True)
        await asyncio.to_thread(sys.stdin.readline)
        t0, c0 = time.perf_counter(), cpu_seconds()
        opts = PutOptions(syncpoint=True, async_response=True)
        for i, (md, body) in enumerate(messages, 1):
            await handle.put(md, body, opts)
            if i % unit == 0:
                await conn.commit()
        await conn.commit()
        took, cpu = time.perf_counter() - t0, cpu_seconds() - c0
        await handle.close()
    finally:
        await conn.disconnect()
    return {"sent": count, "seconds": took, "cpu": cpu}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--qm-dir", type=Path, required=True,
                        help="the embedded queue manager's data directory")
    parser.add_argument("--queue", required=True, help="the queue to put to")
    parser.add_argument("--stream", required=True, help="the stream of the publications")
    parser.add_argument("--count", type=int, required=True, help="publications to put")
    parser.add_argument("--unit", type=int, default=100, help="puts per unit of work")
    args = parser.parse_args(argv)
    result = asyncio.run(publish(args.qm_dir, args.queue, args.stream, args.count, args.unit))
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
