"""A hierarchy of brokers as processes on 127.0.0.1, the way an operator runs one:
gateways (``mqgw run``) and legacy stand-ins (``mqgw broker --profile legacy``), each on
its own embedded queue manager, joined to its parent and children as neighbours (the
seed's neighbour protocol: RegSub/DeregSub proxies, forwarded Publish) over channel
pairs. Used by the 6-node test (tests/network/test_six_nodes.py) and the 20-node
benchmark (benchmarks/bench_network_20.py).

Why a module of its own: tests/support/legacy_network.py is the seed's fixed three-node
figure; a network of N nodes needs the topology as data (:class:`NodeSpec`), the route
between any two nodes (:meth:`TreeNetwork.path`) and views of every node's state that
do not disturb it (its pub/sub store read-only, /proc for memory and CPU).

Every node has a channel pair with its parent and each child (also a *detached* child,
whose neighbour relation is left to ``mqgw neighbours join`` at run time) and one with
the in-test **TESTER** node, through which the test puts commands and publications and
receives what subscribers registered with ``QMgrName TESTER`` get
(tests/support/legacy_network.py describes the TESTER pattern). Everything travels on
``SYSTEM.BROKER.DEFAULT.STREAM``, which every broker shares.
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from gateway.mq.embedded.network import QueueManagerNode
from gateway.mq.port import (
    Connection,
    GetOptions,
    OpenOption,
    PutOptions,
    QueueHandle,
)
from gateway.wire.constants import MsgType, Report
from gateway.wire.mqmd import MQMD
from tests.support.gateway_process import GatewayProcess, write_config
from tests.support.legacy_network import (
    BrokerProcess,
    broker_argv,
    channel_pair_mqsc,
    free_ports,
)
from tests.support.neighbour_traffic import mqgw
from tests.support.process_network import ProcessNetwork
from tests.support.pubsub_messages import CONTROL, DEFAULT, decode, rfh_message

TESTER = "TESTER"
START_TIMEOUT = 120.0
Kind = Literal["gateway", "legacy"]


@dataclass(frozen=True, slots=True)
class NodeSpec:
    """One broker: its queue manager name, what runs it, its parent (None: the root)
    and whether its link to the parent is left to a run-time join (``detached``)."""

    name: str
    kind: Kind
    parent: str | None = None
    detached: bool = False
    #: Local queues defined at start (subscriber queues of MQ applications on it).
    local_queues: tuple[str, ...] = ()


def neighbour_kind(spec: NodeSpec) -> str:
    """How a broker talks to ``spec``: MQRFH2 to a gateway, MQRFH to a V6 stand-in."""
    return "gateway" if spec.kind == "gateway" else "mqpubsub"


def node_mqsc(spec: NodeSpec, specs: Mapping[str, NodeSpec], ports: Mapping[str, int]) -> str:
    """Channel pairs with the parent, every child and TESTER; the local queues."""
    adjacent = [s.name for s in specs.values() if s.parent == spec.name]
    if spec.parent is not None:
        adjacent.insert(0, spec.parent)
    text = "".join(channel_pair_mqsc(spec.name, o, ports[o]) for o in [*adjacent, TESTER])
    text += "".join(
        f"DEFINE QLOCAL({q}) DEFPSIST(YES) MAXDEPTH(1000000) REPLACE\n"
        for q in spec.local_queues
    )
    return text


def joined_neighbours(spec: NodeSpec, specs: Mapping[str, NodeSpec]) -> list[tuple[str, str]]:
    """(neighbour, role) joined at start: the parent unless detached, children that
    are not detached."""
    out: list[tuple[str, str]] = []
    if spec.parent is not None and not spec.detached:
        out.append((spec.parent, "parent"))
    out += [(s.name, "child") for s in specs.values() if s.parent == spec.name and not s.detached]
    return out


def gateway_yaml(spec: NodeSpec, specs: Mapping[str, NodeSpec], port: int) -> dict[str, Any]:
    """``mqgw run`` configuration of a gateway node (paths relative to its directory)."""
    return {
        "id": spec.name,
        "queue_manager": {"name": spec.name, "data_dir": "qm", "mqsc_file": "channels.mqsc",
                          "listener_port": port},
        "broker": {"store": "pubsub.db", "wait_ms": 50},
        "metrics": {"enabled": False},
        "logging": {"format": "text", "level": "info"},
        "neighbours": [
            {"q_mgr": n, "kind": neighbour_kind(specs[n]), "role": role, "probe_timeout": 2.0}
            for n, role in joined_neighbours(spec, specs)
        ],
    }


def legacy_args(spec: NodeSpec, specs: Mapping[str, NodeSpec]) -> list[str]:
    """``--neighbour QM:kind:role`` for each neighbour joined at start."""
    out: list[str] = []
    for n, role in joined_neighbours(spec, specs):
        out += ["--neighbour", f"{n}:{neighbour_kind(specs[n])}:{role}"]
    return out


@dataclass
class TreeNetwork(ProcessNetwork):
    """The processes, the TESTER node and views of the nodes (module docstring)."""

    root: Path
    specs: dict[str, NodeSpec]
    ports: dict[str, int]
    processes: dict[str, BrokerProcess | GatewayProcess]
    tester: QueueManagerNode
    #: Links joined at run time (child, parent), on top of the specs' attached ones.
    attached: set[tuple[str, str]] = field(default_factory=set)

    start_timeout = START_TIMEOUT
    poll_s = 0.1
    tail_lines = 15
    stop_together = True  # many nodes: they drain in parallel

    # ------------------------------------------------------------ topology

    def directory(self, name: str) -> Path:
        """The node's directory: its store, neighbours.db, queue manager, log."""
        return self.root / name

    def is_attached(self, name: str) -> bool:
        """Whether ``name`` is linked to the root through joined links only."""
        spec = self.specs[name]
        while spec.parent is not None:
            if spec.detached and (spec.name, spec.parent) not in self.attached:
                return False
            spec = self.specs[spec.parent]
        return True

    def attached_nodes(self) -> list[str]:
        return [n for n in self.specs if self.is_attached(n)]

    def neighbours(self, name: str) -> list[str]:
        """The nodes joined to ``name`` now."""
        spec = self.specs[name]
        out = []
        if spec.parent is not None and (
            not spec.detached or (name, spec.parent) in self.attached
        ):
            out.append(spec.parent)
        out += [
            s.name for s in self.specs.values()
            if s.parent == name and (not s.detached or (s.name, name) in self.attached)
        ]
        return out

    def _ancestors(self, name: str) -> list[str]:
        out = [name]
        while (parent := self.specs[out[-1]].parent) is not None:
            out.append(parent)
        return out

    def path(self, a: str, b: str) -> list[str]:
        """The nodes from ``a`` to ``b`` along the hierarchy (both included)."""
        up, down = self._ancestors(a), self._ancestors(b)
        common = next(x for x in up if x in down)
        return up[: up.index(common) + 1] + list(reversed(down[: down.index(common)]))

    def next_hop(self, at: str, towards: str) -> str:
        return self.path(at, towards)[1]

    # ------------------------------------------------------------ processes

    def ready_line(self, name: str) -> str:
        if self.specs[name].kind == "gateway":
            return f"gateway {name} started"
        return f"READY {name} 127.0.0.1 {self.ports[name]}"

    def process(self, name: str) -> BrokerProcess | GatewayProcess:
        return self.processes[name]

    def names(self) -> Sequence[str]:
        return list(self.processes)

    def neighbour_states(self, name: str) -> dict[str, str]:
        """``mqgw neighbours list --json`` of ``name``: neighbour -> state."""
        rc, out = mqgw("neighbours", "list", "--json", "--data-dir", str(self.directory(name)))
        if rc != 0:
            return {}
        import json

        rows = [json.loads(line) for line in out.splitlines() if line.strip()]
        return {r["q_mgr"]: r["state"] for r in rows}

    def links_active(self) -> bool:
        """Every node's neighbours are exactly the joined ones, each active."""
        return all(
            self.neighbour_states(n) == dict.fromkeys(self.neighbours(n), "active")
            for n in self.specs
        )

    def join(self, child: str) -> None:
        """``mqgw neighbours join`` on both sides of the detached ``child``'s link to its
        parent (what an operator types; the running brokers pick it up)."""
        parent = self.specs[child].parent
        assert parent is not None
        for at, other, role in ((parent, child, "child"), (child, parent, "parent")):
            rc, out = mqgw("neighbours", "join", other, "--kind", neighbour_kind(self.specs[other]),
                           "--role", role, "--probe-timeout", "2",
                           "--data-dir", str(self.directory(at)))
            assert rc == 0, out
        self.attached.add((child, parent))

    def clear(self, child: str) -> None:
        """``mqgw neighbours clear`` on both sides of ``child``'s link to its parent."""
        parent = self.specs[child].parent
        assert parent is not None
        for at, other in ((parent, child), (child, parent)):
            rc, out = mqgw("neighbours", "clear", other, "--data-dir", str(self.directory(at)))
            assert rc == 0, out
        self.attached.discard((child, parent))

    def pid(self, name: str) -> int:
        proc = self.processes[name].process
        assert proc is not None, f"{name} is not running"
        return proc.pid

    def rss_mb(self, name: str) -> float:
        """Resident memory of ``name``'s process (VmRSS), MB."""
        with open(f"/proc/{self.pid(name)}/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
        return 0.0

    def cpu_s(self, name: str) -> float:
        """User + system CPU seconds of ``name``'s process so far."""
        with open(f"/proc/{self.pid(name)}/stat", encoding="ascii") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    async def close(self) -> None:
        """Stop every process (SIGTERM, SIGKILL after a timeout) and the TESTER node."""
        self.stop_processes(self.processes.values())
        await self.tester.stop()

    # ------------------------------------------------------------ stores (read-only)

    def _query(self, name: str, sql: str, params: Sequence[object]) -> list[tuple[Any, ...]]:
        path = self.directory(name) / "pubsub.db"
        try:
            db = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=5.0)
        except sqlite3.Error:
            return []
        try:
            return db.execute(sql, tuple(params)).fetchall()
        except sqlite3.Error:  # not created yet, or busy beyond the timeout
            return []
        finally:
            db.close()

    def topics_from(self, name: str, q_mgr: str, prefix: str) -> int:
        """Distinct topics starting with ``prefix`` that ``name`` holds a subscription
        for whose destination is queue manager ``q_mgr`` (a neighbour: its proxies)."""
        rows = self._query(
            name,
            "SELECT COUNT(DISTINCT topic) FROM subscriptions WHERE stream = ? AND topic >= ?"
            " AND topic < ? AND q_mgr = ?",
            (DEFAULT, prefix, prefix + "\U0010ffff", q_mgr),
        )
        return int(rows[0][0]) if rows else 0

    def subscriptions_of(self, name: str, q_mgr: str) -> int:
        """Subscriptions ``name`` holds whose destination is queue manager ``q_mgr``."""
        rows = self._query(name, "SELECT COUNT(*) FROM subscriptions WHERE q_mgr = ?",
                           (q_mgr,))
        return int(rows[0][0]) if rows else 0

    def subscription_rows(self, name: str) -> int:
        rows = self._query(name, "SELECT COUNT(*) FROM subscriptions", ())
        return int(rows[0][0]) if rows else 0

    def proxies_missing(self, origin: str, prefix: str, count: int,
                        nodes: Iterable[str] | None = None) -> list[str]:
        """The nodes (of ``nodes``, default every attached one but ``origin``) that do
        not yet hold, from their next hop towards ``origin``, a proxy for ``count``
        topics starting with ``prefix`` (subscriptions registered at ``origin``)."""
        todo = [n for n in (nodes if nodes is not None else self.attached_nodes()) if n != origin]
        return [n for n in todo if self.topics_from(n, self.next_hop(n, origin), prefix) < count]

    # ------------------------------------------------------------ TESTER node

    def tester_queue(self, name: str) -> str:
        """Define local queue ``name`` on TESTER; returns ``name``."""
        self.tester.qm.run_mqsc(
            f"DEFINE QLOCAL({name}) DEFPSIST(YES) MAXDEPTH(1000000) REPLACE",
            stop_on_error=True,
        )
        return name

    async def register(self, at: str, topic: str, queue: str, *, q_mgr: str = TESTER,
                       deregister: bool = False) -> None:
        """RegSub (DeregSub) at ``at`` for ``queue`` on ``q_mgr``; asserts the OK
        response (a REQUEST, answered to TESTER's ``REPLIES.<at>``)."""
        replies = self.tester_queue(f"REPLIES.{at}")
        msg = rfh_message(
            CONTROL,
            [("MQPSCommand", "DeregSub" if deregister else "RegSub"),
             ("MQPSStreamName", DEFAULT), ("MQPSTopic", topic),
             ("MQPSQMgrName", q_mgr), ("MQPSQName", queue)],
            reply_to_q=replies, reply_to_q_mgr=TESTER, msg_type=MsgType.REQUEST,
        )
        async with await self.tester.qm.connect() as conn:
            await conn.put1(CONTROL, msg.md, msg.body, q_mgr_name=at)
            h = await conn.open(replies, OpenOption.INPUT_SHARED)
            got = await h.get(GetOptions(wait_ms=60_000))
        r = decode(got.md, got.body)
        assert r.get("MQPSCompCode") == "0", (at, topic, r.pairs)

    async def register_many(self, at: str, subs: Iterable[tuple[str, str]],
                            errors: str, *, batch: int = 200) -> int:
        """RegSub at ``at`` for each (topic, local queue of ``at``): non-persistent
        DATAGRAMs asking for negative replies only (Report NAN, to TESTER's
        ``errors``), as an application registering many subscriptions would; committed
        every ``batch``. Returns how many were put."""
        n = 0
        async with await self.tester.qm.connect() as conn:
            h = await conn.open(CONTROL, OpenOption.OUTPUT, q_mgr_name=at)
            opts = PutOptions(syncpoint=True)
            for topic, queue in subs:
                msg = rfh_message(
                    CONTROL,
                    [("MQPSCommand", "RegSub"), ("MQPSStreamName", DEFAULT),
                     ("MQPSTopic", topic), ("MQPSQMgrName", at), ("MQPSQName", queue)],
                    reply_to_q=errors, reply_to_q_mgr=TESTER, msg_type=MsgType.DATAGRAM,
                    report=int(Report.NAN), persistence=0,
                )
                await h.put(msg.md, msg.body, opts)
                n += 1
                if n % batch == 0:
                    await conn.commit()
            await conn.commit()
        return n

    async def publisher(self, at: str) -> Publisher:
        conn = await self.tester.qm.connect()
        h = await conn.open(DEFAULT, OpenOption.OUTPUT, q_mgr_name=at)
        return Publisher(conn, h)


class Publisher:
    """An MQRFH publisher putting to one broker's default stream queue through TESTER."""

    def __init__(self, conn: Connection, handle: QueueHandle) -> None:
        self._conn = conn
        self._handle = handle

    async def publish(self, topic: str, payload: bytes, *, persistent: bool = True) -> None:
        msg = rfh_message(
            DEFAULT,
            [("MQPSCommand", "Publish"), ("MQPSStreamName", DEFAULT), ("MQPSTopic", topic)],
            payload, reply_to_q_mgr=TESTER, persistence=1 if persistent else 0,
        )
        md: MQMD = msg.md
        await self._handle.put(md, msg.body, PutOptions())

    async def close(self) -> None:
        await self._handle.close()
        await self._conn.disconnect()


async def start_tree(root: Path, specs: Sequence[NodeSpec]) -> TreeNetwork:
    """Start TESTER (in this process) and one process per node; return once all serve,
    TESTER's channels run and every link joined at start is active both ways. The
    caller closes the network (its ``finally``)."""
    by_name = {s.name: s for s in specs}
    ports = free_ports([*by_name, TESTER])
    tester_mqsc = "".join(channel_pair_mqsc(TESTER, n, ports[n]) for n in by_name)
    tester = QueueManagerNode(TESTER, root / TESTER / "qm", mqsc=tester_mqsc, port=ports[TESTER])
    await tester.start()
    processes: dict[str, BrokerProcess | GatewayProcess] = {}
    for spec in specs:
        d = root / spec.name
        d.mkdir(parents=True, exist_ok=True)
        (d / "channels.mqsc").write_text(node_mqsc(spec, by_name, ports), encoding="utf-8")
        if spec.kind == "gateway":
            config = write_config(d / "gateway.yaml", gateway_yaml(spec, by_name, ports[spec.name]))
            processes[spec.name] = GatewayProcess(config, d / "gateway.log")
        else:
            processes[spec.name] = BrokerProcess(
                spec.name,
                broker_argv(spec.name, root, ports[spec.name], (), legacy_args(spec, by_name)),
                d / "broker.log", d,
            )
    net = TreeNetwork(root, by_name, ports, processes, tester)
    try:
        for proc in processes.values():
            proc.start()
        await net.wait_ready(by_name)
        deadline = time.monotonic() + START_TIMEOUT
        while not net.links_active():
            if time.monotonic() > deadline:
                states = {n: net.neighbour_states(n) for n in by_name}
                raise TimeoutError(f"links not active: {states}\n{net.log_tails()}")
            await asyncio.sleep(0.25)
    except BaseException:
        await net.close()
        raise
    return net
