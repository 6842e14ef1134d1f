"""A burst of new topics along a chain of neighbours: what one proxy registration costs.

In one process (tests/support/inprocess_brokers.py): three gateways L — M — R, each a
BrokerService with its NeighbourLinks on an embedded queue manager, channels up. N
RegSubs for N new topics (``burst/0`` … ) are put at L's control queue for a local
subscriber queue. Each topic becomes a proxy registration at M (L's RegSub) and at R
(M's RegSub onward): 2·N registrations. Timed from the first put until L's N proxies
at M and M's N proxies at R are acknowledged (each sender's ``neighbours.db`` row
settled by its neighbour's response); the process's CPU seconds over the same window
give the CPU per registration (all three brokers share the one process).
``--profile FILE`` writes cProfile statistics of the window. Bounded: ``--time-limit``.
Run: .venv/bin/python -m benchmarks.bench_proxy_burst [--topics N] [--profile FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import os
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.bench_proxy_registration import until
from gateway.mq.embedded.network import Network
from gateway.mq.embedded.topology import topology_from_dict
from tests.support.inprocess_brokers import Broker, broker, gw, mqsc, put_commands, regsub


async def run(work: Path, n: int, limit: float, profile: str | None) -> dict[str, float]:
    topo = topology_from_dict(
        {"queue_managers": {"L": {"mqsc": mqsc("L", ["M"])},
                            "M": {"mqsc": mqsc("M", ["L", "R"])},
                            "R": {"mqsc": mqsc("R", ["M"])}}},
        work,
    )
    async with (
        Network(topo, work / "data") as net,
        broker(net["L"].qm, work / "L", [gw("M")]) as left,
        broker(net["M"].qm, work / "M", [gw("L"), gw("R")]) as mid,
        broker(net["R"].qm, work / "R", [gw("M")]) as right,
    ):
        await until(
            lambda: left.link_state("M") == mid.link_state("L") == mid.link_state("R")
            == right.link_state("M") == "active", 60, "the chain never became active")
        await asyncio.sleep(1.0)  # joins settled, nothing in flight

        def acknowledged(b: Broker, q_mgr: str) -> int:
            return sum(1 for r in b.state.proxy_map(q_mgr).values() if r.acknowledged)

        def settled() -> bool:
            return acknowledged(left, "M") >= n and acknowledged(mid, "R") >= n

        prof = cProfile.Profile() if profile else None
        cpu0, started = time.process_time(), time.monotonic()
        if prof is not None:
            prof.enable()
        await put_commands(left.qm, [regsub(f"burst/{i}", q_mgr="L") for i in range(n)])
        await until(settled, limit, f"{n} proxies not in place within {limit} s")
        took, cpu = time.monotonic() - started, time.process_time() - cpu0
        if prof is not None:
            prof.disable()
            prof.dump_stats(profile)  # type: ignore[arg-type]
    return {"topics": n, "seconds": round(took, 2), "cpu_s": round(cpu, 2),
            "cpu_ms_per_registration": round(1000 * cpu / (2 * n), 3)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--topics", type=int, default=1000)
    p.add_argument("--time-limit", type=float, default=300.0)
    p.add_argument("--profile", help="write cProfile statistics of the timed window here")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        out = asyncio.run(run(Path(tmp), args.topics, args.time_limit, args.profile))
    print(f"burst of {out['topics']} new topics over L -> M -> R: settled in "
          f"{out['seconds']} s, {out['cpu_s']} CPU s, {out['cpu_ms_per_registration']} ms "
          f"CPU per proxy registration (load average {os.getloadavg()[0]:.1f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
