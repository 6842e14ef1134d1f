"""Publications per second across neighbour brokers: A -> gateway -> B and A -> gateway -> Kafka.

The seed's figure as three processes (tests/support/legacy_network.py): BROKERA and
BROKERB are ``mqgw broker --profile legacy`` stand-ins, GW is ``mqgw run`` between them
with its Kafka plugin on a local Kafka broker; A and B know GW as a neighbour
(``--neighbour GW:mqpubsub:parent``), GW knows both (``neighbours:`` YAML). This process
runs the TESTER node, which has a channel pair to each of the three.

* **raw baseline**: N plain persistent 1 KiB messages put at TESTER for a remote queue
  of BROKERA that sends them on through the transmission-queue chain A -> GW -> B ->
  TESTER (QREMOTE definitions, no broker touches them); timed until all are read back.
* **A -> GW -> B**: an MQRFH subscriber registered at BROKERB (BULLETIN.STREAM,
  ``Bench/*``, subscriber queue on TESTER); N persistent 1 KiB MQRFH publications put at
  TESTER for BROKERA's BULLETIN.STREAM queue. They cross the same four channels: A
  forwards them to GW (GW's proxy subscription, asked for by B's proxy at GW), GW to B,
  B delivers to TESTER. Timed from the first put until all N are read back.
* **A -> GW -> Kafka**: N publications on BROKERA's STOCK.STREAM; GW's Kafka plugin
  routes STOCK.STREAM to topic ``bench.STOCK.STREAM``; an aiokafka consumer counts them.
  Its ratio is given against both raw chains: the four-channel one above and
  TESTER -> A -> GW -> TESTER (the channels this path shares, plus GW's way back).

Before each timed run, warm-up publications are sent until one arrives (the proxy
subscriptions are in place). Every timed run checks that each of the N sequence numbers
arrived exactly once. Bounded: ``--time-limit`` per run (default 90 s), N=2,000.
Run: .venv/bin/python -m benchmarks.bench_neighbours [--messages N]
(``make bench`` runs it; it imports the harness from tests/support, hence ``-m``).
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Coroutine
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaConsumer

from gateway.devstack import KafkaBroker
from gateway.mq.port import GetOptions, MQError, OpenOption, PutOptions
from gateway.wire.constants import MsgType, Persistence
from gateway.wire.formats import FMT_STRING
from gateway.wire.mqmd import MQMD
from gateway.wire.reasons import Reason
from tests.support.legacy_network import (
    BROKERA,
    BROKERB,
    GW,
    TESTER,
    LegacyNetwork,
    start_legacy_network,
)
from tests.support.pubsub_messages import CONTROL, decode, rfh_message

BULLETIN, STOCK = "BULLETIN.STREAM", "STOCK.STREAM"
KAFKA_TOPIC = f"bench.{STOCK}"
PAYLOAD_SIZE = 1024
PUT_BATCH = 100
WARM_UP_S = 60.0

#: The raw chains: TESTER -> A (RAW.VIA.A) -> GW -> B (RAW.AT.B) -> TESTER (RAW.IN), the
#: channels of A -> GW -> B; and TESTER -> A (RAW.VIA.A.GW) -> GW (RAW.AT.GW) -> TESTER
#: (RAW.IN.GW), the channels A -> GW -> Kafka shares.
RAW_MQSC = {
    BROKERA: "DEFINE QREMOTE(RAW.VIA.A) RNAME(RAW.AT.B) RQMNAME(BROKERB) XMITQ(GW) REPLACE\n"
    "DEFINE QREMOTE(RAW.VIA.A.GW) RNAME(RAW.AT.GW) RQMNAME(GW) XMITQ(GW) REPLACE\n",
    BROKERB: "DEFINE QREMOTE(RAW.AT.B) RNAME(RAW.IN) RQMNAME(TESTER) XMITQ(TESTER) REPLACE\n",
    GW: "DEFINE QREMOTE(RAW.AT.GW) RNAME(RAW.IN.GW) RQMNAME(TESTER) XMITQ(TESTER) REPLACE\n",
    TESTER: "DEFINE QLOCAL(RAW.IN) DEFPSIST(YES) MAXDEPTH(1000000) REPLACE\n"
    "DEFINE QLOCAL(RAW.IN.GW) DEFPSIST(YES) MAXDEPTH(1000000) REPLACE\n",
}


def payload(tag: bytes, seq: int) -> bytes:
    """1 KiB: a tag (``T`` timed, ``W`` warm-up) and the sequence number, then padding."""
    head = tag + b"%08d" % seq
    return head + b"x" * (PAYLOAD_SIZE - len(head))


def sequence(data: bytes) -> int | None:
    """The sequence number of a timed payload (None for anything else)."""
    if data[:1] != b"T" or len(data) != PAYLOAD_SIZE:
        return None
    return int(data[1:9])


def publication(stream: str, tag: bytes, seq: int) -> tuple[MQMD, bytes]:
    """A persistent MQRFH Publish on ``stream``, topic ``Bench/t``, as a V6 publisher
    puts it."""
    msg = rfh_message(
        stream,
        [("MQPSCommand", "Publish"), ("MQPSStreamName", stream), ("MQPSTopic", "Bench/t")],
        payload(tag, seq),
        reply_to_q_mgr=TESTER,
    )
    return msg.md, msg.body


def plain(seq: int) -> tuple[MQMD, bytes]:
    md = MQMD(format=FMT_STRING, persistence=Persistence.PERSISTENT)
    return md, payload(b"T", seq)


async def put_all(
    net: LegacyNetwork, q_mgr: str, queue: str, n: int, build: Callable[[int], tuple[MQMD, bytes]]
) -> None:
    """``n`` messages put at ``q_mgr`` through TESTER, committed every PUT_BATCH."""
    async with await net.tester.qm.connect() as conn:
        h = await conn.open(queue, OpenOption.OUTPUT, q_mgr_name=q_mgr)
        opts = PutOptions(syncpoint=True)
        for i in range(n):
            md, body = build(i)
            await h.put(md, body, opts)
            if i % PUT_BATCH == PUT_BATCH - 1:
                await conn.commit()
        await conn.commit()


class Count:
    """Sequence numbers seen by a reader: ``seen`` (distinct), ``duplicates``."""

    def __init__(self) -> None:
        self.seen: set[int] = set()
        self.duplicates = 0

    def add(self, seq: int | None) -> None:
        if seq is None:
            return
        if seq in self.seen:
            self.duplicates += 1
        self.seen.add(seq)


async def read_queue(
    net: LegacyNetwork, queue: str, n: int, deadline: float, count: Count,
    decode_body: bool,
) -> None:
    """Read TESTER's ``queue`` until ``n`` distinct timed messages or the deadline."""
    async with await net.tester.qm.connect() as conn:
        h = await conn.open(queue, OpenOption.INPUT_SHARED)
        while len(count.seen) < n and time.monotonic() < deadline:
            try:
                msg = await h.get(GetOptions(wait_ms=200))
            except MQError as exc:
                if exc.reason != Reason.NO_MSG_AVAILABLE:
                    raise
                continue
            body = decode(msg.md, msg.body).payload if decode_body else msg.body
            count.add(sequence(body))


async def timed(
    n: int, limit: float, publish: Callable[[], Awaitable[None]],
    read: Callable[[float, Count], Coroutine[Any, Any, None]],
) -> tuple[Count, float]:
    """Start the reader, put ``n``, wait for the reader; (count, seconds)."""
    count = Count()
    started = time.monotonic()
    reader = asyncio.create_task(read(started + limit, count))
    try:
        await publish()
        await reader
    finally:
        reader.cancel()
    return count, time.monotonic() - started


async def warm_up(send: Callable[[int], Awaitable[None]], arrived: Callable[[], Awaitable[bool]],
                  what: str) -> None:
    """Send a warm-up publication every 0.5 s until one arrives (proxies registered)."""
    deadline = time.monotonic() + WARM_UP_S
    i = 0
    while time.monotonic() < deadline:
        await send(i)
        i += 1
        for _ in range(5):
            if await arrived():
                return
            await asyncio.sleep(0.1)
    raise TimeoutError(f"{what}: no warm-up publication arrived in {WARM_UP_S:.0f} s")


async def drain(net: LegacyNetwork, queue: str) -> list[bytes]:
    return [m.body for m in await net.drain(queue, wait_s=0.2)]


async def raw(
    net: LegacyNetwork, via: str, back: str, n: int, limit: float
) -> tuple[Count, float]:
    """Plain messages put at BROKERA's remote queue ``via``, read back from TESTER's
    ``back``: 50 to warm the channels, then ``n`` timed."""
    await put_all(net, BROKERA, via, 50, plain)
    deadline = time.monotonic() + WARM_UP_S
    while net.tester.qm.queue_depth(back) < 50:
        if time.monotonic() > deadline:
            raise TimeoutError(f"raw {via}: warm-up did not arrive\n{net.log_tails()}")
        await asyncio.sleep(0.1)
    await drain(net, back)
    return await timed(
        n, limit, lambda: put_all(net, BROKERA, via, n, plain),
        lambda d, c: read_queue(net, back, n, d, c, decode_body=False),
    )


async def subscribe_at_b(net: LegacyNetwork, queue: str) -> None:
    replies = net.subscriber_queue("BENCH.REPLIES")
    reg = rfh_message(
        CONTROL,
        [("MQPSCommand", "RegSub"), ("MQPSStreamName", BULLETIN), ("MQPSTopic", "Bench/*"),
         ("MQPSQMgrName", TESTER), ("MQPSQName", queue)],
        reply_to_q=replies, reply_to_q_mgr=TESTER, msg_type=MsgType.REQUEST,
    )
    await net.put(BROKERB, CONTROL, reg.md, reg.body)
    msg = await net.get(replies, wait_s=30)
    response = decode(msg.md, msg.body)
    if response.get("MQPSCompCode") != "0":
        raise RuntimeError(f"RegSub at BROKERB refused: {response.pairs}")


def report(what: str, n: int, count: Count, took: float, raw_rate: float | None) -> bool:
    got = len(count.seen)
    rate = got / took
    ratio = f"; ratio to raw = {rate / raw_rate:.2f}" if raw_rate else ""
    print(f"{what}: {got:,} of {n:,} in {took:.2f} s = {rate:,.0f} msg/s{ratio}"
          f"; duplicates {count.duplicates}", flush=True)
    if got != n or count.duplicates:
        print(f"error: {what}: {got} of {n} arrived, {count.duplicates} duplicates",
              file=sys.stderr)
        return False
    return True


async def run(work: Path, bootstrap: str, n: int, limit: float) -> bool:
    gateway_extra = {
        "neighbours": [
            {"q_mgr": BROKERA, "kind": "mqpubsub", "role": "child", "streams": [STOCK, BULLETIN]},
            {"q_mgr": BROKERB, "kind": "mqpubsub", "role": "child",
             "streams": [BULLETIN, "SPORTS.STREAM"]},
        ],
    }
    kafka = {
        "name": "kafka", "plugin": "kafka",
        "config": {"bootstrap_servers": bootstrap,
                   "outbound": {"topic_template": "bench.{stream}", "routes": [{"stream": STOCK}]}},
    }
    net = await start_legacy_network(
        work, plugins=[kafka], gateway_extra=gateway_extra,
        broker_args={BROKERA: ["--neighbour", f"{GW}:mqpubsub:parent"],
                     BROKERB: ["--neighbour", f"{GW}:mqpubsub:parent"]},
        extra_mqsc=RAW_MQSC,
    )
    consumer = AIOKafkaConsumer(KAFKA_TOPIC, bootstrap_servers=bootstrap, group_id=None,
                                auto_offset_reset="earliest")
    ok = True
    consumer_started = False
    try:
        # ---- raw baselines (also warm the channels)
        count, took = await raw(net, "RAW.VIA.A", "RAW.IN", n, limit)
        ok &= report("raw MQ, TESTER -> A -> GW -> B -> TESTER (persistent 1 KiB, no broker)",
                     n, count, took, None)
        raw_rate = len(count.seen) / took
        count, took = await raw(net, "RAW.VIA.A.GW", "RAW.IN.GW", n, limit)
        ok &= report("raw MQ, TESTER -> A -> GW -> TESTER (persistent 1 KiB, no broker)",
                     n, count, took, None)
        raw_gw_rate = len(count.seen) / took

        # ---- A -> GW -> B
        subs = net.subscriber_queue("BENCH.SUBS")
        await subscribe_at_b(net, subs)

        async def warm_b(i: int) -> None:
            md, body = publication(BULLETIN, b"W", i)
            await net.put(BROKERA, BULLETIN, md, body)

        async def b_arrived() -> bool:
            return net.tester.qm.queue_depth(subs) > 0

        await warm_up(warm_b, b_arrived, "A -> GW -> B")
        await asyncio.sleep(1.0)
        await drain(net, subs)
        count, took = await timed(
            n, limit,
            lambda: put_all(net, BROKERA, BULLETIN, n, lambda i: publication(BULLETIN, b"T", i)),
            lambda d, c: read_queue(net, subs, n, d, c, decode_body=True),
        )
        ok &= report("pub/sub A -> GW -> B (MQRFH publisher at A, subscriber at B)",
                     n, count, took, raw_rate)

        # ---- A -> GW -> Kafka
        await consumer.start()
        consumer_started = True
        warm_seen: list[bytes] = []

        async def warm_k(i: int) -> None:
            md, body = publication(STOCK, b"W", i)
            await net.put(BROKERA, STOCK, md, body)

        async def kafka_arrived() -> bool:
            batch = await consumer.getmany(timeout_ms=100)
            warm_seen.extend(r.value for recs in batch.values() for r in recs)
            return bool(warm_seen)

        await warm_up(warm_k, kafka_arrived, "A -> GW -> Kafka")

        async def read_kafka(deadline: float, c: Count) -> None:
            while len(c.seen) < n and time.monotonic() < deadline:
                batch = await consumer.getmany(timeout_ms=200)
                for recs in batch.values():
                    for r in recs:
                        c.add(sequence(r.value))

        count, took = await timed(
            n, limit,
            lambda: put_all(net, BROKERA, STOCK, n, lambda i: publication(STOCK, b"T", i)),
            read_kafka,
        )
        ok &= report(f"pub/sub A -> GW -> Kafka (topic {KAFKA_TOPIC}, aiokafka consumer)",
                     n, count, took, raw_rate)
        print(f"  (ratio to the raw TESTER -> A -> GW -> TESTER chain = "
              f"{len(count.seen) / took / raw_gw_rate:.2f})", flush=True)
        if not ok:
            print(net.log_tails(), file=sys.stderr)
    finally:
        if consumer_started:
            await consumer.stop()
        await net.close()
    return ok


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=2_000)
    parser.add_argument("--time-limit", type=float, default=90.0, help="seconds per timed run")
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="mqgw-bench-neighbours-"))
    broker = KafkaBroker(work / "kafka")
    try:
        broker.start()
        ok = asyncio.run(run(work / "net", broker.bootstrap, args.messages, args.time_limit))
    finally:
        broker.stop()
        shutil.rmtree(work, ignore_errors=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
