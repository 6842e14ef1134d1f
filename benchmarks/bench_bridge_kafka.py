"""MQ -> Kafka bridge throughput next to raw aiokafka and librdkafka producers on the same broker.

One local Kafka broker (devstack), one embedded queue manager. For each broker-service
batch size, N persistent 1 KiB MQRFH2 publications are put on a stream queue first;
then the gateway (broker service + plugin host + ``kafka`` plugin, idempotent producer,
acks=all) is started and timed until every publication is acknowledged by Kafka and
its MQ unit of work committed. The raw baseline produces N records of the same size and
header count with an idempotent acks=all aiokafka producer, fully pipelined. The
Kafka topic's end offset is checked against N (no loss, no duplicate). With the
``confluent`` backend (``--backends``, default both) the gateway runs again with the
plugin's librdkafka backend, next to a raw librdkafka producer (confluent-kafka,
idempotent, acks=all, same records) measured in the same run; an info row also sets it
against the raw aiokafka producer (the issue's stretch: above 1.0). With ``--workers
0,1`` (the default) each gateway run is followed by the same with the ``kafka`` instance
in ONE worker process, configured with ``workers:`` (benchmarks/worker_bridge.py: timed
the same way, main-process and worker CPU per message printed), rows "..., 1 worker"
with the same goal. Both rows' CPU covers their timed window only. The windows still
differ in two ways: the in-process one includes the broker service's start (a few ms),
the worker one the commit of the units holding the publications (worker_bridge). The
worker rows count what the worker's sink delivered. Bounded to about 90 s per run.
Before each in-process aiokafka gateway run (``--hand``, the default), the hand-written
bridge (benchmarks/hand_bridge.py: get_batch of the same batch size under syncpoint,
MQRFH2 decode for the topic, raw aiokafka producer as above, wait for the batch's
acknowledgements, MQ commit) runs on the same pre-loaded publications: an info row
"MQ -> Kafka, batch B [vs hand-written bridge ...]", its end offset checked against N,
and its own ratio to the raw producer printed (what the MQ side costs a bridge alone).
Run: .venv/bin/python benchmarks/bench_bridge_kafka.py [--messages N] [--workers 0,1]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import shutil
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from benchmarks import gc_setting, hand_bridge
from benchmarks.batch_setting import batch_label, broker_config, parse_batch_sizes
from benchmarks.summary import Row, record
from benchmarks.worker_bridge import WorkerRun, run_with_worker
from gateway.devstack import KafkaBroker
from gateway.mq.embedded.qmgr import EmbeddedQueueManager
from gateway.mq.port import Message
from gateway.pubsub.engine import PubSubEngine
from gateway.pubsub.sqlite_store import SqliteStore
from gateway.runtime.plugin_host import PluginHost
from gateway.runtime.pubsub_service import BrokerConfig, BrokerService
from gateway.wire.constants import Persistence
from gateway.wire.folder import Element
from gateway.wire.formats import FMT_RF_HEADER_2, FMT_STRING
from gateway.wire.mqmd import MQMD
from gateway.wire.rfh2 import MQRFH2, encode_rfh2
from plugins.kafka import KafkaPluginConfig, plugin

STREAM = "BENCH.STREAM"
PAYLOAD = b"x" * 1024
TOPICS = 16
TIME_LIMIT_S = 20.0
#: Issue 32's goal for the gateway's CPU per message on this path, default configuration.
CPU_GOAL_US = 40.0


#: Of the last :func:`bridge` run: deliveries handed to the sink directly (the rest went
#: through its backlog queue) and the broker service's batches on the stream queue.
LAST_DIRECT: list[int] = [0, 0]
#: Of the last :func:`bridge` run: CPU seconds of the event-loop thread alone (the rest
#: of the process's is the queue manager's writer thread and the clients' threads).
LAST_LOOP_CPU: list[float] = [0.0]


def _publication(i: int) -> tuple[MQMD, bytes]:
    psc = Element.from_pairs(
        "psc", {"Command": "Publish", "Topic": f"$SYS/STREAM/{STREAM}/T{i % TOPICS}"}
    )
    usr = Element.from_pairs("usr", {"Seq": i})
    rfh2 = MQRFH2(folders=[psc, usr], format=FMT_STRING, coded_char_set_id=1208)
    md = MQMD(format=FMT_RF_HEADER_2, persistence=Persistence.PERSISTENT, coded_char_set_id=1208)
    return md, encode_rfh2(rfh2, ccsid=1208) + PAYLOAD


async def _create_topic(bootstrap: str, topic: str) -> None:
    """One partition, replication 1 (the raw producers' topics)."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(topic, 1, 1)])
    finally:
        await admin.close()


async def _end_offset(bootstrap: str, topic: str) -> int:
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None)
    await consumer.start()
    try:
        parts = consumer.partitions_for_topic(topic) or set()
        if not parts:
            await consumer.topics()  # refreshes the metadata
            parts = consumer.partitions_for_topic(topic) or {0}
        ends = await consumer.end_offsets([TopicPartition(topic, p) for p in parts])
        return sum(ends.values())
    finally:
        await consumer.stop()


async def bridge(
    bootstrap: str,
    work: Path,
    n: int,
    batch: int | None,
    prefix: str,
    linger_ms: int | None = None,
    backend: str = "aiokafka",
) -> tuple[int, float, float]:
    """Returns (messages bridged, seconds, main-process CPU seconds) for ``n`` queued
    publications. Seconds and CPU cover the same window: from the broker service's start
    (included, a few ms) until the last delivery is committed. Putting the
    publications and starting/stopping the plugin are outside it, as in
    worker_bridge.run_with_worker's window. ``batch`` None: the broker's default
    configuration (no ``batch_size`` given)."""
    qm = EmbeddedQueueManager("QMBENCH", work / f"qm-{prefix}")
    qm.run_mqsc(f"DEFINE QLOCAL('{STREAM}') DEFPSIST(YES) MAXDEPTH(1000000) REPLACE")
    store = SqliteStore(work / f"pubsub-{prefix}.db", synchronous="NORMAL")
    service = BrokerService(
        qm,
        PubSubEngine(qm.name, store),
        broker_config(STREAM, batch, wait_ms=100),
    )
    host = PluginHost(qm, service, "bench")
    config = KafkaPluginConfig.model_validate(
        {
            "bootstrap_servers": bootstrap,
            "backend": backend,
            **({} if linger_ms is None else {"linger_ms": linger_ms}),
            "outbound": {"topic_template": prefix + ".{stream}", "routes": [{"stream": STREAM}]},
        }
    )
    instance = plugin.create("kafka", config)
    gc_policy = None
    try:
        await host.start(instance)
        # started up: the policy `mqgw run` applies at this point (benchmarks/gc_setting.py),
        # before the publications are queued, so they are not frozen (as in steady running)
        gc_policy = gc_setting.apply_gateway_policy(f"bench bridge {prefix}")
        await hand_bridge.preload(qm, STREAM, n, _publication)
        counters = host.sink_counters["kafka"]
        started, cpu, loop_cpu = time.monotonic(), time.process_time(), time.thread_time()
        await service.start()
        deadline = started + TIME_LIMIT_S
        backlog = service.backlogs["kafka"]
        # acknowledged by Kafka (counted on acknowledgement) and the last batch's MQ unit
        # of work committed: a depth counts gets locked in an open unit of work
        while (
            counters.deliveries < n or qm.queue_depth(STREAM) or qm.queue_depth(backlog)
        ) and time.monotonic() < deadline:
            await asyncio.sleep(0.005)
        took = time.monotonic() - started
        cpu = time.process_time() - cpu
        LAST_LOOP_CPU[0] = time.thread_time() - loop_cpu
        done = counters.deliveries
        LAST_DIRECT[:] = [service.forwarder_counters()["kafka"].direct, service.counters.batches]
    finally:
        if gc_policy is not None:
            gc_policy.release()
        await host.stop_all()
        await service.stop()
        await qm.close()
        store.close()
    return done, took, cpu


async def hand(
    bootstrap: str, work: Path, n: int, batch: int, prefix: str,
    on_start: Callable[[], None] | None = None, on_stop: Callable[[], None] | None = None,
) -> hand_bridge.HandRun:
    """The hand-written bridge (benchmarks/hand_bridge.py) with the raw aiokafka producer
    of :func:`raw` (idempotent, acks=all, linger 5 ms, the same 14 headers; record batches
    as big as the plugin's, so the two bridges differ in their code only), key = the
    publication's topic within the stream (the raw baseline's keys), on the same
    pre-loaded publications as :func:`bridge`; timed from the first get to the last MQ
    commit. Topic creation and the producer's start are outside the window."""
    qm = EmbeddedQueueManager("QMBENCH", work / f"qm-{prefix}")
    qm.run_mqsc(f"DEFINE QLOCAL('{STREAM}') DEFPSIST(YES) MAXDEPTH(1000000) REPLACE")
    topic = f"{prefix}.{STREAM}"
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap, acks="all", enable_idempotence=True, linger_ms=5,
        max_batch_size=KafkaPluginConfig().producer_batch_bytes(),
    )
    headers = [(f"mq.h{i}", b"0123456789") for i in range(14)]
    # the gateway's collector setting, applied at the same point (before the preload): the
    # comparison is of the bridges, not of the settings (a user can tune theirs alike)
    gc_policy = gc_setting.apply_gateway_policy(f"hand-written bridge {prefix}")
    try:
        await hand_bridge.preload(qm, STREAM, n, _publication)
        await _create_topic(bootstrap, topic)
        await producer.start()
        await producer.partitions_for(topic)  # metadata outside the timed part

        async def send(
            mq_topic: str, _m: Message, _rfh2: MQRFH2, payload: bytes
        ) -> Awaitable[object]:
            result: Awaitable[object] = await producer.send(
                topic, payload, key=mq_topic.encode(), headers=headers
            )
            return result

        return await hand_bridge.run(
            qm, STREAM, n, batch, send, time_limit=TIME_LIMIT_S, on_start=on_start, on_stop=on_stop
        )
    finally:
        gc_policy.release()
        await producer.stop()
        await qm.close()


async def bridge_in_worker(
    bootstrap: str, work: Path, n: int, batch: int, prefix: str, linger_ms: int | None = None,
    backend: str = "aiokafka",
) -> WorkerRun:
    """The same bridge with the ``kafka`` instance in one worker process (``workers:``),
    timed the same way (benchmarks/worker_bridge.py)."""
    return await run_with_worker(
        work=work, stream=STREAM, n=n, batch=batch, wait_ms=100, plugin="kafka",
        config={"bootstrap_servers": bootstrap, "backend": backend,
                **({} if linger_ms is None else {"linger_ms": linger_ms}),
                "outbound": {"topic_template": prefix + ".{stream}",
                             "routes": [{"stream": STREAM}]}},
        publication=_publication, time_limit=TIME_LIMIT_S, label=prefix,
    )


async def raw(bootstrap: str, n: int, topic: str, batch_bytes: int | None = None) -> float:
    """Seconds for an idempotent acks=all producer to get ``n`` comparable records acked
    (``batch_bytes``: its max_batch_size; default aiokafka's own, 16 KiB)."""
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap, acks="all", enable_idempotence=True, linger_ms=5,
        **({} if batch_bytes is None else {"max_batch_size": batch_bytes}),
    )
    await producer.start()
    await _create_topic(bootstrap, topic)
    headers = [(f"mq.h{i}", b"0123456789") for i in range(14)]
    try:
        await producer.partitions_for(topic)  # metadata outside the timed part
        started = time.monotonic()
        pending = []
        for i in range(n):
            pending.append(
                await producer.send(topic, PAYLOAD, key=f"T{i % TOPICS}".encode(), headers=headers)
            )
            if len(pending) >= 5000:
                await asyncio.gather(*pending)
                pending.clear()
        await asyncio.gather(*pending)
        return time.monotonic() - started
    finally:
        await producer.stop()


def raw_confluent(bootstrap: str, n: int, topic: str) -> float:
    """Seconds for an idempotent acks=all librdkafka producer (confluent-kafka) to get
    ``n`` comparable records acked: the raw baseline of the ``confluent`` backend."""
    import confluent_kafka
    from confluent_kafka.admin import AdminClient
    from confluent_kafka.admin import NewTopic as CNewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([CNewTopic(topic, 1, 1)]).values():
        future.result(30)
    producer = confluent_kafka.Producer(
        {"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True,
         "linger.ms": 5}
    )
    headers = [(f"mq.h{i}", b"0123456789") for i in range(14)]
    acked = 0

    def delivered(err: object, _msg: object) -> None:
        nonlocal acked
        if err is not None:
            raise RuntimeError(f"raw librdkafka producer: {err}")
        acked += 1

    producer.list_topics(topic, timeout=30)  # metadata outside the timed part
    started = time.monotonic()
    for i in range(n):
        while True:
            try:
                producer.produce(
                    topic, PAYLOAD, f"T{i % TOPICS}".encode(), headers=headers,
                    on_delivery=delivered,
                )
                break
            except BufferError:
                producer.poll(0.01)
        producer.poll(0)
    producer.flush(60)
    took = time.monotonic() - started
    if acked != n:
        raise RuntimeError(f"raw librdkafka producer: {acked} of {n} acknowledged")
    return took


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=10_000)
    parser.add_argument(
        "--batch-sizes", default="default,256",
        help="broker batch_size settings, comma-separated; 'default': the configuration's "
        "default (no batch_size given)",
    )
    parser.add_argument(
        "--linger-ms", type=int, default=None,
        help="the plugin's linger_ms (default: the backend's default, 0 or 2 for confluent)",
    )
    parser.add_argument(
        "--backends", default="aiokafka,confluent",
        help="plugin backends to run the gateway with (comma-separated)",
    )
    parser.add_argument("--workers", default="0,1",
                        help="configurations: 0 = sink in process, 1 = in one worker process")
    parser.add_argument("--hand", action=argparse.BooleanOptionalAction, default=True,
                        help="also the hand-written bridge (MQ get + raw aiokafka + commit)")
    gc_setting.add_argument(parser)
    args = parser.parse_args(argv)
    gc_setting.configure(args)
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    workers = [int(w) for w in args.workers.split(",")]
    n = args.messages
    work = Path(tempfile.mkdtemp(prefix="mqgw-bench-kafka-"))
    broker = KafkaBroker(work / "kafka")
    failed = False
    try:
        broker.start()
        print(f"GC: the gateway and the hand-written bridge run with {gc_setting.describe()}; "
              f"the raw producers with "
              f"Python's settings {gc.get_threshold()} (a raw client's user has them)",
              flush=True)
        raw_s = asyncio.run(raw(broker.bootstrap, n, "raw-warmup"))  # JVM warm-up
        raw_s = asyncio.run(raw(broker.bootstrap, n, "raw"))
        raw_rate = n / raw_s
        print(
            f"raw aiokafka producer (idempotent, acks=all, 1 KiB): {n:,} in {raw_s:.2f} s "
            f"= {raw_rate:,.0f} msg/s",
            flush=True,
        )
        # the plugin batches up to its max_batch_size per request; the same setting on
        # the raw producer, for information (the goal's baseline keeps aiokafka's 16 KiB)
        plugin_batch = KafkaPluginConfig().producer_batch_bytes()
        raw_big_rate = n / asyncio.run(raw(broker.bootstrap, n, "raw-big", plugin_batch))
        print(
            f"raw aiokafka producer, max_batch_size {plugin_batch:,} (the plugin's): "
            f"{raw_big_rate:,.0f} msg/s",
            flush=True,
        )
        baselines = {"aiokafka": ("raw aiokafka producer", raw_rate)}
        if "confluent" in backends:
            raw_confluent(broker.bootstrap, min(n, 2000), "raw-rd-warmup")
            rd_s = raw_confluent(broker.bootstrap, n, "raw-rd")
            rd_rate = n / rd_s
            print(
                f"raw librdkafka producer (confluent-kafka, idempotent, acks=all, 1 KiB): "
                f"{n:,} in {rd_s:.2f} s = {rd_rate:,.0f} msg/s; "
                f"librdkafka/aiokafka = {rd_rate / raw_rate:.2f}",
                flush=True,
            )
            baselines["confluent"] = ("raw librdkafka producer", rd_rate)
        for backend in backends:
            base_name, base_rate = baselines[backend]
            for setting, w in ((b, w) for b in parse_batch_sizes(args.batch_sizes)
                               for w in workers):
                # the number a default configuration uses, where a number is needed
                batch = BrokerConfig().batch_size if setting is None else setting
                what = batch_label(setting)
                prefix = f"bench{setting or 'default'}-{args.linger_ms}-{backend}-w{w}"
                extra = ""
                hand_run = None
                if w == 0 and backend == "aiokafka" and args.hand:
                    # the hand-written bridge just before the gateway run it is set against
                    hand_run = asyncio.run(hand(broker.bootstrap, work, n, batch,
                                                  f"hand{setting or 'default'}"))
                    hand_on = asyncio.run(_end_offset(
                        broker.bootstrap, f"hand{setting or 'default'}.{STREAM}"))
                    print(
                        f"hand-written bridge (MQ get_batch {batch} + raw aiokafka + commit): "
                        f"{hand_run.sent:,} in {hand_run.seconds:.2f} s = {hand_run.rate:,.0f} "
                        f"msg/s; ratio hand-written/raw aiokafka = {hand_run.rate / raw_rate:.2f}"
                        f"; records on Kafka: {hand_on:,}; CPU "
                        f"{hand_run.cpu / max(hand_run.sent, 1) * 1e6:.0f} us/msg (loop thread "
                        f"{hand_run.loop_cpu / max(hand_run.sent, 1) * 1e6:.0f})",
                        flush=True,
                    )
                    if hand_run.sent != n or hand_on != n:
                        print(f"error: hand-written bridge: expected {n} bridged and on Kafka, "
                              f"got {hand_run.sent} / {hand_on}", file=sys.stderr)
                        failed = True
                if w == 0:
                    # CPU over the timed window only (not the puts before it), as the
                    # worker rows' main CPU
                    done, took, cpu = asyncio.run(
                        bridge(broker.bootstrap, work, n, setting, prefix, args.linger_ms,
                               backend)
                    )
                    cpu_us = cpu / max(done, 1) * 1e6
                    extra = (f"; CPU {cpu_us:.0f} us/msg (loop thread "
                             f"{LAST_LOOP_CPU[0] / max(done, 1) * 1e6:.0f}); "
                             f"{LAST_DIRECT[0]:,} handed to the "
                             f"sink directly; {done / max(LAST_DIRECT[1], 1):.0f} msgs/batch")
                    if backend == "aiokafka":
                        record(Row(f"MQ -> Kafka, {what}: gateway CPU per message",
                                   cpu_us, 0.0, CPU_GOAL_US if setting is None else None,
                                   kind="figure", unit="us/msg",
                                   note="process, all threads, the timed window"))
                else:
                    wr = asyncio.run(bridge_in_worker(broker.bootstrap, work, n, batch, prefix,
                                                      args.linger_ms, backend))
                    # what the worker's sink delivered, checked against n below
                    done, took = wr.delivered, wr.seconds
                    extra = (f"; main CPU {wr.main_cpu / n * 1e6:.0f} us/msg (loop thread "
                             f"{wr.loop_cpu / n * 1e6:.0f}), worker "
                             f"{wr.worker_cpu / n * 1e6:.0f} us/msg, "
                             f"{wr.delivered / max(wr.batches, 1):.0f} msgs/batch")
                on_kafka = asyncio.run(_end_offset(broker.bootstrap, f"{prefix}.{STREAM}"))
                rate = done / took
                label = "" if backend == "aiokafka" else f" ({backend} backend)"
                where = "" if w == 0 else ", 1 worker"
                print(
                    f"MQ -> Kafka bridge{label} (persistent 1 KiB, {what}{where}): "
                    f"{done:,} in {took:.2f} s = {rate:,.0f} msg/s; ratio bridge/"
                    f"{base_name.removesuffix(' producer')} = {rate / base_rate:.2f}"
                    + ("" if backend == "aiokafka" else
                       f", bridge/raw aiokafka = {rate / raw_rate:.2f}")
                    + f"; records on Kafka: {on_kafka:,}{extra}",
                    flush=True,
                )
                record(Row(f"MQ -> Kafka{label}, {what}{where}", rate, base_rate, 0.8,
                           note=f"vs {base_name}"))
                if backend == "aiokafka" and w == 0:
                    print(f"ratio bridge/raw aiokafka with the plugin's max_batch_size = "
                          f"{rate / raw_big_rate:.2f}", flush=True)
                    record(Row(f"MQ -> Kafka, {what}", rate, raw_big_rate,
                               0.4 if setting is None else None,
                               kind="ratio" if setting is None else "info",
                               note="vs raw aiokafka producer, max_batch_size as the plugin's"))
                if hand_run is not None:
                    print(f"ratio bridge/hand-written bridge = {rate / hand_run.rate:.2f}",
                          flush=True)
                    record(Row(f"MQ -> Kafka, {what}", rate, hand_run.rate, None,
                               kind="info",
                               note="vs hand-written bridge: MQ get + raw aiokafka + commit"))
                if backend != "aiokafka":
                    record(Row(f"MQ -> Kafka{label}, {what}{where}", rate, raw_rate,
                               None, kind="info",
                               note="vs raw aiokafka producer; stretch > 1.0"))
                if done != n or on_kafka != n:
                    print(
                        f"error: expected {n} bridged and on Kafka, got {done} / {on_kafka}"
                        + (" (time limit)" if done < n else ""),
                        file=sys.stderr,
                    )
                    failed = True
    finally:
        broker.stop()
        shutil.rmtree(work, ignore_errors=True)
    print(f"peak RSS of the whole run: {gc_setting.peak_rss_mib():.0f} MiB", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
