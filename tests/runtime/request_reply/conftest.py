"""Request/reply runtime tests: a 2-QM cluster DEMO of embedded queue managers (GW, the
gateway's; QMA, an MQ application's, hosting SVC.QUOTE), the service on GW and memory
plugin instances as the requester/responder side."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from gateway.mq.embedded.network import Network
from gateway.mq.embedded.topology import topology_from_dict
from gateway.mq.port import GetOptions, Message, OpenOption, PutOptions, QueueManager
from gateway.routing import CorrelationStore, RequestReplyConfig
from gateway.runtime.request_reply import RequestReplyService
from gateway.wire.constants import MsgType, Report
from gateway.wire.mqmd import MQMD
from plugins.memory import MemoryInstance, reset_buses
from tests.network.network_helpers import wait_for
from tests.support.exchanges import started_memory
from tests.support.names import unique


def member(name: str, peer: str) -> str:
    """Both full repositories of DEMO (each knows every record at once)."""
    return (
        f"DEFINE CHANNEL(TO.{name}) CHLTYPE(CLUSRCVR) CONNAME('{name}') CLUSTER(DEMO)\n"
        f"ALTER QMGR REPOS(DEMO)\n"
        f"DEFINE CHANNEL(TO.{peer}) CHLTYPE(CLUSSDR) CONNAME('{peer}') CLUSTER(DEMO)\n"
    )


GW_MQSC = member("GW", "QMA") + (
    "DEFINE QLOCAL(MQGW.REPLY)\n"
    # reply-to alias: requests name it as ReplyToQ, MQ rewrites it at put
    "DEFINE QREMOTE(MQGW.REPLY.ALIAS) RNAME(MQGW.REPLY) RQMNAME(GWREPLY)\n"
    # the QM alias the cluster reaches GW's replies by
    "DEFINE QREMOTE(GWREPLY) RNAME(' ') RQMNAME(GW) CLUSTER(DEMO)\n"
    "DEFINE QLOCAL(GW.PRICING) CLUSTER(DEMO)\n"
)
QMA_MQSC = member("QMA", "GW") + (
    "DEFINE QLOCAL(SVC.QUOTE) CLUSTER(DEMO)\n"
    "DEFINE QLOCAL(APP.REPLY)\n"
)


@asynccontextmanager
async def demo_network(tmp_path: Path) -> AsyncIterator[Network]:
    topo = topology_from_dict(
        {"queue_managers": {"GW": {"mqsc": GW_MQSC}, "QMA": {"mqsc": QMA_MQSC}}}, tmp_path
    )
    net = Network(topo, tmp_path / "data")
    await net.start()
    try:
        def knows(qm: str, name: str) -> bool:
            return any(r.name == name for r in net[qm].cluster.repository.live())

        await wait_for(lambda: knows("GW", "SVC.QUOTE") and knows("QMA", "GWREPLY")
                       and knows("QMA", "GW.PRICING"), timeout=20)
        yield net
    finally:
        await net.stop()


@pytest.fixture
async def net(tmp_path: Path) -> AsyncIterator[Network]:
    async with demo_network(tmp_path) as n:
        yield n


class Gateway:
    """The service on GW with memory instance(s); ``restart`` reopens it on the same store."""

    def __init__(self, net: Network, store_path: Path, config: RequestReplyConfig) -> None:
        self.net = net
        self.store_path = store_path
        self.config = config
        self.svc: RequestReplyService | None = None
        self.instances: dict[str, MemoryInstance] = {}
        #: The queue manager the service connects to (a test may put a switch between).
        self.qm: QueueManager = net["GW"].qm

    async def start(self, **memory: str) -> RequestReplyService:
        store = CorrelationStore(self.store_path)
        self.svc = RequestReplyService(self.qm, self.config, store, wait_ms=50)
        await self.svc.start()
        for name, bus in memory.items():
            inst = self.instances[name] = await started_memory(name, bus)
            self.svc.attach(name, inst)
        return self.svc

    async def stop(self) -> None:
        for inst in self.instances.values():
            await inst.stop()
        if self.svc is not None:
            await self.svc.stop()
            self.svc.store.close()
            self.svc = None


@pytest.fixture
async def gateway(net: Network, tmp_path: Path) -> AsyncIterator[Callable[..., Gateway]]:
    reset_buses()
    made: list[Gateway] = []

    def make(**config: Any) -> Gateway:
        cfg = RequestReplyConfig.model_validate({"sweep_interval": 0.1, **config})
        gw = Gateway(net, tmp_path / unique("rr") / "request_reply.db", cfg)
        made.append(gw)
        return gw

    yield make
    for gw in made:
        await gw.stop()


async def echo(qm: Any, queue: str, count: int = 1, *, prefix: bytes = b"re:") -> list[Message]:
    """An MQ application answering ``count`` requests as MQ documents: CorrelId = the
    request's MsgId unless PASS_CORREL_ID (then its CorrelId), to ReplyToQ@ReplyToQMgr."""
    got: list[Message] = []
    async with await qm.connect() as conn:
        h = await conn.open(queue, OpenOption.INPUT_SHARED)
        for _ in range(count):
            m = await h.get(GetOptions(wait_ms=15_000))
            got.append(m)
            correl = m.md.correl_id if m.md.report & Report.PASS_CORREL_ID else m.md.msg_id
            md = MQMD(msg_type=MsgType.REPLY, format="MQSTR", correl_id=correl)
            await conn.put1(m.md.reply_to_q, md, prefix + m.body, PutOptions(new_msg_id=True),
                            q_mgr_name=m.md.reply_to_q_mgr)
    return got

