"""``mqgw streams move``: the pure plan (journal -> next step) and the steps run against a
simulated network of nodes under load, with the move stopped at every one of its
operations (before or after the operation took effect) and run again.

The simulation is MQ's semantics reduced to what a move touches: a route (QALIAS) per
node, stream queues, holding queues, transmission queues and FIFO channels between
nodes, brokers taking their stream queue in order. Publishers publish between every two
operations of the move. The assertions: every publication taken by a broker exactly
once, each publisher's publications taken in the order published, the routes all name
the new owner at the end, nothing left held.
"""

from __future__ import annotations

import random
import re
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from gateway.runtime.streams.move import MoveError, parse_display, run_move
from gateway.runtime.streams.move_plan import (
    HOLD,
    MoveJournal,
    hold_queue_name,
    next_step,
    plan_steps,
    read_journal,
    record_done,
    remote_def_name,
    route_state,
    write_journal,
)

S, ROUTE = "PRICES", "PRICES.PUB"
A, B, C = "QMA", "QMB", "QMC"


def journal(nodes: tuple[str, ...] = (A, B), to: str = B) -> MoveJournal:
    return MoveJournal(stream=S, route=ROUTE, from_q_mgr=A, to_q_mgr=to,
                       nodes={n: f"/cfg/{n}.yaml" for n in nodes})


# ------------------------------------------------------------------ the plan --------


def test_plan_holds_everywhere_then_drains_then_releases_the_new_owner_first() -> None:
    j = journal((A, B, C))
    assert plan_steps(j) == [
        "hold:QMA", "hold:QMB", "hold:QMC", "drain", "retained", "sinks",
        "release:QMB", "release:QMA", "release:QMC", "finish",
    ]
    # a move started by version 2 (sinks never moved) continues as it was planned
    assert plan_steps(j.model_copy(update={"version": 2})) == [
        "hold:QMA", "hold:QMB", "hold:QMC", "drain", "retained",
        "release:QMB", "release:QMA", "release:QMC", "finish",
    ]
    # a move started by version 1 (no retained copy) continues as it was planned
    assert plan_steps(j.model_copy(update={"version": 1})) == [
        "hold:QMA", "hold:QMB", "hold:QMC", "drain",
        "release:QMB", "release:QMA", "release:QMC", "finish",
    ]


def test_next_step_after_every_prefix_and_out_of_order_records_refused() -> None:
    j = journal()
    steps = plan_steps(j)
    for i, step in enumerate(steps):
        assert next_step(j) == step
        assert j.done == steps[:i]
        later = steps[i + 1:]
        for wrong in later:
            with pytest.raises(ValueError, match="out of order"):
                record_done(j, wrong)
        j = record_done(j, step)
    assert next_step(j) is None and j.complete


def test_journal_round_trip_and_unreadable(tmp_path: Path) -> None:
    path = tmp_path / "move-PRICES.json"
    assert read_journal(path) is None
    j = record_done(journal(), "hold:QMA")
    write_journal(path, j)
    assert read_journal(path) == j
    path.write_text("{not json", encoding="utf-8")
    with pytest.raises(ValueError, match="not a move journal"):
        read_journal(path)


def test_generated_names_are_valid_mq_names() -> None:
    long = "S" * 48
    assert hold_queue_name(S) == HOLD + S
    assert len(hold_queue_name(long)) <= 48 and hold_queue_name(long) != hold_queue_name(
        "T" * 48)
    assert remote_def_name(ROUTE, B) == "PRICES.PUB.QMB"
    assert len(remote_def_name(long, B)) <= 48


def test_route_state() -> None:
    assert route_state(A, S, ROUTE, S, None).owner == A
    assert route_state(B, S, ROUTE, "PRICES.PUB.QMA", (S, A)).owner == A
    assert route_state(B, S, ROUTE, hold_queue_name(S), None).held
    assert "no QALIAS" in route_state(B, S, ROUTE, None, None).problem
    assert "neither" in route_state(B, S, ROUTE, "OTHER", ("X", A)).problem


def test_parse_display() -> None:
    lines = [
        "AMQ8409I: Display Queue details.",
        "   QUEUE(PRICES.PUB)                       TYPE(QALIAS)",
        "   DESCR(a (nested) text)                  TARGET(PRICES)",
        "AMQ8409I: Display Queue details.",
        "   QUEUE(QMB)                              TYPE(QLOCAL)",
        "   USAGE(XMITQ)                            CURDEPTH(3)",
    ]
    qs = parse_display(lines)
    assert qs["PRICES.PUB"]["TARGET"] == "PRICES"
    assert qs["QMB"] == {"TYPE": "QLOCAL", "USAGE": "XMITQ", "CURDEPTH": "3"}


# ------------------------------------------------------------- the simulation -------


class Crash(Exception):
    """The move command dies here."""


@dataclass
class Msg:
    publisher: str
    seq: int
    dest_qm: str = ""


@dataclass
class SimQueue:
    qtype: str  # QLOCAL, QALIAS, QREMOTE
    target: str = ""
    rname: str = ""
    rqmname: str = ""
    put: bool = True
    msgs: deque[Msg] = field(default_factory=deque)


class SimNetwork:
    """Nodes, channels, brokers, publishers; ``tick`` moves everything one random step."""

    def __init__(self, nodes: tuple[str, ...], seed: int) -> None:
        self.rng = random.Random(seed)
        self.nodes = {n: SimNode(self, n) for n in nodes}
        #: publisher -> next sequence number; publishers live on every node
        self.next_seq: dict[str, int] = {f"P{n}": 0 for n in nodes}
        self.taken: list[tuple[str, int, str]] = []  # (publisher, seq, broker)
        self.refused = 0
        self.ops = 0
        self.crash_at: int | None = None
        self.crash_after = False
        for n, node in self.nodes.items():
            node.q[S] = SimQueue("QLOCAL")
            for m in nodes:
                if m != n:
                    node.q[m] = SimQueue("QLOCAL")  # xmitq named after the other QM
            if n == A:
                node.q[ROUTE] = SimQueue("QALIAS", target=S)
            else:
                node.q[f"{ROUTE}.{A}"] = SimQueue("QREMOTE", rname=S, rqmname=A)
                node.q[ROUTE] = SimQueue("QALIAS", target=f"{ROUTE}.{A}")

    def publish(self, node: str) -> None:
        p = f"P{node}"
        if self.nodes[node].put_route(Msg(p, self.next_seq[p])):
            self.next_seq[p] += 1
        else:
            self.refused += 1

    def tick(self, n: int = 3) -> None:
        for _ in range(n):
            what = self.rng.random()
            names = list(self.nodes)
            node = self.nodes[self.rng.choice(names)]
            if what < 0.4:
                self.publish(node.name)
            elif what < 0.7:  # a channel moves one message (FIFO)
                others = [m for m in names if m != node.name]
                xq = node.q[self.rng.choice(others)]
                if xq.msgs:
                    msg = xq.msgs.popleft()
                    self.nodes[msg.dest_qm].q[S].msgs.append(msg)
            else:  # a broker takes one publication
                sq = node.q[S]
                if sq.msgs:
                    msg = sq.msgs.popleft()
                    self.taken.append((msg.publisher, msg.seq, node.name))

    def op(self) -> None:
        """One operation of the move: maybe crash before/after it, traffic around it."""
        self.tick()
        self.ops += 1
        if self.crash_at == self.ops and not self.crash_after:
            raise Crash

    def after_op(self) -> None:
        if self.crash_at == self.ops and self.crash_after:
            raise Crash
        self.tick()

    def settle(self) -> None:
        """No more publishing: channels and brokers finish their work."""
        for _ in range(10_000):
            busy = False
            for node in self.nodes.values():
                for name, q in node.q.items():
                    if q.qtype == "QLOCAL" and name in self.nodes and q.msgs:
                        msg = q.msgs.popleft()
                        self.nodes[msg.dest_qm].q[S].msgs.append(msg)
                        busy = True
                sq = node.q[S]
                if sq.msgs:
                    msg = sq.msgs.popleft()
                    self.taken.append((msg.publisher, msg.seq, node.name))
                    busy = True
            if not busy:
                return
        raise AssertionError("the simulation never settled")


class SimNode:
    def __init__(self, net: SimNetwork, name: str) -> None:
        self.net = net
        self.name = name
        self.q: dict[str, SimQueue] = {}

    @property
    def q_mgr(self) -> str:
        return self.name

    def put_route(self, msg: Msg) -> bool:
        alias = self.q[ROUTE]
        return self._put(alias.target, msg)

    def _put(self, name: str, msg: Msg) -> bool:
        q = self.q[name]
        if not q.put:
            return False
        if q.qtype == "QREMOTE":
            msg.dest_qm = q.rqmname
            self.q[q.rqmname].msgs.append(msg)  # xmitq named after the owner
        else:
            q.msgs.append(msg)
        return True

    # MoveNode
    async def mqsc(self, script: str) -> None:
        for line in script.splitlines():
            self.net.op()
            self._command(line)
            self.net.after_op()

    def _command(self, line: str) -> None:
        verb, obj, name = re.match(r"(\w+) (\w+)\(([^)]*)\)", line).groups()  # type: ignore[union-attr]
        attrs = dict(re.findall(r"(\w+)\(([^)]*)\)", line)[1:])
        if verb == "DEFINE":
            if name in self.q and "REPLACE" not in line:
                raise MoveError(f"{name} exists")
            old = self.q.get(name)
            self.q[name] = SimQueue(obj, rname=attrs.get("RNAME", ""),
                                    rqmname=attrs.get("RQMNAME", ""),
                                    msgs=old.msgs if old else deque())
        elif verb == "ALTER":
            q = self.q[name]
            assert q.qtype == obj
            if "TARGET" in attrs:
                q.target = attrs["TARGET"]
            if "PUT" in attrs:
                q.put = attrs["PUT"] == "ENABLED"
        elif verb == "DELETE":
            if self.q[name].msgs:
                raise MoveError(f"{name} is not empty")
            del self.q[name]
        else:
            raise AssertionError(line)

    async def queues(self) -> dict[str, dict[str, str]]:
        self.net.op()
        out = {
            n: {"TYPE": q.qtype, "TARGET": q.target, "RNAME": q.rname, "RQMNAME": q.rqmname,
                "CURDEPTH": str(len(q.msgs)),
                "USAGE": "XMITQ" if n in self.net.nodes else "NORMAL"}
            for n, q in self.q.items()
        }
        self.net.after_op()
        return out

    async def in_transmission(self, q_name: str) -> int:
        self.net.op()
        n = sum(len(q.msgs) for name, q in self.q.items() if name in self.net.nodes)
        self.net.after_op()
        return n

    async def move_batch(self, source: str, target: str, limit: int) -> int:
        self.net.op()
        src = self.q[source]
        moved = 0
        while src.msgs and moved < limit:
            msg = src.msgs.popleft()
            assert self._put(target, msg), f"{target} refused the move"
            moved += 1
        self.net.after_op()
        return moved


def _check_outcome(net: SimNetwork) -> None:
    published = {(p, s) for p, n in net.next_seq.items() for s in range(n)}
    taken = [(p, s) for p, s, _ in net.taken]
    assert len(taken) == len(set(taken)), "a publication was taken twice"
    assert set(taken) == published, f"lost: {sorted(published - set(taken))[:5]}"
    last: dict[str, int] = {}
    for p, s, broker in net.taken:
        assert s > last.get(p, -1), f"{p}'s {s} taken at {broker} after {last[p]}"
        last[p] = s


async def _move(net: SimNetwork, j: MoveJournal, saved: list[MoveJournal]) -> MoveJournal:
    def save(x: MoveJournal) -> None:
        saved.append(x)

    j, why = await run_move(j, net.nodes, save, drain_timeout=600, poll=0)
    assert why is None, why
    return j


@pytest.mark.parametrize("nodes", [(A, B), (A, B, C)])
@pytest.mark.parametrize("crash_after", [False, True])
async def test_move_stopped_at_every_operation_then_run_again(
    nodes: tuple[str, ...], crash_after: bool
) -> None:
    # Crash at operation 1, 2, ... until a run ends before reaching the crash point
    # (the number of operations varies with the traffic: drain polls, batches).
    crashed_at: list[int] = []
    for crash_at in range(1, 1000):
        net = SimNetwork(nodes, seed=crash_at)
        for _ in range(20):
            net.tick()
        net.crash_at, net.crash_after = crash_at, crash_after
        saved: list[MoveJournal] = [journal(nodes)]
        try:
            await _move(net, saved[0], saved)
        except Crash:
            crashed_at.append(crash_at)
        else:
            break
        net.crash_at = None
        for _ in range(10):
            net.tick()
        j = await _move(net, saved[-1], saved)  # run again from the journal on disk
        assert j.complete
        for _ in range(20):
            net.tick()
        net.settle()
        _check_outcome(net)
        for name, node in net.nodes.items():
            assert node.q[ROUTE].target == (S if name == B else f"{ROUTE}.{B}"), name
            assert hold_queue_name(S) not in node.q, name
    assert len(crashed_at) > 10 and crashed_at == list(range(1, len(crashed_at) + 1))


async def test_a_node_that_fails_stops_the_move_which_continues_when_run_again() -> None:
    net = SimNetwork((A, B), seed=7)
    saved = [journal()]

    async def refuse(script: str) -> None:
        raise MoveError("QMB: connection broken")

    node_b = net.nodes[B]
    node_b.mqsc = refuse  # type: ignore[method-assign]
    j, why = await run_move(saved[0], net.nodes, saved.append, poll=0)
    assert why is not None and "hold:QMB" in why and "connection broken" in why
    assert j.done == ["hold:QMA"] and saved[-1].waiting == why
    del node_b.mqsc
    j, why = await run_move(saved[-1], net.nodes, saved.append, drain_timeout=600, poll=0)
    assert why is None and j.complete
    net.settle()
    _check_outcome(net)


async def test_drain_bounded_by_its_timeout() -> None:
    net = SimNetwork((A, B), seed=3)
    net.nodes[A].q[S].msgs.append(Msg("PQMA", 0))
    net.next_seq["PQMA"] = 1
    net.tick = lambda n=3: None  # type: ignore[method-assign]  # nothing moves
    j = record_done(record_done(journal(), "hold:QMA"), "hold:QMB")
    j, why = await run_move(j, net.nodes, lambda _: None, drain_timeout=0.05, poll=0.01)
    assert why is not None and "not drained" in why and "QMA's PRICES" in why
    assert next_step(j) == "drain"
