"""Step ``sinks`` of ``mqgw streams move`` and the ``sinks: owner`` decision (pure
parts and the step against fake nodes; against real queue managers and brokers:
test_move_sinks_cli.py, with two ``mqgw run`` processes: test_move_end_to_end.py)."""

from __future__ import annotations

import json
from pathlib import Path

from gateway.runtime.streams.move import run_move
from gateway.runtime.streams.move_plan import (
    MovedSink,
    MoveJournal,
    next_step,
    read_journal,
    record_done,
)
from gateway.runtime.streams.move_sinks import command_outcome, refused, sink_command
from gateway.runtime.streams.sink_ownership import (
    SinkDecision,
    SinkGate,
    read_catalogue_route,
    sink_rule,
)
from gateway.wire.reasons import Reason
from tests.support.pubsub_messages import decode

S, ROUTE = "PRICES", "PRICES.PUB"
A, B = "QMA", "QMB"
MEM_A = MovedSink(q_mgr=A, sink="mem", topic="#", scheme=2)


# ------------------------------------------------------- sinks: owner --------------


def defs(route_target: str) -> dict[str, tuple[str, str, str, str]]:
    return {ROUTE: ("QALIAS", route_target, "", ""),
            f"{ROUTE}.QMA": ("QREMOTE", "", S, A), S: ("QLOCAL", "", "", "")}


def test_the_route_decides_whether_a_nodes_sinks_subscribe() -> None:
    def rule(q_mgr: str, target: str | None) -> SinkDecision:
        d = defs(target) if target is not None else {}
        return sink_rule(read_catalogue_route(d.get, q_mgr, S, ROUTE), S, ROUTE).decision

    assert rule(A, S) is SinkDecision.SUBSCRIBE  # the route names the stream queue here
    assert rule(B, f"{ROUTE}.QMA") is SinkDecision.WITHHOLD  # it names QMA
    assert rule(B, "MQGW.MOVE.HOLD.PRICES") is SinkDecision.KEEP  # a move holds it
    assert rule(B, None) is SinkDecision.KEEP  # no route: ownership unknown
    why = sink_rule(read_catalogue_route(defs(f"{ROUTE}.QMA").get, B, S, ROUTE), S, ROUTE).why
    assert why == (f"QMA owns {S} ({ROUTE} on QMB names it there): no sink subscribes to "
                   f"{S} here")


def test_the_gate_reads_the_route_at_each_ask_and_tells_each_decision_once() -> None:
    now = defs(S)
    told: list[str] = []
    gate = SinkGate(A, {S: ROUTE}, lambda name: now.get(name), told.append)
    assert gate(S) is SinkDecision.SUBSCRIBE and gate(S) is SinkDecision.SUBSCRIBE
    assert gate("OTHER") is SinkDecision.SUBSCRIBE  # not sinks: owner
    now[ROUTE] = ("QALIAS", "MQGW.MOVE.HOLD.PRICES", "", "")
    assert gate(S) is SinkDecision.KEEP
    now.update(defs(f"{ROUTE}.QMB"))
    now[f"{ROUTE}.QMB"] = ("QREMOTE", "", S, B)
    assert gate(S) is SinkDecision.WITHHOLD
    assert len(told) == 3 and "QMA owns" in told[0] and "held" in told[1]


# ------------------------------------------------------- the commands --------------


def test_sink_commands_name_the_backlog_queue_and_register_new_publications_only() -> None:
    md, body = sink_command(MEM_A, S, register=True, q_mgr=B, reply_q="R", msg_id=b"x" * 24)
    got = decode(md, body)
    assert got.get("psc/Command") == "RegSub" and got.get("psc/RegOpt") == "NewPubsOnly"
    assert got.get("psc/Topic") == f"$SYS/STREAM/{S}/#"
    assert (got.get("psc/QMgrName"), got.get("psc/QName")) == (B, "SYSTEM.MQGW.SINK.mem")
    assert (md.reply_to_q, md.reply_to_q_mgr, md.expiry) == ("R", B, 600)
    char = MovedSink(q_mgr=A, sink="mem", topic="T/*", scheme=1)
    md, body = sink_command(char, S, register=False, q_mgr=A, reply_q="R", msg_id=b"y" * 24)
    got = decode(md, body)
    assert got.pairs == [("MQPSCommand", "DeregSub"), ("MQPSStreamName", S),
                         ("MQPSTopic", "T/*"), ("MQPSQMgrName", A),
                         ("MQPSQName", "SYSTEM.MQGW.SINK.mem")]
    assert command_outcome(md, body) is None  # a command is no response
    assert not refused(("error", Reason.NOT_REGISTERED), register=False)  # gone already
    assert refused(("error", Reason.NOT_REGISTERED), register=True)
    assert refused(("error", Reason.CF_NOT_AUTHORIZED), register=False)


# ------------------------------------------------------- the step ------------------


class FakeNode:
    """A node's stream queue depth, sink backlogs and sink subscriptions; commands are
    idempotent as the broker's are."""

    def __init__(self, name: str, net: FakeNet) -> None:
        self.name = name
        self.net = net
        self.depth = 0
        self.backlog: dict[str, int] = {}
        self.sinks: set[tuple[str, str, int]] = set()
        self.fail_next_dereg = False

    @property
    def q_mgr(self) -> str:
        return self.name

    async def queues(self) -> dict[str, dict[str, str]]:
        return {S: {"CURDEPTH": str(self.depth)}}

    async def mqsc(self, script: str) -> None:
        """The release's route change (not what these tests look at)."""

    async def backlog_holds(self, sink: str, stream: str) -> int:
        n = self.backlog.get(sink, 0)
        if n:
            self.backlog[sink] = n - 1  # the forwarder works it off
        return n

    async def sink_command(self, sub: MovedSink, stream: str, *, register: bool) -> None:
        self.net.log.append(("RegSub" if register else "DeregSub", self.name, sub.sink))
        if not register and self.fail_next_dereg:
            self.fail_next_dereg = False
            raise OSError("connection broken")  # the node went away mid-step
        key = (sub.sink, sub.topic, sub.scheme)
        if register:
            self.sinks.add(key)
        else:
            self.sinks.discard(key)

    async def forget_replies(self, stream: str) -> None:
        self.net.log.append(("forget", self.name, stream))


class FakeNet:
    def __init__(self) -> None:
        self.log: list[tuple[str, str, str]] = []
        self.nodes = {A: FakeNode(A, self), B: FakeNode(B, self)}


def at_sinks(sinks: list[MovedSink]) -> MoveJournal:
    j = MoveJournal(stream=S, route=ROUTE, from_q_mgr=A, to_q_mgr=B,
                    nodes={A: "a.yaml", B: "b.yaml"}, sinks=sinks)
    for step in ("hold:QMA", "hold:QMB", "drain", "retained"):
        j = record_done(j, step)
    assert next_step(j) == "sinks"
    return j


async def test_the_step_waits_for_the_copies_and_the_backlogs_then_moves_each_sink() -> None:
    net = FakeNet()
    net.nodes[A].sinks.add(("mem", "#", 2))
    net.nodes[B].depth = 0
    net.nodes[A].backlog["mem"] = 3
    saved: list[MoveJournal] = []
    j, why = await run_move(at_sinks([MEM_A]), net.nodes, saved.append, poll=0.001)  # type: ignore[arg-type]
    assert why is None and j.complete
    assert net.nodes[A].backlog["mem"] == 0  # waited until it held nothing of S
    assert net.log[:2] == [("RegSub", B, "mem"), ("DeregSub", A, "mem")]
    assert net.nodes[B].sinks == {("mem", "#", 2)} and net.nodes[A].sinks == set()


async def test_the_step_is_bounded_and_says_what_it_waits_for() -> None:
    net = FakeNet()
    net.nodes[B].depth = 4  # the retained copies not taken yet
    j, why = await run_move(at_sinks([MEM_A]), net.nodes, lambda _: None,  # type: ignore[arg-type]
                            drain_timeout=0.05, poll=0.01)
    assert why == "sinks not settled after 0.05 s: 4 publication(s) on QMB's PRICES"
    assert j.waiting == why and next_step(j) == "sinks" and net.log == []


async def test_a_step_stopped_between_its_commands_ends_the_same_when_run_again() -> None:
    net = FakeNet()
    net.nodes[A].sinks.add(("mem", "#", 2))
    net.nodes[A].fail_next_dereg = True
    j, why = await run_move(at_sinks([MEM_A]), net.nodes, lambda _: None, poll=0.001)  # type: ignore[arg-type]
    assert why is not None and "connection broken" in why and next_step(j) == "sinks"
    # the reply queues are removed though the step failed
    assert [e for e in net.log if e[0] == "forget"] == [("forget", A, S), ("forget", B, S)]
    # both subscribed while the routes hold: nothing is published meanwhile
    assert net.nodes[B].sinks == net.nodes[A].sinks == {("mem", "#", 2)}
    j, why = await run_move(j, net.nodes, lambda _: None, poll=0.001)  # type: ignore[arg-type]
    assert why is None and j.complete
    assert net.nodes[B].sinks == {("mem", "#", 2)} and net.nodes[A].sinks == set()


async def test_no_sink_to_move_changes_nothing() -> None:
    net = FakeNet()
    net.nodes[B].depth = 9  # not even looked at
    j, why = await run_move(at_sinks([]), net.nodes, lambda _: None, poll=0.001)  # type: ignore[arg-type]
    assert why is None and j.complete and net.log == []


def test_a_version_2_journal_continues_without_the_step(tmp_path: Path) -> None:
    path = tmp_path / "move-PRICES.json"
    path.write_text(json.dumps({
        "version": 2, "stream": S, "route": ROUTE, "from_q_mgr": A, "to_q_mgr": B,
        "nodes": {A: "a.yaml", B: "b.yaml"},
        "done": ["hold:QMA", "hold:QMB", "drain", "retained"]}), encoding="utf-8")
    j = read_journal(path)
    assert j is not None and j.sinks == [] and next_step(j) == "release:QMB"
