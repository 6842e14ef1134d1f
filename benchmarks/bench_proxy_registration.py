"""RegSubs naming a neighbour per second, and what they cost (issue 29).

In one process (tests/support/inprocess_brokers.py): GW has two neighbours, A (a broker
in this process, channels up) and B, active but its channel down (a transmission queue
and no channel). N RegSubs on GW's control queue name a subscriber queue at A
(``QMgrName A``): each is a subscription GW needs a proxy for at B, and none at A.

Measured: commands per second from the first put until GW's engine holds the N
subscriptions and GW has put a RegSub for each of the N proxies at B; the growth of the
process's resident memory over that; then B's transmission queue depth after the links'
clock is moved past their resend time three times (each proxy command once on the queue
when resends are not duplicated; one more copy of each per move when they are).
Bounded: ``--time-limit`` (default 300 s).
Run: .venv/bin/python -m benchmarks.bench_proxy_registration [--commands N]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path

from gateway.mq.embedded.network import Network
from gateway.mq.embedded.topology import topology_from_dict
from tests.support.inprocess_brokers import (
    BULLETIN,
    FakeClock,
    broker,
    gw,
    mqsc,
    put_commands,
    regsub,
    remember_active,
)

#: How far the links' clock is moved per step (past any resend time).
STEP_S = 700.0


def rss_mb() -> float:
    with open("/proc/self/status", encoding="ascii") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


async def until(predicate, limit: float, what: str) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + limit
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        await asyncio.sleep(0.05)


async def run(work: Path, n: int, limit: float) -> dict[str, float]:
    topo = topology_from_dict(
        {"queue_managers": {"GW": {"mqsc": mqsc("GW", ["A"], down=["B"])},
                            "A": {"mqsc": mqsc("A", ["GW"])}}},
        work,
    )
    clock = FakeClock()
    remember_active(work / "GW", gw("B"), [BULLETIN])
    async with (
        Network(topo, work / "data") as net, broker(net["A"].qm, work / "A", [gw("GW")]) as a,
        broker(net["GW"].qm, work / "GW", [gw("A"), gw("B")], clock=clock) as g,
    ):
        await until(lambda: g.link_state("A") == a.link_state("GW") == "active", 30,
                    "A never became active")
        xmitq_before = g.qm.queue_depth("B")
        rss_before = rss_mb()
        started = time.monotonic()
        await put_commands(g.qm, [regsub(f"flood/{i}", q_mgr="A") for i in range(n)])

        def done() -> bool:
            subs = sum(1 for s in g.engine.subscriptions if s.destination.q_mgr == "A")
            return subs >= n and len(g.state.proxies("B")) >= n

        await until(done, limit, f"{n} RegSubs not handled within {limit} s")
        took = time.monotonic() - started
        rss_after = rss_mb()
        depths = [g.qm.queue_depth("B") - xmitq_before]
        for _ in range(3):
            clock.advance(STEP_S)
            await g.links.tick()
            depths.append(g.qm.queue_depth("B") - xmitq_before)
    return {"commands": n, "seconds": round(took, 2), "per_second": round(n / took, 1),
            "rss_growth_mb": round(rss_after - rss_before, 1),
            "xmitq_B": depths}  # type: ignore[dict-item]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--commands", type=int, default=2000)
    p.add_argument("--time-limit", type=float, default=300.0)
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        out = asyncio.run(run(Path(tmp), args.commands, args.time_limit))
    print(f"{out['commands']} RegSubs naming a neighbour: {out['seconds']} s, "
          f"{out['per_second']} commands/s, resident memory +{out['rss_growth_mb']} MB; "
          f"B's transmission queue (proxy commands) after 0/1/2/3 resend times: "
          f"{out['xmitq_B']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
