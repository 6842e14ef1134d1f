"""A cleared neighbour's proxy subscriptions go with it (issue 31, found by the 20-node
benchmark).

Why: they used to stay until the neighbour deregistered them. Between our clear and
its DeregSubs arriving (a while, behind a busy channel) each was an ordinary
subscription: our publications went on to it as plain publications, and when both
sides had cleared each other, a publication forwarded one way came straight back the
other way (neither knew the other as a neighbour any more, so the never-back-to-its-
source rule no longer applied): a loop that ran until the DeregSubs got through,
carrying a copy of every pass into the rest of both networks. Measured in the 20-node
benchmark: 2,575 publications circling between B3 and S two minutes after the clear.
"""

from __future__ import annotations

from contextlib import AsyncExitStack
from pathlib import Path

from tests.network.network_helpers import NetworkFactory, wait_for
from tests.runtime.neighbours.test_links_network import (
    broker,
    command,
    publications,
    publish,
    subscribe,
)
from tests.support.inprocess_brokers import BULLETIN, gw, mqsc


async def test_a_cleared_neighbours_subscriptions_are_dropped_at_once(
    make_network: NetworkFactory, tmp_path: Path
) -> None:
    async with make_network({"GW": mqsc("GW", ["A"]), "A": mqsc("A", ["GW"])}) as net, \
            AsyncExitStack() as stack:
        g = await stack.enter_async_context(broker(net["GW"].qm, tmp_path, [gw("A")]))
        a = await stack.enter_async_context(broker(net["A"].qm, tmp_path, [gw("GW")]))
        await wait_for(lambda: g.link_state("A") == a.link_state("GW") == "active", 15)
        # A subscriber at A: A's proxy at GW.
        await command(a.qm, subscribe(True))
        await wait_for(lambda: g.subscribers_from("A") == [(BULLETIN, "news")], 10)

        # GW leaves A; A has not (yet) left GW, so A sends no DeregSub.
        assert g.state.request_clear("A")
        await wait_for(lambda: g.state.neighbour("A") is None, 10)
        await wait_for(lambda: g.subscribers_from("A") == [], 5)
        assert not [s for s in g.engine.subscriptions if s.destination.q_mgr == "A"]

        # GW's publications no longer go to A.
        await publish(g.qm, "after the clear")
        await publish(a.qm, "at A")  # what A's subscriber gets once the first had time
        got: list[bytes] = []
        for _ in range(50):
            got += await publications(a.qm)
            if b"at A" in got:
                break
        assert got == [b"at A"]
