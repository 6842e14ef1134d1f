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
from gateway.runtime.neighbours.links import READ_RETRY_MAX, READ_RETRY_PAUSE
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


async def put_junk(qm: EmbeddedQueueManager, n: int) -> None:
    """``n`` messages that are no pub/sub message on the inter-broker queue."""
    async with await qm.connect() as conn:
        for i in range(n):
            await conn.put1(INTER_BROKER_QUEUE, MQMD(format=FMT_STRING), b"junk %d" % i)


def stall_bound(threshold: int) -> float:
    """The longest one message the DLQ cannot take holds up the inter-broker queue:
    a failed unit per get until BOTHRESH, each followed by the reader's pause."""
    return sum(min(READ_RETRY_MAX, READ_RETRY_PAUSE * 2**i) for i in range(threshold)) + 0.5


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


async def counted(g: Broker, key: tuple[str, str], n: int) -> None:
    """Assert ``g`` counted ``n`` refusals of ``key``: counted once its unit committed,
    just after the DLQ shows it (polled, bounded)."""
    await wait_for(lambda: g.links.counters.refused[key] >= n, 5)
    assert g.links.counters.refused[key] == n


def commands_for(g: Broker, q_mgr: str) -> int:
    """How many proxy commands ``g``'s rows for ``q_mgr`` were put as (a command may
    carry several topics: its rows share its MsgId)."""
    return len({p.msg_id for p in g.state.proxies(q_mgr)})


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
        # the n proxies travel as a few commands of several topics (one per sync)
        await wait_for(lambda: len(g.state.proxies("B")) == n
                       and g.qm.queue_depth("B") - base == commands_for(g, "B"), 20)
        c = commands_for(g, "B")
        assert c < n
        for _ in range(3):
            clock.advance(PAST_RESENDS)
            await g.links.tick()
            assert g.qm.queue_depth("B") - base == c  # not one copy more

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
        assert g.qm.queue_depth("B") == c
        await g.links.tick()
        assert g.qm.queue_depth("B") == c
        assert commands_for(g, "B") == c  # the same commands, every topic in one of them


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
        sent = g.links.counters.commands[("B", "sent")]
        n = 10
        await put_commands(g.qm, [regsub(f"silent/{i}", q_mgr="A") for i in range(n)])
        # counted once their unit is committed (the depth counts them before); the n
        # proxies travel as a few commands of several topics (one per sync)
        await wait_for(lambda: len(g.state.proxies("B")) == n and
                       g.links.counters.commands[("B", "sent")] - sent == commands_for(g, "B"),
                       20)
        c = commands_for(g, "B")
        await drain_queue(g.qm, "B")  # delivered; the answers never come back
        assert g.qm.queue_depth("B") == 0

        # The backoff doubles from RESEND_AFTER at each look B stays silent, up to
        # RESEND_MAX; the look after that sends them again.
        looks_to_max = math.ceil(math.log2(RESEND_MAX / RESEND_AFTER)) + 1
        looks = 0
        while g.qm.queue_depth("B") == 0 and looks < looks_to_max:
            clock.advance(PAST_RESENDS)
            await g.links.tick()
            looks += 1
        assert g.qm.queue_depth("B") == c, f"not sent again after {looks} looks"
        assert looks > 1  # not at once: B might still answer
        for _ in range(3):
            clock.advance(PAST_RESENDS)
            await g.links.tick()
            assert g.qm.queue_depth("B") == c  # one copy waits: not one more
        await drain_queue(g.qm, "B")
        clock.advance(PAST_RESENDS)
        await g.links.tick()
        assert g.qm.queue_depth("B") == c  # at the longest backoff, every time
        assert commands_for(g, "B") == c


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
        await counted(g, ("", "unknown_broker"), 1)
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
        await counted(g, ("B", "stream_support_too_many"), 1)
        await counted(g, ("B", "stream_support_invalid"), 1)
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
        await counted(g, ("B", "stream_not_accepted"), 2)
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


async def test_a_remembered_list_longer_than_max_streams_is_forgotten_with_a_warning_saying_so(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """An upgrade: neighbours.db remembers more valid, accepted streams of B than its
    max_streams. They are forgotten (only the default stream is shared), and the
    warning says why and what to set, not that they were invalid."""
    caplog.set_level(logging.WARNING, logger="gateway.runtime.neighbours.links")
    cfg = gw("B", streams=None, max_streams=3)
    remember_active(tmp_path / "GW", cfg, [f"S{i}.STREAM" for i in range(5)])
    async with (
        network(tmp_path, {"GW": mqsc("GW", [], down=["B"])}) as net,
        broker(net["GW"].qm, tmp_path / "GW", [cfg]) as g,
    ):
        row = g.state.neighbour("B")
        assert row is not None and row.learnt_streams == ()
        assert g.links.active["B"].streams == {DEFAULT_STREAM}
    (line,) = [r.getMessage() for r in caplog.records if "remembered" in r.getMessage()]
    assert "more than its max_streams (3)" in line and "Upgrading" in line, line


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
        await counted(g, ("", "not_pubsub"), n)
    lines = [r for r in caplog.records if "no pub/sub message" in r.getMessage()]
    # the first one whole, then (at stop at the latest) one line with the count
    assert 1 <= len(lines) <= 2, [r.getMessage() for r in lines]
    assert any(f"{n - 1} more like this" in r.getMessage() for r in caplog.records)


# ------------------------------------------------------------ a DLQ that takes nothing


async def test_junk_the_dead_letter_queue_cannot_take_does_not_stall_the_links(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """GW's dead-letter queue is put-inhibited and junk waits on its inter-broker queue
    (BOTHRESH 3, no BOQNAME) when it joins the neighbour A. Each junk message is tried
    up to BOTHRESH times, then discarded (counted once, logged in summary), and A's
    answer behind it is handled: A becomes active within a bound derived from BOTHRESH."""
    caplog.set_level(logging.INFO, logger="gateway.runtime.neighbours.links")
    threshold, n = 3, 6
    gw_mqsc = mqsc("GW", ["A"]) + f"DEFINE QLOCAL({INTER_BROKER_QUEUE}) BOTHRESH({threshold})\n"
    async with network(tmp_path, {"GW": gw_mqsc, "A": mqsc("A", ["GW"])}) as net:
        net["GW"].qm.run_mqsc(f"ALTER QLOCAL({DLQ}) PUT(DISABLED)", stop_on_error=True)
        await put_junk(net["GW"].qm, n)
        loop = asyncio.get_running_loop()
        async with (
            broker(net["A"].qm, tmp_path / "A", []),
            broker(net["GW"].qm, tmp_path / "GW", [gw("A")]) as g,
        ):
            started = loop.time()
            # the join and its answer take well under 20 s (the other tests' bound)
            await wait_for(lambda: g.link_state("A") == "active", 20 + n * stall_bound(threshold))
            took = loop.time() - started
            assert g.links.counters.refused[("", "discarded")] == n  # the junk went first
            assert g.links.counters.refused[("", "not_pubsub")] == 0  # never dead-lettered
    print(f"{n} junk messages (BOTHRESH {threshold}) before A's answer: active after {took:.2f} s")
    lines = [r.getMessage() for r in caplog.records if "discarded" in r.getMessage()]
    assert 1 <= len(lines) <= 2, lines  # the first whole, then the count
    assert any(f"{n - 1} more like this" in line for line in lines), lines


async def test_junk_backed_out_to_bothresh_is_moved_to_the_backout_queue(tmp_path: Path) -> None:
    """With a BOQNAME, junk the put-inhibited dead-letter queue cannot take is moved
    there as is once backed out BOTHRESH times, and the queue moves on."""
    threshold, n = 2, 3
    gw_mqsc = (
        mqsc("GW", [])
        + "DEFINE QLOCAL(IBC.BACKOUT)\n"
        + f"DEFINE QLOCAL({INTER_BROKER_QUEUE}) BOTHRESH({threshold}) BOQNAME(IBC.BACKOUT)\n"
    )
    async with network(tmp_path, {"GW": gw_mqsc}) as net:
        net["GW"].qm.run_mqsc(f"ALTER QLOCAL({DLQ}) PUT(DISABLED)", stop_on_error=True)
        await put_junk(net["GW"].qm, n)
        async with broker(net["GW"].qm, tmp_path / "GW", []) as g:
            await wait_for(
                lambda: g.links.counters.refused[("", "backed_out")] == n,
                5 + n * stall_bound(threshold),
            )
            assert g.qm.queue_depth("IBC.BACKOUT") == n
            assert g.qm.queue_depth(INTER_BROKER_QUEUE) == 0
            assert g.links.counters.refused[("", "not_pubsub")] == 0
            assert g.links.counters.refused[("", "discarded")] == 0
        async with await net["GW"].qm.connect() as conn:
            h = await conn.open("IBC.BACKOUT", OpenOption.INPUT_SHARED)
            bodies = {(await h.get(GetOptions())).body for _ in range(n)}
        assert bodies == {b"junk %d" % i for i in range(n)}


async def test_a_refusal_is_counted_once_however_often_its_dead_letter_failed(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The DLQ refuses the first tries of a junk message's dead-letter put, then takes
    it: the message is dead-lettered once and counted once, not once per get."""
    caplog.set_level(logging.INFO, logger="gateway.runtime.neighbours.links")
    gw_mqsc = mqsc("GW", []) + f"DEFINE QLOCAL({INTER_BROKER_QUEUE}) BOTHRESH(50)\n"
    async with network(tmp_path, {"GW": gw_mqsc}) as net:
        qm = net["GW"].qm
        qm.run_mqsc(f"ALTER QLOCAL({DLQ}) PUT(DISABLED)", stop_on_error=True)
        async with broker(qm, tmp_path / "GW", []) as g:
            await put_junk(qm, 1)
            await wait_for(lambda: "cannot dead-letter" in caplog.text, 10)
            qm.run_mqsc(f"ALTER QLOCAL({DLQ}) PUT(ENABLED)", stop_on_error=True)
            assert await wait_dead_letters(qm, 1, 10) == [Reason.FORMAT_ERROR]
            await wait_for(lambda: g.links.counters.refused[("", "not_pubsub")] > 0, 5)
            await g.links.tick()  # one more round of the links: nothing more counted
            assert g.links.counters.refused == {("", "not_pubsub"): 1}
