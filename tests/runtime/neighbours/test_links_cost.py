"""What a sync costs (issue 29): the proxy diff reads the engine's subscriptions only
when they (or the active neighbours, or the proxy rows) changed, so a gateway with many
subscriptions is not re-diffed on every wake of a busy broker service."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from gateway.mq.embedded.qmgr import EmbeddedQueueManager
from gateway.pubsub.records import Subscription
from gateway.runtime.neighbours.config import NeighbourConfig
from gateway.runtime.neighbours.links import NeighbourLinks
from gateway.runtime.neighbours.state import NeighbourState


async def test_the_proxy_diff_runs_only_when_something_changed(tmp_path: Path) -> None:
    state = NeighbourState(tmp_path / "neighbours.db")
    state.request_join(NeighbourConfig(q_mgr="A"), 0.0)
    state.set_state("A", "active")
    reads = 0
    revision = 1

    def subscriptions() -> Iterable[Subscription]:
        nonlocal reads
        reads += 1
        return []

    qm = EmbeddedQueueManager("GW", tmp_path / "qm")
    links = NeighbourLinks(
        qm, state, subscriptions=subscriptions, subscriptions_revision=lambda: revision,
        sync_interval=60.0,
    )
    await links.start()
    try:
        for _ in range(20):
            await links.tick()
        assert reads == 1  # unchanged since the first diff
        revision += 1  # a RegSub, a DeregSub, a suspension
        await links.tick()
        await links.tick()
        assert reads == 2
    finally:
        await links.stop()
        await qm.close()
        state.close()
