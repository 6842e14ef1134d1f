"""Direct hand-over to an idle sink (issue 16, latency pass): when a sink's forwarder is
idle and its backlog queue empty, the stream batch sends the deliveries to the sink
itself and skips the backlog put only if the sink acknowledged before the commit.

Checked from outside: publications put by an MQ client on the stream queue, arrival
read from the memory plugin's bus (or its record file after a crash), the backlog and
stream queues' depths read from the queue manager.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

from gateway.mq.port import Browse, GetOptions, OpenOption, PutOptions
from gateway.plugin_api import Envelope, PluginError
from gateway.runtime.backlog_format import backlog_queue_name
from gateway.runtime.pubsub_service.sink_backlogs import HandOver
from plugins.memory import MemoryConfig, MemoryInstance, get_bus, reset_buses
from tests.support.gateway import (
    BULLETIN,
    STOCK,
    InProcessGateway,
    bridge_config,
    build_gateway,
)
from tests.support.pubsub_messages import rfh_message
from tests.support.service_client import settle

STOCK_ALL = f"$SYS/STREAM/{STOCK}/#"
CHILD = Path(__file__).with_name("direct_crash_child.py")


def _memory(name: str, record_file: Path | None = None) -> MemoryInstance:
    cfg: dict[str, Any] = {"subscribe": [STOCK_ALL], "bus": name}
    if record_file is not None:
        cfg["record_file"] = str(record_file)
    return MemoryInstance(name, MemoryConfig.model_validate(cfg))


def _before_send(inst: MemoryInstance, wait: Callable[[], Awaitable[object]]) -> MemoryInstance:
    """``inst``, each send awaiting ``wait()`` first (a sink slow to acknowledge)."""
    send = inst.send

    async def delayed_send(envelopes: Sequence[Envelope]) -> None:
        await wait()
        await send(envelopes)

    inst.send = delayed_send  # type: ignore[method-assign]
    return inst


def _delayed(inst: MemoryInstance, seconds: float) -> MemoryInstance:
    """``inst``, each send taking ``seconds`` longer."""
    return _before_send(inst, lambda: asyncio.sleep(seconds))


def _gateway(path: Path) -> InProcessGateway:
    return build_gateway(path, config=bridge_config(retry_delay=0.01, sink_retry_max_delay=0.1))


async def _publish(gw: InProcessGateway, payloads: Sequence[bytes]) -> None:
    conn = await gw.qm.connect()
    try:
        stream = await conn.open(STOCK, OpenOption.OUTPUT)
        for i, payload in enumerate(payloads):
            msg = rfh_message(STOCK, [("MQPSCommand", "Publish"), ("MQPSTopic", f"T{i}")], payload)
            await stream.put(msg.md, msg.body, PutOptions(syncpoint=True))
        await conn.commit()
    finally:
        await conn.disconnect()


def _count_backlog_puts(gw: InProcessGateway) -> list[int]:
    """Counts every backlog put the service makes (wraps the instance's put_of)."""
    calls = [0]
    backlogs = gw.service.sink_backlogs
    original = backlogs.put_of

    def counted(*args: Any) -> Any:
        calls[0] += 1
        return original(*args)

    backlogs.put_of = counted  # type: ignore[method-assign]
    return calls


def _first_seen(payloads: Sequence[bytes]) -> list[bytes]:
    seen: list[bytes] = []
    for p in payloads:
        if p not in seen:
            seen.append(p)
    return seen


async def test_an_idle_sink_gets_the_deliveries_directly_without_a_backlog_put(
    tmp_path: Path,
) -> None:
    reset_buses()
    gw = _gateway(tmp_path)
    puts = _count_backlog_puts(gw)
    await gw.start(_memory("fast"))
    try:
        payloads = [f"m{i}".encode() for i in range(20)]
        for i in range(0, 20, 5):  # several units of work, so several batches
            await _publish(gw, payloads[i : i + 5])
            await settle(gw.qm, gw.service)
        records = await get_bus("fast").wait_for(20)
        assert [r.payload for r in records] == payloads  # once each, in order
        fw = gw.service.sink_backlogs.forwarders["fast"]
        assert fw.counters.direct == 20
        assert fw.counters.delivered == 20
        assert puts[0] == 0
        assert gw.qm.queue_depth(backlog_queue_name("fast")) == 0
        assert gw.qm.queue_depth(STOCK) == 0
    finally:
        await gw.close()
        reset_buses()


async def test_a_slow_acknowledgement_goes_through_the_backlog_in_order(tmp_path: Path) -> None:
    """No acknowledgement within the wait: the deliveries are put on the backlog in the
    same unit of work; the forwarder waits for the slow send to end and, as it ended
    acknowledged, takes those copies off the backlog unsent: the sink sees each
    publication once, in the stream's order (a slow sink is not a failure, so no
    duplicate); the next deliveries take the backlog (no hand-over to a sink that was
    just slow)."""
    reset_buses()
    gw = _gateway(tmp_path)
    gw.service.sink_backlogs.direct_ack_timeout = 0.02
    puts = _count_backlog_puts(gw)
    inst = _memory("slow")
    send = inst.send
    slow = [True]

    async def slow_send(envelopes: Sequence[Envelope]) -> None:
        if slow[0]:
            slow[0] = False
            await asyncio.sleep(0.3)
        await send(envelopes)

    inst.send = slow_send  # type: ignore[method-assign]
    await gw.start(inst)
    try:
        first = [b"a", b"b", b"c"]
        await _publish(gw, first)
        await asyncio.sleep(0.05)  # the first batch is committed with its backlog puts
        await _publish(gw, [b"d", b"e"])
        await get_bus("slow").wait_for(5)
        await settle(gw.qm, gw.service)
        await asyncio.sleep(0.2)  # a duplicate would arrive here
        got = [r.payload for r in get_bus("slow").records]
        assert got == [b"a", b"b", b"c", b"d", b"e"]  # once each, in order
        fw = gw.service.sink_backlogs.forwarders["slow"]
        # the slow hand-over's three, acknowledged late: their copies were taken off
        # the backlog unsent; d and e went through the backlog (no hand-over for a while)
        assert fw.counters.direct == 3
        assert fw.counters.delivered == 5
        assert puts[0] == 5
        assert gw.qm.queue_depth(backlog_queue_name("slow")) == 0
        assert gw.qm.queue_depth(STOCK) == 0
    finally:
        await gw.close()
        reset_buses()


@pytest.mark.parametrize("per_delivery", [0.01, 0.0])
async def test_a_large_hand_over_waits_in_proportion_to_its_size(
    tmp_path: Path, per_delivery: float
) -> None:
    """The wait for a hand-over's acknowledgement grows with the deliveries handed over
    (a batch of 256 to Kafka takes longer than a batch of 3): 20 deliveries whose send
    takes 0.1 s are acknowledged in time with 10 ms each on top of a 20 ms wait, with
    no backlog put; without the allowance the same send is late and takes the backlog."""
    reset_buses()
    gw = _gateway(tmp_path)
    backlogs = gw.service.sink_backlogs
    backlogs.direct_ack_timeout = 0.02
    backlogs.direct_ack_per_delivery = per_delivery
    puts = _count_backlog_puts(gw)
    await gw.start(_delayed(_memory("big"), 0.1))
    try:
        payloads = [f"b{i}".encode() for i in range(20)]
        await _publish(gw, payloads)  # one unit of work: one batch of 20
        records = await get_bus("big").wait_for(20)
        await settle(gw.qm, gw.service)
        await asyncio.sleep(0.2)  # a duplicate would arrive here
        assert [r.payload for r in get_bus("big").records] == payloads
        fw = backlogs.forwarders["big"]
        assert len(records) == 20 and fw.counters.delivered == 20
        if per_delivery:
            assert (fw.counters.direct, puts[0]) == (20, 0)
        else:
            # late: the copies were put and, the send ending acknowledged, taken off unsent
            assert (fw.counters.direct, puts[0]) == (20, 20)
        assert gw.qm.queue_depth(backlog_queue_name("big")) == 0
    finally:
        await gw.close()
        reset_buses()


async def test_the_wait_is_capped_and_the_pause_doubles_then_resets(tmp_path: Path) -> None:
    """``ack_wait`` is the base plus the allowance of the largest hand-over, at most
    ``direct_ack_max``; each late hand-over in a row doubles the pause without hand-over
    (0.5 s, 1 s, ... up to 5 s) and one acknowledged in time resets it."""
    reset_buses()
    gw = _gateway(tmp_path)
    await gw.start(_memory("timing"))
    try:
        backlogs = gw.service.sink_backlogs
        fw = backlogs.forwarders["timing"]

        def handover(n: int) -> HandOver:
            return HandOver("timing", [None] * n, [], fw, None)  # type: ignore[list-item,arg-type]

        assert backlogs.ack_wait([handover(3), handover(200)]) == pytest.approx(0.05 + 0.2)
        assert backlogs.ack_wait([handover(5000)]) == pytest.approx(0.3)
        assert backlogs.ack_wait([]) == pytest.approx(0.05)
        pauses = [fw.pause_direct_after_miss(0.5, 5.0) for _ in range(6)]
        assert pauses == [0.5, 1.0, 2.0, 4.0, 5.0, 5.0]
        assert not fw.idle  # paused
        fw.direct_in_time()
        assert fw.pause_direct_after_miss(0.5, 5.0) == 0.5
        fw.pause_direct(0)
        assert fw.idle
    finally:
        await gw.close()
        reset_buses()


async def test_late_hand_overs_in_a_row_pause_longer_and_one_in_time_resets(
    tmp_path: Path,
) -> None:
    """Through ``settle``: a late hand-over pauses hand-overs to that sink for
    ``direct_pause_min``, a second late one in a row for twice that, and one acknowledged
    in time makes the next miss pause the shortest again; while paused the deliveries
    take the backlog. Each sink sees every publication once, in order."""
    reset_buses()
    gw = _gateway(tmp_path)
    backlogs = gw.service.sink_backlogs
    backlogs.direct_ack_timeout = 0.02
    backlogs.direct_ack_per_delivery = 0.0
    backlogs.direct_pause_min = 0.3
    puts = _count_backlog_puts(gw)
    inst = _memory("moody")
    send = inst.send
    async def moody_send(envelopes: Sequence[Envelope]) -> None:
        if any(e.payload in (b"a", b"c") for e in envelopes):  # the late hand-overs
            await asyncio.sleep(0.1)
        await send(envelopes)

    inst.send = moody_send  # type: ignore[method-assign]
    await gw.start(inst)
    fw = backlogs.forwarders["moody"]
    bus = get_bus("moody")

    def paused_for() -> float:
        return fw._no_direct_until - time.monotonic()

    try:
        await _publish(gw, [b"a"])  # hand-over, late: paused 0.3 s
        await bus.wait_for(1)
        await settle(gw.qm, gw.service)
        assert 0.0 < paused_for() <= 0.3
        await _publish(gw, [b"b"])  # paused: the backlog
        await bus.wait_for(2)
        await settle(gw.qm, gw.service)
        assert (fw.counters.direct, puts[0]) == (1, 2)
        await asyncio.sleep(max(paused_for(), 0) + 0.05)
        await _publish(gw, [b"c"])  # hand-over again, late again: paused 0.6 s
        await bus.wait_for(3)
        await settle(gw.qm, gw.service)
        assert 0.3 < paused_for() <= 0.6
        assert (fw.counters.direct, puts[0]) == (2, 3)
        await asyncio.sleep(max(paused_for(), 0) + 0.05)
        await _publish(gw, [b"d"])  # in time: no backlog put, the misses forgotten
        await bus.wait_for(4)
        await settle(gw.qm, gw.service)
        assert (fw.counters.direct, puts[0]) == (3, 3)
        assert fw.pause_direct_after_miss(0.3, 5.0) == 0.3
        await asyncio.sleep(0.2)  # a duplicate would arrive here
        assert [r.payload for r in bus.records] == [b"a", b"b", b"c", b"d"]
    finally:
        await gw.close()
        reset_buses()


@pytest.mark.parametrize("other_waiting", [True, False])
async def test_the_long_wait_is_cut_while_another_serviced_queue_holds_messages(
    tmp_path: Path, other_waiting: bool
) -> None:
    """The wait for a hand-over holds the service's lock: past ``direct_ack_timeout`` it
    goes on only while no other serviced queue has messages (review 19b, F1). A send
    of 0.15 s with a 20 ms wait and a large allowance: in time when the other stream is
    empty; with a message waiting on it (here an uncommitted put, which its depth
    counts) the wait stops at 20 ms and the deliveries take the backlog (taken off
    unsent when the send ends acknowledged). Once each, in order, either way."""
    reset_buses()
    gw = _gateway(tmp_path)
    backlogs = gw.service.sink_backlogs
    backlogs.direct_ack_timeout = 0.02
    backlogs.direct_ack_per_delivery = 0.2
    puts = _count_backlog_puts(gw)
    await gw.start(_delayed(_memory("fair"), 0.15))
    other = await gw.qm.connect()
    try:
        if other_waiting:
            bulletin = await other.open(BULLETIN, OpenOption.OUTPUT)
            msg = rfh_message(BULLETIN, [("MQPSCommand", "Publish"), ("MQPSTopic", "x")], b"o")
            await bulletin.put(msg.md, msg.body, PutOptions(syncpoint=True))
        started = time.monotonic()
        await _publish(gw, [b"1", b"2"])
        records = await get_bus("fair").wait_for(2)
        deadline = time.monotonic() + 10
        while gw.qm.queue_depth(STOCK) and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        assert gw.qm.queue_depth(STOCK) == 0, "the batch did not commit"
        fw = backlogs.forwarders["fair"]
        await asyncio.sleep(0.2)  # a duplicate would arrive here
        assert [r.payload for r in get_bus("fair").records] == [b"1", b"2"] == [
            r.payload for r in records
        ]
        assert fw.counters.direct == 2
        assert puts[0] == (2 if other_waiting else 0)
        assert time.monotonic() - started < 5
    finally:
        await other.backout()
        await other.disconnect()
        await gw.close()
        reset_buses()


async def _start_with_a_held_send(
    path: Path, name: str, *, then_fail: bool = False
) -> tuple[InProcessGateway, asyncio.Event, asyncio.Event]:
    """A started gateway whose sink ``name`` holds each send until ``release`` is set
    (then fails it retriably if ``then_fail``); the hand-over wait is 20 s, so only a
    stop ends it. Returns the gateway, ``sending`` (set once a send is held) and
    ``release``."""
    reset_buses()
    gw = _gateway(path)
    backlogs = gw.service.sink_backlogs
    backlogs.direct_ack_timeout = backlogs.direct_ack_max = 20.0
    sending, release = asyncio.Event(), asyncio.Event()

    async def held() -> None:
        sending.set()
        await release.wait()
        if then_fail:
            raise PluginError("target went away", retriable=True)

    await gw.start(_before_send(_memory(name), held))
    return gw, sending, release


async def test_a_stop_ends_the_wait_for_a_hand_over_and_loses_nothing(tmp_path: Path) -> None:
    """A stop during the wait for a slow sink's acknowledgement ends the stream batch's
    wait at once (the wait holds the service's lock; a stop must not sit out the
    allowance, here 20 s): the unsettled deliveries take the backlog in the batch's unit
    of work, which commits. The forwarder still lets the sink's send end (its outcome
    decides whether the backlog copies go out), and since the sink then acknowledges,
    the copies are taken off unsent: the sink has each publication once."""
    gw, sending, release = await _start_with_a_held_send(tmp_path, "slowstop")
    backlog = backlog_queue_name("slowstop")
    stop: asyncio.Task[None] | None = None
    try:
        await _publish(gw, [b"1", b"2"])
        await asyncio.wait_for(sending.wait(), 10)
        await asyncio.sleep(0.1)  # the batch now waits in settle
        assert gw.qm.queue_depth(STOCK) == 2 and gw.qm.queue_depth(backlog) == 0
        started = time.monotonic()
        stop = asyncio.create_task(gw.service.stop())
        while time.monotonic() - started < 10 and gw.qm.queue_depth(STOCK):
            await asyncio.sleep(0.01)
        waited = time.monotonic() - started
        assert gw.qm.queue_depth(STOCK) == 0, "the stream batch did not commit"
        assert waited < 5, f"the stream batch waited {waited:.1f} s after the stop"
        assert gw.qm.queue_depth(backlog) == 2  # the copies, nothing lost
        release.set()
        await asyncio.wait_for(stop, 10)
        stop = None
        assert gw.qm.queue_depth(backlog) == 0  # acknowledged: taken off unsent
        assert [r.payload for r in get_bus("slowstop").records] == [b"1", b"2"]
    finally:
        release.set()
        if stop is not None:
            await stop
        await gw.close()
        reset_buses()


def _keep_between_gets(gw: InProcessGateway, name: str) -> list[bool]:
    """Once the returned flag is raised, sink ``name``'s forwarder gets nothing more, as
    if each get found the backlog empty (the race behind a CI failure: its last get
    ended empty just as the stop came). Its gets wait 1 ms, so 0.1 s after the flag
    none is in progress."""
    fw = gw.service.sink_backlogs.forwarders[name]
    fw.wait_ms = 1
    between_gets = [False]
    forward = fw.forward_batch

    async def forward_unless_between_gets(*args: Any) -> int:
        if between_gets[0]:
            return 0
        return await forward(*args)

    fw.forward_batch = forward_unless_between_gets  # type: ignore[method-assign]
    return between_gets


async def _stop_while_the_forwarder_is_between_gets(
    gw: InProcessGateway, name: str, sending: asyncio.Event, stops: int = 1
) -> asyncio.Future[Any]:
    """Publish two messages, then stop the service (``stops`` calls at once) while
    their hand-over is held and the forwarder is between gets
    (:func:`_keep_between_gets`): the stream batch commits the copies, the forwarder
    never gets them. Returns the stop, still waiting for the held send."""
    between_gets = _keep_between_gets(gw, name)
    await _publish(gw, [b"1", b"2"])
    await asyncio.wait_for(sending.wait(), 10)
    between_gets[0] = True
    await asyncio.sleep(0.1)
    calls = [asyncio.create_task(gw.service.stop()) for _ in range(stops)]
    stop = asyncio.gather(*calls)
    for _ in range(1000):
        if not gw.qm.queue_depth(STOCK):
            break
        await asyncio.sleep(0.01)
    assert gw.qm.queue_depth(STOCK) == 0, "the stream batch did not commit"
    assert gw.qm.queue_depth(backlog_queue_name(name)) == 2  # the copies, nothing lost
    # every stop waits for the held send (a later call waits for the first), so none
    # returns to a caller that would stop the plugins under it
    await asyncio.sleep(0.1)
    assert not any(call.done() for call in calls)
    return stop


@pytest.mark.parametrize("stops", [1, 2])
async def test_a_stop_takes_acknowledged_copies_off_even_when_the_forwarder_stopped_first(
    tmp_path: Path, stops: int
) -> None:
    """The forwarder stopped before it got the copies of a hand-over still sending: the
    service, after its last commit, waits for that send and, acknowledged, takes the
    copies off the backlog, so the next start sends nothing twice. Two stops at once
    (``stops=2``): the second waits for the first, which alone takes copies off."""
    gw, sending, release = await _start_with_a_held_send(tmp_path, "stopfirst")
    fw = gw.service.sink_backlogs.forwarders["stopfirst"]
    stop: asyncio.Future[Any] | None = None
    try:
        stop = await _stop_while_the_forwarder_is_between_gets(gw, "stopfirst", sending, stops)
        release.set()
        await asyncio.wait_for(stop, 10)
        stop = None
        assert gw.qm.queue_depth(backlog_queue_name("stopfirst")) == 0
        assert [r.payload for r in get_bus("stopfirst").records] == [b"1", b"2"]
        assert (fw.counters.delivered, fw.counters.direct) == (2, 2)
    finally:
        release.set()
        if stop is not None:
            await stop
        await gw.close()
        reset_buses()


async def test_a_send_unacknowledged_at_the_stop_leaves_its_copies_for_the_next_start(
    tmp_path: Path,
) -> None:
    """A hand-over still unacknowledged ``stop_settle_timeout`` after the last commit:
    the stop ends anyway and the copies stay on the backlog; the next start sends
    them (the sink may now have them twice: at-least-once, never a loss)."""
    gw, sending, release = await _start_with_a_held_send(tmp_path, "stuck")
    gw.service.sink_backlogs.stop_settle_timeout = 0.3
    try:
        stop = await _stop_while_the_forwarder_is_between_gets(gw, "stuck", sending)
        started = time.monotonic()
        await asyncio.wait_for(stop, 10)
        assert time.monotonic() - started < 2  # stop_settle_timeout, not the default 5 s
        assert gw.qm.queue_depth(backlog_queue_name("stuck")) == 2
    finally:
        release.set()
        await gw.close()
    reset_buses()  # what the released send delivered is not the next start's
    again = _gateway(tmp_path)
    await again.start(_memory("stuck"))
    try:
        records = await get_bus("stuck").wait_for(2)
        assert [r.payload for r in records] == [b"1", b"2"]
        await settle(again.qm, again.service)
        assert again.qm.queue_depth(backlog_queue_name("stuck")) == 0
    finally:
        await again.close()
        reset_buses()


async def test_a_send_that_fails_during_the_stop_keeps_its_copies(tmp_path: Path) -> None:
    """The held hand-over fails after the stop's last commit: its copies stay on the
    backlog (taking them off would lose the publications) and the next start sends
    them."""
    gw, sending, release = await _start_with_a_held_send(tmp_path, "failstop", then_fail=True)
    try:
        stop = await _stop_while_the_forwarder_is_between_gets(gw, "failstop", sending)
        release.set()
        await asyncio.wait_for(stop, 10)
        assert gw.qm.queue_depth(backlog_queue_name("failstop")) == 2
        assert get_bus("failstop").records == []
    finally:
        release.set()
        await gw.close()
    again = _gateway(tmp_path)
    await again.start(_memory("failstop"))
    try:
        records = await get_bus("failstop").wait_for(2)
        assert [r.payload for r in records] == [b"1", b"2"]
    finally:
        await again.close()
        reset_buses()


async def test_a_stop_takes_off_copies_the_forwarder_knew_acknowledged_but_had_not_committed(
    tmp_path: Path,
) -> None:
    """Copies the forwarder had found acknowledged (its hand-over ended in time for
    it) and then did not commit away, its batch backed out at the stop: the stop takes
    exactly those off. White-box: the forwarder's record of them is set directly."""
    reset_buses()
    gw = _gateway(tmp_path)
    gw.service.sink_backlogs.direct_ack_timeout = 0  # everything through the backlog
    await gw.start(_memory("knew"))
    fw = gw.service.sink_backlogs.forwarders["knew"]
    between_gets = _keep_between_gets(gw, "knew")
    between_gets[0] = True
    backlog = backlog_queue_name("knew")
    try:
        await asyncio.sleep(0.1)
        await _publish(gw, [b"a", b"b", b"c"])
        for _ in range(1000):  # the stream batch committed
            if gw.qm.queue_depth(STOCK) == 0 and gw.qm.queue_depth(backlog) == 3:
                break
            await asyncio.sleep(0.01)
        assert (gw.qm.queue_depth(STOCK), gw.qm.queue_depth(backlog)) == (0, 3)
        conn = await gw.qm.connect()
        try:
            handle = await conn.open(backlog, OpenOption.BROWSE)
            ids = [(await handle.get(GetOptions(browse=Browse.FIRST))).md.msg_id]
            ids.append((await handle.get(GetOptions(browse=Browse.NEXT))).md.msg_id)
        finally:
            await conn.disconnect()
        fw._acked_copies.update([*ids, b"never put".ljust(24, b"\0")])
        await gw.service.stop()
        assert gw.qm.queue_depth(backlog) == 1
        assert (fw.counters.delivered, fw.counters.direct) == (2, 2)
        assert get_bus("knew").records == []
    finally:
        await gw.close()
        reset_buses()


async def test_a_failed_direct_send_is_retried_from_the_backlog(tmp_path: Path) -> None:
    """The sink fails the hand-over (retriably): the deliveries are on the backlog and
    the forwarder delivers them once the sink is back; nothing is lost."""
    reset_buses()
    gw = _gateway(tmp_path)
    puts = _count_backlog_puts(gw)
    inst = _memory("flaky")
    send = inst.send
    fails = [1]

    async def flaky_send(envelopes: Sequence[Envelope]) -> None:
        if fails[0]:
            fails[0] -= 1
            raise PluginError("flaky", retriable=True)
        await send(envelopes)

    inst.send = flaky_send  # type: ignore[method-assign]
    await gw.start(inst)
    try:
        await _publish(gw, [b"x", b"y"])
        records = await get_bus("flaky").wait_for(2)
        await settle(gw.qm, gw.service)
        assert [r.payload for r in records] == [b"x", b"y"]
        assert puts[0] == 2
        fw = gw.service.sink_backlogs.forwarders["flaky"]
        assert fw.counters.direct == 0
        assert fw.counters.delivered == 2
        assert gw.qm.queue_depth(backlog_queue_name("flaky")) == 0
    finally:
        await gw.close()
        reset_buses()


async def test_no_direct_hand_over_while_the_backlog_holds_deliveries(tmp_path: Path) -> None:
    """A backlog that is not empty (the sink was down) keeps the backlog path, so what
    waited there is not overtaken by newer deliveries."""
    reset_buses()
    gw = _gateway(tmp_path)
    bus = get_bus("late")
    bus.down = True
    await gw.start(_memory("late"))
    try:
        await _publish(gw, [b"1", b"2"])
        deadline = time.monotonic() + 10
        while gw.qm.queue_depth(backlog_queue_name("late")) < 2 and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        assert gw.qm.queue_depth(backlog_queue_name("late")) == 2
        await _publish(gw, [b"3"])
        await asyncio.sleep(0.1)
        bus.down = False
        records = await bus.wait_for(3)
        await settle(gw.qm, gw.service)
        assert [r.payload for r in records] == [b"1", b"2", b"3"]
        assert gw.service.sink_backlogs.forwarders["late"].counters.direct == 0
    finally:
        await gw.close()
        reset_buses()


async def test_disabled_hand_over_puts_everything_on_the_backlog(tmp_path: Path) -> None:
    reset_buses()
    gw = _gateway(tmp_path)
    gw.service.sink_backlogs.direct_ack_timeout = 0
    puts = _count_backlog_puts(gw)
    await gw.start(_memory("plain"))
    try:
        await _publish(gw, [b"p", b"q"])
        records = await get_bus("plain").wait_for(2)
        assert [r.payload for r in records] == [b"p", b"q"]
        assert puts[0] == 2
        assert gw.service.sink_backlogs.forwarders["plain"].counters.direct == 0
    finally:
        await gw.close()
        reset_buses()


async def test_a_crash_between_the_sink_ack_and_the_commit_loses_nothing(tmp_path: Path) -> None:
    """The child process hands publications to its sink (a record file, fsynced before
    the acknowledgement) and is SIGKILLed after the acknowledgement, before the stream
    batch commits. After a restart every publication is in the record file (some twice:
    the re-delivered batch is sent again), the stream queue and the backlog are empty."""
    reset_buses()
    records = tmp_path / "records.jsonl"
    payloads = [f"c{i}".encode() for i in range(6)]
    child = subprocess.Popen(
        [sys.executable, str(CHILD), str(tmp_path), str(records)],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    try:
        assert child.stdout is not None
        line = child.stdout.readline()
        assert line.strip() == "acked", line
        child.send_signal(signal.SIGKILL)
        child.wait(30)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(30)
    before = [json.loads(ln)["payload"] for ln in records.read_text().splitlines()]
    assert before == [p.decode() for p in payloads]  # acknowledged, not committed
    gw = _gateway(tmp_path)
    assert gw.qm.queue_depth(STOCK) == len(payloads)  # the batch came back
    await gw.start(_memory("crash", records))
    try:
        await get_bus("crash").wait_for(len(payloads))
        await settle(gw.qm, gw.service)
        after = [json.loads(ln)["payload"] for ln in records.read_text().splitlines()]
        assert after[: len(payloads)] == before
        assert _first_seen([a.encode() for a in after]) == payloads
        assert sorted(set(after)) == sorted(p.decode() for p in payloads)
        assert gw.qm.queue_depth(STOCK) == 0
        assert gw.qm.queue_depth(backlog_queue_name("crash")) == 0
    finally:
        await gw.close()
        reset_buses()


async def test_a_batch_held_by_a_full_backlog_is_not_handed_over_again_and_again(
    tmp_path: Path,
) -> None:
    """Sink ``down``'s target is down and its backlog full (MAXDEPTH 5): a batch for it
    and for the idle sink ``up`` backs out (2053) and is retried until ``down``'s
    backlog has room. ``up`` must not get that batch handed over on every retry: it
    gets each publication once, through its backlog, when the batch finally commits."""
    reset_buses()
    gw = build_gateway(tmp_path, config=bridge_config(
        retry_delay=0.01, sink_retry_max_delay=0.1, sink_backlog_max_depth=5))
    get_bus("down").down = True
    await gw.start(_memory("down"), _memory("up"))
    try:
        first = [f"a{i}".encode() for i in range(5)]
        await _publish(gw, first)
        async with asyncio.timeout(20):
            while gw.qm.queue_depth(backlog_queue_name("down")) < 5:
                await asyncio.sleep(0.01)
        assert [r.payload for r in await get_bus("up").wait_for(5)] == first
        more = [f"b{i}".encode() for i in range(3)]
        await _publish(gw, more)
        async with asyncio.timeout(20):  # held back (2053), retried four times
            while gw.service.counters.backlog_full < 5:
                await asyncio.sleep(0.01)
        assert [r.payload for r in get_bus("up").records] == first
        get_bus("down").down = False
        assert [r.payload for r in await get_bus("down").wait_for(8)] == first + more
        assert [r.payload for r in await get_bus("up").wait_for(8)] == first + more
        await settle(gw.qm, gw.service)
        assert [r.payload for r in get_bus("up").records] == first + more
        assert gw.qm.queue_depth(STOCK) == 0
    finally:
        await gw.close()
        reset_buses()


async def test_a_batch_behind_a_short_backlog_waits_for_it_then_goes_directly(
    tmp_path: Path,
) -> None:
    """Issue 32: after a late hand-over its copy is on the backlog, in the forwarder's
    hand while the slow send goes on. The next batch waits for the forwarder to end
    that batch (the backlog is then empty) and hands its own deliveries over directly:
    no backlog put, get and commit of its own, and the sink still sees each
    publication once, in the stream's order. (Before, it went through the backlog
    behind it, and so did every batch while the forwarder had something in hand.)"""
    reset_buses()
    gw = _gateway(tmp_path)
    backlogs = gw.service.sink_backlogs
    backlogs.direct_ack_timeout = 0.02
    backlogs.direct_ack_per_delivery = 0.0
    backlogs.direct_pause_min = backlogs.direct_pause = 0.0  # no pause after the late one
    puts = _count_backlog_puts(gw)
    gate = asyncio.Event()
    inst = _memory("gated")
    send = inst.send

    async def gated_send(envelopes: Sequence[Envelope]) -> None:
        if any(e.payload == b"a" for e in envelopes):
            await gate.wait()
        await send(envelopes)

    inst.send = gated_send  # type: ignore[method-assign]
    await gw.start(inst)
    fw = backlogs.forwarders["gated"]
    backlog = backlog_queue_name("gated")
    engine = gw.service.engine

    async def until(check: Callable[[], bool]) -> None:
        async with asyncio.timeout(10):
            while not check():
                await asyncio.sleep(0.005)

    try:
        await _publish(gw, [b"a"])
        # a's hand-over was late: its copy is on the backlog, the forwarder holds it
        # while it waits for a's send to end
        await until(lambda: gw.qm.queue_depth(backlog) == 1 and fw.busy)
        backlogs.direct_ack_timeout = 10.0  # from now on: wait as long as it takes
        handled = engine.counters.commands
        await _publish(gw, [b"b"])
        await until(lambda: engine.counters.commands > handled)  # b's batch is deciding
        gate.set()
        await get_bus("gated").wait_for(2)
        await settle(gw.qm, gw.service)
        assert [r.payload for r in get_bus("gated").records] == [b"a", b"b"]
        # a's copy was taken off unsent (acknowledged late); b went directly
        assert (puts[0], fw.counters.direct, fw.counters.delivered) == (1, 2, 2)
        assert gw.qm.queue_depth(backlog) == 0
        assert gw.qm.queue_depth(STOCK) == 0
    finally:
        gate.set()
        await gw.close()
        reset_buses()
