"""The seed's figure "A heterogeneous network" as three processes on 127.0.0.1.

Why: the gateway must interoperate with legacy brokers it can only reach through MQ.
Real ones cannot run here, so BROKERA and BROKERB are ``mqgw broker --profile legacy``
stand-ins (docs/neighbours.md says what they do not imitate), each on its own embedded
queue manager, and GW is ``mqgw run`` between them::

    BROKERA (default, STOCK.STREAM, BULLETIN.STREAM)  <->  GW  <->  BROKERB (default,
                                                                    BULLETIN.STREAM,
                                                                    SPORTS.STREAM)

Channels: one SDR/RCVR pair each way for A<->GW and B<->GW, the transmission queue named
after the remote queue manager, ``CONNAME('127.0.0.1(port)')`` from free ports. A and B
have no channel to each other: each routes the other's name through GW with a queue
manager alias (``QREMOTE(BROKERB) RNAME(' ') RQMNAME(BROKERB) XMITQ(GW)``), so anything
addressed from A to BROKERB crosses GW's queue manager.

How a test reaches a broker while it runs: each embedded store is locked by its
process, and the embedded listener speaks only the channel protocol (no client
connections, gateway/mq/embedded/channels.py). So the test process runs a fourth,
small queue manager node, ``TESTER``, joined to all three by channel pairs, and works
the way an MQ application on another queue manager does:

* **put at X**: ``await net.put(X, queue, md, body)`` opens ``(queue, q_mgr=X)`` on
  TESTER; the message travels TESTER's transmission queue ``X`` to X, where it is put
  to ``queue`` (a broker's control queue or stream queue, or a QREMOTE defined at X,
  which makes X forward it further).
* **get from X**: queues can only be read where they live, so what a broker sends to a
  test comes to TESTER: subscriptions registered at X name ``QMgrName TESTER`` and a
  queue of TESTER (``net.subscriber_queue(name)`` defines it), command responses use
  ``ReplyToQMgr TESTER``; ``await net.get(queue)`` / ``net.drain(queue)`` read them.

The TESTER routes are plain point-to-point channels: no broker knows TESTER as a
neighbour, so they add no second path between the brokers.

Neighbours (issue 13's ``neighbours:`` YAML, ``mqgw broker --neighbour``) are left to the
caller as opaque extras: ``gateway_extra`` is merged into the GW's YAML,
``broker_args[name]`` is appended to that broker's command line. Plugins (Kafka, MQTT)
are a parameter too (``plugins``: the YAML list of instances).
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gateway.devstack import ports as devstack_ports
from gateway.mq.embedded.network import QueueManagerNode
from gateway.mq.port import GetOptions, Message, OpenOption
from gateway.wire.mqmd import MQMD
from tests.support.gateway_process import ChildProcess, GatewayProcess, write_config
from tests.support.process_network import ProcessNetwork

BROKERA, BROKERB, GW, TESTER = "BROKERA", "BROKERB", "GW", "TESTER"
DEFAULT_STREAM = "SYSTEM.BROKER.DEFAULT.STREAM"
#: The seed's figure: each legacy broker's streams besides the default stream.
LEGACY_STREAMS: dict[str, tuple[str, ...]] = {
    BROKERA: ("STOCK.STREAM", "BULLETIN.STREAM"),
    BROKERB: ("BULLETIN.STREAM", "SPORTS.STREAM"),
}
#: The gateway services the union of its neighbours' streams.
GATEWAY_STREAMS = ("STOCK.STREAM", "BULLETIN.STREAM", "SPORTS.STREAM")
START_TIMEOUT = 60.0


def free_port() -> int:
    """A free port reserved for this process (gateway.devstack.ports)."""
    return devstack_ports.free_port()


def free_ports(names: Sequence[str]) -> dict[str, int]:
    """A distinct free port per name, each reserved for this process and out of the
    kernel's ephemeral range, so no other queue manager, worker or suite gets it
    (gateway.devstack.ports)."""
    return dict(zip(names, devstack_ports.free_ports(len(names)), strict=True))


def channel_pair_mqsc(local: str, remote: str, remote_port: int) -> str:
    """``local``'s half of a channel pair with ``remote``: xmitq named after ``remote``,
    sender ``local.TO.remote`` to 127.0.0.1(remote_port), receiver ``remote.TO.local``."""
    return (
        f"DEFINE QLOCAL({remote}) USAGE(XMITQ) DEFPSIST(YES) REPLACE\n"
        f"DEFINE CHANNEL({local}.TO.{remote}) CHLTYPE(SDR) "
        f"CONNAME('127.0.0.1({remote_port})') XMITQ({remote}) REPLACE\n"
        f"DEFINE CHANNEL({remote}.TO.{local}) CHLTYPE(RCVR) REPLACE\n"
    )


def route_through_mqsc(target: str, via: str) -> str:
    """A queue manager alias: messages for ``target`` leave through xmitq ``via``."""
    return f"DEFINE QREMOTE({target}) RNAME(' ') RQMNAME({target}) XMITQ({via}) REPLACE\n"


def network_mqsc(ports: Mapping[str, int]) -> dict[str, str]:
    """Every queue manager's channel MQSC (A<->GW, B<->GW, TESTER<->each)."""
    out = {
        BROKERA: channel_pair_mqsc(BROKERA, GW, ports[GW]) + route_through_mqsc(BROKERB, GW),
        BROKERB: channel_pair_mqsc(BROKERB, GW, ports[GW]) + route_through_mqsc(BROKERA, GW),
        GW: channel_pair_mqsc(GW, BROKERA, ports[BROKERA])
        + channel_pair_mqsc(GW, BROKERB, ports[BROKERB]),
        TESTER: "",
    }
    for name in (BROKERA, BROKERB, GW):
        out[name] += channel_pair_mqsc(name, TESTER, ports[TESTER])
        out[TESTER] += channel_pair_mqsc(TESTER, name, ports[name])
    return out


class BrokerProcess(ChildProcess):
    """One ``mqgw broker --profile legacy`` child; every start appends to the same log."""

    terminate_timeout = 30.0

    def __init__(self, name: str, argv: Sequence[str], log_path: Path, cwd: Path) -> None:
        super().__init__(name, list(argv), log_path, cwd, env={"PYTHONUNBUFFERED": "1"})


def _merge(base: dict[str, Any], extra: Mapping[str, Any]) -> dict[str, Any]:
    """``extra`` merged into ``base`` (nested mappings merged, everything else replaced)."""
    out = dict(base)
    for key, value in extra.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


@dataclass
class LegacyNetwork(ProcessNetwork):
    """Handles on the three processes and the in-test TESTER node (module docstring)."""

    root: Path
    ports: dict[str, int]
    brokers: dict[str, BrokerProcess]
    gateway: GatewayProcess
    tester: QueueManagerNode
    mqsc: dict[str, str] = field(default_factory=dict)

    start_timeout = START_TIMEOUT

    # ------------------------------------------------------------ processes

    def process(self, name: str) -> BrokerProcess | GatewayProcess:
        return self.gateway if name == GW else self.brokers[name]

    def ready_line(self, name: str) -> str:
        if name == GW:
            return f"gateway {GW} started"
        return f"READY {name} 127.0.0.1 {self.ports[name]}"

    def names(self) -> Sequence[str]:
        return (BROKERA, BROKERB, GW)

    async def close(self) -> None:
        """Stop the processes (SIGTERM, SIGKILL after a timeout) and the TESTER node."""
        self.stop_processes([self.gateway, *self.brokers.values()])
        await self.tester.stop()

    # ------------------------------------------------------------ TESTER node

    def subscriber_queue(self, name: str) -> str:
        """Define local queue ``name`` on TESTER (subscriptions at a broker name it with
        ``QMgrName TESTER``); returns ``name``."""
        self.tester.qm.run_mqsc(f"DEFINE QLOCAL({name}) DEFPSIST(YES) REPLACE",
                                stop_on_error=True)
        return name

    async def put(self, q_mgr: str, queue: str, md: MQMD, body: bytes) -> MQMD:
        """Put at ``q_mgr`` (through TESTER's channel to it); the MQMD as put (MsgId)."""
        async with await self.tester.qm.connect() as conn:
            return await conn.put1(queue, md, body, q_mgr_name=q_mgr)

    async def get(self, queue: str, wait_s: float = 15.0) -> Message:
        """One message from TESTER's ``queue`` (MQError 2033 after ``wait_s``)."""
        async with await self.tester.qm.connect() as conn:
            h = await conn.open(queue, OpenOption.INPUT_SHARED)
            return await h.get(GetOptions(wait_ms=int(wait_s * 1000)))


def broker_argv(name: str, root: Path, port: int, streams: Sequence[str],
                extra: Sequence[str] = ()) -> list[str]:
    """``mqgw broker --profile legacy`` for ``name`` (data in ``root/name``)."""
    d = root / name
    return [
        sys.executable, "-m", "gateway.runtime.pubsub_service.cli",
        "--qmgr", name, "--qmgr-path", str(d / "qm"), "--store", str(d / "pubsub.db"),
        "--listen", str(port), "--mqsc", str(d / "channels.mqsc"),
        "--profile", "legacy", "--supported-streams", ",".join(streams),
        *extra,
    ]


def gateway_config(port: int, *, plugins: Sequence[Mapping[str, Any]] = (),
                   extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """GW's YAML (paths relative to ``root/GW``): network node, the union of streams."""
    base: dict[str, Any] = {
        "id": GW,
        "queue_manager": {"name": GW, "data_dir": "qm", "mqsc_file": "channels.mqsc",
                          "listener_port": port},
        "broker": {"store": "pubsub.db", "wait_ms": 50,
                   "streams": [{"name": s} for s in GATEWAY_STREAMS]},
        "metrics": {"enabled": False},
        "logging": {"format": "text", "level": "info"},
        "plugins": [dict(p) for p in plugins],
    }
    return _merge(base, extra or {})


async def start_legacy_network(
    root: Path,
    *,
    plugins: Sequence[Mapping[str, Any]] = (),
    gateway_extra: Mapping[str, Any] | None = None,
    broker_args: Mapping[str, Sequence[str]] | None = None,
    extra_mqsc: Mapping[str, str] | None = None,
) -> LegacyNetwork:
    """Start TESTER (in this process), BROKERA, BROKERB and GW; wait until all serve and
    TESTER's channels run. ``extra_mqsc[name]`` is appended to that queue manager's
    channel MQSC. Call :meth:`LegacyNetwork.close` (the caller's ``finally``)."""
    ports = free_ports((BROKERA, BROKERB, GW, TESTER))
    mqsc = network_mqsc(ports)
    for name, text in (extra_mqsc or {}).items():
        mqsc[name] += text
    for name in (BROKERA, BROKERB, GW):
        (root / name).mkdir(parents=True, exist_ok=True)
        (root / name / "channels.mqsc").write_text(mqsc[name], encoding="utf-8")
    tester = QueueManagerNode(TESTER, root / TESTER / "qm", mqsc=mqsc[TESTER],
                              port=ports[TESTER])
    await tester.start()
    brokers = {
        name: BrokerProcess(
            name,
            broker_argv(name, root, ports[name], streams, (broker_args or {}).get(name, ())),
            root / name / "broker.log",
            root / name,
        )
        for name, streams in LEGACY_STREAMS.items()
    }
    config = write_config(root / GW / "gateway.yaml",
                          gateway_config(ports[GW], plugins=plugins, extra=gateway_extra))
    net = LegacyNetwork(root, ports, brokers,
                        GatewayProcess(config, root / GW / "gateway.log"), tester, mqsc)
    try:
        for proc in brokers.values():
            proc.start()
        net.gateway.start()
        await net.wait_ready()
    except BaseException:
        await net.close()
        raise
    return net
