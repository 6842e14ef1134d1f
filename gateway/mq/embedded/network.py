"""A network of embedded queue managers: listeners, channels and repository managers.

Why: one :class:`QueueManagerNode` is what an IBM MQ installation runs next to a queue
manager (listener, channel initiator, repository manager). A :class:`Network` starts the
nodes of a topology file in one process and one event loop (tests, the demo); every node
can also run in its own process (``python -m gateway.mq.embedded.network TOPOLOGY --qm
NAME``), talking to the others over 127.0.0.1 only. Channels always use the TCP protocol
of :mod:`gateway.mq.embedded.channels`, in-process or not, so both set-ups behave the same.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import signal
import sys
from pathlib import Path
from types import TracebackType
from typing import Self

from gateway.mq.embedded.channels import (
    Address,
    ChannelListener,
    ChannelSender,
    SenderSpec,
)
from gateway.mq.embedded.cluster import ClusterManager
from gateway.mq.embedded.cluster_transmit import cluster_correl_id
from gateway.mq.embedded.mqsc import MQSCError
from gateway.mq.embedded.objects import CLUSTER_TRANSMIT_QUEUE, ChannelDef, ChannelType
from gateway.mq.embedded.qmgr import EmbeddedQueueManager
from gateway.mq.embedded.space import SpacePolicy
from gateway.mq.embedded.topology import Topology, TopologyError, load_topology
from gateway.mq.port import MQError

log = logging.getLogger(__name__)


class QueueManagerNode:
    """One embedded queue manager with its listener, channels and repository manager."""

    def __init__(
        self,
        name: str,
        path: Path | str,
        *,
        mqsc: str = "",
        port: int = 0,
        address_book: dict[str, Address | list[Address]] | None = None,
        appl_name: str | None = None,
        space: SpacePolicy | None = None,
    ) -> None:
        self.name = name
        self.appl_name = appl_name
        self.space = space
        self.path = Path(path)
        self.mqsc = mqsc
        self.requested_port = port
        self.port = 0
        self.address_book = address_book if address_book is not None else {}
        self.cluster = ClusterManager(name)
        self._qm: EmbeddedQueueManager | None = None
        self.listener: ChannelListener | None = None
        self.senders: dict[tuple[str, ...], ChannelSender] = {}
        #: stops of replaced or deleted channels still running (awaited by stop())
        self._stopping: set[asyncio.Task[None]] = set()

    @property
    def qm(self) -> EmbeddedQueueManager:
        if self._qm is None:
            raise RuntimeError(f"queue manager node {self.name} is not started")
        return self._qm

    async def start(self) -> None:
        await self.open()
        await self.run()

    def prepare(self) -> None:
        """Open the queue manager's store and check the MQSC against its definitions
        (raises MQSCError naming the line); nothing is defined or started yet."""
        if self._qm is None:
            self._qm = EmbeddedQueueManager(self.name, self.path, directory=self.cluster,
                                            appl_name=self.appl_name, space=self.space)
            self._qm.status_reports["CHSTATUS"] = self.channel_status
        if self.mqsc:
            self._qm.check_mqsc(self.mqsc)

    async def open(self) -> None:
        """Start the queue manager (MQSC applied) and its listener."""
        try:
            if self._qm is None:
                self.prepare()
            qm = self.qm
            if self.mqsc:
                qm.run_mqsc(self.mqsc, stop_on_error=True)
            self.listener = ChannelListener(qm)
            self.port = await self.listener.start(port=self.requested_port)
            self.address_book[self.name] = ("127.0.0.1", self.port)
        except BaseException:
            await self.stop()
            raise

    async def run(self) -> None:
        """Start the repository manager and the channels (after :meth:`open`)."""
        qm = self.qm
        try:
            qm.definition_listeners.append(lambda kind, name: self._sync_channels())
            await self.cluster.attach(qm, self)
            self._sync_channels()
        except BaseException:
            await self.stop()
            raise

    async def stop(self) -> None:
        """Stop channels, listener and repository manager, then the queue manager."""
        for sender in list(self.senders.values()):
            await sender.stop()
        self.senders.clear()
        while self._stopping:
            await asyncio.wait(list(self._stopping))
        await self.cluster.close()
        if self.listener is not None:
            await self.listener.close()
            self.listener = None
        if self._qm is not None:
            await self._qm.close()
            self._qm = None

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop()

    # ------------------------------------------------------------------ channels

    def _sync_channels(self) -> None:
        """Start SDR and manually defined CLUSSDR channels; stop deleted ones."""
        if self._qm is None or self._qm.stopping:
            return
        defs = self._qm.catalogue.channels
        for d in defs.values():
            if d.chltype is ChannelType.SDR:
                self._manual_sender(d, SenderSpec(
                    d.name, d.conname, d.xmit_q_name, batch_size=d.batch_size,
                    address_book=self.address_book))
            elif d.chltype is ChannelType.CLUSSDR:
                self._manual_sender(d, SenderSpec(
                    d.name, d.conname, CLUSTER_TRANSMIT_QUEUE, batch_size=d.batch_size,
                    correl_for=lambda p: cluster_correl_id(p, ""),
                    on_partner=_partner_callback(self.cluster, d),
                    address_book=self.address_book))
        for key, sender in list(self.senders.items()):
            if key[0] == "MANUAL" and key[1] not in defs:
                del self.senders[key]
                self._stop_later(sender)

    def _stop_later(self, sender: ChannelSender) -> None:
        """Stop a replaced or deleted channel without blocking MQSC; stop() awaits it."""
        task = asyncio.get_running_loop().create_task(sender.stop())
        self._stopping.add(task)
        task.add_done_callback(self._stopping.discard)

    def _manual_sender(self, d: ChannelDef, spec: SenderSpec) -> None:
        key = ("MANUAL", d.name)
        old = self.senders.get(key)
        if old is not None and (old.spec.conname, old.spec.xmit_q_name) == (spec.conname,
                                                                            spec.xmit_q_name):
            old.start()
            return
        if old is not None:
            self._stop_later(old)
        sender = ChannelSender(self.qm, spec)
        self.senders[key] = sender
        sender.start()

    def cluster_sender(self, hop: str, lane: str, channel: str, conname: str) -> ChannelSender:
        """The cluster-sender channel to ``hop`` (auto-defined on first need)."""
        if lane == "":
            for key, s in self.senders.items():
                if key[0] == "MANUAL" and s.spec.correl_for is not None and s.partner == hop:
                    s.start()
                    return s
        key = ("AUTO", channel, lane, hop)
        sender = self.senders.get(key)
        if sender is None:
            sender = ChannelSender(self.qm, SenderSpec(
                channel, conname, CLUSTER_TRANSMIT_QUEUE, lane=lane, partner=hop,
                correl_for=lambda p: cluster_correl_id(p, lane),
                address_book=self.address_book))
            self.senders[key] = sender
        sender.start()
        return sender

    def channel_status(self, pattern: str) -> list[list[str]]:
        """DISPLAY CHSTATUS rows: the sending channels this node runs."""
        rows = []
        for s in sorted(self.senders.values(), key=lambda s: (s.spec.channel, s.spec.lane)):
            name = s.spec.channel
            if not (name.startswith(pattern[:-1]) if pattern.endswith("*") else name == pattern):
                continue
            status = ("RUNNING" if s.connected.is_set() else "RETRYING" if s.retrying
                      else "BINDING" if s.running else "STOPPED")
            kind = "CLUSSDR" if s.spec.lane else "SDR"
            # as MQ's CHSTATUS: the address in use, of a CONNAME that lists several
            conname = s.address if s.connected.is_set() and s.address else s.spec.conname
            rows.append([f"CHANNEL({name})", f"CHLTYPE({kind})", f"CONNAME({conname})",
                         "CURRENT", f"RQMNAME({s.partner})", f"STATUS({status})",
                         f"XMITQ({s.spec.xmit_q_name})", f"MSGS({s.stats.messages})",
                         f"BATCHES({s.stats.batches})"])
        return rows

    def channel_running(self, q_mgr: str) -> bool:
        return any(s.partner == q_mgr and s.connected.is_set() for s in self.senders.values())

    def channel_failing(self, q_mgr: str) -> bool:
        return any(s.partner == q_mgr and s.retrying for s in self.senders.values())


def _partner_callback(cluster: ClusterManager, d: ChannelDef):  # type: ignore[no-untyped-def]
    def found(q_mgr: str) -> None:
        cluster.partner_found(d.cluster, d.name, d.conname, q_mgr)
    return found


class Network:
    """The queue managers of a topology, run in this process."""

    def __init__(self, topology: Topology, data_dir: Path | str | None = None) -> None:
        self.topology = topology
        self.data_dir = data_dir_of(topology, Path(data_dir) if data_dir is not None else None)
        self.address_book: dict[str, Address | list[Address]] = {
            k: v for k, v in topology.address_book().items()}
        self.nodes: dict[str, QueueManagerNode] = {}

    def node_for(self, name: str) -> QueueManagerNode:
        spec = self.topology.queue_managers[name]
        return QueueManagerNode(name, self.data_dir / name,
                                mqsc=spec.script(self.topology.base_dir),
                                port=spec.port, address_book=self.address_book)

    async def start(self, names: list[str] | None = None) -> None:
        """Check every queue manager's MQSC against its stored definitions first (a bad
        line raises TopologyError before any definition changes), then open every queue
        manager and listener, then start channels, so the first channel starts find
        their partners listening."""
        started: list[QueueManagerNode] = []
        try:
            for name in names or list(self.topology.queue_managers):
                node = self.node_for(name)
                self.nodes[name] = node
                try:
                    node.prepare()
                except MQSCError as exc:
                    raise self.topology.mqsc_error(name, exc) from None
                started.append(node)
            for node in started:
                await node.open()
            for node in started:
                await node.run()
        except BaseException:
            await self.stop()
            raise

    def __getitem__(self, name: str) -> QueueManagerNode:
        return self.nodes[name]

    async def stop(self) -> None:
        for node in reversed(list(self.nodes.values())):
            await node.stop()
        self.nodes.clear()

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop()


def data_dir_of(topology: Topology, override: Path | None = None) -> Path:
    if override is not None:
        return override
    if topology.data_dir is None:
        raise TopologyError(str(topology.base_dir), "no data_dir in the topology")
    d = topology.data_dir
    return d if d.is_absolute() else topology.base_dir / d


async def serve(topology: Topology, names: list[str] | None, data_dir: Path | None) -> None:
    """Run queue managers of ``topology`` (all, or ``names``) until SIGTERM/SIGINT.

    Prints ``READY <QM> 127.0.0.1 <port>`` per queue manager once it listens."""
    wanted = names or list(topology.queue_managers)
    for name in wanted:
        if name not in topology.queue_managers:
            raise TopologyError(str(topology.base_dir), f"no queue manager {name} in the topology")
        if len(wanted) < len(topology.queue_managers) and not topology.queue_managers[name].port:
            raise TopologyError(str(topology.base_dir),
                                f"{name} needs a fixed port to run apart from the others")
    network = Network(topology, data_dir_of(topology, data_dir))
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await network.start(wanted)
        for name in wanted:
            print(f"READY {name} 127.0.0.1 {network[name].port}", flush=True)
        await stop.wait()
    finally:
        await network.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m gateway.mq.embedded.network",
        description="Run queue managers of a topology file in this process.")
    parser.add_argument("topology", type=Path)
    parser.add_argument("--qm", action="append", default=[], help="run only this QM")
    parser.add_argument("--data-dir", type=Path, help="default: the topology's data_dir")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(message)s")
    try:
        asyncio.run(serve(load_topology(args.topology), args.qm or None, args.data_dir))
    except TopologyError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except MQError as exc:  # e.g. a data directory another process holds
        print(f"error: {args.topology}: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
