"""The network check (pure): every node's view in, the problems of the whole network out,
each with a stable code.

Why pure and synchronous: the command, its tests with many small networks, and the
running gateway's look at its own neighbourhood (the dashboard) all judge the same way;
only :mod:`gateway.runtime.network_check.read` and ``collect`` do I/O.

Who owns a stream (docs/scaling.md "Checking the network"): where MQ takes a put of the
stream's queue made on the other nodes (a QREMOTE, a queue-manager alias, a cluster
queue); when no node routes it anywhere, the node that services it and runs its sinks;
when no node runs sinks either, the one node that services it. A stream several nodes
service with neither routing nor sinks is shared the seed's way (every broker takes
publications) and has no owner to check. The seed's own streams
(``SYSTEM.BROKER.*``) belong to every broker and are left out.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from pydantic import ConfigDict, with_config
from typing_extensions import TypedDict

from gateway.runtime.network_check.resolution import Ended, q_mgr_route, resolve_put
from gateway.runtime.network_check.view import NodeView

__all__ = [
    "CODES",
    "OWN_VIEW_CODES",
    "NetworkReport",
    "NetworkReportJson",
    "Problem",
    "ProblemJson",
    "StreamOwnership",
    "Unreadable",
    "check_network",
    "printable",
]

#: Every problem code and what it means (the docs' table; tests check each is reachable).
CODES: dict[str, str] = {
    "node-unreadable": "a node given to the check could not be read",
    "node-duplicate": "two nodes answer with the same queue manager name",
    "neighbour-not-read": "a gateway neighbour of a node read was not given to the check",
    "neighbour-one-sided": "A lists B as a neighbour, B does not list A",
    "neighbour-role-mismatch": "A and B do not see each other as parent and child",
    "neighbour-kind-mismatch": "A lists gateway B with another kind",
    "neighbour-streams-differ": "A and B disagree on the streams they share",
    "neighbour-not-active": "a neighbour link is not active (joining, refused, ...)",
    "neighbour-no-route": "a node's queue manager has no route to its neighbour's",
    "neighbour-parents": "a node lists more than one parent",
    "neighbour-loop": "the neighbour relations close a loop (the network must be a tree)",
    "stream-owned-twice": "more than one node owns a stream",
    "owner-not-serviced": "MQ routes a stream to a node whose broker does not service it",
    "sink-on-non-owner": "a sink subscribes to a stream on a node that does not own it",
    "owner-no-route": "a node's queue manager has no route to a stream owner's",
    "stream-not-routed": "a put of a stream's queue on a node does not reach its owner",
}

#: The codes a node's check of its own view alone (``neighbourhood``) can find: the rest
#: need a second node's view, or come from reading nodes (the gauge
#: ``mqgw_network_problems`` is zero-filled for these).
OWN_VIEW_CODES: tuple[str, ...] = tuple(c for c in CODES if c not in {
    "node-unreadable", "node-duplicate", "neighbour-not-read", "neighbour-one-sided",
    "neighbour-role-mismatch", "neighbour-kind-mismatch", "neighbour-streams-differ",
})

_DOCUMENTED = ConfigDict(use_attribute_docstrings=True)


@with_config(_DOCUMENTED)
class ProblemJson(TypedDict):
    """One problem of the network."""

    code: str
    """Its stable code (the table below)."""
    subject: str
    """What it is about: a stream, a queue manager, or ``A-B`` for a relation."""
    nodes: list[str]
    """The nodes (queue managers) involved."""
    text: str
    """The problem in words."""


@with_config(_DOCUMENTED)
class NodeJson(TypedDict):
    """One node read."""

    q_mgr: str
    """Its queue manager."""
    gateway: str
    """The gateway's id."""
    source: str
    """Where it was read: the YAML file or the address given."""
    mq_definitions: bool
    """Its view carries its queue manager's definitions (routes can be checked)."""
    truncated: bool
    """Its view was cut at the node's limits (some items left out)."""
    neighbours: list[str]
    """Its neighbours' queue managers."""


@with_config(_DOCUMENTED)
class UnreadableJson(TypedDict):
    """A node given that could not be read."""

    source: str
    """The YAML file or address given."""
    why: str
    """Why it could not be read."""


@with_config(_DOCUMENTED)
class StreamOwnershipJson(TypedDict):
    """Who owns one stream."""

    stream: str
    """The stream."""
    owners: list[str]
    """The nodes that own it (one when all is well; none for a stream shared the seed's
    way)."""
    owned_by: str
    """How the owner was found: ``routing``, ``sinks``, ``only holder``, or empty (no
    owner)."""
    holders: list[str]
    """The nodes whose broker services the stream on a local queue."""
    sinks: dict[str, list[str]]
    """Node -> the sink (plugin) instances subscribed to the stream there."""


@with_config(_DOCUMENTED)
class NetworkReportJson(TypedDict):
    """The network check's report (``mqgw network check --json``)."""

    ok: bool
    """No problem found (an unreadable node is one)."""
    nodes: list[NodeJson]
    """The nodes read."""
    unreadable: list[UnreadableJson]
    """The nodes that could not be read."""
    streams: list[StreamOwnershipJson]
    """Every stream's owners."""
    problems: list[ProblemJson]
    """Every problem found."""
    notes: list[str]
    """What the check could not judge, and why (for instance a node without its MQ
    definitions)."""


_SEED_STREAMS = "SYSTEM.BROKER."
_UNPRINTABLE = re.compile(r"[^\x20-\x7e]")


def printable(text: str) -> str:
    """``text`` with every character outside printable ASCII written as an escape, so
    nothing a node or a network error says can drive a terminal or a page."""
    return _UNPRINTABLE.sub(lambda m: m.group().encode("unicode_escape").decode("ascii")
                            if ord(m.group()) < 0x10000 else "?", text)


@dataclass(frozen=True, slots=True, order=True)
class Problem:
    code: str
    #: what the problem is about: a stream, a queue manager, or "A-B" for a relation
    subject: str
    text: str
    nodes: tuple[str, ...] = ()

    def to_json(self) -> ProblemJson:
        return {"code": self.code, "subject": self.subject, "nodes": list(self.nodes),
                "text": self.text}


@dataclass(frozen=True, slots=True)
class Unreadable:
    """A starting point the check could not read: where, and why."""

    source: str
    why: str


@dataclass(frozen=True, slots=True)
class StreamOwnership:
    stream: str
    owners: tuple[str, ...]
    #: nodes whose broker services the stream on a local queue
    holders: tuple[str, ...]
    #: node -> sink instances subscribed to the stream there
    sinks: Mapping[str, tuple[str, ...]]
    #: how the owner was found: "routing", "sinks", "only holder" or "" (no owner)
    owned_by: str


@dataclass(frozen=True, slots=True)
class NetworkReport:
    nodes: tuple[NodeView, ...]
    unreadable: tuple[Unreadable, ...]
    streams: tuple[StreamOwnership, ...]
    problems: tuple[Problem, ...]
    notes: tuple[str, ...] = ()
    sources: Mapping[str, str] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_json(self) -> NetworkReportJson:
        return {
            "ok": self.ok,
            "nodes": [
                {"q_mgr": v.q_mgr, "gateway": v.gateway, "source": self.sources.get(v.q_mgr, ""),
                 "mq_definitions": v.mq is not None, "truncated": v.truncated,
                 "neighbours": [n.q_mgr for n in v.neighbours]}
                for v in self.nodes
            ],
            "unreadable": [{"source": u.source, "why": u.why} for u in self.unreadable],
            "streams": [
                {"stream": s.stream, "owners": list(s.owners), "owned_by": s.owned_by,
                 "holders": list(s.holders),
                 "sinks": {n: list(v) for n, v in sorted(s.sinks.items())}}
                for s in self.streams
            ],
            "problems": [p.to_json() for p in self.problems],
            "notes": list(self.notes),
        }

    def text(self) -> str:
        lines = [f"{'NODE':24} {'GATEWAY':24} {'MQ':4} NEIGHBOURS"]
        for v in self.nodes:
            lines.append(f"{v.q_mgr:24} {v.gateway:24} {'yes' if v.mq else 'no':4} "
                         + (", ".join(f"{n.q_mgr}({n.role},{n.state})" for n in v.neighbours)
                            or "-"))
        for u in self.unreadable:
            lines.append(f"{printable(u.source):24} UNREADABLE: {printable(u.why)}")
        if self.streams:
            lines.append("")
            lines.append(f"{'STREAM':36} {'OWNER':24} {'SINKS'}")
            for s in self.streams:
                owner = ", ".join(s.owners) or ("(shared)" if len(s.holders) > 1 else "-")
                sinks = "; ".join(f"{n}: {', '.join(v)}" for n, v in sorted(s.sinks.items()))
                lines.append(f"{s.stream:36} {owner:24} {sinks or '-'}")
        for n in self.notes:
            lines.append(f"note: {printable(n)}")
        lines.append("all well" if self.ok else f"{len(self.problems)} problem(s):")
        lines += [f"  [{p.code}] {printable(p.text)}" for p in self.problems]
        return "\n".join(lines)


# ---------------------------------------------------------------------- the check ---


def check_network(
    views: Sequence[NodeView],
    unreadable: Iterable[Unreadable] = (),
    *,
    sources: Mapping[str, str] | None = None,
    neighbourhood: bool = False,
) -> NetworkReport:
    """Judge the network ``views`` describe. ``neighbourhood``: ``views`` are one node's
    own and nothing else was read (a running gateway looking at itself): neighbours not
    read are expected then, not a problem."""
    problems: list[Problem] = []
    notes: list[str] = []
    bad = tuple(unreadable)
    for u in bad:
        text = u.why if u.source in u.why else f"{u.source}: {u.why}"
        problems.append(Problem("node-unreadable", u.source, text))
    by_qm: dict[str, NodeView] = {}
    for v in views:
        if v.q_mgr in by_qm:
            problems.append(Problem(
                "node-duplicate", v.q_mgr,
                f"two nodes answer as queue manager {v.q_mgr} (gateways {by_qm[v.q_mgr].gateway} "
                f"and {v.gateway}): queue manager names must be unique in a network",
                (v.q_mgr,)))
            continue
        by_qm[v.q_mgr] = v
        if v.truncated:
            notes.append(f"{v.q_mgr} sent a part of its view (more than the limit of entries)")
        if v.mq is None:
            notes.append(f"{v.q_mgr} does not describe its MQ definitions (IBM MQ): routes "
                         "from it are not checked")
    problems += _neighbour_problems(by_qm, notes, neighbourhood)
    streams, stream_problems = _stream_problems(by_qm)
    problems += stream_problems
    return NetworkReport(
        tuple(by_qm.values()),
        bad,
        tuple(streams),
        tuple(sorted(set(problems))),
        tuple(dict.fromkeys(notes)),
        dict(sources or {}),
    )


def _neighbour_problems(
    by_qm: Mapping[str, NodeView], notes: list[str], neighbourhood: bool
) -> list[Problem]:
    out: list[Problem] = []
    edges: set[tuple[str, str]] = set()
    for a, view in sorted(by_qm.items()):
        parents = [n.q_mgr for n in view.neighbours if n.role == "parent"]
        if len(parents) > 1:
            out.append(Problem("neighbour-parents", a,
                               f"{a} lists {len(parents)} parents ({', '.join(parents)}): "
                               "at most one", (a,)))
        for nb in view.neighbours:
            b = nb.q_mgr
            edges.add((min(a, b), max(a, b)))
            pair = f"{min(a, b)}-{max(a, b)}"
            if nb.state != "active":
                out.append(Problem("neighbour-not-active", f"{a}-{b}",
                                   f"{a}'s link to neighbour {b} is {nb.state or '(no state)'}",
                                   (a, b)))
            if view.mq is not None and not q_mgr_route(view, b):
                out.append(Problem(
                    "neighbour-no-route", f"{a}-{b}",
                    f"{a} has no route to its neighbour's queue manager {b}: no transmission "
                    f"queue {b}, queue-manager alias, cluster or default transmission queue",
                    (a, b)))
            other = by_qm.get(b)
            if other is None:
                if nb.kind != "gateway":
                    notes.append(f"{b} ({nb.kind}) is not a gateway: its side of the relation "
                                 f"with {a} is not checked")
                elif not neighbourhood:
                    out.append(Problem(
                        "neighbour-not-read", b,
                        f"{a} lists gateway {b} as a neighbour, and {b} was not read: give "
                        "its configuration or address to the check", (a, b)))
                continue
            back = next((n for n in other.neighbours if n.q_mgr == a), None)
            if back is None:
                out.append(Problem("neighbour-one-sided", f"{a}-{b}",
                                   f"{a} lists {b} as a neighbour ({nb.role}), {b} does not "
                                   f"list {a}", (a, b)))
                continue
            if nb.kind != "gateway":
                out.append(Problem("neighbour-kind-mismatch", f"{a}-{b}",
                                   f"{a} lists {b} as kind {nb.kind}; {b} is a gateway "
                                   "(kind: gateway)", (a, b)))
            if a < b:
                if {nb.role, back.role} != {"parent", "child"}:
                    out.append(Problem(
                        "neighbour-role-mismatch", pair,
                        f"{a} sees {b} as its {nb.role}, {b} sees {a} as its {back.role}: "
                        "one must be the other's parent", (a, b)))
                if set(nb.streams) != set(back.streams):
                    only_a = sorted(set(nb.streams) - set(back.streams))
                    only_b = sorted(set(back.streams) - set(nb.streams))
                    out.append(Problem(
                        "neighbour-streams-differ", pair,
                        f"{a} and {b} disagree on their shared streams: only {a} shares "
                        f"{', '.join(only_a) or '-'}; only {b} shares {', '.join(only_b) or '-'}",
                        (a, b)))
    out += _loops(edges)
    return out


def _loops(edges: Iterable[tuple[str, str]]) -> list[Problem]:
    """One problem per edge closing a cycle in the (undirected) neighbour graph, naming
    the cycle."""
    adjacency: dict[str, set[str]] = {}
    parent: dict[str, str] = {}

    def root(x: str) -> str:
        while parent.setdefault(x, x) != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    out: list[Problem] = []
    for a, b in sorted(edges):
        if a == b:
            out.append(Problem("neighbour-loop", a, f"{a} lists itself as a neighbour", (a,)))
            continue
        ra, rb = root(a), root(b)
        if ra == rb:
            cycle = _path(adjacency, a, b)
            out.append(Problem("neighbour-loop", "-".join(sorted(cycle)),
                               "the neighbour relations close a loop: "
                               + " - ".join([*cycle, cycle[0]]), tuple(sorted(cycle))))
        else:
            parent[ra] = rb
            adjacency.setdefault(a, set()).add(b)
            adjacency.setdefault(b, set()).add(a)
    return out


def _path(adjacency: Mapping[str, set[str]], a: str, b: str) -> list[str]:
    """The tree path from ``a`` to ``b`` (breadth first; both are in one tree)."""
    came: dict[str, str] = {a: a}
    queue = [a]
    for x in queue:
        if x == b:
            break
        for y in sorted(adjacency.get(x, ())):
            if y not in came:
                came[y] = x
                queue.append(y)
    path = [b]
    while path[-1] != a:
        path.append(came[path[-1]])
    return path[::-1]


def _stream_problems(
    by_qm: Mapping[str, NodeView],
) -> tuple[list[StreamOwnership], list[Problem]]:
    names: set[str] = set()
    for v in by_qm.values():
        names.update(v.serviced)
        names.update(v.sinks)
        for nb in v.neighbours:
            names.update(nb.streams)
    out: list[Problem] = []
    table: list[StreamOwnership] = []
    for s in sorted(n for n in names if not n.startswith(_SEED_STREAMS)):
        holders = tuple(q for q, v in sorted(by_qm.items())
                        if s in v.serviced and (v.mq is None or s in v.mq.local_set))
        sinks = {q: tuple(v.sinks[s]) for q, v in sorted(by_qm.items()) if v.sinks.get(s)}
        puts: dict[str, Ended] = {}
        routed: set[str] = set()
        for q, v in sorted(by_qm.items()):
            if v.mq is None or s in v.mq.local_set:
                continue
            ended = resolve_put(by_qm, q, s)
            puts[q] = ended
            if ended.arrived and ended.q_mgr != q:
                routed.add(ended.q_mgr)
            routed.update(ended.balanced)
        if routed:
            owners, how = tuple(sorted(routed)), "routing"
        elif any(h in sinks for h in holders):
            owners, how = tuple(h for h in holders if h in sinks), "sinks"
        elif len(holders) == 1:
            owners, how = holders, "only holder"
        else:
            owners, how = (), ""
        table.append(StreamOwnership(s, owners, holders, sinks, how))
        if len(owners) > 1:
            out.append(Problem("stream-owned-twice", s,
                               f"{s} is owned by {len(owners)} nodes ({', '.join(owners)}, by "
                               f"{how}): one node must own it", owners))
        for o in owners:
            view = by_qm.get(o)
            if view is not None and s not in view.serviced:
                out.append(Problem("owner-not-serviced", s,
                                   f"MQ routes {s} to {o}, whose broker does not service it: "
                                   f"its publications pile up there (add it to broker.streams "
                                   f"on {o})", (o,)))
        for q, names_ in sinks.items():
            if q not in owners:
                where = (f"the owner is {', '.join(owners)}" if owners
                         else f"{q} does not service {s}")
                out.append(Problem("sink-on-non-owner", s,
                                   f"sink {', '.join(names_)} on {q} subscribes to {s}, and "
                                   f"{where}: run sinks only on the owner", (q, *owners)))
        for o in owners:
            for q, v in sorted(by_qm.items()):
                if q == o or v.mq is None:
                    continue
                if not q_mgr_route(v, o):
                    out.append(Problem("owner-no-route", f"{s}@{q}",
                                       f"{q} has no route to {o}, the owner of {s}", (q, o)))
                    continue
                put = puts.get(q)
                if put is None or put.unknown or put.balanced or len(owners) > 1:
                    continue  # local there / beyond a node not read / owned twice already
                if not put.arrived or put.q_mgr != o:
                    why = put.why or f"it ends on {put.q_name}@{put.q_mgr}"
                    out.append(Problem("stream-not-routed", f"{s}@{q}",
                                       f"a put of {s} on {q} does not reach its owner {o}: "
                                       f"{why}", (q, o)))
    return table, out
