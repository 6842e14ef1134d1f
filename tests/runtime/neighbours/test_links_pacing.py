"""The links' pacing (review finding 8): a busy broker service wakes the links after
every committed unit, yet last-heard is written only on the 1 s timer and syncs run at
least ``MIN_SYNC_SPACING`` apart."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from pathlib import Path

from gateway.mq.embedded.qmgr import EmbeddedQueueManager
from gateway.pubsub.records import Subscription
from gateway.runtime.neighbours.config import NeighbourConfig
from gateway.runtime.neighbours.links import MIN_SYNC_SPACING, NeighbourLinks
from gateway.runtime.neighbours.state import NeighbourState


class CountingState(NeighbourState):
    """The real state, counting the writes of last-heard."""

    heard_writes = 0

    def heard(self, q_mgr: str, when: float) -> bool:
        self.heard_writes += 1
        return super().heard(q_mgr, when)


async def test_wakes_after_every_commit_are_paced(tmp_path: Path) -> None:
    state = CountingState(tmp_path / "neighbours.db")
    state.request_join(NeighbourConfig(q_mgr="A"), 0.0)
    state.set_state("A", "active")
    syncs = 0

    def subscriptions() -> Iterable[Subscription]:
        nonlocal syncs
        syncs += 1  # read once per sync per active neighbour
        return []

    qm = EmbeddedQueueManager("GW", tmp_path / "qm")
    links = NeighbourLinks(qm, state, subscriptions=subscriptions, sync_interval=5.0)
    await links.start()
    try:
        await asyncio.sleep(0.05)
        assert state.heard_writes == 0  # nothing heard yet: nothing written
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        while loop.time() - t0 < 0.6:
            links.wake(heard=["A"])  # a commit of the broker service, from A
            await asyncio.sleep(0.005)
        # ~120 wakes in 0.6 s: at most one sync per MIN_SYNC_SPACING (+ the first)
        assert 2 <= syncs <= 0.6 / MIN_SYNC_SPACING + 2
        assert state.heard_writes == 0  # the 1 s timer has not come yet
        await asyncio.sleep(0.7)
        assert state.heard_writes == 1
        row = state.neighbour("A")
        assert row is not None and row.last_heard > 0
    finally:
        await links.stop()
        await qm.close()
        state.close()
