"""``mqgw streams move`` between two running gateways while MQ applications publish at
both (tests/support/stream_move.py): the stream moves QMA -> QMB and back, every
publication reaches the subscriber on each node once and in each publisher's order;
with a memory sink on each node (``sinks: owner``) the sink moves with the stream, and
the sinks' outputs together hold every publication once, in each publisher's order.
The SIGKILL trials of the same network: tests/faults/test_faults_stream_move.py."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from pathlib import Path

import pytest

from gateway.mq.embedded.client import connect_local
from gateway.mq.port import GetOptions, OpenOption
from gateway.runtime.streams.move_plan import read_journal
from tests.support.pubsub_messages import decode, rfh_message
from tests.support.stream_move import (
    NODES,
    QMA,
    QMB,
    ROUTE,
    STREAM,
    MoveNetwork,
    Traffic,
    other,
    register_subscriber,
    route_owner,
    run_mqgw,
    sink_payloads,
    start_move_network,
    until,
)

pytestmark = [pytest.mark.subprocess, pytest.mark.slow]


async def timed_move(net: MoveNetwork, to: str, took: dict[str, float]) -> str:
    """Move PRICES to ``to`` (it must succeed); its seconds in ``took``; its output."""
    t0 = time.monotonic()
    rc, out = await net.move(to)
    took[to] = round(time.monotonic() - t0, 2)
    assert rc == 0, out
    return out


async def publishers_going(net: MoveNetwork, traffic: Traffic) -> None:
    traffic.start()
    await until(lambda: all(len(p.sent) >= 20 for p in traffic.publishers.values()), 30, net,
                "publishers never got going")


async def publishing_goes_on(net: MoveNetwork, traffic: Traffic) -> None:
    """Every publisher puts 20 more (the move is over for them)."""
    before = {n: len(p.sent) for n, p in traffic.publishers.items()}
    await until(lambda: all(len(p.sent) >= before[n] + 20
                            for n, p in traffic.publishers.items()),
                30, net, "publishing did not go on after the move")


async def all_delivered(net: MoveNetwork, traffic: Traffic, root: Path) -> None:
    """Publishing stopped, every publication has reached both subscribers and a sink."""
    traffic.stop_publishing()
    await until(lambda: traffic.missing() == 0, 60, net,
                "every publication at both subscribers")
    sent = traffic.sent()
    await until(lambda: sent <= set(sink_payloads(root, QMA)) | set(sink_payloads(root, QMB)),
                60, net, "every publication at a sink")


async def test_move_a_stream_there_and_back_under_load(tmp_path: Path) -> None:
    net = await start_move_network(tmp_path)
    traffic = Traffic(net)
    took: dict[str, float] = {}
    try:
        await publishers_going(net, traffic)
        pubs = traffic.publishers
        for to in (QMB, QMA):
            out = await timed_move(net, to, took)
            assert f"{STREAM} is now owned by {to}" in out, out
            assert [await route_owner(net, n) for n in NODES] == [to, to]
            await publishing_goes_on(net, traffic)
        traffic.stop_publishing()
        await until(lambda: traffic.missing() == 0, 60, net,
                    "every publication at both subscribers")
        rc, out = await run_mqgw(
            "streams", "move", STREAM, "--status", "--to", QMA,
            "--node", str(net.config(QMA)), "--node", str(net.config(QMB)))
        assert rc == 0 and "complete" in out and f"{QMB}: PRICES.PUB routes to {QMA}" in out, out
    finally:
        await traffic.close()
        await net.close()
    assert traffic.problems() == []
    assert all(p.uncertain == set() for p in pubs.values())
    print(f"move command seconds {took}; per publisher (sent, refused 2051): "
          f"{ {n: (len(p.sent), p.refused) for n, p in pubs.items()} }")


async def test_the_old_owners_retained_publications_are_at_the_new_owner(
    tmp_path: Path,
) -> None:
    """A topic retained at QMA that no subscriber at QMB matches (so QMB holds no copy
    of it): after the move to QMB, with QMA stopped, a new subscriber at QMB gets it."""
    net = await start_move_network(tmp_path, topic="T/*")
    try:
        publish = rfh_message(
            ROUTE, [("MQPSCommand", "Publish"), ("MQPSStreamName", STREAM),
                    ("MQPSTopic", "R/1"), ("MQPSPubOpts", "RetainPub"),
                    ("MQPSRegOpts", "Anon")],
            b"R/1 v1", reply_to_q_mgr="", persistence=1)
        conn = await connect_local(net.data_dir(QMA))
        try:
            await conn.put1(ROUTE, publish.md, publish.body)
        finally:
            await conn.disconnect()
        rc, out = await net.move(QMB)  # its drain waits until QMA's broker took it
        assert rc == 0, out
        assert f"copying 1 retained publication(s) of {STREAM} to {QMB}" in out, out
        net.gateways[QMA].terminate(timeout=20)
        await net.mqsc(QMB, "DEFINE QLOCAL(LATE.SUBSCRIBER)")
        await register_subscriber(net, QMB, "R/*", "LATE.SUBSCRIBER")
        conn = await connect_local(net.data_dir(QMB))
        try:
            h = await conn.open("LATE.SUBSCRIBER", OpenOption.INPUT_SHARED)
            got = await h.get(GetOptions(wait_ms=15_000))
        finally:
            await conn.disconnect()
        assert decode(got.md, got.body).payload == b"R/1 v1"
    finally:
        await net.close()


def sink_problems(traffic: Traffic, outputs: list[str]) -> list[str]:
    """Lost, duplicated, unexpected or out-of-order publications in the sinks' outputs
    taken together (old owner's then new owner's, in the order of the moves)."""
    counts = Counter(outputs)
    sent, maybe = traffic.sent(), traffic.uncertain()
    out = []
    if lost := sorted(sent - set(counts)):
        out.append(f"{len(lost)} lost, e.g. {lost[:5]}")
    if dup := sorted(i for i, c in counts.items() if c > 1):
        out.append(f"{len(dup)} duplicated, e.g. {dup[:5]}")
    if odd := sorted(set(counts) - sent - maybe):
        out.append(f"{len(odd)} unexpected, e.g. {odd[:5]}")
    last: dict[str, int] = {}
    for i in outputs:
        pub, _, seq = i.rpartition("-")
        if int(seq) < last.get(pub, -1):
            out.append(f"{i} after {pub}-{last[pub]} (order)")
            break
        last[pub] = int(seq)
    return out


async def test_the_sinks_move_with_the_stream_there_and_back_under_load(
    tmp_path: Path,
) -> None:
    """A memory sink on each node, PRICES configured ``sinks: owner`` on both: only the
    owner's sink subscribes; each move takes the subscription to the new owner. The old
    owner's sink output ends when its move ends, so the concatenation QMA's (up to the
    first move), QMB's, QMA's (after) holds every publication once, in order."""
    net = await start_move_network(tmp_path, sinks=True)
    traffic = Traffic(net)
    took: dict[str, float] = {}
    ended: dict[str, int] = {}  # the old owner's sink output when its move ended
    try:
        await publishers_going(net, traffic)
        assert sink_payloads(tmp_path, QMB) == []  # QMB does not own PRICES
        for to in (QMB, QMA):
            out = await timed_move(net, to, took)
            assert f"moving sink(s) with the stream: mem on {other(to)}" in out, out
            ended[other(to)] = len(sink_payloads(tmp_path, other(to)))
            await publishing_goes_on(net, traffic)
        await all_delivered(net, traffic, tmp_path)
    finally:
        await traffic.close()
        await net.close()
    a, b = sink_payloads(tmp_path, QMA), sink_payloads(tmp_path, QMB)
    assert len(b) == ended[QMB]  # QMB's sink got nothing after the move back
    assert sink_problems(traffic, a[:ended[QMA]] + b + a[ended[QMA]:]) == []
    assert traffic.problems() == []
    print(f"move command seconds {took}; sink outputs QMA {ended[QMA]} + "
          f"{len(a) - ended[QMA]}, QMB {len(b)}")


async def test_a_move_stopped_in_its_sinks_step_and_run_again_loses_and_repeats_nothing(
    tmp_path: Path,
) -> None:
    """The move command SIGKILLed as soon as it says it runs step ``sinks`` (inside the
    step or just after it, as timing falls), then run again: the sinks' outputs
    together still hold every publication once, in each publisher's order."""
    net = await start_move_network(tmp_path, sinks=True)
    traffic = Traffic(net)
    try:
        await publishers_going(net, traffic)
        proc = await net.spawn_move(QMB)
        assert proc.stdout is not None
        said = b""
        while b"running: sinks" not in said:
            line = await asyncio.wait_for(proc.stdout.readline(), 120)
            assert line, said.decode()
            said += line
        proc.kill()
        await proc.wait()
        journal = read_journal(tmp_path / QMB / "move-PRICES.json")
        assert journal is not None and not journal.complete
        where = "after" if "sinks" in journal.done else "inside"
        rc, out = await net.move(QMB)
        assert rc == 0, out
        assert "continuing the move of PRICES" in out, out
        ended = len(sink_payloads(tmp_path, QMA))
        await publishing_goes_on(net, traffic)
        await all_delivered(net, traffic, tmp_path)
    finally:
        await traffic.close()
        await net.close()
    a, b = sink_payloads(tmp_path, QMA), sink_payloads(tmp_path, QMB)
    assert len(a) == ended  # QMA's sink got nothing once the move was done
    assert sink_problems(traffic, a + b) == []
    assert traffic.problems() == []
    print(f"killed {where} step sinks; sink outputs QMA {len(a)}, QMB {len(b)}")
