"""Hostile input from the neighbour side (issue 29): an MQ application that can put on
the gateway's SYSTEM.BROKER.INTER.BROKER.COMMUNICATIONS, a forged neighbour, and a
neighbour whose channel is down. Whatever they send, the gateway keeps, resends,
reports and logs only a bounded amount, and dead-letters what it refuses.

In one process (tests/support/inprocess_brokers.py): GW is a broker with its neighbour
links on an embedded queue manager; the hostile application is a plain connection to
GW's queue manager putting documented pub/sub messages (a StreamSupport publication as
a broker delivers it: MQRFH Publish + PCF). A neighbour whose channel is down has a
transmission queue at GW and no channel. The links' clock is moved forward instead of
waiting for resend times; everything else waits for events, bounded.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from gateway.mq.embedded.network import Network
from gateway.mq.embedded.qmgr import EmbeddedQueueManager
from gateway.mq.embedded.topology import topology_from_dict
from gateway.mq.port import Browse, GetOptions, MQError, OpenOption
from gateway.pubsub.streams import DEFAULT_STREAM, INTER_BROKER_QUEUE
from gateway.runtime.metrics import NeighbourCollector
from gateway.runtime.neighbours.resend import RESEND_AFTER, RESEND_JITTER, RESEND_MAX
from gateway.runtime.neighbours.state import NeighbourState
from gateway.runtime.neighbours.status import neighbour_status
from gateway.runtime.neighbours.stream_support import stream_support_command
from gateway.wire.dlh import unwrap_from_dlq
from gateway.wire.formats import FMT_RF_HEADER, FMT_STRING
from gateway.wire.mqmd import MQMD
from gateway.wire.reasons import Reason
from tests.network.network_helpers import wait_for
from tests.support.inprocess_brokers import (
    BULLETIN,
    Broker,
    FakeClock,
    broker,
    gw,
    mqsc,
    put_at,
    put_commands,
    regsub,
    remember_active,
)

DLQ = "SYSTEM.DEAD.LETTER.QUEUE"
#: Past any resend time of the links (their longest backoff with its jitter).
PAST_RESENDS = RESEND_MAX * (1 + RESEND_JITTER) + 1
#: What a flood announces (the issue's figure): junk, markup, MQ's own queues, an
#: empty name, and thousands of plausible names.
FLOOD = ["", "<script>x</script>", "SYSTEM.ADMIN.COMMAND.QUEUE", "A" * 49,
         *(f"JUNK.{i:04d}" for i in range(3003))]


@asynccontextmanager
async def network(tmp_path: Path, mqsc_by_name: dict[str, str]) -> AsyncIterator[Network]:
    topo = topology_from_dict(
        {"queue_managers": {name: {"mqsc": text} for name, text in mqsc_by_name.items()}},
        tmp_path,
    )
    net = Network(topo, tmp_path / "data")
    try:
        await net.start()
        yield net
    finally:
        await net.stop()


def forged_stream_support(q_mgr: str, streams: list[str]) -> tuple[MQMD, bytes]:
    """A StreamSupport publication of ``q_mgr`` as a broker delivers it to a
    subscriber: MQRFH Publish on the admin stream, the PCF behind it."""
    msg = stream_support_command(q_mgr, streams)
    md = msg.md
    md.reply_to_q_mgr = q_mgr
    return md, msg.body


async def dead_letters(qm: EmbeddedQueueManager) -> list[int]:
    """The MQDLH reasons of what the DLQ holds for the inter-broker queue (browsed)."""
    out: list[int] = []
    async with await qm.connect() as conn:
        h = await conn.open(DLQ, OpenOption.BROWSE)
        first = True
        while True:
            try:
                m = await h.get(GetOptions(browse=Browse.FIRST if first else Browse.NEXT))
            except MQError as exc:
                assert exc.reason == Reason.NO_MSG_AVAILABLE
                return out
            first = False
            dlh, _, _ = unwrap_from_dlq(m.md, m.body)
            if dlh.dest_q_name.strip() == INTER_BROKER_QUEUE:
                out.append(dlh.reason)


async def drain_queue(qm: EmbeddedQueueManager, q: str) -> int:
    """Get everything on ``q`` (a channel that delivered it); returns the count."""
    n = 0
    async with await qm.connect() as conn:
        h = await conn.open(q, OpenOption.INPUT_SHARED)
        while True:
            try:
                await h.get(GetOptions())
            except MQError:
                return n
            n += 1


async def wait_dead_letters(qm: EmbeddedQueueManager, n: int, timeout: float) -> list[int]:
    """:func:`dead_letters` once ``n`` are committed there (polled, bounded)."""
    async with asyncio.timeout(timeout):
        while len(found := await dead_letters(qm)) < n:
            await asyncio.sleep(0.05)
    return found


def healthz_size(g: Broker) -> int:
    """The bytes of what /healthz shows of the neighbours (``neighbour_status``)."""
    return len(json.dumps(neighbour_status(g.state, 0.0)))


# ------------------------------------------------------------ a channel down ---------


async def test_proxy_commands_for_a_neighbour_whose_channel_is_down_are_not_duplicated(
    tmp_path: Path,
) -> None:
    """B was active, its channel is down: each proxy command for it waits once on the
    transmission queue, however long B stays silent; once the queue was delivered
    and B is heard from again, an unanswered command is sent once more."""
    clock = FakeClock()
    remember_active(tmp_path / "GW", gw("B"), [BULLETIN])
    async with (
        network(tmp_path, {"GW": mqsc("GW", ["A"], down=["B"]), "A": mqsc("A", ["GW"])}) as net,
        broker(net["A"].qm, tmp_path / "A", [gw("GW")]) as a,
        broker(net["GW"].qm, tmp_path / "GW", [gw("A"), gw("B")], clock=clock) as g,
    ):
        await wait_for(lambda: g.link_state("A") == a.link_state("GW") == "active", 20)
        base = g.qm.queue_depth("B")
        n = 40
        await put_commands(g.qm, [regsub(f"flood/{i}", q_mgr="A") for i in range(n)])
        await wait_for(lambda: g.qm.queue_depth("B") - base == n, 20)
        for _ in range(3):
            clock.advance(PAST_RESENDS)
            await g.links.tick()
            assert g.qm.queue_depth("B") - base == n  # not one copy more

        # The channel delivered them (the queue empties) but B never answers: nothing
        # came back, so nothing is sent again yet (only at the longest backoff: see
        # the next test).
        await drain_queue(g.qm, "B")
        clock.advance(PAST_RESENDS)
        await g.links.tick()
        assert g.qm.queue_depth("B") == 0
        # B is heard from again and still has not answered them: sent once more.
        g.links.wake(heard=["B"])
        clock.advance(PAST_RESENDS)
        await g.links.tick()
        assert g.qm.queue_depth("B") == n
        await g.links.tick()
        assert g.qm.queue_depth("B") == n


async def test_an_unanswered_command_to_a_silent_neighbour_is_sent_again_at_the_longest_backoff(
    tmp_path: Path,
) -> None:
    """B's channel delivered GW's proxy commands but the answers were lost, and B sends
    nothing else (it publishes nothing to GW until the proxies are registered): once
    the backoff has reached RESEND_MAX and nothing waits for B, each is sent again
    although B was not heard from: one copy, not more while it waits, and again at
    the longest backoff after that copy went too."""
    clock = FakeClock()
    remember_active(tmp_path / "GW", gw("B"), [BULLETIN])
    async with (
        network(tmp_path, {"GW": mqsc("GW", ["A"], down=["B"]), "A": mqsc("A", ["GW"])}) as net,
        broker(net["A"].qm, tmp_path / "A", [gw("GW")]) as a,
        broker(net["GW"].qm, tmp_path / "GW", [gw("A"), gw("B")], clock=clock) as g,
    ):
        await wait_for(lambda: g.link_state("A") == a.link_state("GW") == "active", 20)
        base = g.qm.queue_depth("B")
        n = 10
        await put_commands(g.qm, [regsub(f"silent/{i}", q_mgr="A") for i in range(n)])
        await wait_for(lambda: g.qm.queue_depth("B") - base == n, 20)
        await drain_queue(g.qm, "B")  # delivered; the answers never come back

        # The backoff doubles from RESEND_AFTER at each look B stays silent, up to
        # RESEND_MAX; the look after that sends them again.
        looks_to_max = math.ceil(math.log2(RESEND_MAX / RESEND_AFTER)) + 1
        looks = 0
        while g.qm.queue_depth("B") == 0 and looks < looks_to_max:
            clock.advance(PAST_RESENDS)
            await g.links.tick()
            looks += 1
        assert g.qm.queue_depth("B") == n, f"not sent again after {looks} looks"
        assert looks > 1  # not at once: B might still answer
        for _ in range(3):
            clock.advance(PAST_RESENDS)
            await g.links.tick()
            assert g.qm.queue_depth("B") == n  # one copy waits: not one more
        await drain_queue(g.qm, "B")
        clock.advance(PAST_RESENDS)
        await g.links.tick()
        assert g.qm.queue_depth("B") == n  # at the longest backoff, every time


# ------------------------------------------------------------ forged StreamSupport ---


async def test_a_stream_support_of_a_queue_manager_that_is_no_neighbour_is_dead_lettered(
    tmp_path: Path,
) -> None:
    async with (
        network(tmp_path, {"GW": mqsc("GW", [])}) as net,
        broker(net["GW"].qm, tmp_path / "GW", []) as g,
    ):
        md, body = forged_stream_support("EVIL", [BULLETIN, "EVIL.STREAM"])
        await put_at(g.qm, INTER_BROKER_QUEUE, md, body)
        assert await wait_dead_letters(g.qm, 1, 10) == [Reason.UNKNOWN_BROKER]
        assert g.links.counters.refused[("", "unknown_broker")] == 1
        assert g.state.neighbour("EVIL") is None
        assert "EVIL.STREAM" not in g.links.supported_streams


async def test_a_forged_stream_support_of_a_neighbour_installs_nothing_invalid_or_unbounded(
    tmp_path: Path,
) -> None:
    """B is configured, its channel down (joining). Forged StreamSupports naming B:
    3,007 names (refused whole: more than max_streams), a short list with an invalid
    name (refused whole), then a valid list with a stream B's accept_streams does not
    take and MQ's own queue (only the accepted stream is kept). Nothing refused is
    activated, kept in neighbours.db, advertised, or shown by /healthz or /metrics."""
    cfg = gw("B", streams=None, accept_streams=["NEWS.*"], max_streams=20)
    async with (
        network(tmp_path, {"GW": mqsc("GW", [], down=["B"])}) as net,
        broker(net["GW"].qm, tmp_path / "GW", [cfg]) as g,
    ):
        await wait_for(lambda: g.link_state("B") == "inactive", 10)
        before = healthz_size(g)
        own = set(g.links.supported_streams)

        for streams in (FLOOD, [BULLETIN, "", "<b>NEWS</b>"]):
            md, body = forged_stream_support("B", streams)
            await put_at(g.qm, INTER_BROKER_QUEUE, md, body)
        refused = [Reason.CFSL_COUNT_ERROR, Reason.STREAM_ERROR]
        assert await wait_dead_letters(g.qm, 2, 10) == refused
        assert g.links.counters.refused[("B", "stream_support_too_many")] == 1
        assert g.links.counters.refused[("B", "stream_support_invalid")] == 1
        row = g.state.neighbour("B")
        assert row is not None and row.learnt_streams is None
        assert "B" not in g.links.active
        assert set(g.links.supported_streams) == own
        assert healthz_size(g) == before, neighbour_status(g.state, 0.0)

        md, body = forged_stream_support(
            "B", ["NEWS.STREAM", "OTHER.STREAM", "SYSTEM.ADMIN.COMMAND.QUEUE", DEFAULT_STREAM]
        )
        await put_at(g.qm, INTER_BROKER_QUEUE, md, body)
        await wait_for(
            lambda: (r := g.state.neighbour("B")) is not None and r.learnt_streams is not None,
            10,
        )
        row = g.state.neighbour("B")
        assert row is not None and row.learnt_streams == ("NEWS.STREAM", DEFAULT_STREAM)
        assert g.links.counters.refused[("B", "stream_not_accepted")] == 2
        assert len(await dead_letters(g.qm)) == 2  # a valid list is taken, not refused
        assert healthz_size(g) < before + 200
        # /metrics: the neighbour series are per known neighbour and per kind.
        families = list(NeighbourCollector(g.links).collect())
        assert sum(len(f.samples) for f in families) < 20


async def test_a_stream_list_an_older_gateway_kept_is_screened_at_start(tmp_path: Path) -> None:
    """neighbours.db holds the 3,007 names a forged StreamSupport installed before
    issue 29: at start they are forgotten, never shared or advertised."""
    remember_active(tmp_path / "GW", gw("B", streams=None), FLOOD)
    async with (
        network(tmp_path, {"GW": mqsc("GW", [], down=["B"])}) as net,
        broker(net["GW"].qm, tmp_path / "GW", [gw("B", streams=None)]) as g,
    ):
        row = g.state.neighbour("B")
        assert row is not None and row.learnt_streams == ()
        assert not any(s.startswith("JUNK.") for s in g.links.supported_streams)
        assert g.links.active["B"].streams == {DEFAULT_STREAM}
    state = NeighbourState(tmp_path / "GW" / "neighbours.db")
    try:
        row = state.neighbour("B")
        assert row is not None and row.learnt_streams == ()
    finally:
        state.close()


# ------------------------------------------------------------ junk -------------------


async def test_junk_on_the_inter_broker_queue_is_dead_lettered_and_logged_in_summary(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    n = 300
    caplog.set_level(logging.INFO, logger="gateway.runtime.neighbours.links")
    async with (
        network(tmp_path, {"GW": mqsc("GW", [])}) as net,
        broker(net["GW"].qm, tmp_path / "GW", []) as g,
    ):
        async with await g.qm.connect() as conn:
            for i in range(n):
                fmt = FMT_STRING if i % 2 else FMT_RF_HEADER  # text, and a broken MQRFH
                await conn.put1(INTER_BROKER_QUEUE, MQMD(format=fmt), b"junk %d" % i)
        assert await wait_dead_letters(g.qm, n, 30) == [Reason.FORMAT_ERROR] * n
        assert g.links.counters.refused[("", "not_pubsub")] == n
    lines = [r for r in caplog.records if "no pub/sub message" in r.getMessage()]
    # the first one whole, then (at stop at the latest) one line with the count
    assert 1 <= len(lines) <= 2, [r.getMessage() for r in lines]
    assert any(f"{n - 1} more like this" in r.getMessage() for r in caplog.records)
