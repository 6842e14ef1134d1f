"""MQ -> MQTT bridge throughput next to a raw aiomqtt publisher on the same Mosquitto.

One local Mosquitto (devstack), one embedded queue manager. For each broker-service
batch size, N persistent 1 KiB MQRFH2 publications (with one ``usr`` property) are put
on a stream queue first; then the gateway (broker service + plugin host + ``mqtt``
plugin, MQTT 5, QoS 1) is started; each MQ unit of work commits only after its
PUBACKs. The raw baseline publishes N messages of the same size and user-property count
with aiomqtt at
QoS 1, pipelined in windows of 1,000. Both are timed to the last PUBACK (gateway: until the sink has
acknowledged all N and the stream queue and the sink's backlog queue are empty, i.e. the
forwarder committed); an MQTT subscriber in
the same process checks that exactly N arrived (no loss, no duplicate). Bounded to about 60 s.
Then (``--workers 0,1``, the default) the same with the ``mqtt`` instance in ONE worker
process, configured with ``workers:`` (benchmarks/worker_bridge.py: timed the same way,
main-process and worker CPU per message printed), a row "..., 1 worker" with the same goal.
Before each in-process gateway run (``--hand``, the default) the hand-written bridge
(benchmarks/hand_bridge.py: get_batch of the same batch size under syncpoint, MQRFH2
decode for the topic, raw aiomqtt QoS 1 publishes of the batch awaited together, MQ
commit) runs on the same pre-loaded publications: an info row "MQ -> MQTT QoS 1, batch B
[vs hand-written bridge ...]", its own ratio to the raw publisher printed, the count
checked by the subscriber.
Run: .venv/bin/python benchmarks/bench_bridge_mqtt.py [--messages N] [--workers 0,1]
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

import aiomqtt
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from benchmarks import gc_setting, hand_bridge
from benchmarks.batch_setting import batch_label, broker_config, parse_batch_sizes
from benchmarks.summary import Row, record
from benchmarks.worker_bridge import run_with_worker
from gateway.devstack import MosquittoBroker
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
from plugins.mqtt import MqttConfig, plugin

STREAM = "BENCH.STREAM"
PAYLOAD = b"x" * 1024
TOPICS = 16
TIME_LIMIT_S = 20.0
#: Raw publisher: publishes awaited together (aiomqtt's cost per pending call grows
#: with their number; windows of its in-flight limit are its best case here).
WINDOW = 1000


def _publication(i: int) -> tuple[MQMD, bytes]:
    psc = Element.from_pairs(
        "psc", {"Command": "Publish", "Topic": f"$SYS/STREAM/{STREAM}/T{i % TOPICS}"}
    )
    usr = Element.from_pairs("usr", {"Seq": i})
    rfh2 = MQRFH2(folders=[psc, usr], format=FMT_STRING, coded_char_set_id=1208)
    md = MQMD(format=FMT_RF_HEADER_2, persistence=Persistence.PERSISTENT, coded_char_set_id=1208)
    return md, encode_rfh2(rfh2, ccsid=1208) + PAYLOAD


class Counter:
    """An MQTT subscriber that counts what arrives under one topic prefix."""

    def __init__(self, broker: MosquittoBroker, prefix: str) -> None:
        self.client = aiomqtt.Client(broker.host, port=broker.port, identifier=f"count-{prefix}")
        self.prefix = prefix
        self.count = 0
        self.last = 0.0
        self.done = asyncio.Event()
        self.expected = 1 << 62
        self.task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> Counter:
        await self.client.__aenter__()
        await self.client.subscribe(f"{self.prefix}/#", qos=1)
        self.task = asyncio.create_task(self._run())
        return self

    async def _run(self) -> None:
        async for _ in self.client.messages:
            self.count += 1
            self.last = time.perf_counter()
            if self.count >= self.expected:
                self.done.set()

    async def wait(self, expected: int, limit: float) -> None:
        self.expected = expected
        self.done.clear()
        if self.count >= expected:
            return
        await asyncio.wait_for(self.done.wait(), limit)

    async def __aexit__(self, *exc: object) -> None:
        await asyncio.sleep(0.3)  # a duplicate would arrive here
        if self.task is not None:
            self.task.cancel()
        await self.client.__aexit__(None, None, None)


#: CPU seconds (this process, every thread) of the last timed run: a per-message cost
#: that the machine's other load disturbs much less than msg/s (printed, not recorded).
LAST_CPU = [0.0]


async def bench_gateway(
    broker: MosquittoBroker, n: int, batch: int | None, work: Path
) -> float:
    """msg/s of the gateway; ``batch`` None: the broker's default configuration."""
    name = batch or "default"
    prefix = f"gw{name}"
    qm = EmbeddedQueueManager("QMB", work / f"qm{name}")
    qm.run_mqsc(
        f"DEFINE QLOCAL('{STREAM}') DEFPSIST(YES) MAXDEPTH({n + 1000}) REPLACE", stop_on_error=True
    )
    # the policy `mqgw run` applies once started (benchmarks/gc_setting.py), here before
    # the publications are queued, so they are not frozen (as in steady running)
    gc_policy = gc_setting.apply_gateway_policy(f"bench bridge {prefix}")
    await hand_bridge.preload(qm, STREAM, n, _publication)
    store = SqliteStore(work / f"pubsub{name}.db", synchronous="NORMAL")
    service = BrokerService(
        qm,
        PubSubEngine(qm.name, store),
        broker_config(STREAM, batch, wait_ms=50),
    )
    host = PluginHost(qm, service, "bench")
    config = MqttConfig.model_validate(
        {
            "host": broker.host,
            "port": broker.port,
            "client_id": f"bench-gw-{name}",
            "outbound": {"prefix": prefix, "topics": [f"$SYS/STREAM/{STREAM}/#"]},
        }
    )
    instance = plugin.create("mqtt", config)
    try:
        async with Counter(broker, prefix) as counter:
            await host.start(instance)
            started = time.perf_counter()
            cpu = time.process_time()
            await service.start()
            deadline = started + TIME_LIMIT_S
            # acknowledged by Mosquitto and committed in MQ: the sink acknowledged all n
            # deliveries (counted on PUBACK) and the stream queue and the sink's backlog
            # queue are empty (a depth counts gets locked in an open unit of work, so 0
            # means the forwarder committed), as bench_workers waits
            sink = host.sink_counters[instance.name]
            backlog = service.backlogs[instance.name]
            while sink.deliveries < n or qm.queue_depth(STREAM) or qm.queue_depth(backlog):
                if time.perf_counter() > deadline:
                    raise SystemExit(f"gateway batch {batch}: not done in {TIME_LIMIT_S} s")
                await asyncio.sleep(0.002)
            elapsed = time.perf_counter() - started
            LAST_CPU[0] = time.process_time() - cpu
            await counter.wait(n, TIME_LIMIT_S)
        if counter.count != n:
            raise SystemExit(f"gateway batch {batch}: received {counter.count}, expected {n}")
    finally:
        gc_policy.release()
        await service.stop()
        await host.stop_all()
        await qm.close()
        store.close()
    return n / elapsed


async def bench_raw(broker: MosquittoBroker, n: int) -> float:
    prefix = f"raw{n}"
    props = Properties(PacketTypes.PUBLISH)  # type: ignore[no-untyped-call]
    props.UserProperty = [("Seq", "0")]
    async with (
        Counter(broker, prefix) as counter,
        aiomqtt.Client(
            broker.host, port=broker.port, identifier="bench-raw", max_inflight_messages=WINDOW
        ) as pub,
    ):
        pub.pending_calls_threshold = n + 1  # pipelining on purpose: no warnings
        started = time.perf_counter()
        cpu = time.process_time()
        for low in range(0, n, WINDOW):  # pipelined in windows of max_inflight
            await asyncio.gather(
                *(
                    pub.publish(f"{prefix}/T{i % TOPICS}", PAYLOAD, qos=1, properties=props)
                    for i in range(low, min(n, low + WINDOW))
                )
            )
        elapsed = time.perf_counter() - started  # every PUBACK received
        LAST_CPU[0] = time.process_time() - cpu
        await counter.wait(n, TIME_LIMIT_S)
    if counter.count != n:
        raise SystemExit(f"raw: received {counter.count}, expected {n}")
    return n / elapsed


async def bench_hand(
    broker: MosquittoBroker, n: int, batch: int, work: Path,
    on_start: Callable[[], None] | None = None, on_stop: Callable[[], None] | None = None,
    label: str = "",
) -> hand_bridge.HandRun:
    """The hand-written bridge (benchmarks/hand_bridge.py) with a raw aiomqtt publisher
    (QoS 1, the client settings of :func:`bench_raw`), one user property (the publication's ``usr``
    Seq), on the same pre-loaded publications as :func:`bench_gateway`: each batch's
    publishes are awaited together (every PUBACK), then the MQ unit of work commits.
    The subscriber checks exactly ``n`` arrived."""
    prefix = f"hand{label or batch}"
    qm = EmbeddedQueueManager("QMB", work / f"qm-{prefix}")
    qm.run_mqsc(
        f"DEFINE QLOCAL('{STREAM}') DEFPSIST(YES) MAXDEPTH({n + 1000}) REPLACE", stop_on_error=True
    )
    # the gateway's collector setting, applied at the same point (before the preload): the
    # comparison is of the bridges, not of the settings (a user can tune theirs alike)
    gc_policy = gc_setting.apply_gateway_policy(f"hand-written bridge {prefix}")
    try:
        await hand_bridge.preload(qm, STREAM, n, _publication)
        async with (
            Counter(broker, prefix) as counter,
            aiomqtt.Client(
                broker.host, port=broker.port, identifier=f"bench-hand-{batch}",
                max_inflight_messages=max(batch, WINDOW),
            ) as pub,
        ):
            pub.pending_calls_threshold = n + 1  # a batch's publishes pipelined on purpose

            async def send(
                topic: str, _m: Message, rfh2: MQRFH2, payload: bytes
            ) -> Awaitable[object]:
                props = Properties(PacketTypes.PUBLISH)  # type: ignore[no-untyped-call]
                props.UserProperty = [("Seq", rfh2.get("usr", "Seq") or "")]
                return pub.publish(f"{prefix}/{topic}", payload, qos=1, properties=props)

            run_ = await hand_bridge.run(
                qm, STREAM, n, batch, send, time_limit=TIME_LIMIT_S, wait_ms=50,
                on_start=on_start, on_stop=on_stop,
            )
            await counter.wait(n, TIME_LIMIT_S)
        if counter.count != n or run_.sent != n:
            raise SystemExit(f"hand-written bridge, batch {batch}: received {counter.count}, "
                             f"committed {run_.sent}, expected {n}")
    finally:
        gc_policy.release()
        await qm.close()
    return run_


async def bench_worker(broker: MosquittoBroker, n: int, batch: int, work: Path) -> float:
    """The same bridge with the ``mqtt`` instance in one worker process (``workers:``),
    timed the same way; the subscriber checks exactly ``n`` arrived."""
    prefix = f"wk{batch}"
    async with Counter(broker, prefix) as counter:
        run_ = await run_with_worker(
            work=work, stream=STREAM, n=n, batch=batch, wait_ms=50, plugin="mqtt",
            config={"host": broker.host, "port": broker.port, "client_id": f"bench-wk-{batch}",
                    "outbound": {"prefix": prefix, "topics": [f"$SYS/STREAM/{STREAM}/#"]}},
            publication=_publication, time_limit=TIME_LIMIT_S,
        )
        await counter.wait(n, TIME_LIMIT_S)
    if counter.count != n or run_.delivered != n:
        raise SystemExit(f"1 worker, batch {batch}: received {counter.count}, the worker's "
                         f"sink delivered {run_.delivered}, expected {n}")
    LAST_CPU[0] = run_.main_cpu
    LAST_WORKER[:] = [run_.worker_cpu, run_.delivered / max(run_.batches, 1), run_.loop_cpu]
    return run_.rate


#: The worker's CPU seconds, messages per forwarder batch and the main process's
#: event-loop thread CPU seconds in the last worker run.
LAST_WORKER = [0.0, 0.0, 0.0]


async def run(
    n: int, batches: list[int | None], workers: list[int], hand: bool = True
) -> None:
    work = Path(tempfile.mkdtemp(prefix="bench-mqtt-"))
    broker = MosquittoBroker(work / "mosquitto")
    broker.start()
    print(f"GC: the gateway and the hand-written bridge run with {gc_setting.describe()}; "
          f"the raw publisher with "
          f"Python's settings {gc.get_threshold()} (a raw client's user has them)", flush=True)
    try:
        await bench_raw(broker, min(n, 500))  # warm-up
        raw = await bench_raw(broker, n)
        print(
            f"raw aiomqtt publisher, QoS 1, pipelined   : {raw:10,.0f} msg/s  ({n} x 1 KiB)"
            f"  CPU {LAST_CPU[0] / n * 1e6:6.0f} us/msg"
        )
        for setting in batches:
            # the number a default configuration uses, where a number is needed
            batch = BrokerConfig().batch_size if setting is None else setting
            what = batch_label(setting)
            hand_rate = None
            if hand and 0 in workers:
                # the hand-written bridge just before the gateway run it is set against
                h = await bench_hand(broker, n, batch, work, label=str(setting or "default"))
                hand_rate = h.rate
                print(
                    f"hand-written bridge (get_batch {batch:>3} + raw aiomqtt + commit): "
                    f"{h.rate:10,.0f} msg/s  ratio to raw {h.rate / raw:5.2f}  "
                    f"CPU {h.cpu / n * 1e6:6.0f} us/msg (loop thread {h.loop_cpu / n * 1e6:4.0f}); "
                    f"received {n:,} exactly",
                    flush=True,
                )
            for w in workers:
                if w == 0:
                    rate = await bench_gateway(broker, n, setting, work)
                    extra = ""
                    if hand_rate is not None:
                        extra = f"  ratio to hand-written bridge {rate / hand_rate:5.2f}"
                else:
                    rate = await bench_worker(broker, n, batch, work)
                    extra = (f" (loop thread {LAST_WORKER[2] / n * 1e6:4.0f}), "
                             f"worker {LAST_WORKER[0] / n * 1e6:4.0f} us/msg, "
                             f"{LAST_WORKER[1]:.0f} msgs/batch")
                where = "" if w == 0 else ", 1 worker"
                print(
                    f"MQ -> MQTT gateway, persistent, {what}{where}: {rate:10,.0f} "
                    f"msg/s  ratio to raw {rate / raw:5.2f}  "
                    f"main CPU {LAST_CPU[0] / n * 1e6:6.0f} us/msg{extra}",
                    flush=True,
                )
                record(
                    Row(
                        f"MQ -> MQTT QoS 1, {what}{where}",
                        rate,
                        raw,
                        1.0 if setting is None and w == 0 else 0.8,
                        note="vs raw aiomqtt publisher",
                    )
                )
                if w == 0 and hand_rate is not None:
                    record(Row(f"MQ -> MQTT QoS 1, {what}", rate, hand_rate, None,
                               kind="info",
                               note="vs hand-written bridge: MQ get + raw aiomqtt + commit"))
    finally:
        broker.stop()
        shutil.rmtree(work, ignore_errors=True)
    print(f"peak RSS of the whole run: {gc_setting.peak_rss_mib():.0f} MiB", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=10000)
    parser.add_argument(
        "--batch-sizes", default="default,256",
        help="broker batch_size settings, comma-separated; 'default': the configuration's "
        "default (no batch_size given)",
    )
    parser.add_argument("--workers", default="0,1",
                        help="configurations: 0 = sink in process, 1 = in one worker process")
    parser.add_argument("--hand", action=argparse.BooleanOptionalAction, default=True,
                        help="also the hand-written bridge (MQ get + raw aiomqtt + commit)")
    gc_setting.add_argument(parser)
    args = parser.parse_args(argv)
    gc_setting.configure(args)
    asyncio.run(run(args.messages, parse_batch_sizes(args.batch_sizes),
                    [int(w) for w in args.workers.split(",")], args.hand))
    return 0


if __name__ == "__main__":
    sys.exit(main())
