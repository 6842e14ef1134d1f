"""Request/reply round trips: MQTT→MQ→MQTT and Kafka→MQ→Kafka against a direct MQ requester.

Issue 14's network (tests/support/rr_network.py): GW is ``mqgw run`` with a Kafka and an
MQTT 5 plugin instance, QMA serves the cluster queue ``SVC.QUOTE`` with an echo MQ
application (a separate process, tests/support/mq_app.py), TESTER (this process) is a
member of the same cluster.

* **MQ baseline**: TESTER puts a REQUEST to ``SVC.QUOTE`` (ReplyToQ APP.REPLY @ its QM
  alias TESTREPLY) and reads the echo on APP.REPLY, matched by CorrelId: what an MQ
  application on the same network gets without the gateway.
* **MQTT→MQ→MQTT**: an MQTT 5 client publishes the request (Response Topic, Correlation
  Data) to the route's source; GW puts the MQ REQUEST to ``SVC.QUOTE``; the echo comes
  back to GW's reply queue through its reply-to alias; GW publishes it to the response
  topic with the correlation data.
* **Kafka→MQ→Kafka**: the same with a Kafka producer (``mq.reply.topic``,
  ``mq.correlation`` headers) and a consumer on the reply topic.

Each path runs with 1 request in flight (sequential: latency) and with a window of
``--window`` in flight (throughput). Every round trip is checked (the echo of its own
body under its own correlation). Printed: round trips per second, p50 and p99 latency in
ms, and the ratio to the MQ baseline measured in the same run. Bounded: ``--requests``
per run (default 300) and ``--time-limit`` per run (default 90 s).
Run: .venv/bin/python -m benchmarks.bench_request_reply (``make bench`` runs it).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import shutil
import socket
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiomqtt
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from benchmarks.summary import Row, record
from gateway.devstack import KafkaBroker, MosquittoBroker
from gateway.mq.port import GetOptions, MQError, OpenOption
from gateway.wire.constants import MsgType, Persistence
from gateway.wire.mqmd import MQMD
from gateway.wire.reasons import Reason
from tests.support.mq_app import ECHO_PREFIX
from tests.support.rr_network import (
    APP_REPLY,
    REPLY_ALIAS,
    SVC_QUOTE,
    TESTER_ALIAS,
    RRNetwork,
    start_rr_network,
)

#: Issue 32's goals with 16 requests in flight, as ratios to the MQ requester in the same
#: run, by the requester's protocol (the path name's first word); 1 in flight has none.
WINDOW_16_GOALS = {"Kafka->MQ->Kafka": 0.5, "MQTT->MQ->MQTT": 0.7}

#: One round trip: send request number ``seq``; the future resolves on its reply.
Sender = Callable[[int], Awaitable[None]]


#: the requester's MQTT socket option (see mqtt_requester)
NO_DELAY = (socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


class Waiter:
    """Pending round trips by correlation key; each reply must carry its own body."""

    def __init__(self) -> None:
        self.pending: dict[bytes, tuple[asyncio.Future[float], bytes]] = {}
        self.bad = 0

    def expect(self, key: bytes, body: bytes) -> asyncio.Future[float]:
        fut: asyncio.Future[float] = asyncio.get_running_loop().create_future()
        self.pending[key] = (fut, ECHO_PREFIX + body)
        return fut

    def arrived(self, key: bytes, body: bytes) -> None:
        entry = self.pending.pop(key, None)
        if entry is None or entry[1] != body:
            self.bad += 1
            return
        if not entry[0].done():
            entry[0].set_result(time.perf_counter())


async def run_window(name: str, send: Callable[[int], Awaitable[asyncio.Future[float]]],
                     count: int, window: int, limit: float) -> dict[str, float]:
    """``count`` round trips with at most ``window`` in flight; latencies in ms."""
    sem = asyncio.Semaphore(window)
    latencies: list[float] = []

    async def one(seq: int) -> None:
        async with sem:
            started = time.perf_counter()
            fut = await send(seq)
            done = await fut
            latencies.append((done - started) * 1000)

    began = time.perf_counter()
    try:
        async with asyncio.timeout(limit):
            await asyncio.gather(*(one(i) for i in range(count)))
    except TimeoutError:
        raise SystemExit(f"{name}: only {len(latencies)} of {count} round trips within "
                         f"{limit:.0f} s") from None
    elapsed = time.perf_counter() - began
    q = statistics.quantiles(latencies, n=100)
    return {"rate": count / elapsed, "p50": q[49], "p99": q[98]}


def body_of(tag: str, seq: int) -> bytes:
    return f"{tag}-{seq:06d}".encode()


@contextlib.asynccontextmanager
async def mq_baseline(net: RRNetwork):  # type: ignore[no-untyped-def]
    waiter = Waiter()
    conn = await net.tester.qm.connect()
    reader_conn = await net.tester.qm.connect()
    replies = await reader_conn.open(APP_REPLY, OpenOption.INPUT_SHARED)

    async def read() -> None:
        while True:
            try:
                msg = await replies.get(GetOptions(wait_ms=200))
            except MQError as exc:
                if exc.reason == Reason.NO_MSG_AVAILABLE:
                    continue
                raise
            waiter.arrived(msg.md.correl_id, msg.body)

    async def send(seq: int) -> asyncio.Future[float]:
        body = body_of("mq", seq)
        md = MQMD(format="MQSTR", msg_type=MsgType.REQUEST, reply_to_q=APP_REPLY,
                  reply_to_q_mgr=TESTER_ALIAS, persistence=Persistence.PERSISTENT,
                  msg_id=uuid.uuid4().bytes + b"\0" * 8)
        fut = waiter.expect(md.msg_id, body)
        await conn.put1(SVC_QUOTE, md, body)
        return fut

    task = asyncio.create_task(read())
    try:
        yield send, waiter
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, MQError):
            await task
        await replies.close()
        await reader_conn.disconnect()
        await conn.disconnect()


@contextlib.asynccontextmanager
async def mqtt_requester(mqtt: MosquittoBroker, source: str, response: str):  # type: ignore[no-untyped-def]
    waiter = Waiter()
    # TCP_NODELAY, as the gateway's MQTT connection sets it: paho leaves Nagle's algorithm
    # on, and a request written right after the PUBACK of the previous reply then waits
    # for the broker's delayed ACK (about 40 ms), which is the requester's, not the
    # gateway's (docs/performance.md, "Nagle's algorithm on the MQTT socket")
    async with aiomqtt.Client(mqtt.host, mqtt.port, identifier=f"bench-rr-{uuid.uuid4().hex[:8]}",
                              protocol=aiomqtt.ProtocolVersion.V5,
                              socket_options=[NO_DELAY]) as client:
        await client.subscribe(response, qos=1)

        async def read() -> None:
            async for message in client.messages:
                corr = bytes(getattr(message.properties, "CorrelationData", b"") or b"")
                waiter.arrived(corr, bytes(message.payload))  # type: ignore[arg-type]

        async def send(seq: int) -> asyncio.Future[float]:
            body = body_of("mqtt", seq)
            corr = f"c{seq}-{uuid.uuid4().hex[:12]}".encode()  # never reused: the gateway
            # filters a repeated (reply topic, correlation data) as a duplicate request
            fut = waiter.expect(corr, body)
            props = Properties(PacketTypes.PUBLISH)  # type: ignore[no-untyped-call]
            props.ResponseTopic = response
            props.CorrelationData = corr
            await client.publish(f"{source}/{seq}", body, qos=1, properties=props)
            return fut

        task = asyncio.create_task(read())
        try:
            yield send, waiter
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


@contextlib.asynccontextmanager
async def kafka_requester(kafka: KafkaBroker, source: str, reply_topic: str):  # type: ignore[no-untyped-def]
    waiter = Waiter()
    producer = AIOKafkaProducer(bootstrap_servers=kafka.bootstrap, acks="all", linger_ms=0)
    consumer = AIOKafkaConsumer(reply_topic, bootstrap_servers=kafka.bootstrap,
                                group_id=f"bench-rr-{uuid.uuid4().hex[:8]}",
                                auto_offset_reset="latest")
    await producer.start()
    await consumer.start()

    async def read() -> None:
        async for rec in consumer:
            headers = dict(rec.headers)
            waiter.arrived(headers.get("mq.correlation", b""), rec.value or b"")

    async def send(seq: int) -> asyncio.Future[float]:
        body = body_of("kafka", seq)
        corr = f"k{seq}-{uuid.uuid4().hex[:12]}".encode()
        fut = waiter.expect(corr, body)
        await producer.send_and_wait(source, body, headers=[
            ("mq.reply.topic", reply_topic.encode()), ("mq.correlation", corr)])
        return fut

    task = asyncio.create_task(read())
    try:
        yield send, waiter
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await consumer.stop()
        await producer.stop()


async def warm_up(name: str, send: Callable[[int], Awaitable[asyncio.Future[float]]]) -> None:
    """One round trip (up to 60 s: Kafka consumer groups, MQTT subscriptions settle)."""
    deadline = time.monotonic() + 60
    seq = 900_000
    while time.monotonic() < deadline:
        fut = await send(seq)
        try:
            await asyncio.wait_for(asyncio.shield(fut), 5)
            return
        except TimeoutError:
            seq += 1
    raise SystemExit(f"{name}: no round trip within 60 s (warm-up)")


async def bench(work: Path, kafka: KafkaBroker, mqtt: MosquittoBroker, count: int,
                window: int, limit: float) -> int:
    base = f"bench-rr-{uuid.uuid4().hex[:6]}"
    routes = {
        "reply_to_q": REPLY_ALIAS,
        "requests": [
            {"name": "mqtt-quote", "plugin": "mqtt", "source": f"{base}/req/#",
             "destination": SVC_QUOTE, "timeout": 120.0},
            {"name": "kafka-quote", "plugin": "kafka", "source": f"{base}.requests",
             "destination": SVC_QUOTE, "timeout": 120.0},
        ],
    }
    plugins: list[dict[str, Any]] = [
        {"name": "kafka", "plugin": "kafka", "config": {"bootstrap_servers": kafka.bootstrap}},
        {"name": "mqtt", "plugin": "mqtt",
         "config": {"host": mqtt.host, "port": mqtt.port, "client_id": f"{base}-gw",
                    "protocol": "5"}},
    ]
    print("starting the request/reply network (GW, QMA, QMB, QMC, TESTER) ...", flush=True)
    net = await start_rr_network(work / "net", plugins=plugins, request_reply=routes)
    results: dict[tuple[str, int], dict[str, float]] = {}
    bad = 0
    try:
        paths = [
            ("MQ baseline (TESTER)", lambda: mq_baseline(net)),
            ("MQTT->MQ->MQTT", lambda: mqtt_requester(mqtt, f"{base}/req",
                                                      f"{base}/resp/bench")),
            ("Kafka->MQ->Kafka", lambda: kafka_requester(kafka, f"{base}.requests",
                                                         f"{base}.replies")),
        ]
        for name, open_path in paths:
            async with open_path() as (send, waiter):
                await warm_up(name, send)
                for w in (1, window):
                    n = max(20, count // 4) if w == 1 else count
                    results[(name, w)] = await run_window(name, send, n, w, limit)
                    print(f"  {name:22s} window {w:3d}: {n} round trips", flush=True)
                bad += waiter.bad
    except SystemExit:
        print(net.log_tails(60), file=sys.stderr)
        raise
    finally:
        await net.close()
    print(f"\nround trips over the rr network ({count} per windowed run; sequential runs "
          f"{max(20, count // 4)})")
    print(f"{'path':22s} {'window':>6s} {'rt/s':>9s} {'p50 ms':>8s} {'p99 ms':>8s} "
          f"{'vs MQ':>7s}")
    for (name, w), r in results.items():
        baseline = results[("MQ baseline (TESTER)", w)]
        print(f"{name:22s} {w:6d} {r['rate']:9.1f} {r['p50']:8.1f} {r['p99']:8.1f} "
              f"{r['rate'] / baseline['rate']:7.2f}")
        if not name.startswith("MQ baseline"):
            goal = WINDOW_16_GOALS.get(name.split()[0]) if w == 16 else None
            record(Row(f"request/reply {name}, window {w}", r["rate"], baseline["rate"], goal,
                       unit="rt/s", note="vs MQ requester"))
    if bad:
        print(f"{bad} replies did not match their request", file=sys.stderr)
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--window", type=int, default=16)
    parser.add_argument("--time-limit", type=float, default=90.0)
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="bench-rr-"))
    kafka = KafkaBroker(work / "kafka")
    mqtt = MosquittoBroker(work / "mosquitto")
    try:
        kafka.start()
        mqtt.start()
        return asyncio.run(bench(work, kafka, mqtt, args.requests, args.window,
                                 args.time_limit))
    finally:
        mqtt.stop()
        kafka.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
