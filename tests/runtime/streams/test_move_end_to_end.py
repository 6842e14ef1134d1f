"""``mqgw streams move`` between two running gateways while MQ applications publish at
both (tests/support/stream_move.py): the stream moves QMA -> QMB and back, every
publication reaches the subscriber on each node once and in each publisher's order.
The SIGKILL trials of the same network: tests/faults/test_faults_stream_move.py."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from gateway.mq.embedded.client import connect_local
from gateway.mq.port import GetOptions, OpenOption
from tests.support.pubsub_messages import decode, rfh_message
from tests.support.stream_move import (
    NODES,
    QMA,
    QMB,
    ROUTE,
    STREAM,
    Traffic,
    register_subscriber,
    route_owner,
    run_mqgw,
    start_move_network,
    until,
)

pytestmark = [pytest.mark.subprocess, pytest.mark.slow]


async def test_move_a_stream_there_and_back_under_load(tmp_path: Path) -> None:
    net = await start_move_network(tmp_path)
    traffic = Traffic(net)
    took: dict[str, float] = {}
    try:
        traffic.start()
        pubs = traffic.publishers
        await until(lambda: all(len(p.sent) >= 20 for p in pubs.values()), 30, net,
                    "publishers never got going")
        for to in (QMB, QMA):
            t0 = time.monotonic()
            rc, out = await net.move(to)
            took[to] = round(time.monotonic() - t0, 2)
            assert rc == 0, out
            assert f"{STREAM} is now owned by {to}" in out, out
            assert [await route_owner(net, n) for n in NODES] == [to, to]
            before = {n: len(p.sent) for n, p in pubs.items()}
            await until(lambda b=before: all(len(p.sent) >= b[n] + 20
                                             for n, p in pubs.items()),
                        30, net, "publishing did not go on after the move")
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
