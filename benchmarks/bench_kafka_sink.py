"""The Kafka sink alone, per backend: CPU and wall per record of ``KafkaSink.deliver``.

Not in ``make bench``: a tool for the client side of MQ -> Kafka (docs/kafka-backends.md).
No queue manager and no broker service: the records (1 KiB, the 14 contract headers of a
bench_bridge_kafka publication, over 16 topics) are built once, then handed to the sink
in batches as the broker service would (one ``deliver`` awaited at a time), each batch
acknowledged before the next. What is timed is the sink and its client library only: the
process CPU (all threads: the event loop, librdkafka's threads and the confluent
backend's poll thread, aiokafka's work on the loop) and the event-loop thread's, per
record, and the records per second. Every backend runs in the same process against the
same local broker, alternating, ``--runs`` times each; the Kafka topics' end offsets are
checked against what was sent.

Run: .venv/bin/python -m benchmarks.bench_kafka_sink [--backends aiokafka,confluent]
[--messages N] [--batch B] [--runs R]
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from aiokafka import AIOKafkaConsumer, TopicPartition

from gateway.devstack import KafkaBroker
from plugins.kafka import KafkaPluginConfig
from plugins.kafka.mapping import ORIGIN_HEADER, OutboundRecord
from plugins.kafka.sink import KafkaSink

TOPICS = 16
PAYLOAD = b"x" * 1024


@dataclass(frozen=True, slots=True)
class SinkRun:
    backend: str
    records: int
    seconds: float
    cpu: float
    loop_cpu: float

    def line(self) -> str:
        n = max(self.records, 1)
        return (f"{self.backend:9s} {self.records:,} records in {self.seconds:.2f} s = "
                f"{self.records / self.seconds:,.0f} rec/s; CPU {self.cpu / n * 1e6:.1f} us/rec "
                f"(event-loop thread {self.loop_cpu / n * 1e6:.1f}, other threads "
                f"{max(self.cpu - self.loop_cpu, 0.0) / n * 1e6:.1f})")


def _record(prefix: str, i: int) -> OutboundRecord:
    headers = [
        ("mq.contract", b"1"),
        ("mq.stream", b"BENCH.STREAM"),
        ("mq.topic", f"bench/t{i % TOPICS}".encode()),
        ("mq.msgId", i.to_bytes(24, "big")),
        ("mq.correlId", bytes(24)),
        ("mq.putTime", b"1700000000000"),
        ("mq.userId", b"bench"),
        ("mq.format", b"MQSTR"),
        ("mq.encoding", b"273"),
        ("mq.ccsid", b"1208"),
        ("mq.persistence", b"1"),
        ("mq.pubHeader", b"MQRFH2"),
        ("mq.seqNum", str(i).encode()),
        (ORIGIN_HEADER, b"mqgw.bench.kafka"),
    ]
    return OutboundRecord(f"{prefix}.t{i % TOPICS}", f"bench/t{i % TOPICS}".encode(),
                          PAYLOAD, headers)


async def run_sink(bootstrap: str, backend: str, n: int, batch: int, prefix: str) -> SinkRun:
    config = KafkaPluginConfig.model_validate(
        {"bootstrap_servers": bootstrap, "backend": backend, "partitions": 1}
    )
    sink = KafkaSink(config, None, instance="kafka", gateway_id="bench")
    records = [(i % batch, _record(prefix, i)) for i in range(n)]
    batches = [records[i:i + batch] for i in range(0, n, batch)]
    await sink.start()
    try:
        await sink.deliver((), batches[0])  # creates the topics, warms the producer up
        cpu, loop_cpu, started = time.process_time(), time.thread_time(), time.monotonic()
        for b in batches[1:]:
            await sink.deliver((), b)
        seconds = time.monotonic() - started
        cpu, loop_cpu = time.process_time() - cpu, time.thread_time() - loop_cpu
    finally:
        await sink.stop()
    return SinkRun(backend, n - len(batches[0]), seconds, cpu, loop_cpu)


async def on_kafka(bootstrap: str, prefix: str) -> int:
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap)
    await consumer.start()
    try:
        parts = [TopicPartition(f"{prefix}.t{t}", 0) for t in range(TOPICS)]
        return sum((await consumer.end_offsets(parts)).values())
    finally:
        await consumer.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backends", default="aiokafka,confluent")
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--batch", type=int, default=256, help="records per deliver")
    parser.add_argument("--runs", type=int, default=3, help="runs per backend, alternating")
    args = parser.parse_args(argv)
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    work = Path(tempfile.mkdtemp(prefix="mqgw-bench-sink-"))
    broker = KafkaBroker(work / "kafka")
    failed = False
    try:
        broker.start()
        asyncio.run(run_sink(broker.bootstrap, "aiokafka", 2000, args.batch, "warmup"))
        runs: dict[str, list[SinkRun]] = {b: [] for b in backends}
        for run in range(args.runs):
            for backend in backends:
                prefix = f"sink-{backend}-{run}"
                result = asyncio.run(run_sink(broker.bootstrap, backend, args.messages,
                                              args.batch, prefix))
                runs[backend].append(result)
                print(result.line(), flush=True)
                got = asyncio.run(on_kafka(broker.bootstrap, prefix))
                if got != args.messages:
                    print(f"error: {prefix}: {got} records on Kafka, sent {args.messages}",
                          file=sys.stderr)
                    failed = True
        for backend, results in runs.items():
            cpu = sorted(r.cpu / r.records * 1e6 for r in results)
            rate = sorted(r.records / r.seconds for r in results)
            print(f"{backend}: CPU {cpu[0]:.1f}-{cpu[-1]:.1f} us/rec, "
                  f"{rate[0]:,.0f}-{rate[-1]:,.0f} rec/s ({len(results)} runs, batch "
                  f"{args.batch})", flush=True)
    finally:
        broker.stop()
        shutil.rmtree(work, ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
