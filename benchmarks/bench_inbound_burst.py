"""Inbound bursts: 500 messages sent at once into Kafka -> MQ and MQTT -> MQ, p50/p99.

One local Kafka broker and one Mosquitto (devstack), one embedded queue manager per
path with the broker service (default batch settings) and one plugin instance on a
plugin host; an MQ subscriber (an MQRFH2 ``RegSub`` to a local queue; MQGET with a wait
under syncpoint, committing each time the queue is empty) gets what the
service forwards. A raw client (aiokafka producer, linger 0; aiomqtt publisher, QoS 1)
sends ``--messages`` (500) 1 KiB persistent messages at once, after one warm-up message per path
(topic creation, connections). Latency of a message = the subscriber's get minus the
moment the burst was sent (all of them: "sent at once"); goal (issue 32): p99 < 150 ms,
i.e. a burst costs its size over the path's throughput, not a unit of work per message.
The plugin's units of work for the burst are printed too (Kafka: offset commits, one per
MQ unit of work; MQTT: ``units_of_work``). Bounded: --time-limit per burst.
Run: .venv/bin/python -m benchmarks.bench_inbound_burst [--messages 500] [--paths kafka,mqtt]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiomqtt
from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from benchmarks.summary import Row, record
from gateway.devstack import KafkaBroker, MosquittoBroker
from gateway.mq.embedded.qm_server import QueueManagerServer
from gateway.mq.embedded.qmgr import EmbeddedQueueManager
from gateway.mq.port import GetOptions, MQError, OpenOption, PutOptions
from gateway.plugin_api import PluginInstance
from gateway.pubsub.engine import PubSubEngine
from gateway.pubsub.store import MemoryStore
from gateway.runtime.plugin_host import PluginHost
from gateway.runtime.pubsub_service import BrokerConfig, BrokerService, StreamQueueConfig
from gateway.wire.constants import MsgType
from gateway.wire.folder import Element
from gateway.wire.formats import FMT_RF_HEADER_2
from gateway.wire.mqmd import MQMD
from gateway.wire.rfh2 import MQRFH2, encode_rfh2
from plugins.kafka import KafkaPluginConfig
from plugins.kafka import plugin as kafka_plugin
from plugins.mqtt import MqttConfig
from plugins.mqtt import plugin as mqtt_plugin

STREAM = "SYSTEM.BROKER.DEFAULT.STREAM"
CONTROL = "SYSTEM.BROKER.CONTROL.QUEUE"
SUB_QUEUE = "BURST.SUB"
KAFKA_TOPIC = "burst-in"
#: --one-by-one: the sender awaits each acknowledgement instead of sending all at once
ONE_BY_ONE = False
#: --no-overlap: the plugin's units of work are put and committed one at a time
NO_OVERLAP = False
#: --stages: print where each message's time went (plugin unit, service batch, get)
STAGES = False
GOAL_P99_MS = 150.0
#: the subscriber commits its gets at least every SUB_BATCH messages
SUB_BATCH = 100
PAD = 1024


def payload(seq: int) -> bytes:
    return (b"%08d" % seq).ljust(PAD, b"x")


def seq_of(body: bytes) -> int:
    return int(body[-PAD:][:8])


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p * len(ordered)))]


async def register(qm: EmbeddedQueueManager, topic: str) -> None:
    """An MQ subscriber: RegSub of ``topic`` on the default stream to SUB_QUEUE."""
    psc = Element.from_pairs(
        "psc", {"Command": "RegSub", "Topic": topic, "QName": SUB_QUEUE}
    )
    md = MQMD(format=FMT_RF_HEADER_2, msg_type=MsgType.DATAGRAM, coded_char_set_id=1208)
    conn = await qm.connect()
    try:
        handle = await conn.open(CONTROL, OpenOption.OUTPUT)
        await handle.put(md, encode_rfh2(MQRFH2(folders=[psc]), ccsid=1208), PutOptions())
    finally:
        await conn.disconnect()


async def subscriber_gets(
    qm: Any, send: Callable[[int, int], Awaitable[None]], n: int, limit: float,
    go: Callable[[], Awaitable[None]],
) -> list[float]:
    """The outside world: an MQ subscriber getting from SUB_QUEUE and a raw client
    sending; one warm-up message, then ``go``, then ``n`` at once. Latencies in ms."""
    conn = await qm.connect()
    try:
        sub = await conn.open(SUB_QUEUE, OpenOption.INPUT_SHARED)

        waiting = GetOptions(wait_ms=200, syncpoint=True)
        more = GetOptions(wait_ms=0, syncpoint=True)

        async def get(count: int) -> list[tuple[int, float]]:
            """MQGET with a wait in a loop, under syncpoint, committing what it got when
            the queue is empty or at SUB_BATCH: what MQ advises for persistent messages
            (a get outside syncpoint is a unit of work, a disk write, per message). A
            message counts as received when its get returns."""
            got: list[tuple[int, float]] = []
            deadline = time.perf_counter() + limit
            while len(got) < count:
                if time.perf_counter() > deadline:
                    raise SystemExit(f"{len(got)} of {count} reached the subscriber in time")
                options, taken = waiting, 0
                while taken < SUB_BATCH and len(got) < count:
                    try:
                        msg = await sub.get(options)
                    except MQError as exc:
                        if exc.reason != 2033:
                            raise
                        break
                    got.append((seq_of(msg.body), time.perf_counter()))
                    options, taken = more, taken + 1
                if taken:
                    await conn.commit()
            return got

        await send(-1, 1)  # warm-up: topic creation, connections, the subscription
        await get(1)
        await go()
        getting = asyncio.create_task(get(n))  # getting while the burst is sent
        await asyncio.sleep(0)
        sent_at = time.perf_counter()
        await send(0, n)
        sent_all = time.perf_counter()  # every message acknowledged to the sender
        got = await getting
        if sorted(s for s, _ in got) != list(range(n)):  # no loss, no duplicate
            raise SystemExit("lost or duplicated messages")
        return [sent_at, (sent_all - sent_at) * 1000,
                *((at - sent_at) * 1000 for _, at in sorted(got))]
    finally:
        await conn.disconnect()


def outside_child(argv: list[str]) -> int:
    """``--outside PATH WHERE QM_DIR N LIMIT ONE_BY_ONE``: sender and subscriber in their own
    process (not competing with the gateway for its event loop), over the queue
    manager's local socket; prints ``ready`` after the warm-up, reads a line, sends the
    burst, prints the latencies."""
    from gateway.mq.embedded.client import ClientQueueManager

    path, where, qm_dir, n, limit, one_by_one = argv

    async def go() -> None:
        print("ready", flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)

    async def main() -> list[float]:
        qm = ClientQueueManager(qm_dir)
        if path == "kafka":
            producer = AIOKafkaProducer(bootstrap_servers=where, linger_ms=0, acks=1)
            await producer.start()

            async def send_kafka(first: int, count: int) -> None:
                if one_by_one == "1":  # as examples/demo does: send_and_wait each
                    for i in range(count):
                        await producer.send_and_wait(KAFKA_TOPIC, payload(max(0, first + i)))
                    return
                pending = [
                    await producer.send(KAFKA_TOPIC, payload(max(0, first + i)))
                    for i in range(count)
                ]
                await asyncio.gather(*pending)

            try:
                return await subscriber_gets(qm, send_kafka, int(n), float(limit), go)
            finally:
                await producer.stop()
        host, port = where.rsplit(":", 1)
        async with aiomqtt.Client(
            host, port=int(port), identifier="burst-sender", max_inflight_messages=1000
        ) as pub:
            pub.pending_calls_threshold = int(n) + 1

            async def send_mqtt(first: int, count: int) -> None:
                if one_by_one == "1":  # as examples/demo does: each PUBACK awaited
                    for i in range(count):
                        await pub.publish("burst/m", payload(max(0, first + i)), qos=1)
                    return
                await asyncio.gather(*(
                    pub.publish("burst/m", payload(max(0, first + i)), qos=1)
                    for i in range(count)
                ))

            return await subscriber_gets(qm, send_mqtt, int(n), float(limit), go)

    print(" ".join(repr(v) for v in asyncio.run(main())), flush=True)
    return 0


class StageClock:
    """--stages: when each plugin unit of work was handed over and committed, and when
    each broker-service batch committed (perf_counter, comparable with the outside
    process's: one monotonic clock)."""

    def __init__(self) -> None:
        #: (handed to the publisher, committed, publications) per plugin unit
        self.units: list[tuple[float, float, int]] = []
        #: (committed, messages) per broker-service batch
        self.batches: list[tuple[float, int]] = []

    def watch(self, publisher: Any, service: BrokerService) -> None:
        publish, after_commit = publisher.publish, service._after_commit
        begin = publisher.begin_publish

        async def timed_publish(publications: Any) -> None:
            began = time.perf_counter()
            await publish(publications)
            self.units.append((began, time.perf_counter(), len(publications)))

        async def timed_begin(publications: Any) -> Any:
            began = time.perf_counter()
            ends = await begin(publications)

            def ended(_: object) -> None:
                self.units.append((began, time.perf_counter(), len(publications)))

            asyncio.ensure_future(ends).add_done_callback(ended)
            return ends

        def timed_after_commit(q: Any, batch: Any) -> None:
            after_commit(q, batch)
            self.batches.append((time.perf_counter(), batch.count))

        if begin is not None:  # publish goes through begin_publish: timed there
            publisher.begin_publish = timed_begin
        else:
            publisher.publish = timed_publish
        service._after_commit = timed_after_commit  # type: ignore[method-assign]

    def report(self, sent_at: float, n: int, sent_all: float, latencies: list[float]) -> None:
        """Per stage, when the burst's messages passed it (ms after the send, p50/p99;
        messages are matched to units and batches in order: one stream, one partition)."""

        def per_message(spans: list[tuple[float, int]]) -> list[float]:
            out: list[float] = []
            for at, count in spans:
                out.extend([(at - sent_at) * 1000] * count)
            return out[-n:]

        handed = per_message([(b, c) for b, _, c in self.units])
        committed = per_message([(e, c) for _, e, c in self.units])
        queued = per_message(self.batches)
        print(f"  stages (ms after the send; sender had all acknowledged at {sent_all:.1f}):")
        for name, values in (("handed to MQ by the plugin", handed),
                             ("plugin unit committed", committed),
                             ("on the subscriber's queue", queued),
                             ("got by the subscriber", latencies)):
            if values:
                print(f"    {name:28s} first {min(values):7.1f}  p50"
                      f" {percentile(values, 0.5):7.1f}  p99 {percentile(values, 0.99):7.1f}"
                      f"  last {max(values):7.1f}")
        tail = self.units[-12:]
        print("    plugin units (size: handed -> committed): " + ", ".join(
            f"{c}: {(b - sent_at) * 1000:.0f}->{(e - sent_at) * 1000:.0f}" for b, e, c in tail))


async def burst(
    qm: EmbeddedQueueManager, instance: PluginInstance, path: str, where: str,
    units: Callable[[], int], n: int, limit: float,
) -> tuple[list[float], float, int]:
    """Run ``instance`` with the broker service on ``qm`` while the outside process sends
    the burst; latencies (ms) and the plugin's units of work for the burst."""
    qm.run_mqsc(f"DEFINE QLOCAL('{SUB_QUEUE}') MAXDEPTH(100000) REPLACE", stop_on_error=True)
    service = BrokerService(
        qm, PubSubEngine(qm.name, MemoryStore()),
        BrokerConfig(streams=[StreamQueueConfig(name=STREAM)]),
    )
    await service.start()
    host = PluginHost(qm, service, "bench")
    server = QueueManagerServer(qm)
    await server.start()
    child: asyncio.subprocess.Process | None = None
    clock = StageClock()
    try:
        publisher = host.attach(instance).publisher
        if NO_OVERLAP:
            begin = publisher.begin_publish

            async def one_at_a_time(publications: Any) -> Any:
                ends = await begin(publications)
                await ends
                return ends

            publisher.begin_publish = one_at_a_time  # type: ignore[method-assign]
        if STAGES:
            clock.watch(publisher, service)
        await host.start(instance)
        await register(qm, "burst/#")
        child = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "benchmarks.bench_inbound_burst", "--outside", path, where,
            str(qm.path), str(n), str(limit), "1" if ONE_BY_ONE else "0",
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        )
        assert child.stdin is not None and child.stdout is not None
        async with asyncio.timeout(limit + 60):
            ready = await child.stdout.readline()
            if ready.strip() != b"ready":
                raise SystemExit(f"the outside process failed: {ready!r}")
            before, handled = units(), service.counters.messages
            child.stdin.write(b"go\n")
            await child.stdin.drain()
            # When the service has committed the burst's last message to the
            # subscriber's queue: the gateway's part, without the subscriber's gets.
            while service.counters.messages < handled + n:
                await asyncio.sleep(0.002)
            committed_at = time.perf_counter()
            line = await child.stdout.readline()
            await child.wait()
        if child.returncode != 0 or not line.strip():
            raise SystemExit(f"the outside process failed ({child.returncode})")
        sent_at, sent_all, *latencies = (float(v) for v in line.split())
        if STAGES:
            clock.report(sent_at, n, sent_all, latencies)
        return latencies, (committed_at - sent_at) * 1000, units() - before
    finally:
        if child is not None and child.returncode is None:
            child.kill()
            await child.wait()
        await host.stop_all()
        await service.stop()
        await server.stop()
        await qm.close()


async def kafka_path(
    kafka: KafkaBroker, work: Path, n: int, limit: float
) -> tuple[list[float], float, int]:
    admin = AIOKafkaAdminClient(bootstrap_servers=kafka.bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(KAFKA_TOPIC, 1, 1)])
    finally:
        await admin.close()
    config = KafkaPluginConfig.model_validate(
        {
            "bootstrap_servers": kafka.bootstrap,
            "outbound": {"enabled": False},
            "inbound": {
                "topics": [{"kafka_topic": KAFKA_TOPIC, "stream": STREAM, "topic": "burst/k"}],
                "group_id": "bench-burst",
            },
        }
    )
    instance = kafka_plugin.create("kafka", config)

    def units() -> int:
        source: Any = getattr(instance, "source", None)
        return 0 if source is None else int(source.counters.commits)

    return await burst(EmbeddedQueueManager("QMKB", work / "qm-kafka"), instance, "kafka",
                       kafka.bootstrap, units, n, limit)


async def mqtt_path(
    mqtt: MosquittoBroker, work: Path, n: int, limit: float
) -> tuple[list[float], float, int]:
    config = MqttConfig.model_validate(
        {
            "host": mqtt.host,
            "port": mqtt.port,
            "client_id": "bench-burst",
            "outbound": {"topics": ["$SYS/STREAM/NOT.BRIDGED/#"]},
            "inbound": {"filters": [{"filter": "burst/#", "stream": STREAM}]},
        }
    )
    instance = mqtt_plugin.create("mqtt", config)

    def units() -> int:
        source: Any = getattr(instance, "source", None)
        return 0 if source is None else int(source.counters.units_of_work)

    return await burst(EmbeddedQueueManager("QMMB", work / "qm-mqtt"), instance, "mqtt",
                       f"{mqtt.host}:{mqtt.port}", units, n, limit)


def report(path: str, latencies: list[float], in_mq: float, units: int, n: int) -> None:
    p50, p99 = percentile(latencies, 0.5), percentile(latencies, 0.99)
    verdict = "met" if p99 < GOAL_P99_MS else "NOT met"
    print(
        f"{path}: burst of {n}: to the subscriber's get p50 {p50:6.1f} ms  p99 {p99:6.1f} ms"
        f" (first {min(latencies):.1f} ms); all {n} committed on its queue after"
        f" {in_mq:6.1f} ms; plugin units of work {units}"
        f"  (goal p99 < {GOAL_P99_MS:.0f} ms: {verdict}; load {os.getloadavg()[0]:.2f})",
        flush=True,
    )
    record(Row(f"{path} burst of {n}", p99, p50, GOAL_P99_MS, kind="latency", unit="ms",
               note=f"send -> MQ subscriber's get; on its queue after {in_mq:.0f} ms;"
               f" {units} plugin units of work"))


async def run(n: int, limit: float, paths: set[str]) -> int:
    work = Path(tempfile.mkdtemp(prefix="mqgw-bench-burst-"))
    try:
        if "kafka" in paths:
            kafka = KafkaBroker(work / "kafka")
            kafka.start()
            try:
                latencies, in_mq, units = await kafka_path(kafka, work, n, limit)
            finally:
                kafka.stop()
            report("Kafka -> MQ", latencies, in_mq, units, n)
        if "mqtt" in paths:
            mqtt = MosquittoBroker(work / "mosquitto")
            mqtt.start()
            try:
                latencies, in_mq, units = await mqtt_path(mqtt, work, n, limit)
            finally:
                mqtt.stop()
            report("MQTT -> MQ", latencies, in_mq, units, n)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=500)
    parser.add_argument("--time-limit", type=float, default=30.0, help="seconds per burst")
    parser.add_argument("--paths", default="kafka,mqtt")
    parser.add_argument(
        "--one-by-one", action="store_true",
        help="the sender awaits each message's acknowledgement (as examples/demo does)",
    )
    parser.add_argument(
        "--stages", action="store_true",
        help="also print when the burst was handed to MQ by the plugin, committed by it,"
        " on the subscriber's queue and got (p50/p99 each)",
    )
    parser.add_argument(
        "--no-overlap", action="store_true",
        help="the plugin puts a unit of work only after the one before has committed"
        " (no begin_publish; to compare)",
    )
    parser.add_argument("--outside", nargs=6, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    global ONE_BY_ONE, STAGES, NO_OVERLAP
    ONE_BY_ONE, STAGES, NO_OVERLAP = args.one_by_one, args.stages, args.no_overlap
    if args.outside:
        return outside_child(args.outside)
    return asyncio.run(run(args.messages, args.time_limit, set(args.paths.split(","))))


if __name__ == "__main__":
    sys.exit(main())
