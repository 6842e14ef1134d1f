"""Brokers with neighbour links in one process, on embedded queue managers linked by
channels: the harness of the hostile-neighbour tests and the proxy-registration bench.

Each broker is a BrokerService with its NeighbourLinks (as ``mqgw run`` wires them,
``links_for``); they talk only with queued pub/sub commands across channels. A
neighbour "whose channel is down" is one that has a transmission queue here and no
channel: what is put for it waits there, as it does while a real channel is down.
``FakeClock`` lets a test move the links' clock past their resend times without
waiting for them.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

from gateway.mq.embedded.qmgr import EmbeddedQueueManager
from gateway.pubsub.engine import PubSubEngine
from gateway.pubsub.neighbours import NeighbourKind, ProxyKey
from gateway.pubsub.store import MemoryStore
from gateway.pubsub.streams import ADMIN_STREAM, CONTROL_QUEUE
from gateway.runtime.neighbours.attach import links_for, with_admin_stream
from gateway.runtime.neighbours.config import NeighbourConfig
from gateway.runtime.neighbours.links import NeighbourLinks
from gateway.runtime.neighbours.state import NeighbourState
from gateway.runtime.pubsub_service import BrokerConfig, BrokerService, StreamQueueConfig
from gateway.wire.mqmd import MQMD
from tests.support.pubsub_messages import rfh_message

BULLETIN = "BULLETIN.STREAM"


def mqsc(me: str, links: Sequence[str], down: Sequence[str] = ()) -> str:
    """Stream and subscriber queues, a channel pair to each of ``links`` and only a
    transmission queue for each of ``down`` (its channel is down)."""
    lines = [f"DEFINE QLOCAL({BULLETIN}) DEFPSIST(YES)", "DEFINE QLOCAL(SUB.Q)"]
    for other in links:
        lines += [
            f"DEFINE QLOCAL({other}) USAGE(XMITQ)",
            f"DEFINE CHANNEL({me}.TO.{other}) CHLTYPE(SDR) CONNAME('{other}') XMITQ({other})",
            f"DEFINE CHANNEL({other}.TO.{me}) CHLTYPE(RCVR)",
        ]
    lines += [f"DEFINE QLOCAL({other}) USAGE(XMITQ)" for other in down]
    return "\n".join(lines) + "\n"


class FakeClock:
    """Wall-clock time plus an offset a test moves forward."""

    def __init__(self) -> None:
        self.offset = 0.0

    def __call__(self) -> float:
        import time

        return time.time() + self.offset

    def advance(self, seconds: float) -> None:
        self.offset += seconds


@dataclass
class Broker:
    qm: EmbeddedQueueManager
    engine: PubSubEngine
    service: BrokerService
    links: NeighbourLinks
    state: NeighbourState

    def proxies(self, q_mgr: str) -> list[ProxyKey]:
        return [p.key for p in self.state.proxies(q_mgr) if p.acknowledged]

    def subscribers_from(self, q_mgr: str) -> list[tuple[str, str]]:
        """(stream, topic) of the subscriptions ``q_mgr`` registered here (its proxies)."""
        return [
            (s.stream, s.topic)
            for s in self.engine.subscriptions
            if s.destination.q_mgr == q_mgr and s.stream != ADMIN_STREAM
        ]

    def link_state(self, q_mgr: str) -> str:
        row = self.state.neighbour(q_mgr)
        return "" if row is None else row.state


def gw(q_mgr: str, **kw: object) -> NeighbourConfig:
    """A gateway neighbour sharing BULLETIN.STREAM, with a short probe window."""
    return NeighbourConfig.model_validate(
        {"q_mgr": q_mgr, "kind": NeighbourKind.GATEWAY, "streams": [BULLETIN],
         "probe_timeout": 1.5, **kw}
    )


def remember_active(directory: Path, cfg: NeighbourConfig, learnt: Sequence[str]) -> None:
    """Write ``neighbours.db`` in ``directory`` as a gateway that had joined ``cfg``
    (active, its StreamSupport learnt) leaves it: restarted, it is active at once."""
    directory.mkdir(parents=True, exist_ok=True)
    state = NeighbourState(directory / "neighbours.db")
    try:
        state.request_join(cfg, 0.0)
        state.set_state(cfg.q_mgr, "active")
        state.set_learnt_streams(cfg.q_mgr, learnt)
    finally:
        state.close()


@asynccontextmanager
async def broker(
    qm: EmbeddedQueueManager,
    directory: Path,
    neighbours: list[NeighbourConfig],
    *,
    streams: tuple[str, ...] = (BULLETIN,),
    supported_streams: frozenset[str] | None = None,
    clock: FakeClock | None = None,
    sync_interval: float = 0.1,
    **links_args: object,
) -> AsyncIterator[Broker]:
    """A broker on ``qm`` with its links; ``neighbours.db`` in ``directory``."""
    engine = PubSubEngine(qm.name, MemoryStore(), supported_streams=supported_streams)
    config = BrokerConfig(
        streams=[StreamQueueConfig(name=s) for s in streams], wait_ms=50, retry_delay=0.01
    )
    service = BrokerService(qm, engine, with_admin_stream(config))
    directory.mkdir(parents=True, exist_ok=True)
    extra: dict[str, object] = dict(links_args)
    if clock is not None:
        extra["clock"] = clock
    links = links_for(
        service, directory / "pubsub.db", neighbours, sync_interval=sync_interval,
        **extra,  # type: ignore[arg-type]
    )
    await service.start()
    await links.start()
    try:
        yield Broker(qm, engine, service, links, links.state)
    finally:
        await links.stop()
        await service.stop()
        links.state.close()


async def put_at(qm: EmbeddedQueueManager, queue: str, md: MQMD, body: bytes) -> None:
    """What any MQ application connected to ``qm`` can do: put one message."""
    async with await qm.connect() as conn:
        await conn.put1(queue, md, body)


def regsub(topic: str, *, q_mgr: str, q_name: str = "SUB.Q") -> list[tuple[str, str]]:
    """An MQRFH RegSub on BULLETIN.STREAM naming the subscriber ``q_name``@``q_mgr``."""
    return [
        ("MQPSCommand", "RegSub"),
        ("MQPSStreamName", BULLETIN),
        ("MQPSTopic", topic),
        ("MQPSQMgrName", q_mgr),
        ("MQPSQName", q_name),
    ]


async def put_commands(qm: EmbeddedQueueManager, commands: Sequence[list[tuple[str, str]]],
                       *, batch: int = 200) -> None:
    """Put MQRFH commands on ``qm``'s control queue, ``batch`` per unit of work."""
    from gateway.mq.port import PutOptions

    async with await qm.connect() as conn:
        for start in range(0, len(commands), batch):
            for pairs in commands[start:start + batch]:
                msg = rfh_message(CONTROL_QUEUE, pairs, reply_to_q_mgr=qm.name)
                await conn.put1(CONTROL_QUEUE, msg.md, msg.body, PutOptions(syncpoint=True))
            await conn.commit()
