"""The demo's legacy MQ applications as separate processes, as they are in real life.

``python -m examples.demo.legacy_process register|publish|read --data-dir DIR`` connects
to the running gateway's embedded queue manager through its local socket
(``gateway.mq.embedded.client``) and plays one application of :mod:`.legacy_apps`:

- ``register``: the MQRFH and MQRFH2 subscribers' RegSub commands (exit 3 when the
  broker refuses one, the reason on stderr);
- ``publish --ticks FILE --count N``: the tick feed and the bulletin publisher; prints
  ``{"path": sent, ...}`` as JSON when done;
- ``read``: drains the subscriber queues, one JSON line per publication on stdout
  (``queue``, ``topic``, ``data`` in hex) until stdin closes.

The driver side (:func:`register`, :func:`publish`, :func:`read`) starts them and feeds
what they report into the demo's statistics.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sys
from collections.abc import Sequence
from decimal import Decimal
from pathlib import Path

from examples.demo.bars import BarBook, Tick
from examples.demo.legacy_apps import (
    DemoError,
    drain_subscribers,
    publish_legacy,
    record_delivery,
    register_subscribers,
)
from examples.demo.paths import PathStats

ROOT = Path(__file__).resolve().parents[2]
_EXIT_REFUSED = 3


# ---------------------------------------------------------------- the processes ---


class _Counts(dict[str, PathStats]):
    """The publisher's statistics: a row for each path it sends on."""

    def __missing__(self, key: str) -> PathStats:
        self[key] = PathStats()
        return self[key]


async def _child(args: argparse.Namespace) -> int:
    from gateway.mq.embedded.client import connect_local

    names = {"register": "mqgw-demo subscriber", "publish": "mqgw-demo publisher",
             "read": "mqgw-demo reader"}
    conn = await connect_local(args.data_dir, appl_name=names[args.role])
    try:
        if args.role == "register":
            try:
                await register_subscribers(conn)
            except DemoError as exc:
                print(f"{exc.step}: {exc}", file=sys.stderr)
                return _EXIT_REFUSED
            return 0
        if args.role == "publish":
            raw = json.loads(Path(args.ticks).read_text())
            ticks = [Tick(t["seq"], t["symbol"], Decimal(t["price"]), t["volume"], t["put_cs"])
                     for t in raw]
            stats = _Counts()
            await publish_legacy(conn, ticks, args.count, stats)
            print(json.dumps({k: v.sent for k, v in stats.items()}), flush=True)
            return 0
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        loop.add_reader(sys.stdin.fileno(), lambda: stop.set() if not os.read(
            sys.stdin.fileno(), 4096) else None)

        def emit(queue: str, topic: str, data: bytes) -> None:
            sys.stdout.write(json.dumps({"queue": queue, "topic": topic,
                                         "data": data.hex()}) + "\n")
            sys.stdout.flush()

        await drain_subscribers(conn, emit, stop)
        return 0
    finally:
        await conn.disconnect()


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m examples.demo.legacy_process")
    p.add_argument("role", choices=("register", "publish", "read"))
    p.add_argument("--data-dir", type=Path, required=True)
    p.add_argument("--ticks", type=Path)
    p.add_argument("--count", type=int, default=0)
    args = p.parse_args(argv)
    return asyncio.run(_child(args))


# ---------------------------------------------------------------- the driver side --


async def _spawn(role: str, data_dir: Path, *extra: str,
                 stdin: int | None = None) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable, "-m", "examples.demo.legacy_process", role, "--data-dir",
        str(data_dir), *extra, stdin=stdin, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE, cwd=ROOT,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(
            filter(None, [str(ROOT), os.environ.get("PYTHONPATH", "")]))},
    )


async def _finish(proc: asyncio.subprocess.Process, what: str, timeout: float = 60) -> str:
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise DemoError(f"the {what} process did not finish in {timeout:.0f} s",
                        step=what) from None
    if proc.returncode != 0:
        text = err.decode(errors="replace").strip()
        last = text.splitlines()[-1] if text else f"exit status {proc.returncode}"
        raise DemoError(f"the {what} process failed: {last}", step=what)
    return out.decode()


async def register(data_dir: Path) -> None:
    """The legacy subscribers register (a process of their own); DemoError if refused."""
    out = await _finish(await _spawn("register", data_dir), "subscribe")
    sys.stdout.write(out)


async def publish(data_dir: Path, ticks: Sequence[Tick], count: int,
                  stats: dict[str, PathStats], work: Path) -> None:
    """The legacy publishers (a process of their own); their sent counts into ``stats``."""
    ticks_file = work / "legacy-ticks.json"
    ticks_file.write_text(json.dumps([
        {"seq": t.seq, "symbol": t.symbol, "price": str(t.price), "volume": t.volume,
         "put_cs": t.put_cs} for t in ticks]))
    proc = await _spawn("publish", data_dir, "--ticks", str(ticks_file), "--count", str(count))
    out = await _finish(proc, "publish", timeout=120)
    for name, sent in json.loads(out.strip().splitlines()[-1]).items():
        if name in stats:
            stats[name].sent += int(sent)


async def read(data_dir: Path, stats: dict[str, PathStats], book: BarBook,
               stop: asyncio.Event) -> None:
    """The legacy reader (a process of their own) until ``stop``; what it got into
    ``stats`` and ``book``."""
    proc = await _spawn("read", data_dir, stdin=asyncio.subprocess.PIPE)
    assert proc.stdout is not None and proc.stdin is not None

    async def lines() -> None:
        assert proc.stdout is not None
        async for raw in proc.stdout:
            item = json.loads(raw)
            record_delivery(item["queue"], item["topic"], bytes.fromhex(item["data"]),
                            stats, book)

    pump = asyncio.create_task(lines())
    try:
        await stop.wait()
    finally:
        proc.stdin.close()  # the reader stops at end of input
        try:
            await asyncio.wait_for(proc.wait(), 10)
        except TimeoutError:
            proc.kill()
            await proc.wait()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await asyncio.wait_for(pump, 5)
    if proc.returncode not in (0, -9) and proc.stderr is not None:
        err = (await proc.stderr.read()).decode(errors="replace").strip()
        raise DemoError(f"the reader process failed: {err.splitlines()[-1] if err else ''}",
                        step="read")


if __name__ == "__main__":
    sys.exit(main())
