"""Issue 14's request/reply network: the gateway as one queue manager of two clusters.

Why: replies must find their way back through MQ's own name resolution (reply-to queue
aliases, queue-manager aliases, clusters, a gateway queue manager between clusters), so
the end-to-end tests run a real network of processes on 127.0.0.1 (free ports)::

    cluster DEMO:  GW (mqgw run, full repository)   QMA (full repository, SVC.QUOTE,
                   TESTER (this process, requester)  SVC.IDLE)
                   QMB (bridge, also in OTHER: QALIAS MYQ3 -> Q3; advertises in OTHER the
                        QM aliases GW, GWREPLY and TESTREPLY so OTHER's members reach
                        the gateway and TESTER)
    cluster OTHER: QMC (full repository of OTHER, Q3)

* GW: ``mqgw run`` (or a plain queue-manager node with the same MQSC, ``gateway=None``,
  for checks of the network alone). Its MQSC: reply-to queue alias
  ``QREMOTE(MQGW.REPLY.ALIAS) RNAME(MQGW.REPLY) RQMNAME(GWREPLY)``, the QM alias
  ``QREMOTE(GWREPLY) RNAME(' ') RQMNAME(GW) CLUSTER(DEMO)`` it advertises, and the
  service queues ``GW.PRICING`` (Kafka responder) and ``GW.WEATHER`` (MQTT responder)
  advertised in DEMO. Requests the gateway puts name ReplyToQ ``MQGW.REPLY.ALIAS``, which
  GW's queue manager rewrites at put to MQGW.REPLY @ GWREPLY.
* QMA and QMC: ``python -m tests.support.mq_app serve`` (a node plus an echo responder on
  SVC.QUOTE resp. Q3). SVC.IDLE on QMA has no server (timeouts).
* QMB: ``python -m gateway.mq.embedded.network TOPOLOGY --qm QMB`` (MQ only).
* TESTER: a queue-manager node in the test process, a DEMO member, so a test is an MQ
  application of the cluster: it puts requests with ReplyToQ ``APP.REPLY`` and
  ReplyToQMgr ``TESTREPLY`` — the QM alias TESTER advertises in DEMO
  (``QREMOTE(TESTREPLY) RNAME(' ') RQMNAME(TESTER) CLUSTER(DEMO)``) — and reads
  APP.REPLY. It also hosts ``SVC.HELD`` (cluster queue) for requests the test answers
  itself, at a moment it chooses (the restart test).

Start-up waits until TESTER can open every cluster queue the tests address and an echo
probe TESTER -> MYQ3 -> Q3@QMC -> PROBE.REPLY@TESTREPLY came back (before QMB has learnt
Q3 from OTHER it dead-letters MYQ3 messages with 2082, as MQ does).

Every queue manager finds the others by name: ``CONNAME('QMA')`` through the address book
(the topology file's fixed ports; ``queue_manager.address_book`` in GW's YAML).
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from gateway.mq.embedded.network import QueueManagerNode
from gateway.mq.port import GetOptions, Message, MQError, OpenOption
from gateway.wire.constants import MsgType
from gateway.wire.mqmd import MQMD
from gateway.wire.reasons import Reason
from tests.support.gateway_process import ChildProcess, GatewayProcess, write_config
from tests.support.legacy_network import free_ports
from tests.support.process_network import ProcessNetwork

GW, QMA, QMB, QMC, TESTER = "GW", "QMA", "QMB", "QMC", "TESTER"
QUEUE_MANAGERS = (GW, QMA, QMB, QMC, TESTER)
DEMO, OTHER = "DEMO", "OTHER"
#: The gateway's reply queue, the reply-to alias its requests name and the QM alias.
REPLY_QUEUE, REPLY_ALIAS, REPLY_QM_ALIAS = "MQGW.REPLY", "MQGW.REPLY.ALIAS", "GWREPLY"
#: Services: cluster queue on QMA (echo), the bridge alias on QMB (-> Q3 on QMC, echo),
#: a cluster queue nobody serves, and the gateway's service queues.
SVC_QUOTE, SVC_IDLE, MYQ3, Q3 = "SVC.QUOTE", "SVC.IDLE", "MYQ3", "Q3"
GW_PRICING, GW_WEATHER = "GW.PRICING", "GW.WEATHER"
#: TESTER: its reply queue, the QM alias its requests name, the queue the test serves.
APP_REPLY, TESTER_ALIAS, SVC_HELD = "APP.REPLY", "TESTREPLY", "SVC.HELD"
#: Where the start-up probe's echo replies arrive on TESTER.
PROBE_REPLY = "PROBE.REPLY"
DLQ = "SYSTEM.DEAD.LETTER.QUEUE"
CLUSTER_XMITQ = "SYSTEM.CLUSTER.TRANSMIT.QUEUE"
START_TIMEOUT = 90.0
#: (queue, queue manager) names TESTER must be able to open before the tests start: the
#: cluster queues, and GW's reply queue through the QM alias GWREPLY (learnt now, so the
#: test can answer the gateway while GW, TESTER's full repository, is stopped).
JOINED_NAMES = ((SVC_QUOTE, ""), (SVC_IDLE, ""), (MYQ3, ""), (GW_PRICING, ""),
                (GW_WEATHER, ""), (REPLY_QUEUE, REPLY_QM_ALIAS))
#: The checkout (child processes run ``-m tests.support.mq_app`` from here).
REPO = Path(__file__).resolve().parents[2]


def _clusrcvr(name: str, cluster: str, channel: str | None = None) -> str:
    return (f"DEFINE CHANNEL({channel or 'TO.' + name}) CHLTYPE(CLUSRCVR) "
            f"CONNAME('{name}') CLUSTER({cluster}) REPLACE\n")


def _clussdr(channel: str, to: str, cluster: str) -> str:
    return (f"DEFINE CHANNEL({channel}) CHLTYPE(CLUSSDR) CONNAME('{to}') "
            f"CLUSTER({cluster}) REPLACE\n")


def network_mqsc() -> dict[str, str]:
    """Every queue manager's MQSC (module docstring)."""
    return {
        GW: f"ALTER QMGR REPOS({DEMO})\n" + _clusrcvr(GW, DEMO)
        + _clussdr("TO.QMA", QMA, DEMO)
        + f"DEFINE QREMOTE({REPLY_ALIAS}) RNAME({REPLY_QUEUE}) RQMNAME({REPLY_QM_ALIAS}) "
        "REPLACE\n"
        f"DEFINE QREMOTE({REPLY_QM_ALIAS}) RNAME(' ') RQMNAME({GW}) CLUSTER({DEMO}) REPLACE\n"
        f"DEFINE QLOCAL({GW_PRICING}) CLUSTER({DEMO}) DEFPSIST(YES) REPLACE\n"
        f"DEFINE QLOCAL({GW_WEATHER}) CLUSTER({DEMO}) DEFPSIST(YES) REPLACE\n",
        QMA: f"ALTER QMGR REPOS({DEMO})\n" + _clusrcvr(QMA, DEMO)
        + _clussdr("TO.GW", GW, DEMO)
        + f"DEFINE QLOCAL({SVC_QUOTE}) CLUSTER({DEMO}) DEFPSIST(YES) REPLACE\n"
        f"DEFINE QLOCAL({SVC_IDLE}) CLUSTER({DEMO}) DEFPSIST(YES) REPLACE\n",
        QMB: _clusrcvr(QMB, DEMO, "TO.QMB.DEMO") + _clussdr("TO.GW", GW, DEMO)
        + _clusrcvr(QMB, OTHER, "TO.QMB.OTHER") + _clussdr("TO.QMC", QMC, OTHER)
        + f"DEFINE QALIAS({MYQ3}) TARGET({Q3}) CLUSTER({DEMO}) DEFBIND(NOTFIXED) REPLACE\n"
        f"DEFINE QREMOTE({GW}) RNAME(' ') RQMNAME({GW}) CLUSTER({OTHER}) REPLACE\n"
        f"DEFINE QREMOTE({REPLY_QM_ALIAS}) RNAME(' ') RQMNAME({GW}) CLUSTER({OTHER}) "
        "REPLACE\n"
        f"DEFINE QREMOTE({TESTER_ALIAS}) RNAME(' ') RQMNAME({TESTER}) CLUSTER({OTHER}) "
        "REPLACE\n",
        QMC: f"ALTER QMGR REPOS({OTHER})\n" + _clusrcvr(QMC, OTHER)
        + f"DEFINE QLOCAL({Q3}) CLUSTER({OTHER}) DEFPSIST(YES) REPLACE\n",
        TESTER: _clusrcvr(TESTER, DEMO) + _clussdr("TO.GW", GW, DEMO)
        + f"DEFINE QREMOTE({TESTER_ALIAS}) RNAME(' ') RQMNAME({TESTER}) CLUSTER({DEMO}) "
        "REPLACE\n"
        f"DEFINE QLOCAL({APP_REPLY}) DEFPSIST(YES) REPLACE\n"
        f"DEFINE QLOCAL({PROBE_REPLY}) REPLACE\n"
        f"DEFINE QLOCAL({SVC_HELD}) CLUSTER({DEMO}) DEFPSIST(YES) REPLACE\n",
    }


class NodeProcess(ChildProcess):
    """A queue-manager node (plain, or with the echo responder) in its own process."""

    terminate_timeout = 20.0

    def __init__(self, name: str, argv: Sequence[str], root: Path) -> None:
        (root / name).mkdir(parents=True, exist_ok=True)
        super().__init__(name, list(argv), root / name / "node.log", REPO,
                         env={"PYTHONUNBUFFERED": "1"})


def node_argv(topology: Path, name: str, serve: Sequence[str]) -> list[str]:
    """``mq_app serve`` for a node with services, else the plain network node."""
    if serve:
        return [sys.executable, "-m", "tests.support.mq_app", "serve", str(topology),
                "--qm", name, *(a for q in serve for a in ("--queue", q))]
    return [sys.executable, "-m", "gateway.mq.embedded.network", str(topology), "--qm", name]


#: Which queues each child node serves with the echo responder.
SERVED: dict[str, tuple[str, ...]] = {QMA: (SVC_QUOTE,), QMB: (), QMC: (Q3,)}


def gateway_yaml(ports: Mapping[str, int], *, plugins: Sequence[Mapping[str, Any]],
                 request_reply: Mapping[str, Any]) -> dict[str, Any]:
    """GW's ``mqgw run`` YAML (paths relative to ``root/GW``)."""
    return {
        "id": GW,
        "queue_manager": {
            "name": GW, "data_dir": "qm", "mqsc_file": "network.mqsc",
            "listener_port": ports[GW],
            "address_book": {n: f"127.0.0.1:{p}" for n, p in ports.items() if n != GW},
        },
        "broker": {"store": "pubsub.db", "wait_ms": 50},
        "metrics": {"enabled": False},
        "logging": {"format": "text", "level": "info"},
        "shutdown_timeout": 10.0,
        "plugins": [dict(p) for p in plugins],
        "request_reply": {"reply_queue": REPLY_QUEUE, "reply_to_q": REPLY_ALIAS,
                          "store": "request_reply.db", "sweep_interval": 0.2,
                          **request_reply},
    }


@dataclass
class RRNetwork(ProcessNetwork):
    """Handles on the processes and the in-test TESTER node (module docstring)."""

    root: Path
    ports: dict[str, int]
    nodes: dict[str, NodeProcess]
    tester: QueueManagerNode
    gateway: GatewayProcess | None = None
    #: GW as a plain node in this process when there is no ``mqgw run``.
    gw_node: QueueManagerNode | None = None
    mqsc: dict[str, str] = field(default_factory=dict)

    start_timeout = START_TIMEOUT
    tester_channels = False  # TESTER reaches the nodes through the cluster
    tail_lines = 25

    # ------------------------------------------------------------ processes

    def process(self, name: str) -> ChildProcess:
        if name == GW:
            if self.gateway is None:
                raise RuntimeError("GW runs in this process (no mqgw run)")
            return self.gateway
        return self.nodes[name]

    def ready_line(self, name: str) -> str:
        return f"gateway {GW} started" if name == GW else f"READY {name} 127.0.0.1"

    def names(self) -> Sequence[str]:
        return (GW, QMA, QMB, QMC)

    async def wait_joined(self, timeout: float = START_TIMEOUT) -> None:
        """TESTER can open every name the tests address (``JOINED_NAMES``). TESTER's only
        full repository is GW, so this also says GW (through QMA) knows them."""
        deadline = time.monotonic() + timeout
        while True:
            missing = await self._unknown(JOINED_NAMES)
            if not missing:
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"TESTER cannot open {missing} (cluster not joined)\n"
                                   f"{self.log_tails()}")
            await asyncio.sleep(0.25)
        await self._probe_other(deadline)

    async def _probe_other(self, deadline: float) -> None:
        """Echo requests from TESTER to MYQ3 until one is answered: QMB knows Q3 in OTHER
        and QMC reaches back through QMB's QM aliases (TESTREPLY, advertised with GWREPLY).
        Until then QMB dead-letters MYQ3 messages with 2082, as MQ does while a partial
        repository has not learnt the alias's target: lost probes stay on QMB's DLQ."""
        n = 0
        while True:
            n += 1
            md = MQMD(format="MQSTR", msg_type=MsgType.REQUEST, reply_to_q=PROBE_REPLY,
                      reply_to_q_mgr=TESTER_ALIAS)
            sent = await self.put(MYQ3, md, f"probe {n}".encode())
            async with await self.tester.qm.connect() as conn:
                h = await conn.open(PROBE_REPLY, OpenOption.INPUT_SHARED)
                try:
                    got = await h.get(GetOptions(wait_ms=2000, match_correl_id=sent.msg_id))
                except MQError as exc:
                    if exc.reason != Reason.NO_MSG_AVAILABLE:
                        raise
                else:
                    assert got.body.endswith(f"probe {n}".encode())
                    return
            if time.monotonic() > deadline:
                qm = self.tester.qm
                raise TimeoutError(
                    f"no echo from Q3@QMC to {n} probes put to MYQ3; on TESTER "
                    f"{qm.queue_depth(CLUSTER_XMITQ)} message(s) wait on {CLUSTER_XMITQ}, "
                    f"{qm.queue_depth(DLQ)} on its DLQ\n{self.log_tails()}")

    async def _unknown(self, names: Sequence[tuple[str, str]]) -> list[str]:
        """The names TESTER cannot open yet (a partial repository learns a cluster queue
        or queue-manager alias on first use; 2085/2087 mean not yet)."""
        out: list[str] = []
        async with await self.tester.qm.connect() as conn:
            for q, q_mgr in names:
                try:
                    h = await conn.open(q, OpenOption.OUTPUT, q_mgr)
                    await h.close()
                except MQError:
                    out.append(f"{q}@{q_mgr}" if q_mgr else q)
        return out

    async def close(self) -> None:
        """Stop the processes (SIGTERM, SIGKILL after a timeout) and the local nodes."""
        gateway = [self.gateway] if self.gateway is not None else []
        self.stop_processes([*gateway, *self.nodes.values()])
        if self.gw_node is not None:
            await self.gw_node.stop()
        await self.tester.stop()

    # ------------------------------------------------------------ TESTER as an application

    async def put(self, queue: str, md: MQMD, body: bytes, q_mgr: str = "") -> MQMD:
        """Put from TESTER (name resolution of TESTER: cluster, aliases); the MQMD as put."""
        async with await self.tester.qm.connect() as conn:
            return await conn.put1(queue, md, body, q_mgr_name=q_mgr)

    async def get(self, queue: str, wait_s: float, what: str) -> Message:
        """One message from TESTER's ``queue``; AssertionError naming ``what`` (and the
        processes' log tails) when none arrives within ``wait_s``."""
        async with await self.tester.qm.connect() as conn:
            h = await conn.open(queue, OpenOption.INPUT_SHARED)
            try:
                return await h.get(GetOptions(wait_ms=int(wait_s * 1000)))
            except MQError as exc:
                if exc.reason != Reason.NO_MSG_AVAILABLE:
                    raise
        raise AssertionError(f"{what}: nothing on {queue}@{TESTER} within {wait_s:.0f} s\n"
                             f"{self.log_tails()}")


def write_topology(root: Path, ports: Mapping[str, int], mqsc: Mapping[str, str]) -> Path:
    """The topology file the child nodes run (every QM with its fixed port)."""
    path = root / "network.yaml"
    path.write_text(yaml.safe_dump({
        "data_dir": "data",
        "queue_managers": {n: {"port": ports[n], "mqsc": mqsc[n]} for n in QUEUE_MANAGERS},
    }, sort_keys=False), encoding="utf-8")
    return path


async def start_rr_network(
    root: Path,
    *,
    plugins: Sequence[Mapping[str, Any]] = (),
    request_reply: Mapping[str, Any] | None = None,
    gateway: bool = True,
    extra_mqsc: Mapping[str, str] | None = None,
) -> RRNetwork:
    """Start TESTER, QMA, QMB, QMC and GW (``mqgw run`` with ``plugins`` and the
    ``request_reply`` section; or, ``gateway=False``, a plain node in this process) and
    wait until TESTER knows the cluster. Call :meth:`RRNetwork.close` (``finally``)."""
    root.mkdir(parents=True, exist_ok=True)
    ports = free_ports(QUEUE_MANAGERS)
    mqsc = network_mqsc()
    for name, text in (extra_mqsc or {}).items():
        mqsc[name] += text
    topology = write_topology(root, ports, mqsc)
    book = {n: ("127.0.0.1", p) for n, p in ports.items()}
    tester = QueueManagerNode(TESTER, root / "data" / TESTER, mqsc=mqsc[TESTER],
                              port=ports[TESTER], address_book=dict(book))
    nodes = {n: NodeProcess(n, node_argv(topology, n, SERVED[n]), root)
             for n in (QMA, QMB, QMC)}
    net = RRNetwork(root, ports, nodes, tester, mqsc=mqsc)
    try:
        await tester.start()
        for proc in nodes.values():
            proc.start()
        if gateway:
            (root / GW).mkdir(exist_ok=True)
            (root / GW / "network.mqsc").write_text(mqsc[GW], encoding="utf-8")
            config = write_config(root / GW / "gateway.yaml", gateway_yaml(
                ports, plugins=plugins, request_reply=request_reply or {}))
            net.gateway = GatewayProcess(config, root / GW / "gateway.log")
            net.gateway.start()
        else:
            net.gw_node = QueueManagerNode(GW, root / "data" / GW, mqsc=mqsc[GW],
                                           port=ports[GW], address_book=dict(book))
            await net.gw_node.start()
        await net.wait_ready([QMA, QMB, QMC, *([GW] if gateway else [])])
        await net.wait_joined()
    except BaseException:
        await net.close()
        raise
    return net
