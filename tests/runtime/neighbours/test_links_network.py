"""Neighbour links between embedded queue managers in one process: every broker is a
BrokerService with its NeighbourLinks, the queue managers are linked by channels
(transmission queue named after the neighbour), and they talk only with queued pub/sub
commands. Checked: join → active; a subscription at the far broker registers a proxy
at the near one; a publication flows once; the last unsubscribe withdraws the proxy;
clear withdraws everything; a redundant link is refused at join by the loop probe."""

from __future__ import annotations

from contextlib import AbstractAsyncContextManager, AsyncExitStack
from pathlib import Path
from typing import Any

from gateway.mq.embedded.network import Network
from gateway.mq.embedded.qmgr import EmbeddedQueueManager
from gateway.pubsub.neighbours import ProxyKey, proxy_command
from gateway.pubsub.streams import ADMIN_STREAM, CONTROL_QUEUE
from gateway.pubsub.topics import Scheme
from gateway.runtime.neighbours.config import NeighbourConfig
from gateway.runtime.neighbours.state import NeighbourState
from tests.network.network_helpers import NetworkFactory, drain, wait_for
from tests.support.inprocess_brokers import BULLETIN, Broker, gw, mqsc
from tests.support.inprocess_brokers import broker as inprocess_broker
from tests.support.pubsub_messages import decode, rfh_message


def broker(
    qm: EmbeddedQueueManager, tmp_path: Path, neighbours: list[NeighbourConfig], **kw: Any
) -> AbstractAsyncContextManager[Broker]:
    """The shared in-process broker with its links, its store under ``tmp_path/<QM>``."""
    return inprocess_broker(qm, tmp_path / qm.name, neighbours, **kw)


async def command(qm: EmbeddedQueueManager, pairs: list[tuple[str, str]]) -> None:
    msg = rfh_message(CONTROL_QUEUE, pairs, reply_to_q="SUB.Q", reply_to_q_mgr=qm.name)
    async with await qm.connect() as conn:
        await conn.put1(CONTROL_QUEUE, msg.md, msg.body)


def subscribe(register: bool) -> list[tuple[str, str]]:
    return [
        ("MQPSCommand", "RegSub" if register else "DeregSub"),
        ("MQPSStreamName", BULLETIN),
        ("MQPSTopic", "news"),
        ("MQPSQName", "SUB.Q"),
    ]


async def publish(qm: EmbeddedQueueManager, text: str) -> None:
    msg = rfh_message(
        BULLETIN,
        [("MQPSCommand", "Publish"), ("MQPSStreamName", BULLETIN), ("MQPSTopic", "news")],
        text.encode(),
    )
    async with await qm.connect() as conn:
        await conn.put1(BULLETIN, msg.md, msg.body)


async def publications(qm: EmbeddedQueueManager) -> list[bytes]:
    """Payloads of the publications on SUB.Q (responses skipped)."""
    out = []
    for m in await drain(qm, "SUB.Q", 300):
        r = decode(m.md, m.body)
        if r.get("MQPSCommand") == "Publish":
            out.append(r.payload)
    return out


async def test_proxy_subscription_follows_the_far_subscriber(
    make_network: NetworkFactory, tmp_path: Path
) -> None:
    async with make_network({"GW": mqsc("GW", ["A"]), "A": mqsc("A", ["GW"])}) as net:
        net_: Network = net
        async with AsyncExitStack() as stack:
            g = await stack.enter_async_context(broker(net_["GW"].qm, tmp_path, [gw("A")]))
            a = await stack.enter_async_context(broker(net_["A"].qm, tmp_path, [gw("GW")]))
            await wait_for(lambda: g.link_state("A") == a.link_state("GW") == "active", 15)
            # Last-heard is written on the links' 1 s timer (not per commit).
            await wait_for(lambda: g.state.neighbour("A").last_heard > 0, 3)  # type: ignore[union-attr]

            # A subscriber at A: A registers one proxy at GW (identity A, stream queue).
            await command(a.qm, subscribe(True))
            await wait_for(lambda: [k.topic for k in a.proxies("GW")] == ["news"], 10)
            assert [k.stream for k in a.proxies("GW")] == [BULLETIN]
            await wait_for(lambda: g.subscribers_from("A") == [(BULLETIN, "news")], 10)
            assert g.proxies("A") == []  # nothing of GW's own is wanted at A

            # A publication at GW reaches the subscriber at A once.
            await publish(g.qm, "hello")
            got: list[bytes] = []
            for _ in range(50):
                got += await publications(a.qm)
                if got:
                    break
            got += await publications(a.qm)
            assert got == [b"hello"]

            # The last unsubscribe withdraws the proxy at GW.
            await command(a.qm, subscribe(False))
            await wait_for(lambda: a.state.proxies("GW") == [], 10)
            await wait_for(lambda: g.subscribers_from("A") == [], 10)

            # Clear: every proxy at GW withdrawn, GW forgotten by A.
            await command(a.qm, subscribe(True))
            await wait_for(lambda: g.subscribers_from("A") == [(BULLETIN, "news")], 10)
            assert a.state.request_clear("GW")
            await wait_for(lambda: a.state.neighbour("GW") is None, 10)
            await wait_for(lambda: g.subscribers_from("A") == [], 10)
            assert "GW" not in a.links.active
            assert a.state.proxies() == []
            # Nothing is remembered of the commands once settled or cleared.
            await wait_for(
                lambda: a.links.unanswered_commands == g.links.unanswered_commands == 0, 10
            )


async def test_redundant_link_is_refused_by_the_probe(
    make_network: NetworkFactory, tmp_path: Path
) -> None:
    topology = {
        "GW": mqsc("GW", ["A", "B"]),
        "A": mqsc("A", ["GW", "B"]),
        "B": mqsc("B", ["GW", "A"]),
    }
    async with make_network(topology) as net, AsyncExitStack() as stack:
        g = await stack.enter_async_context(broker(net["GW"].qm, tmp_path, [gw("A")]))
        a = await stack.enter_async_context(broker(net["A"].qm, tmp_path, [gw("GW"), gw("B")]))
        b = await stack.enter_async_context(broker(net["B"].qm, tmp_path, [gw("A")]))
        await wait_for(lambda: g.link_state("A") == a.link_state("GW") == "active", 15)
        await wait_for(lambda: a.link_state("B") == b.link_state("A") == "active", 15)

        # GW -> B would close the circle GW - A - B - GW: refused, nothing left at B.
        g.state.request_join(gw("B"), 0.0)
        await wait_for(lambda: g.link_state("B") in ("refused", "active"), 20)
        row = g.state.neighbour("B")
        assert row is not None and row.state == "refused"
        assert row.refusal == "loop: B is already reachable through A"
        await wait_for(
            lambda: not [s for s in b.engine.subscriptions if s.destination.q_mgr == "GW"], 10
        )
        assert "B" not in g.links.active


async def test_a_proxy_registered_just_before_a_crash_does_not_leak(
    make_network: NetworkFactory, tmp_path: Path
) -> None:
    """A was killed after its RegSub reached GW's control queue but before any answer:
    neighbours.db holds the unanswered intent. Restarted without that interest, A
    withdraws the proxy at GW."""
    async with make_network({"GW": mqsc("GW", ["A"]), "A": mqsc("A", ["GW"])}) as net:
        key = ProxyKey(BULLETIN, "news", int(Scheme.TOPIC))
        (tmp_path / "A").mkdir()
        before = NeighbourState(tmp_path / "A" / "neighbours.db")
        before.request_join(gw("GW"), 0.0)
        before.set_state("GW", "active")
        before.intend("GW", key, b"R" * 24, register=True)
        row = before.neighbour("GW")
        assert row is not None
        regsub = proxy_command(row.neighbour, key, register=True, self_q_mgr="A", msg_id=b"R" * 24)
        before.close()
        async with broker(net["GW"].qm, tmp_path, [gw("A")]) as g:
            async with await g.qm.connect() as conn:
                await conn.put1(regsub.queue, regsub.md, regsub.body)
            await wait_for(lambda: g.subscribers_from("A") == [(BULLETIN, "news")], 10)
            async with broker(net["A"].qm, tmp_path, [gw("GW")]) as a:
                await wait_for(lambda: g.subscribers_from("A") == [], 10)
                await wait_for(lambda: a.state.proxies("GW") == [], 10)


async def test_an_unreachable_neighbour_holds_back_only_itself(
    make_network: NetworkFactory, tmp_path: Path
) -> None:
    async with (
        make_network({"GW": mqsc("GW", ["A"]), "A": mqsc("A", ["GW"])}) as net,
        broker(net["GW"].qm, tmp_path, [gw("NOWHERE"), gw("A")]) as g,
        broker(net["A"].qm, tmp_path, [gw("GW")]),
    ):
        await wait_for(lambda: g.link_state("A") == "active", 15)
        row = g.state.neighbour("NOWHERE")
        assert row is not None and row.state == "joining"
        assert row.last_error.startswith("cannot put to NOWHERE")
        assert g.links.counters.commands[("NOWHERE", "put_failed")] >= 1
        assert g.links.counters.commands[("A", "sent")] >= 1


async def test_streams_are_learnt_from_the_neighbours_stream_support(
    make_network: NetworkFactory, tmp_path: Path
) -> None:
    """No streams configured: each side learns the other's from its retained
    StreamSupport publication (PCF) and shares them; the engine is told."""
    async with (
        make_network({"GW": mqsc("GW", ["A"]), "A": mqsc("A", ["GW"])}) as net,
        broker(net["GW"].qm, tmp_path, [gw("A", streams=None)]) as g,
        broker(net["A"].qm, tmp_path, [gw("GW", streams=None)]) as a,
    ):

        def learnt() -> bool:
            row = g.state.neighbour("A")
            return row is not None and row.learnt_streams is not None

        await wait_for(lambda: learnt() and g.link_state("A") == "active", 15)
        row = g.state.neighbour("A")
        assert row is not None and row.learnt_streams is not None
        assert {BULLETIN, ADMIN_STREAM} <= set(row.learnt_streams)
        assert BULLETIN in row.common_streams
        await wait_for(lambda: BULLETIN in g.engine.neighbours["A"].streams, 10)
        assert a.links.supported_streams >= {BULLETIN, ADMIN_STREAM}


async def test_a_legacy_broker_supports_only_its_own_streams(
    make_network: NetworkFactory, tmp_path: Path
) -> None:
    """The seed: a V6 broker does not take on its neighbours' streams (only a gateway
    supports the union). A legacy-profile broker next to a gateway servicing STOCK too
    publishes only its own streams, so the gateway never shares STOCK with it."""
    stock = "STOCK.STREAM"
    gw_mqsc = mqsc("GW", ["A"]) + f"DEFINE QLOCAL({stock}) DEFPSIST(YES)\n"
    async with (
        make_network({"GW": gw_mqsc, "A": mqsc("A", ["GW"])}) as net,
        broker(net["GW"].qm, tmp_path, [gw("A", streams=None)], streams=(BULLETIN, stock)) as g,
        broker(net["A"].qm, tmp_path, [gw("GW", streams=None)],
               supported_streams=frozenset({BULLETIN})) as a,
    ):

        def learnt() -> bool:
            row = g.state.neighbour("A")
            return row is not None and row.learnt_streams is not None

        await wait_for(lambda: learnt() and a.link_state("GW") == "active", 15)
        assert stock not in a.links.supported_streams
        assert stock not in a.engine.neighbours["GW"].streams
        await wait_for(lambda: (r := a.state.neighbour("GW")) is not None
                       and r.learnt_streams is not None, 10)
        mine = a.state.neighbour("GW")
        assert mine is not None and stock not in mine.common_streams  # what `list` shows
        row = g.state.neighbour("A")
        assert row is not None
        assert BULLETIN in row.common_streams and stock not in row.common_streams


async def test_two_neighbours_joined_at_once_that_are_linked_are_not_both_accepted(
    make_network: NetworkFactory, tmp_path: Path
) -> None:
    """First start of GW with A and B configured, A and B already linked directly:
    the two joins probe through each other, so the circle GW - A - B - GW is found
    and the later join (B) is refused; nothing of GW's is left at B."""
    topology = {
        "GW": mqsc("GW", ["A", "B"]),
        "A": mqsc("A", ["GW", "B"]),
        "B": mqsc("B", ["GW", "A"]),
    }
    async with make_network(topology) as net, AsyncExitStack() as stack:
        a = await stack.enter_async_context(broker(net["A"].qm, tmp_path, [gw("B")]))
        b = await stack.enter_async_context(broker(net["B"].qm, tmp_path, [gw("A")]))
        await wait_for(lambda: a.link_state("B") == b.link_state("A") == "active", 15)

        g = await stack.enter_async_context(broker(net["GW"].qm, tmp_path, [gw("A"), gw("B")]))
        await wait_for(lambda: {g.link_state("A"), g.link_state("B")} <= {"active", "refused"}, 20)
        assert (g.link_state("A"), g.link_state("B")) == ("active", "refused")
        row = g.state.neighbour("B")
        assert row is not None and row.refusal == "loop: B is already reachable through A"
        assert set(g.links.active) == {"A"}
        await wait_for(
            lambda: not [s for s in b.engine.subscriptions if s.destination.q_mgr == "GW"], 10
        )


async def test_a_join_of_our_own_queue_manager_is_refused(
    make_network: NetworkFactory, tmp_path: Path
) -> None:
    """`join --data-dir` cannot know our queue manager: the links refuse it."""
    async with (
        make_network({"GW": mqsc("GW", [])}) as net,
        broker(net["GW"].qm, tmp_path, []) as g,
    ):
        g.state.request_join(gw("GW"), 0.0)
        await wait_for(lambda: g.link_state("GW") == "refused", 10)
        row = g.state.neighbour("GW")
        assert row is not None and row.refusal == "GW is our own queue manager"
        assert "GW" not in g.links.active
