"""Two gateways (``mqgw run`` processes, each with its embedded queue manager) joined
as neighbours on one stream, the stream's publishing route on both, and MQ applications
publishing and subscribing at both while ``mqgw streams move`` runs: what the move
tests (tests/runtime/streams, tests/faults) drive.

The network: QMA and QMB, a channel pair between them (transmission queue named after
the other queue manager), each the other's neighbour (``kind: gateway``) sharing
PRICES. The route ``PRICES.PUB`` is defined once through the local socket (never in
the ``mqsc_file``, which runs at every start and would undo a move): on the owner
``QALIAS(PRICES.PUB) TARGET(PRICES)``, elsewhere ``TARGET(PRICES.PUB.<owner>)``, a
``QREMOTE RNAME(PRICES) RQMNAME(<owner>)``.

Publishers put persistent MQRFH publications to the route (one MQPUT1 each, so a
route change applies to the next one), payload ``<publisher>-<seq>``; a publication
counts as sent once the put returned, as uncertain when the connection broke during
it. Subscribers (one per node, registered at their own broker on ``*``) get under
syncpoint and count a publication once its get is committed.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gateway.mq.embedded.client import connect_local
from gateway.mq.port import Connection, GetOptions, MQError, OpenOption
from gateway.wire.constants import MsgType
from gateway.wire.reasons import Reason
from tests.support.gateway_process import GatewayProcess, write_config
from tests.support.legacy_network import channel_pair_mqsc, free_ports
from tests.support.pubsub_messages import CONTROL, decode, rfh_message

STREAM, ROUTE = "PRICES", "PRICES.PUB"
QMA, QMB = "QMA", "QMB"
NODES = (QMA, QMB)
SUB, SUB_REPLIES = "SUB.PRICES", "SUB.PRICES.R"
START_TIMEOUT = 60.0
#: Bound of the neighbours' join and proxy propagation.
SETTLE_S = 60.0


def other(name: str) -> str:
    return QMB if name == QMA else QMA


def route_mqsc(node: str, owner: str) -> str:
    """The route of ``node`` when ``owner`` owns the stream."""
    if node == owner:
        return f"DEFINE QALIAS({ROUTE}) TARGET({STREAM}) REPLACE"
    return (
        f"DEFINE QREMOTE({ROUTE}.{owner}) RNAME({STREAM}) RQMNAME({owner}) REPLACE\n"
        f"DEFINE QALIAS({ROUTE}) TARGET({ROUTE}.{owner}) REPLACE"
    )


@dataclass
class MoveNetwork:
    root: Path
    ports: dict[str, int]
    gateways: dict[str, GatewayProcess]

    def config(self, name: str) -> Path:
        return self.gateways[name].config

    def data_dir(self, name: str) -> Path:
        return self.root / name / "qm"

    async def wait_ready(self, name: str, timeout: float = START_TIMEOUT) -> None:
        gw = self.gateways[name]
        deadline = time.monotonic() + timeout
        while not gw.has_logged(f"gateway {name} started"):
            if not gw.running:
                raise RuntimeError(f"{name} exited:\n{gw.log_tail()}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"{name} not ready:\n{gw.log_tail()}")
            await asyncio.sleep(0.05)

    def kill(self, name: str) -> None:
        self.gateways[name].kill()

    async def restart(self, name: str) -> None:
        self.gateways[name].start()
        await self.wait_ready(name)

    async def mqsc(self, name: str, script: str) -> None:
        conn = await connect_local(self.data_dir(name))
        try:
            _, results = await conn.mqsc(script)
        finally:
            await conn.disconnect()
        failed = [r for r in results if not r["ok"]]
        assert not failed, failed

    async def close(self) -> None:
        for gw in self.gateways.values():
            if gw.running:
                gw.terminate(timeout=20)

    def log_tails(self, lines: int = 30) -> str:
        return "\n".join(
            f"==== {n} ====\n{gw.log_tail(lines)}" for n, gw in self.gateways.items()
        )

    async def move(self, to: str, *, timeout: float = 30.0,
                   process_timeout: float = 120.0) -> tuple[int, str]:
        """``mqgw streams move`` as an operator runs it; (exit status, output)."""
        return await run_mqgw(
            "streams", "move", STREAM, "--to", to,
            "--node", str(self.config(QMA)), "--node", str(self.config(QMB)),
            "--timeout", str(timeout), timeout=process_timeout,
        )

    def spawn_move(self, to: str) -> Any:
        """The move command as a process of its own (to SIGKILL it); awaitable."""
        return asyncio.create_subprocess_exec(
            sys.executable, "-m", "gateway.runtime.cli", "streams", "move", STREAM,
            "--to", to, "--node", str(self.config(QMA)), "--node", str(self.config(QMB)),
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
        )


async def run_mqgw(*argv: str, timeout: float = 120.0) -> tuple[int, str]:
    """``mqgw ARGV`` as a process; (exit status, output). AssertionError with what it
    printed when it overran ``timeout``."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gateway.runtime.cli", *argv,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )
    assert proc.stdout is not None
    chunks: list[bytes] = []

    async def read() -> None:
        assert proc.stdout is not None
        while chunk := await proc.stdout.read(4096):
            chunks.append(chunk)

    reader = asyncio.create_task(read())
    try:
        await asyncio.wait_for(proc.wait(), timeout)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        await reader
        said = b"".join(chunks).decode("utf-8", "replace")
        raise AssertionError(f"mqgw {' '.join(argv)} overran {timeout} s:\n{said}") from None
    await reader
    assert proc.returncode is not None
    return proc.returncode, b"".join(chunks).decode("utf-8", "replace")


#: The memory sink of each node when the network has sinks (its JSONL output).
SINK, SINK_FILE = "mem", "sink.jsonl"


def gateway_yaml(name: str, port: int, sink_file: Path | None = None) -> dict[str, Any]:
    """``sink_file``: a memory sink on the stream, ``sinks: owner``, writing there."""
    stream: dict[str, Any] = {"name": STREAM}
    plugins: list[dict[str, Any]] = []
    if sink_file is not None:
        stream["sinks"] = "owner"
        plugins.append({"name": SINK, "plugin": "memory", "config": {
            "bus": f"{name}-sink", "record_file": str(sink_file),
            "subscribe": [f"$SYS/STREAM/{STREAM}/#"]}})
    return {
        "id": name,
        "queue_manager": {"name": name, "data_dir": "qm", "mqsc_file": "channels.mqsc",
                          "listener_port": port},
        "broker": {"store": "pubsub.db", "wait_ms": 20, "streams": [stream]},
        "metrics": {"enabled": False},
        "logging": {"format": "text", "level": "info"},
        "neighbours": [{
            "q_mgr": other(name), "kind": "gateway",
            "role": "child" if name == QMA else "parent",
            "streams": [STREAM], "probe_timeout": 2.0,
        }],
        "plugins": plugins,
    }


def sink_payloads(root: Path, name: str) -> list[str]:
    """What ``name``'s memory sink has written so far, in order (its JSONL file)."""
    import json

    path = root / name / SINK_FILE
    if not path.exists():
        return []
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        with contextlib.suppress(ValueError):  # a line being written
            out.append(str(json.loads(line)["payload"]))
    return out


async def start_move_network(root: Path, topic: str = "*", *, sinks: bool = False
                             ) -> MoveNetwork:
    """Both gateways running, routes to QMA, a subscriber on each node (on ``topic``)
    whose proxy is registered at the other node (the caller closes the network).
    ``sinks``: a memory sink on each node (``sinks: owner``), the routes defined before
    the first start, so the owner's sink subscribes and the other's does not."""
    ports = free_ports(NODES)
    gateways = {}
    for name in NODES:
        d = root / name
        d.mkdir(parents=True, exist_ok=True)
        if sinks:
            from gateway.mq.embedded.qmgr import EmbeddedQueueManager

            qm = EmbeddedQueueManager(name, d / "qm")
            qm.run_mqsc(route_mqsc(name, QMA), stop_on_error=True)
            await qm.close()
        (d / "channels.mqsc").write_text(
            channel_pair_mqsc(name, other(name), ports[other(name)]), encoding="utf-8")
        cfg = write_config(d / "gateway.yaml", gateway_yaml(
            name, ports[name], d / SINK_FILE if sinks else None))
        gateways[name] = GatewayProcess(cfg, d / "gateway.log")
    net = MoveNetwork(root, ports, gateways)
    try:
        for gw in gateways.values():
            gw.start()
        for name in NODES:
            await net.wait_ready(name)
        for name in NODES:
            await net.mqsc(name, route_mqsc(name, QMA) + "\n"
                           f"DEFINE QLOCAL({SUB}) DEFPSIST(YES)\n"
                           f"DEFINE QLOCAL({SUB_REPLIES})")
            await register_subscriber(net, name, topic)
        deadline = time.monotonic() + SETTLE_S
        while not all([await has_proxy(net, other(n), n) for n in NODES]):
            if time.monotonic() > deadline:
                raise TimeoutError(f"proxies not registered\n{net.log_tails()}")
            await asyncio.sleep(0.25)
    except BaseException:
        await net.close()
        raise
    return net


async def register_subscriber(net: MoveNetwork, name: str, topic: str = "*",
                              queue: str = SUB) -> None:
    msg = rfh_message(
        CONTROL,
        [("MQPSCommand", "RegSub"), ("MQPSStreamName", STREAM), ("MQPSTopic", topic),
         ("MQPSQMgrName", name), ("MQPSQName", queue)],
        reply_to_q=SUB_REPLIES, reply_to_q_mgr=name, msg_type=MsgType.REQUEST,
    )
    conn = await connect_local(net.data_dir(name))
    try:
        await conn.put1(CONTROL, msg.md, msg.body)
        h = await conn.open(SUB_REPLIES, OpenOption.INPUT_SHARED)
        got = await h.get(GetOptions(wait_ms=15_000))
    finally:
        await conn.disconnect()
    r = decode(got.md, got.body)
    assert r.get("MQPSCompCode") == "0", r.pairs


async def has_proxy(net: MoveNetwork, at: str, of: str) -> bool:
    """Whether ``at``'s broker holds ``of``'s proxy subscription on the stream."""
    import json

    rc, out = await run_mqgw("subscriptions", "--json", "--store",
                             str(net.root / at / "pubsub.db"), timeout=30)
    if rc != 0:
        return False
    for line in out.splitlines():
        with contextlib.suppress(ValueError):
            s = json.loads(line)
            if s.get("stream") == STREAM and str(s.get("destination", "")).endswith(f"@{of}"):
                return True
    return False


# ------------------------------------------------------------------- traffic ------


@dataclass
class Publisher:
    node: str
    rate: float = 40.0
    sent: list[int] = field(default_factory=list)
    uncertain: set[int] = field(default_factory=set)
    refused: int = 0
    #: a put is on its way: its publication is neither sent nor uncertain yet
    in_flight: bool = False

    @property
    def name(self) -> str:
        return f"P{self.node}"

    def ids(self) -> set[str]:
        return {f"{self.name}-{s}" for s in self.sent}


@dataclass
class Subscriber:
    node: str
    received: list[str] = field(default_factory=list)
    #: got but the commit's outcome unknown (the connection broke): counted if seen again
    unsure: set[str] = field(default_factory=set)


class Traffic:
    """A publisher and a subscriber on each node, reconnecting across restarts."""

    def __init__(self, net: MoveNetwork, rate: float = 40.0, *, retain: bool = False) -> None:
        self.net = net
        #: every publication retained (RetainPub): each move copies the old owner's
        self.retain = retain
        self.publishers = {n: Publisher(n, rate) for n in NODES}
        self.subscribers = {n: Subscriber(n) for n in NODES}
        self._publishing = True
        self._reading = True
        #: unexpected errors the clients met (they reconnect and go on)
        self.errors: list[str] = []
        self._tasks: list[asyncio.Task[None]] = []

    def start(self) -> None:
        for n in NODES:
            self._tasks.append(asyncio.create_task(self._publish(self.publishers[n])))
            self._tasks.append(asyncio.create_task(self._read(self.subscribers[n])))

    def stop_publishing(self) -> None:
        self._publishing = False

    async def close(self) -> None:
        self._publishing = self._reading = False
        for t in self._tasks:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(t, 10)

    async def _connect(self, node: str) -> Connection | None:
        try:
            return await connect_local(self.net.data_dir(node))
        except (MQError, OSError):
            await asyncio.sleep(0.2)
            return None

    async def _publish(self, p: Publisher) -> None:
        conn: Connection | None = None
        seq = 0
        while self._publishing:
            if conn is None:
                conn = await self._connect(p.node)
                continue
            msg = rfh_message(
                ROUTE,
                [("MQPSCommand", "Publish"), ("MQPSStreamName", STREAM),
                 ("MQPSTopic", f"T/{p.name}"), ("MQPSPubOpts", "NoReg")]
                + ([("MQPSPubOpts", "RetainPub")] if self.retain else []),
                f"{p.name}-{seq}".encode(), reply_to_q_mgr="", persistence=1,
            )
            p.in_flight = True
            try:
                await conn.put1(ROUTE, msg.md, msg.body)
            except MQError as exc:
                if exc.reason == Reason.PUT_INHIBITED:
                    p.refused += 1
                    await asyncio.sleep(0.01)
                    continue  # put the same publication again
                p.uncertain.add(seq)
                seq += 1
                with contextlib.suppress(Exception):
                    await conn.disconnect()
                conn = None
                continue
            except Exception as exc:  # the connection broke some other way
                self.errors.append(f"publisher {p.name}: {exc!r}")
                p.uncertain.add(seq)
                seq += 1
                conn = None
                continue
            finally:
                p.in_flight = False
            p.sent.append(seq)
            seq += 1
            await asyncio.sleep(1 / p.rate)
        if conn is not None:
            with contextlib.suppress(Exception):
                await conn.disconnect()

    async def _read(self, s: Subscriber) -> None:
        conn: Connection | None = None
        while self._reading:
            if conn is None:
                conn = await self._connect(s.node)
                continue
            got: str | None = None
            try:
                h = await conn.open(SUB, OpenOption.INPUT_SHARED)
                while self._reading:
                    got = None
                    try:
                        m = await h.get(GetOptions(wait_ms=300, syncpoint=True))
                    except MQError as exc:
                        if exc.reason == Reason.NO_MSG_AVAILABLE:
                            continue
                        raise
                    got = decode(m.md, m.body).payload.decode()
                    await conn.commit()
                    self._count(s, got)
                    got = None
            except Exception as exc:
                if not isinstance(exc, MQError):
                    self.errors.append(f"subscriber {s.node}: {exc!r}")
                if got is not None:
                    s.unsure.add(got)
                with contextlib.suppress(Exception):
                    await conn.disconnect()
                conn = None
                await asyncio.sleep(0.05)
        if conn is not None:
            with contextlib.suppress(Exception):
                await conn.disconnect()

    @staticmethod
    def _count(s: Subscriber, got: str) -> None:
        s.unsure.discard(got)  # seen again: its first commit had not happened
        s.received.append(got)

    def received(self, node: str) -> Counter[str]:
        """Times each publication was received at ``node``'s subscriber (one whose
        commit's outcome is unknown and that never came back was received once)."""
        sub = self.subscribers[node]
        return Counter(sub.received) + Counter(sub.unsure)

    def sent(self) -> set[str]:
        return set().union(*(p.ids() for p in self.publishers.values()))

    def uncertain(self) -> set[str]:
        return {f"{p.name}-{s}" for p in self.publishers.values() for s in p.uncertain}

    # ---------------------------------------------------------------- outcome

    def missing(self) -> int:
        """Sent publications some subscriber has not received yet, plus one for each
        put still on its way (so that a wait for none missing after
        :meth:`stop_publishing` also waits for the last put: it may yet be sent)."""
        sent = self.sent()
        on_the_way = sum(p.in_flight for p in self.publishers.values())
        return on_the_way + sum(len(sent - set(self.received(n))) for n in NODES)

    def problems(self) -> list[str]:
        """Lost, duplicated, unexpected or out-of-order publications, per subscriber."""
        out: list[str] = []
        sent, maybe = self.sent(), self.uncertain()
        for n, sub in self.subscribers.items():
            counts = self.received(n)
            lost = sorted(sent - set(counts))
            dup = sorted(i for i, c in counts.items() if c > 1)
            odd = sorted(set(counts) - sent - maybe)
            if lost:
                out.append(f"{n}: {len(lost)} lost, e.g. {lost[:5]}")
            if dup:
                out.append(f"{n}: {len(dup)} duplicated, e.g. {dup[:5]}")
            if odd:
                out.append(f"{n}: {len(odd)} unexpected, e.g. {odd[:5]}")
            last: dict[str, int] = {}
            for i in sub.received:
                pub, _, seq = i.rpartition("-")
                if int(seq) < last.get(pub, -1):
                    out.append(f"{n}: {i} after {pub}-{last[pub]} (order)")
                    break
                last[pub] = int(seq)
        return out


async def until(predicate: Any, timeout: float, net: MoveNetwork, what: str) -> None:
    """Wait for ``predicate()`` (sync) within ``timeout`` seconds, else fail with logs."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} within {timeout} s\n{net.log_tails()}")
        await asyncio.sleep(0.1)


async def route_owner(net: MoveNetwork, node: str) -> str:
    """Whom ``node``'s route names now (read as the move reads it)."""
    from gateway.runtime.streams.move import SocketNode, read_route

    conn = await connect_local(net.data_dir(node))
    try:
        state = await read_route(SocketNode(node, conn), STREAM, ROUTE)
    finally:
        await conn.disconnect()
    return "held" if state.held else state.owner or state.problem


async def held(net: MoveNetwork, node: str) -> int:
    """Publications left in ``node``'s holding queue (0 when it is gone)."""
    from gateway.runtime.streams.move import SocketNode
    from gateway.runtime.streams.move_plan import hold_queue_name

    conn = await connect_local(net.data_dir(node))
    try:
        qs = await SocketNode(node, conn).queues()
    finally:
        await conn.disconnect()
    return int(qs.get(hold_queue_name(STREAM), {}).get("CURDEPTH", "0") or 0)

