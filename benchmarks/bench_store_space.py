"""The free-space watermark's cost per store transaction (gateway/mq/embedded/space.py).

The embedded queue manager's store writes each unit of work as one SQLite transaction;
with a watermark (``min_free_mb``, on by default in ``mqgw run``) the room on the disk is
measured after it when due. This times ``MessageStore.apply`` with the watermark off and
on, for a one-message unit (insert, then delete: a put and its get) and a 100-message
one, on a tmpfs when there is one (/dev/shm: fsync costs nothing there, so what is left
is the store's own work and the watermark's share of it) and in the temporary directory.
Prints the CPU microseconds per transaction (this thread's CPU time: waits for the disk
and other processes on a busy machine do not count), the median of REPEATS runs (off
and on taking turns), on minus off, and the CPU time of one measure of the room.

Bounded: REPEATS x 2 x TRANSACTIONS small transactions per directory and setting.
Run: .venv/bin/python benchmarks/bench_store_space.py
"""

from __future__ import annotations

import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from gateway.mq.embedded.space import SpacePolicy
from gateway.mq.embedded.store import MessageStore, StoredMessage

BODY = os.urandom(1024)
MD = bytes(364)
TRANSACTIONS = 2000
REPEATS = 7
BIG = 100
#: The watermark and reserve of ``mqgw run``'s defaults.
ON = SpacePolicy(min_free_bytes=64 * 2**20, reserve_bytes=16 * 2**20)


def _row(seq: int) -> StoredMessage:
    return StoredMessage(seq, "Q", 0, seq.to_bytes(24, "big"), bytes(24), 0.0, None, 0, MD,
                         BODY)


def _one_message_units(store: MessageStore, first: int) -> float:
    """CPU µs per transaction: TRANSACTIONS inserts of one row, each then deleted."""
    t0 = time.thread_time()
    for seq in range(first, first + TRANSACTIONS):
        store.apply(inserts=[_row(seq)])
        store.apply(deletes=[seq])
    return (time.thread_time() - t0) / (2 * TRANSACTIONS) * 1e6


def _big_units(store: MessageStore, first: int) -> float:
    """CPU µs per transaction: inserts of BIG rows, then their delete."""
    n = TRANSACTIONS // 20
    t0 = time.thread_time()
    for i in range(n):
        seqs = range(first + i * BIG, first + (i + 1) * BIG)
        store.apply(inserts=[_row(s) for s in seqs])
        store.apply(deletes=list(seqs))
    return (time.thread_time() - t0) / (2 * n) * 1e6


def _cases(where: Path) -> dict[str, tuple[float, float]]:
    """Per setting (off, on): the median µs per transaction of one-message and BIG-
    message units. The settings take turns, so drift on a busy machine hits both."""
    made = {"off": SpacePolicy(), "on": ON}
    runs: dict[str, tuple[list[float], list[float]]] = {k: ([], []) for k in made}
    stores: dict[str, MessageStore] = {}
    directories = []
    try:
        for key, policy in made.items():
            directory = Path(tempfile.mkdtemp(prefix="bench-space-", dir=where))
            directories.append(directory)
            stores[key] = MessageStore(directory, policy)
        for r in range(REPEATS):
            for key, store in stores.items():
                small, big = runs[key]
                small.append(_one_message_units(store, 10**7 * (r + 1)))
                big.append(_big_units(store, 10**7 * (r + 1) + 5 * 10**6))
        return {k: (statistics.median(a), statistics.median(b)) for k, (a, b) in runs.items()}
    finally:
        for store in stores.values():
            store.close()
        for directory in directories:
            shutil.rmtree(directory, ignore_errors=True)


def _measure_cost(where: Path) -> float:
    """CPU µs of one measure of the room and the reserve check after it (what every
    transaction paid before the measure was throttled)."""
    directory = Path(tempfile.mkdtemp(prefix="bench-space-", dir=where))
    try:
        store = MessageStore(directory, ON)
        try:
            n = TRANSACTIONS * 5
            t0 = time.thread_time()
            for _ in range(n):
                store.space.measure(store._free_pages_bytes())
                store.space.make_reserve()
            return (time.thread_time() - t0) / n * 1e6
        finally:
            store.close()
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def main() -> None:
    places = [Path(tempfile.gettempdir())]
    if Path("/dev/shm").is_dir():
        places.insert(0, Path("/dev/shm"))
    print(f"CPU microseconds per store transaction, watermark off and on ({ON})")
    print(f"{'directory':<12} {'unit':<14} {'off us/tx':>10} {'on us/tx':>10} {'on-off':>8}")
    for where in places:
        got = _cases(where)
        off, on = got["off"], got["on"]
        for label, a, b in (("1 message", off[0], on[0]), (f"{BIG} messages", off[1], on[1])):
            print(f"{where!s:<12} {label:<14} {a:>10.1f} {b:>10.1f} {b - a:>8.1f}")
    print(f"one measure of the room + reserve check: {_measure_cost(places[0]):.1f} us")


if __name__ == "__main__":
    main()
