"""Embedded queue manager throughput: persistent 1 KiB messages, put+commit and get+commit,
batches of 1 and of 100 messages per unit of work; then 8 and 32 connections committing
one message each at once (group commit), and 100 getters parked in get-with-wait.
Prints messages/s.

Bounded: each case runs for at most ~6 s or a fixed message count, whichever is first.
Run: .venv/bin/python benchmarks/bench_embedded_qm.py
"""

from __future__ import annotations

import asyncio
import os
import tempfile
import time
from pathlib import Path

from gateway.mq.embedded.qmgr import EmbeddedQueueManager
from gateway.mq.port import GetOptions, MQError, OpenOption, PutOptions
from gateway.wire.constants import Persistence
from gateway.wire.mqmd import MQMD

BODY = os.urandom(1024)
CASE_SECONDS = 6.0
MAX_MESSAGES = 50_000


async def put_case(qm: EmbeddedQueueManager, queue: str, batch: int) -> tuple[int, float]:
    async with await qm.connect() as conn:
        q = await conn.open(queue, OpenOption.OUTPUT)
        md = MQMD(persistence=Persistence.PERSISTENT, format="MQSTR")
        sent = 0
        t0 = time.perf_counter()
        while sent < MAX_MESSAGES and time.perf_counter() - t0 < CASE_SECONDS:
            for _ in range(batch):
                await q.put(md, BODY, PutOptions(syncpoint=True))
            await conn.commit()
            sent += batch
        return sent, time.perf_counter() - t0


async def get_case(qm: EmbeddedQueueManager, queue: str, batch: int, n: int) -> tuple[int, float]:
    async with await qm.connect() as conn:
        q = await conn.open(queue, OpenOption.INPUT_SHARED)
        got = 0
        t0 = time.perf_counter()
        while got + batch <= n and time.perf_counter() - t0 < CASE_SECONDS:
            for _ in range(batch):
                await q.get(GetOptions(syncpoint=True))
            await conn.commit()
            got += batch
        return got, time.perf_counter() - t0


async def concurrent_put_case(
    qm: EmbeddedQueueManager, queue: str, conns: int
) -> tuple[int, float]:
    """``conns`` connections each putting one message per unit of work (group commit)."""
    md = MQMD(persistence=Persistence.PERSISTENT, format="MQSTR")
    deadline = time.perf_counter() + CASE_SECONDS
    counts = [0] * conns

    async def worker(i: int) -> None:
        async with await qm.connect() as conn:
            q = await conn.open(queue, OpenOption.OUTPUT)
            while time.perf_counter() < deadline and sum(counts) < MAX_MESSAGES:
                await q.put(md, BODY, PutOptions(syncpoint=True))
                await conn.commit()
                counts[i] += 1

    t0 = time.perf_counter()
    await asyncio.gather(*(worker(i) for i in range(conns)))
    return sum(counts), time.perf_counter() - t0


async def waiter_case(
    qm: EmbeddedQueueManager, queue: str, waiters: int, n: int
) -> tuple[int, float]:
    """``waiters`` getters parked in get-with-wait; ``n`` non-persistent puts feed them."""
    got = 0
    done = asyncio.Event()

    async def getter() -> None:
        nonlocal got
        async with await qm.connect() as conn:
            q = await conn.open(queue, OpenOption.INPUT_SHARED)
            while got < n:
                try:
                    await q.get(GetOptions(wait_ms=200))
                except MQError:
                    continue
                got += 1
                if got >= n:
                    done.set()

    tasks = [asyncio.ensure_future(getter()) for _ in range(waiters)]
    await asyncio.sleep(0.2)
    md = MQMD(persistence=Persistence.NOT_PERSISTENT, format="MQSTR")
    t0 = time.perf_counter()
    async with await qm.connect() as conn:
        q = await conn.open(queue, OpenOption.OUTPUT)
        for i in range(n):
            await q.put(md, BODY)
            if i % 100 == 99:
                await asyncio.sleep(0)
    await asyncio.wait_for(done.wait(), 60)
    elapsed = time.perf_counter() - t0
    await asyncio.gather(*tasks)
    return got, elapsed


async def run() -> None:
    with tempfile.TemporaryDirectory(prefix="bench-qm-") as tmp:
        qm = EmbeddedQueueManager("BENCH", Path(tmp) / "qm")
        qm.run_mqsc("DEFINE QLOCAL(BENCH.Q) MAXDEPTH(999999999)")
        print(f"embedded QM, SQLite WAL synchronous=FULL, 1 KiB persistent, data in {tmp}")
        print(f"{'case':<28}{'msgs':>8}{'seconds':>10}{'msgs/s':>12}")
        try:
            for batch in (1, 100):
                n, s = await put_case(qm, "BENCH.Q", batch)
                print(f"{f'put+commit batch {batch}':<28}{n:>8}{s:>10.2f}{n / s:>12.0f}")
                m, s = await get_case(qm, "BENCH.Q", batch, n)
                print(f"{f'get+commit batch {batch}':<28}{m:>8}{s:>10.2f}{m / s:>12.0f}")
                # leave the queue empty for the next case
                async with await qm.connect() as conn:
                    q = await conn.open("BENCH.Q", OpenOption.INPUT_SHARED)
                    for _ in range(qm.queue_depth("BENCH.Q")):
                        await q.get(GetOptions())
            for conns in (8, 32):
                before = qm.stats.store_transactions
                n, s = await concurrent_put_case(qm, "BENCH.Q", conns)
                txns = qm.stats.store_transactions - before
                print(f"{f'put+commit x{conns} conns':<28}{n:>8}{s:>10.2f}{n / s:>12.0f}"
                      f"   ({n / max(txns, 1):.1f} commits per fsync)")
                async with await qm.connect() as conn:
                    q = await conn.open("BENCH.Q", OpenOption.INPUT_SHARED)
                    for _ in range(qm.queue_depth("BENCH.Q") // 100):
                        for _ in range(100):
                            await q.get(GetOptions(syncpoint=True))
                        await conn.commit()
                    while qm.queue_depth("BENCH.Q"):
                        await q.get(GetOptions())
            n, s = await waiter_case(qm, "BENCH.Q", 100, 20_000)
            print(f"{'get-wait, 100 waiters (np)':<28}{n:>8}{s:>10.2f}{n / s:>12.0f}")
        finally:
            await qm.close()


def main() -> None:
    asyncio.run(run())


if __name__ == "__main__":
    main()
