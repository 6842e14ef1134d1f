"""A 20-node network of brokers, measured: proxy settle time, latency per hop, memory,
a subtree joined and cleared under traffic (issue 31 item 4).

Twenty processes on 127.0.0.1 (tests/support/tree_network.py), one per broker as an
operator runs them: gateways (``mqgw run``) and legacy stand-ins (``mqgw broker
--profile legacy``), each on its own embedded queue manager, joined parent/child as
neighbours over channel pairs (the seed's neighbour protocol, nothing new)::

    R(g) ─┬─ A(g) ─┬─ A1(g) ─ A1L1(l) A1L2(g)
          │        ├─ A2(l) ─ A2L1(g) A2L2(l)
          │        └─ A3(g) ─ A3L1(l)
          └─ B(l) ─┬─ B1(g) ─ B1L1(l) B1L2(g)
                   ├─ B2(l) ─ B2L1(g)
                   └─ B3(g) ─ B3L1(l)   S(g) ─ SL1(l)   (S: the subtree, detached at start)

This process runs the TESTER node (a channel pair to every broker) and acts as the MQ
applications: it registers subscriptions with RegSub command messages and puts
publications through TESTER, and reads what subscribers registered with ``QMgrName
TESTER`` receive. It observes each node without disturbing it: its pub/sub store
read-only (which proxies it holds), /proc (resident memory, CPU seconds).

1. **Load**: ``--subscriptions`` (100,000) spread evenly over the 10 leaves, registered
   at each leaf by non-persistent RegSub DATAGRAMs (Report NAN: only failures answered),
   1,000 per leaf at a time, the next 1,000 once the leaf's store holds them (bounded);
   topics ``load/<i mod --topics>`` (1,000 distinct: each topic has ~100 subscribers),
   subscriber queues of the leaf. Timed until every node holds the proxies of every
   topic from each neighbour.
2. **Subtree joined under traffic**: publications at A1L1 (100/s) to subscribers at B1
   (main tree) and SL1 (in the detached subtree); S joined under B3 (``mqgw neighbours
   join``, both sides) while they flow. Ledger as tests/faults/ledger.py: B1 must get
   every publication once, in order; SL1 every one put after its proxies were seen.
3. **Burst**: 1,000 RegSubs for new topics at leaf A1L1, timed from the first put until
   each of the 19 other nodes holds the proxy of all 1,000 from its next hop towards
   A1L1 (each store polled every 50 ms); each node's time is reported (goal: < 5 s).
4. **Latency**: a publisher at A1L1, subscribers at every node on the path A1L1 -> A1
   -> A -> R -> B -> B1 (0 to 5 hops); 100 publications/s (1 KiB) for ``--seconds``,
   persistent, then non-persistent. Latency = put at TESTER until read at TESTER, so
   every figure includes TESTER -> A1L1 and the last node -> TESTER; the 0-hop figure
   (A1L1 delivering back to TESTER) is that cost alone. p50/p99 per hop count (goal:
   5 hops p99 < 50 ms), CPU seconds of each process during the window, load average.
5. **Subtree cleared under traffic** (``mqgw neighbours clear``, both sides): B1 must
   get every publication once, in order; SL1 every one put before the clear was asked.

Memory: resident memory of each process idle, after the load and at the end; per
10,000 subscriptions = a leaf's growth over the load / its subscriptions x 10,000.
``--quick``: 10,000 subscriptions over 500 topics, 5 s latency windows. Bounded:
``--time-limit`` (default 1,200 s) for the whole run; every wait has its own bound.
Run: .venv/bin/python -m benchmarks.bench_network_20 [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks.summary import Row, record
from gateway.mq.port import Message
from tests.faults.ledger import PathLedger
from tests.support.pubsub_messages import decode
from tests.support.queue_reader import QueueReader
from tests.support.tree_network import NodeSpec, Publisher, TreeNetwork, start_tree

PAYLOAD_SIZE = 1024
CHUNK = 1_000
POLL_S = 0.05
PUBLISHER, FAR = "A1L1", "B1"
SUBTREE, SUBTREE_LEAF = "S", "SL1"


def leaf_queues(per_leaf: int, topics: int) -> tuple[str, ...]:
    return tuple(f"SUB.{k}" for k in range(-(-per_leaf // topics)))


def specs(per_leaf: int, topics: int) -> list[NodeSpec]:
    """The 20 nodes of the module docstring (``g`` gateway, ``l`` legacy stand-in)."""
    q = leaf_queues(per_leaf, topics)
    interior = [("R", "gateway", None), ("A", "gateway", "R"), ("B", "legacy", "R"),
                ("A1", "gateway", "A"), ("A2", "legacy", "A"), ("A3", "gateway", "A"),
                ("B1", "gateway", "B"), ("B2", "legacy", "B"), ("B3", "gateway", "B")]
    leaves = [("A1L1", "legacy", "A1"), ("A1L2", "gateway", "A1"), ("A2L1", "gateway", "A2"),
              ("A2L2", "legacy", "A2"), ("A3L1", "legacy", "A3"), ("B1L1", "legacy", "B1"),
              ("B1L2", "gateway", "B1"), ("B2L1", "gateway", "B2"), ("B3L1", "legacy", "B3")]
    out = [NodeSpec(n, k, p) for n, k, p in interior]  # type: ignore[arg-type]
    out += [NodeSpec(n, k, p, local_queues=q) for n, k, p in leaves]  # type: ignore[arg-type]
    out.append(NodeSpec(SUBTREE, "gateway", "B3", detached=True))
    out.append(NodeSpec(SUBTREE_LEAF, "legacy", SUBTREE, local_queues=q))
    return out


def load_average() -> str:
    return "load average " + " ".join(f"{x:.1f}" for x in os.getloadavg())


def pct(values: Sequence[float], p: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(p / 100 * len(s)))] if s else float("nan")


class OverTime(Exception):
    """A bounded wait ran out."""


@dataclass
class Clock:
    """The run's deadline; every wait is bounded by it and by its own bound."""

    deadline: float

    async def until(self, what: str, predicate: Callable[[], bool], bound: float,
                    poll: float = POLL_S) -> float:
        started = time.monotonic()
        limit = min(started + bound, self.deadline)
        while not predicate():
            if time.monotonic() > limit:
                raise OverTime(f"{what}: not within {limit - started:.0f} s")
            await asyncio.sleep(poll)
        return time.monotonic() - started


@dataclass
class Reader:
    """Reads a TESTER queue in the background: (tag, seq, latency s) per publication."""

    net: TreeNetwork
    queue: str
    got: list[tuple[bytes, int, float]] = field(default_factory=list)
    _reader: QueueReader | None = None

    def start(self) -> None:
        self._reader = QueueReader(self.net.tester.qm, self.queue, self._record)
        self._reader.start()

    def _record(self, m: Message) -> None:
        now = time.perf_counter()
        body = decode(m.md, m.body).payload
        tag, seq, sent = body[:64].split(b" ")[:3]
        self.got.append((tag, int(seq), now - float(sent)))

    def seqs(self, tag: bytes) -> list[int]:
        return [s for t, s, _ in self.got if t == tag]

    async def stop(self) -> None:
        if self._reader is not None:
            await self._reader.close()


def payload(tag: bytes, seq: int) -> bytes:
    head = b"%s %d %.6f " % (tag, seq, time.perf_counter())
    return head + b"x" * (PAYLOAD_SIZE - len(head))


async def publish_at(pub: Publisher, topic: str, tag: bytes, rate: float,
                     stop: Callable[[], bool], sent: list[int], persistent: bool = True) -> None:
    """Publish ``tag seq time`` at ``rate`` per second until ``stop()``."""
    started = time.monotonic()
    while not stop():
        seq = len(sent)
        await pub.publish(topic, payload(tag, seq), persistent=persistent)
        sent.append(seq)
        delay = started + (seq + 1) / rate - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)


@dataclass
class Results:
    lines: list[str] = field(default_factory=list)
    rows: list[Row] = field(default_factory=list)
    ok: bool = True

    def say(self, text: str) -> None:
        print(text, flush=True)
        self.lines.append(text)


def leaves_of(net: TreeNetwork) -> list[str]:
    return [n for n, s in net.specs.items() if s.local_queues]


def stored(net: TreeNetwork, leaf: str, count: int) -> Callable[[], bool]:
    """``leaf``'s store holds ``count`` subscriptions of its own subscriber queues."""
    return lambda: net.subscriptions_of(leaf, leaf) >= count


def in_place(net: TreeNetwork, origin: str, topic: str,
             nodes: list[str]) -> Callable[[], bool]:
    """``origin``'s subscription to ``topic`` has its proxy at each of ``nodes``."""
    return lambda: not net.proxies_missing(origin, topic, 1, nodes)


def proxies_complete(net: TreeNetwork, prefix: str, count: int) -> Callable[[], bool]:
    """Every attached node holds ``count`` topics' proxies from each neighbour."""
    def check() -> bool:
        return all(net.topics_from(n, m, prefix) >= count
                   for n in net.attached_nodes() for m in net.neighbours(n))
    return check


async def load_subscriptions(net: TreeNetwork, clock: Clock, res: Results, total: int,
                             topics: int) -> dict[str, float]:
    """Phase 1; returns each node's RSS (MB) before the load."""
    leaves = leaves_of(net)
    per_leaf = total // len(leaves)
    rss = {n: net.rss_mb(n) for n in net.specs}
    started = time.monotonic()

    async def one(leaf: str) -> None:
        errors = net.tester_queue(f"ERRORS.{leaf}")
        for first in range(0, per_leaf, CHUNK):
            last = min(first + CHUNK, per_leaf)
            await net.register_many(
                leaf, ((f"load/{i % topics}", f"SUB.{i // topics}") for i in range(first, last)),
                errors)
            await clock.until(f"{leaf}: {last} subscriptions stored",
                              stored(net, leaf, last), 120.0, poll=0.2)

    await asyncio.gather(*(one(leaf) for leaf in leaves))
    registered = time.monotonic() - started
    await clock.until("load proxies everywhere", proxies_complete(net, "load/", topics), 600.0,
                      poll=0.5)
    settled = time.monotonic() - started
    refused = sum(net.tester.qm.queue_depth(f"ERRORS.{leaf}") for leaf in leaves)
    res.say(f"load: {per_leaf * len(leaves):,} subscriptions ({per_leaf:,} at each of "
            f"{len(leaves)} leaves, {topics:,} distinct topics) stored in {registered:.1f} s "
            f"({per_leaf * len(leaves) / registered:,.0f}/s); every node's proxies in place "
            f"after {settled:.1f} s; {refused} refused; {load_average()}")
    if refused:
        res.ok = False
    return rss


async def burst(net: TreeNetwork, clock: Clock, res: Results, n: int, goal_s: float) -> None:
    """Phase 2: ``n`` new subscriptions at PUBLISHER; each node's settle time."""
    errors = net.tester_queue("ERRORS.BURST")
    others = [x for x in net.attached_nodes() if x != PUBLISHER]
    seen: dict[str, float] = {}
    cpu0 = {x: net.cpu_s(x) for x in net.specs}
    started = time.monotonic()
    put_task = asyncio.create_task(net.register_many(
        PUBLISHER, ((f"burst/{i}", "SUB.0") for i in range(n)), errors))

    def settled() -> bool:
        now = time.monotonic() - started
        for x in others:
            if x not in seen and net.topics_from(x, net.next_hop(x, PUBLISHER), "burst/") >= n:
                seen[x] = now
        return len(seen) == len(others)

    try:
        took = await clock.until(f"burst of {n} at {PUBLISHER} settled", settled, 120.0)
    finally:
        await put_task
    cpu = {x: net.cpu_s(x) - cpu0[x] for x in net.specs}
    by_hops: dict[int, list[float]] = {}
    for x, t in seen.items():
        by_hops.setdefault(len(net.path(PUBLISHER, x)) - 1, []).append(t)
    res.say(f"burst: {n:,} new subscriptions at {PUBLISHER}: proxies in place at all "
            f"{len(others)} other nodes after {took:.2f} s (goal < {goal_s:g} s); "
            f"{load_average()}")
    res.say("  by hops from " + PUBLISHER + ": " + "; ".join(
        f"{h} hop{'s' if h > 1 else ''}: {min(ts):.2f}-{max(ts):.2f} s"
        for h, ts in sorted(by_hops.items())))
    res.say("  each node: " + ", ".join(f"{x} {t:.2f}" for x, t in sorted(
        seen.items(), key=lambda kv: kv[1])))
    res.say(f"  CPU seconds over those {took:.1f} s: " + ", ".join(
        f"{x} {c:.2f}" for x, c in sorted(cpu.items(), key=lambda kv: -kv[1])[:8])
        + f"; all 20: {sum(cpu.values()):.2f} (2 cores: {2 * took:.1f} available)")
    res.rows.append(Row(f"network 20: burst of {n:,} subscriptions at a leaf, all proxies "
                        "in place", took, 0.0, goal_s, kind="figure", unit="s"))


async def latency(net: TreeNetwork, clock: Clock, res: Results, rate: float, seconds: float,
                  persistent: bool, tag: bytes) -> None:
    """Phase 3: p50/p99 from PUBLISHER to each node on its path to FAR."""
    path = net.path(PUBLISHER, FAR)
    topic = f"lat/{tag.decode()}"
    readers = {x: Reader(net, net.tester_queue(f"LAT.{tag.decode()}.{x}")) for x in path}
    for x, r in readers.items():
        await net.register(x, topic, r.queue)
        r.start()
    pub = await net.publisher(PUBLISHER)
    try:
        for x in path[1:]:
            await clock.until(f"proxies towards {x}", in_place(net, x, topic, path), 60.0)
        warm: list[int] = []
        warmer = asyncio.create_task(publish_at(
            pub, topic, b"W", 10.0, lambda: all(r.got for r in readers.values()), warm))
        await clock.until("warm-up publication at every hop",
                          lambda: all(r.got for r in readers.values()), 60.0)
        await warmer
        cpu0 = {x: net.cpu_s(x) for x in net.specs}
        t0 = time.monotonic()
        sent: list[int] = []
        await publish_at(pub, topic, tag, rate, lambda: time.monotonic() - t0 >= seconds,
                         sent, persistent)
        await clock.until("every timed publication at every hop",
                          lambda: all(len(r.seqs(tag)) >= len(sent) for r in readers.values()),
                          60.0)
        wall = time.monotonic() - t0
        cpu = {x: (net.cpu_s(x) - cpu0[x]) / wall for x in net.specs}
    finally:
        for r in readers.values():
            await r.stop()
        await pub.close()
    kind = "persistent" if persistent else "non-persistent"
    res.say(f"latency, {len(sent):,} {kind} 1 KiB publications at {rate:g}/s from "
            f"{PUBLISHER} (put at TESTER -> read at TESTER); {load_average()}")
    five = None
    for hops, x in enumerate(path):
        lat = [v * 1000 for t, _, v in readers[x].got if t == tag]
        dup = len(lat) - len(set(readers[x].seqs(tag)))
        res.say(f"  {hops} hop{'s' if hops != 1 else ' '} ({x:4}): p50 {pct(lat, 50):6.1f} ms "
                f"p99 {pct(lat, 99):6.1f} ms  max {max(lat):6.1f} ms  "
                f"received {len(lat):,}, duplicates {dup}")
        if hops == 5:
            five = (pct(lat, 50), pct(lat, 99))
        if readers[x].seqs(tag) != sorted(readers[x].seqs(tag)) or dup:
            res.ok = False
            res.say(f"  error: {x}: out of order or duplicated")
    res.say("  CPU share during the window (s/s): " + ", ".join(
        f"{x} {c:.2f}" for x, c in sorted(cpu.items(), key=lambda kv: -kv[1])[:8])
        + f"; all 20: {sum(cpu.values()):.2f}")
    if five is not None:
        what = f"network 20: publication over 5 hops, {rate:g}/s, {kind}"
        res.rows.append(Row(f"{what}, p99", five[1], 0.0, 50.0, kind="figure", unit="ms"))
        res.rows.append(Row(f"{what}, p50", five[0], 0.0, None, kind="figure", unit="ms"))


@dataclass
class Traffic:
    """Publications at PUBLISHER on SUBTREE_TOPIC at ``rate`` to a subscriber at FAR
    (main tree) and one at SUBTREE_LEAF, until :meth:`stop`; the ledger afterwards."""

    net: TreeNetwork
    rate: float
    tag: bytes
    sent: list[int] = field(default_factory=list)
    stopped: bool = False

    async def start(self, clock: Clock) -> None:
        net = self.net
        self.main = Reader(net, net.tester_queue(f"SUBTREE.{self.tag.decode()}.MAIN"))
        self.leaf = Reader(net, net.tester_queue(f"SUBTREE.{self.tag.decode()}.LEAF"))
        topic = f"sub/{self.tag.decode()}"
        await net.register(FAR, topic, self.main.queue)
        await net.register(SUBTREE_LEAF, topic, self.leaf.queue)
        self.main.start()
        self.leaf.start()
        # Publishing starts once FAR's proxies are in place along the whole path (and
        # SUBTREE_LEAF's, when the subtree is joined): nothing is put before anyone
        # could route it.
        await clock.until(f"proxies towards {FAR}",
                          in_place(net, FAR, topic, net.path(PUBLISHER, FAR)), 60.0)
        if net.is_attached(SUBTREE_LEAF):
            await clock.until(f"proxies towards {SUBTREE_LEAF}",
                              in_place(net, SUBTREE_LEAF, topic,
                                       net.path(PUBLISHER, SUBTREE_LEAF)), 60.0)
        self.pub = await net.publisher(PUBLISHER)
        self.task = asyncio.create_task(
            publish_at(self.pub, topic, self.tag, self.rate, lambda: self.stopped, self.sent))

    def more(self, seconds: float) -> Callable[[], bool]:
        """A predicate: ``seconds`` more of publications sent from now."""
        mark = len(self.sent) + int(seconds * self.rate)
        return lambda: len(self.sent) >= mark

    async def stop(self, clock: Clock, *, leaf_too: bool = False) -> None:
        """Stop publishing; wait (bounded) for all to reach FAR (and SUBTREE_LEAF); a
        shortfall is left to the ledger to report."""
        self.stopped = True
        await self.task
        readers = [self.main, self.leaf] if leaf_too else [self.main]
        try:
            await clock.until(f"all publications at {FAR}",
                              lambda: all(self.sent and r.seqs(self.tag)[-1:] == self.sent[-1:]
                                          for r in readers), 60.0)
        except OverTime as exc:
            print(f"error: {exc}", file=sys.stderr)
        finally:
            await self.main.stop()
            await self.leaf.stop()
            await self.pub.close()

    def ledger(self, res: Results, owed: range, joined: bool) -> None:
        """B1 must have every publication once, in order. SUBTREE_LEAF must have an
        unbroken run, once each, in order: when joined, from at most ``owed.start`` (the
        first put after its proxies were seen in place) to the last; when cleared, from
        the first to at least ``owed.start``, the last it had when the clear was asked
        for (what was still on its way to B3 when B3 left S is not owed to the
        subtree)."""
        main = PathLedger(sent={str(s) for s in self.sent})
        main.receive(str(s) for s in self.main.seqs(self.tag))
        seqs = self.main.seqs(self.tag)
        in_order = seqs == sorted(seqs)
        res.say(f"  {FAR} (main tree): sent {len(main.sent):,}, received "
                f"{sum(n for i, n in main.received.items() if i in main.sent):,}, "
                f"lost {len(main.lost)}, duplicated {main.duplicated}, in order {in_order}")
        ok = not main.lost and not main.duplicated and in_order
        leaf = self.leaf.seqs(self.tag)
        lo, hi = (leaf[0], leaf[-1]) if leaf else (-1, -1)
        unbroken = leaf == list(range(lo, hi + 1))
        if joined:
            covers = bool(leaf) and lo <= owed.start and hi == len(self.sent) - 1
            what = (f"#{lo}-#{hi}, unbroken {unbroken}; owed #{owed.start} (first put after "
                    f"its proxies were seen) to #{len(self.sent) - 1}")
        else:
            covers = bool(leaf) and lo == 0 and hi >= owed.start
            last = owed.stop - 1
            after = (f"{last - hi} of those were still on their way to B3 when it left S"
                     if hi <= last else
                     f"{hi - last} put after it arrived too, before the clear took effect")
            what = (f"#{lo}-#{hi}, unbroken {unbroken}; it had #{owed.start} when the clear "
                    f"was asked for, #{last} was put last before it: {after}")
        res.say(f"  {SUBTREE_LEAF} (subtree): received {len(leaf):,}: {what}")
        if not (ok and unbroken and covers):
            res.ok = False
            res.say(f"  error: lost {main.lost[:20]}; subtree run covers what is owed: {covers}")


async def join_subtree(net: TreeNetwork, clock: Clock, res: Results, rate: float,
                       topics: int) -> None:
    """Phase 4a: S joined under B3 while PUBLISHER publishes to FAR and SUBTREE_LEAF."""
    t = Traffic(net, rate, b"J")
    await t.start(clock)
    try:
        await clock.until("2 s of traffic", t.more(2), 30.0)
        net.join(SUBTREE)
        joined = await clock.until(f"proxies towards {SUBTREE_LEAF}",
                                   in_place(net, SUBTREE_LEAF, "sub/J",
                                            net.path(PUBLISHER, SUBTREE_LEAF)), 60.0)
        first = len(t.sent)
        full = await clock.until("the subtree's load proxies",
                                 proxies_complete(net, "load/", topics), 120.0) + joined
        await clock.until("2 s of traffic", t.more(2), 30.0)
    finally:
        await t.stop(clock, leaf_too=True)
    res.say(f"subtree {SUBTREE}+{SUBTREE_LEAF} joined under B3 (mqgw neighbours join, both "
            f"sides) under {rate:g} publications/s from {PUBLISHER}: {len(t.sent):,} sent; "
            f"the proxy towards {SUBTREE_LEAF} along {len(net.path(PUBLISHER, SUBTREE_LEAF)) - 1}"
            f" hops in place {joined:.2f} s after the join, the {topics:,} load topics' "
            f"proxies both ways after {full:.2f} s; {load_average()}")
    t.ledger(res, range(first, len(t.sent)), joined=True)


async def clear_subtree(net: TreeNetwork, clock: Clock, res: Results, rate: float) -> None:
    """Phase 4b: S cleared while PUBLISHER publishes to FAR and SUBTREE_LEAF."""
    t = Traffic(net, rate, b"C")
    await t.start(clock)
    try:
        await clock.until("2 s of traffic", t.more(2), 30.0)
        had = (t.leaf.seqs(b"C") or [-1])[-1]  # the last SL1 had before the clear
        last = len(t.sent)
        before = (net.subscriptions_of("B3", SUBTREE), net.subscriptions_of(SUBTREE, "B3"))
        net.clear(SUBTREE)
        try:
            cleared = await clock.until(
                "proxies between B3 and S withdrawn",
                lambda: net.subscriptions_of("B3", SUBTREE) == 0
                and net.subscriptions_of(SUBTREE, "B3") == 0, 120.0)
        except OverTime:
            res.say(f"  subscriptions of S at B3, of B3 at S: {before} before the clear, "
                    f"{net.subscriptions_of('B3', SUBTREE), net.subscriptions_of(SUBTREE, 'B3')}"
                    " now")
            raise
        await clock.until("2 s of traffic", t.more(2), 30.0)
    finally:
        await t.stop(clock)
    res.say(f"subtree cleared (mqgw neighbours clear, both sides) under {rate:g} "
            f"publications/s: every proxy between B3 and {SUBTREE} withdrawn after "
            f"{cleared:.2f} s; {len(t.sent):,} sent; {load_average()}")
    t.ledger(res, range(had, last), joined=False)


def memory(net: TreeNetwork, res: Results, idle: dict[str, float], loaded: dict[str, float],
           per_leaf: int) -> None:
    res.say("memory (resident, MB): node kind subscriptions-held idle loaded end")
    for n, s in net.specs.items():
        res.say(f"  {n:5} {s.kind:8} {net.subscription_rows(n):8,} {idle[n]:7.1f} "
                f"{loaded[n]:7.1f} {net.rss_mb(n):7.1f}")
    leaves = leaves_of(net)
    growth = [(loaded[n] - idle[n]) / per_leaf * 10_000 for n in leaves]
    by_kind = {k: [(loaded[n] - idle[n]) / per_leaf * 10_000 for n in leaves
                   if net.specs[n].kind == k] for k in ("gateway", "legacy")}
    res.say(f"  per 10,000 subscriptions at a leaf: {statistics.mean(growth):.1f} MB "
            f"(gateways {statistics.mean(by_kind['gateway']):.1f}, legacy stand-ins "
            f"{statistics.mean(by_kind['legacy']):.1f}); total of 20 processes "
            f"{sum(net.rss_mb(n) for n in net.specs):,.0f} MB")
    res.rows.append(Row("network 20: resident memory per 10,000 subscriptions (leaf)",
                        statistics.mean(growth), 0.0, None, kind="figure", unit="MB"))
    res.rows.append(Row("network 20: resident memory per node, mean",
                        statistics.mean(net.rss_mb(n) for n in net.specs), 0.0, None,
                        kind="figure", unit="MB"))


async def run(work: Path, args: argparse.Namespace) -> Results:
    res = Results()
    clock = Clock(time.monotonic() + args.time_limit)
    leaves = 10
    per_leaf = args.subscriptions // leaves
    started = time.monotonic()
    net = await start_tree(work, specs(per_leaf, args.topics))
    res.say(f"20 processes started and joined in {time.monotonic() - started:.1f} s "
            f"({sum(s.kind == 'gateway' for s in net.specs.values())} gateways, "
            f"{sum(s.kind == 'legacy' for s in net.specs.values())} legacy stand-ins; "
            f"subtree {SUBTREE}+{SUBTREE_LEAF} detached); {load_average()}")
    try:
        idle = await load_subscriptions(net, clock, res, per_leaf * leaves, args.topics)
        loaded = {n: net.rss_mb(n) for n in net.specs}
        await join_subtree(net, clock, res, args.rate, args.topics)
        await burst(net, clock, res, args.burst, 5.0)
        await latency(net, clock, res, args.rate, args.seconds, True, b"P")
        await latency(net, clock, res, args.rate, args.seconds, False, b"N")
        await clear_subtree(net, clock, res, args.rate)
        memory(net, res, idle, loaded, per_leaf)
    except OverTime as exc:
        res.ok = False
        res.say(f"error: {exc}; {load_average()}")
        print(net.log_tails(), file=sys.stderr)
    finally:
        await net.close()
    return res


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true",
                   help="10,000 subscriptions over 500 topics, 5 s latency windows")
    p.add_argument("--subscriptions", type=int, default=100_000)
    p.add_argument("--topics", type=int, default=1_000, help="distinct topics of the load")
    p.add_argument("--burst", type=int, default=1_000)
    p.add_argument("--rate", type=float, default=100.0, help="publications per second")
    p.add_argument("--seconds", type=float, default=20.0, help="each latency window")
    p.add_argument("--time-limit", type=float, default=1_200.0)
    p.add_argument("--keep", action="store_true", help="keep the nodes' directories (logs)")
    args = p.parse_args(argv)
    if args.quick:
        args.subscriptions, args.topics, args.seconds = 10_000, 500, 5.0
    if args.subscriptions // 10 < args.topics:
        p.error("--subscriptions / 10 leaves must be at least --topics")
    work = Path(tempfile.mkdtemp(prefix="mqgw-bench-network20-"))
    try:
        res = asyncio.run(run(work, args))
    finally:
        if args.keep:
            print(f"kept {work}", file=sys.stderr)
        else:
            shutil.rmtree(work, ignore_errors=True)
    for row in res.rows:
        record(row)
    return 0 if res.ok else 1


if __name__ == "__main__":
    sys.exit(main())

