"""Open-loop latency: MQ put -> Kafka consumer and MQ put -> MQTT subscriber, p50/p99.

One embedded queue manager with a stream queue, the broker service (default batch
settings) and one plugin instance (``kafka``: idempotent acks=all, linger 0; ``mqtt``:
MQTT 5, QoS 1). The Kafka or MQTT consumer runs in its own process, as a subscriber of
the bridged topics does (it reports each receipt's time on its stdout;
``--consumer-in-loop``: on the gateway's event loop, as before). The Kafka broker gets
one uncounted pass at the first rate first (``--no-broker-warm-up``: none), so the
measured runs do not share the cores with a broker's JIT warm-up. Each run prints the CPU
per message of every process on the path (MQ application, gateway, consumer, broker):
on a 2-core machine their sum says whether the offered rate fits. The MQ application runs
in its own process over the queue manager's local socket, as a real MQ application does
(``--app-in-loop``: on the gateway's event loop, as before issue 16's latency pass; it
then competes with the gateway for that loop). It puts
persistent 1 KiB MQRFH2 publications at a fixed offered rate, ``--per-unit`` (10) per
unit of work every ``per-unit/rate`` seconds, on a schedule that does not wait for the
previous unit (open loop: a late put is counted late, no coordinated omission; one
commit per message would itself cap the embedded queue manager near 1,000 puts/s on
this machine, see bench_embedded_qm). Latency of a message = the consumer's receipt
minus its *scheduled* put time; the message carries its sequence number. After a
warm-up (topic creation, connections), ``--seconds`` (3) of load per path and rate, or
longer at a low rate so that each rate measures at least ``--min-messages`` (2,000): a
p99 of 400 messages would be their 4 slowest.
Rates: 1,000 msg/s (issue 16's goal: p99 < 20 ms) and 200 msg/s for information. The
Kafka consumer uses ``fetch_max_wait_ms=100``: a fetch returns as soon as a record is
there (fetch_min_bytes 1), so the wait bounds only empty fetches; at 5 ms (used before)
the broker answered 200 empty fetches a second and spent 0.3-0.9 of a core on them,
which this 2-core machine's gateway then lacked (measured: docs/performance.md).
``--stages`` also timestamps each message at every stage (the MQ application's commit,
the service's backlog put, the forwarder handing it to the sink, the sink's
acknowledgement, the forwarder's commit; instrumented from outside, by wrapping those
methods) and prints p50/p99 of each step: where the latency goes.
``--no-direct``: no direct hand-over to an idle sink (every delivery via the backlog).
The MQ application puts asynchronously (MQPMO_ASYNC_RESPONSE: no reply per put; a failed
put fails the unit's commit), as a throughput-minded MQ client does; ``--sync-put``: one
round trip per put (before issue 16's asynchronous-put pass). The summary row says which.
Run: .venv/bin/python -m benchmarks.bench_latency [--rates 1000,200] [--seconds 3] [--stages]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import aiomqtt
from aiokafka import AIOKafkaConsumer

from benchmarks import gc_setting
from benchmarks.summary import Row, record
from gateway.devstack import KafkaBroker, MosquittoBroker
from gateway.mq.embedded.qm_server import QueueManagerServer
from gateway.mq.embedded.qmgr import EmbeddedQueueManager
from gateway.mq.port import OpenOption, PutOptions
from gateway.plugin_api import PluginInstance
from gateway.pubsub.engine import PubSubEngine
from gateway.pubsub.store import MemoryStore
from gateway.runtime.plugin_host import PluginHost
from gateway.runtime.pubsub_service import BrokerConfig, BrokerService, StreamQueueConfig
from gateway.runtime.pubsub_service.sink_backlogs import SinkBacklogs
from gateway.runtime.pubsub_service.sink_forwarder import SinkForwarder
from gateway.wire.constants import Persistence
from gateway.wire.folder import Element
from gateway.wire.formats import FMT_RF_HEADER_2, FMT_STRING
from gateway.wire.mqmd import MQMD
from gateway.wire.rfh2 import MQRFH2, encode_rfh2
from plugins.kafka import KafkaPluginConfig
from plugins.kafka import plugin as kafka_plugin
from plugins.mqtt import MqttConfig
from plugins.mqtt import plugin as mqtt_plugin

STREAM = "BENCH.STREAM"
SIZE = 1024
WARM_UP = 50
#: ``--app-alone``: units of work put first and not counted (connection, caches, the
#: queue file's first growth), in both the rate and the CPU per message
APP_ALONE_WARM_UNITS = 5
GOAL_P99_MS = 20.0

#: Calls back with each received payload and its receipt time (perf_counter); yields
#: once the consumer is listening.
Arrived = Callable[[bytes, float], None]
Consumer = Callable[[Arrived], contextlib.AbstractAsyncContextManager[None]]

#: The stages a message passes, in order (``--stages``); "received" is the consumer's.
STAGES = ("scheduled", "committed", "backlog_put", "to_sink", "acked", "fw_commit", "received")

#: Broker settings other than the defaults (``--batch-size``); empty: the defaults.
BROKER_SETTINGS: dict[str, int] = {}


class StageClock:
    """Per-message timestamps (perf_counter) of each stage, by sequence number; the
    gateway's methods are wrapped while ``installed`` (measurement only)."""

    def __init__(self) -> None:
        self.times: dict[int, dict[str, float]] = {}

    def mark(self, seq: int, stage: str, at: float | None = None) -> None:
        self.times.setdefault(seq, {}).setdefault(stage, time.perf_counter() if at is None else at)

    @contextlib.contextmanager
    def installed(self) -> Iterator[None]:
        clock = self
        put_of, send, forward = SinkBacklogs.put_of, SinkForwarder._send, SinkForwarder._forward
        send_directly, delivered = SinkForwarder.send_directly, SinkBacklogs.delivered
        in_hand: list[int] = []

        def seq_of(payload: bytes) -> int | None:
            try:
                return int(payload[:12])
            except ValueError:
                return None

        def put_of_timed(self: SinkBacklogs, name: str, d: Any, envelope: Any = None) -> Any:
            put = put_of(self, name, d, envelope)
            seq = seq_of(d.body)
            if seq is not None:
                clock.mark(seq, "backlog_put")
            return put

        async def send_timed(self: SinkForwarder, pending: Any, *args: Any) -> None:
            seqs = [s for s in (seq_of(e.payload) for _, e in pending) if s is not None]
            for seq in seqs:
                clock.mark(seq, "to_sink")
            await send(self, pending, *args)
            now = time.perf_counter()
            for seq in seqs:
                clock.mark(seq, "acked", now)
            in_hand.extend(seqs)

        async def forward_timed(self: SinkForwarder, *args: Any) -> int:
            in_hand.clear()
            got = await forward(self, *args)
            now = time.perf_counter()
            for seq in in_hand:
                clock.mark(seq, "fw_commit", now)
            return got

        def send_directly_timed(self: SinkForwarder, envelopes: list[Any]) -> Any:
            seqs = [s for s in (seq_of(e.payload) for e in envelopes) if s is not None]
            for seq in seqs:
                clock.mark(seq, "to_sink")
            task = send_directly(self, envelopes)

            def acked(_: Any) -> None:
                now = time.perf_counter()
                for seq in seqs:
                    clock.mark(seq, "acked", now)

            task.add_done_callback(acked)
            return task

        def delivered_timed(handovers: list[Any]) -> None:
            delivered(handovers)
            now = time.perf_counter()
            for h in handovers:
                if h.acked:
                    for e in h.envelopes:
                        seq = seq_of(e.payload)
                        if seq is not None:
                            clock.mark(seq, "fw_commit", now)

        SinkForwarder.send_directly = send_directly_timed  # type: ignore[method-assign]
        SinkBacklogs.delivered = staticmethod(delivered_timed)  # type: ignore[method-assign,assignment]
        SinkBacklogs.put_of = put_of_timed  # type: ignore[method-assign]
        SinkForwarder._send = send_timed  # type: ignore[method-assign]
        SinkForwarder._forward = forward_timed  # type: ignore[method-assign]
        try:
            yield
        finally:
            SinkBacklogs.put_of = put_of  # type: ignore[method-assign]
            SinkForwarder._send = send  # type: ignore[method-assign]
            SinkForwarder._forward = forward  # type: ignore[method-assign]
            SinkForwarder.send_directly = send_directly  # type: ignore[method-assign]
            SinkBacklogs.delivered = staticmethod(delivered)  # type: ignore[method-assign,assignment]

    def report(self, seqs: Iterable[int]) -> None:
        """p50/p99 of each stage's time since the scheduled put, over ``seqs`` (the
        consumer may receive before the forwarder has the acknowledgement)."""
        since: dict[str, list[float]] = {}
        seqs = list(seqs)
        for seq in seqs:
            t = self.times.get(seq, {})
            if "scheduled" not in t:
                continue
            for stage in STAGES[1:]:
                if stage in t:
                    since.setdefault(stage, []).append((t[stage] - t["scheduled"]) * 1000)
        for stage, values in since.items():
            print(
                f"    scheduled -> {stage:12s} p50 {percentile(values, 0.5):8.2f} ms  "
                f"p99 {percentile(values, 0.99):8.2f} ms  ({len(values):,})",
                flush=True,
            )
        # What the gateway adds: from the MQ application's commit to the receipt (the
        # gateway may deliver before the application has the commit's reply: < 0).
        added = [
            (t["received"] - t["committed"]) * 1000
            for t in (self.times.get(seq, {}) for seq in seqs)
            if "received" in t and "committed" in t
        ]
        if added:
            print(
                f"    committed -> received    p50 {percentile(added, 0.5):8.2f} ms  "
                f"p99 {percentile(added, 0.99):8.2f} ms  ({len(added):,}): the gateway's part",
                flush=True,
            )


def publication(seq: int) -> tuple[MQMD, bytes]:
    psc = Element.from_pairs(
        "psc", {"Command": "Publish", "Topic": f"$SYS/STREAM/{STREAM}/T{seq % 16}"}
    )
    rfh2 = MQRFH2(folders=[psc], format=FMT_STRING, coded_char_set_id=1208)
    md = MQMD(format=FMT_RF_HEADER_2, persistence=Persistence.PERSISTENT, coded_char_set_id=1208)
    payload = f"{seq:012d}".encode().ljust(SIZE, b"x")
    return md, encode_rfh2(rfh2, ccsid=1208) + payload


def stat_cpu(stat: Path) -> float:
    """CPU seconds (user + system) in a Linux ``/proc/.../stat`` file (OSError if it
    cannot be read, ValueError if it is not one)."""
    try:
        fields = stat.read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except IndexError:
        raise ValueError(f"{stat} is not a stat file") from None


def thread_cpu() -> dict[str, float]:
    """CPU seconds (user + system) of this process's threads by name (Linux /proc)."""
    out: dict[str, float] = {}
    tasks = Path("/proc/self/task")
    if not tasks.is_dir():
        return out
    for task in tasks.iterdir():
        with contextlib.suppress(OSError, ValueError):
            comm = (task / "comm").read_text().strip()
            out[comm] = out.get(comm, 0.0) + stat_cpu(task / "stat")
    return out


def process_cpu(pid: int) -> float:
    """CPU seconds (user + system) of another process (Linux /proc; 0.0 elsewhere)."""
    try:
        return stat_cpu(Path(f"/proc/{pid}/stat"))
    except (OSError, ValueError):
        return 0.0


def unit_times(start: float, rate: float, total: int, per_unit: int) -> Iterator[tuple[int, float]]:
    """(first sequence number, scheduled time) of each unit of work of the load."""
    for i in range(0, total - WARM_UP, per_unit):
        yield WARM_UP + i, start + i / rate


async def run_app(
    qm: Any, get_start: Callable[[], Awaitable[float]], rate: float, total: int,
    per_unit: int, async_put: bool = True,
    on_commit: Callable[[int], None] | None = None,
) -> list[tuple[int, int, float]]:
    """The MQ application: puts on the open-loop schedule; (first, end, commit time)
    of each unit of work. ``qm`` is the embedded queue manager (same event loop) or a
    client of its local socket (its own process); ``get_start`` gives the schedule's
    start once the application has connected and opened the queue (a process that is
    slow to start on a loaded machine is not counted late)."""
    conn = await qm.connect()
    committed: list[tuple[int, int, float]] = []
    try:
        handle = await conn.open(STREAM, OpenOption.OUTPUT)
        start = await get_start()
        opts = PutOptions(syncpoint=True, async_response=async_put)
        for first, at in unit_times(start, rate, total, per_unit):
            delay = at - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            end = min(total, first + per_unit)
            for seq in range(first, end):
                md, body = publication(seq)
                await handle.put(md, body, opts)
            await conn.commit()
            committed.append((first, end, time.perf_counter()))
            if on_commit is not None:
                on_commit(len(committed))
    finally:
        await conn.disconnect()
    return committed


def app_child(argv: list[str]) -> int:
    """``--app-child QM_DIR RATE TOTAL PER_UNIT ASYNC``: the MQ application in its own
    process over the queue manager's local socket, as a real MQ application runs. Once
    connected it prints ``ready`` and reads the schedule's start from stdin; at the end it
    prints the commit time of each unit of work (perf_counter is CLOCK_MONOTONIC: one
    clock for both processes). After the first :data:`APP_ALONE_WARM_UNITS` units it
    prints ``warm CPU`` (its CPU so far), which ``--app-alone`` waits for."""
    from gateway.mq.embedded.client import ClientQueueManager

    where, rate, total, per_unit, async_put = argv

    async def get_start() -> float:
        print("ready", flush=True)
        line = await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
        return float(line)

    def on_commit(units: int) -> None:
        if units == APP_ALONE_WARM_UNITS:
            print("warm", repr(time.process_time()), flush=True)

    committed = asyncio.run(
        run_app(ClientQueueManager(where), get_start, float(rate), int(total), int(per_unit),
                async_put == "1", on_commit)
    )
    for first, end, at in committed:
        print(first, end, repr(at))
    print("cpu", repr(time.process_time()))
    return 0


async def app_alone(work: Path, units: int, per_unit: int, async_put: bool) -> None:
    """``--app-alone``: the MQ application process putting ``units`` units of work back to
    back over the local socket, with no broker service or sink: its achieved rate and
    the CPU per message of the queue manager's process (the socket's server) and of the
    application's. The first :data:`APP_ALONE_WARM_UNITS` units are put and not counted:
    rate and both CPUs run from their last commit to the end."""
    qm = EmbeddedQueueManager("QMAPP", work / f"qm-alone-{int(async_put)}-{time.time_ns()}")
    qm.run_mqsc(f"DEFINE QLOCAL('{STREAM}') DEFPSIST(YES) MAXDEPTH(1000000) REPLACE")
    server = QueueManagerServer(qm)
    await server.start()
    try:
        warm = APP_ALONE_WARM_UNITS
        total = WARM_UP + (warm + units) * per_unit
        child = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "benchmarks.bench_latency", "--app-child",
            str(qm.path), "1e9", str(total), str(per_unit), "1" if async_put else "0",
            stdout=asyncio.subprocess.PIPE, stdin=asyncio.subprocess.PIPE,
        )
        assert child.stdout is not None and child.stdin is not None
        await asyncio.wait_for(child.stdout.readline(), 120)
        child.stdin.write(f"{time.perf_counter()!r}\n".encode())
        warm_line = (await asyncio.wait_for(child.stdout.readline(), 120)).split()
        cpu = time.process_time()  # the server's, from the end of the warm-up units
        if not warm_line or warm_line[0] != b"warm":
            raise SystemExit(f"the MQ application process said {warm_line!r}, not warm")
        out, _ = await child.communicate()
        server_cpu = time.process_time() - cpu
        if child.returncode:
            raise SystemExit(f"the MQ application process failed ({child.returncode})")
        lines = [ln.split() for ln in out.decode().splitlines()]
        rows = [(int(a), int(b), float(c)) for a, b, c in (ln for ln in lines if len(ln) == 3)]
        app_cpu = next(float(ln[1]) for ln in lines if ln[0] == "cpu") - float(warm_line[1])
        start = rows[warm - 1][2]  # the last warm-up unit's commit
        n = rows[-1][1] - rows[warm][0]
        print(
            f"  MQ application alone ({'async' if async_put else 'sync'} put, {per_unit} per "
            f"unit, after {warm} warm-up units): {n / (rows[-1][2] - start):,.0f} msg/s; "
            f"queue manager process {server_cpu * 1e6 / n:,.0f} us/msg, application "
            f"process {app_cpu * 1e6 / n:,.0f} us/msg",
            flush=True,
        )
    finally:
        await server.stop()
        await qm.close()


async def measure(
    qm: EmbeddedQueueManager,
    consumer: Consumer,
    rate: float,
    seconds: float,
    per_unit: int,
    clock: StageClock | None = None,
    app_in_loop: bool = False,
    after_warm_up: Callable[[], None] = lambda: None,
    async_put: bool = True,
) -> list[float]:
    """Latencies (ms) of ``rate * seconds`` publications put on an open-loop schedule."""
    scheduled: dict[int, float] = {}
    latencies: list[float] = []
    warm = asyncio.Event()
    done = asyncio.Event()
    total = WARM_UP + int(rate * seconds)

    def arrived(payload: bytes, now: float) -> None:
        try:
            seq = int(payload[:12])
        except ValueError:
            return
        if seq < WARM_UP:
            if seq == WARM_UP - 1:
                warm.set()
            return
        at = scheduled.pop(seq, None)
        if at is not None:
            latencies.append((now - at) * 1000)
            if clock is not None:
                clock.mark(seq, "scheduled", at)
                clock.mark(seq, "received", now)
        if len(latencies) >= total - WARM_UP:
            done.set()

    async with consumer(arrived):
        conn = await qm.connect()
        try:
            handle = await conn.open(STREAM, OpenOption.OUTPUT)
            for seq in range(WARM_UP):
                md, body = publication(seq)
                await handle.put(md, body, PutOptions(syncpoint=True))
                await conn.commit()
        finally:
            await conn.disconnect()
        await asyncio.wait_for(warm.wait(), 60)
        after_warm_up()
        start = 0.0

        async def get_start() -> float:
            # the schedule starts once the application is connected (a child process
            # can take seconds to start on a loaded machine)
            nonlocal start
            start = time.perf_counter() + 0.05
            for first, at in unit_times(start, rate, total, per_unit):
                for seq in range(first, min(total, first + per_unit)):
                    scheduled[seq] = at
            return start

        if app_in_loop:
            committed = await run_app(qm, get_start, rate, total, per_unit, async_put)
        else:
            child = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "benchmarks.bench_latency", "--app-child",
                str(qm.path), repr(rate), str(total), str(per_unit),
                "1" if async_put else "0", stdout=asyncio.subprocess.PIPE,
                stdin=asyncio.subprocess.PIPE,
            )
            assert child.stdout is not None and child.stdin is not None
            ready = await asyncio.wait_for(child.stdout.readline(), 120)
            if ready.strip() != b"ready":
                raise SystemExit(f"the MQ application process did not start: {ready!r}")
            child.stdin.write(f"{await get_start()!r}\n".encode())
            out, _ = await child.communicate()
            if child.returncode:
                raise SystemExit(f"the MQ application process failed ({child.returncode})")
            rows = [ln.split() for ln in out.decode().splitlines()]
            committed = [(int(r[0]), int(r[1]), float(r[2])) for r in rows if len(r) == 3]
            cpus = {r[0]: float(r[1]) for r in rows if len(r) == 2}
            if "warm" in cpus and "cpu" in cpus and len(committed) > APP_ALONE_WARM_UNITS:
                n_warm = committed[-1][1] - committed[APP_ALONE_WARM_UNITS][0]
                print(f"  MQ application process CPU (after {APP_ALONE_WARM_UNITS} units): "
                      f"{(cpus['cpu'] - cpus['warm']) * 1e6 / n_warm:,.0f} us/msg", flush=True)
        if committed:
            # the application's own pace: its achieved rate and how far behind its
            # schedule each unit's commit came (it is open loop: late means slow)
            lags = [
                (at - (start + (first - WARM_UP) / rate)) * 1000 for first, _, at in committed
            ]
            n_app = committed[-1][1] - committed[0][0]
            print(
                f"  MQ application ({'async' if async_put else 'sync'} put): {n_app:,} msgs "
                f"committed at {n_app / max(committed[-1][2] - start, 1e-9):,.0f} msg/s "
                f"(offered {rate:,.0f}); scheduled -> committed p50 "
                f"{percentile(lags, 0.5):.1f} ms, p99 {percentile(lags, 0.99):.1f} ms",
                flush=True,
            )
        if clock is not None:
            for first, end, at in committed:
                for seq in range(first, end):
                    clock.mark(seq, "committed", at)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(done.wait(), 10)
    if len(latencies) != total - WARM_UP:
        raise SystemExit(f"received {len(latencies)} of {total - WARM_UP} publications")
    return latencies


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * p))]


async def with_gateway(
    work: Path,
    name: str,
    instance: PluginInstance,
    consumer: Consumer,
    rate: float,
    seconds: float,
    per_unit: int,
    stages: bool = False,
    app_in_loop: bool = False,
    direct: bool = True,
    async_put: bool = True,
    consumer_cpu: list[float] | None = None,
    broker_pid: int | None = None,
) -> list[float]:
    """``consumer_cpu``: the consumer runs in its own process and appends its CPU seconds
    there (None: it runs on the gateway's event loop and its CPU is the gateway's).
    ``broker_pid``: the Kafka or MQTT broker's process, whose CPU is printed too."""
    qm = EmbeddedQueueManager("QMLAT", work / f"qm-{name}")
    qm.run_mqsc(f"DEFINE QLOCAL('{STREAM}') DEFPSIST(YES) MAXDEPTH(1000000) REPLACE")
    service = BrokerService(
        qm,
        PubSubEngine(qm.name, MemoryStore()),
        BrokerConfig(streams=[StreamQueueConfig(name=STREAM)], **BROKER_SETTINGS),
    )
    if not direct:
        service.sink_backlogs.direct_ack_timeout = 0
    host = PluginHost(qm, service, "bench")
    server = QueueManagerServer(qm)
    gc_policy = None
    try:
        await server.start()
        await host.start(instance)
        await service.start()
        # started up: the policy `mqgw run` applies here (benchmarks/gc_setting.py)
        gc_policy = gc_setting.apply_gateway_policy(f"bench latency {name}")
        cpu, times, threads = time.process_time(), os.times(), thread_cpu()
        broker_cpu = 0.0

        def after_warm_up() -> None:
            nonlocal broker_cpu
            if broker_pid is not None:  # from here: the load only (no topic creation)
                broker_cpu = process_cpu(broker_pid)
            # The warm-up's first sends (topic creation, connections) are slow once and
            # pause the direct hand-over (SinkBacklogs.direct_pause); a gateway past its
            # start has no such pause, so the measured load starts without it.
            for fw in service.sink_backlogs.forwarders.values():
                fw.pause_direct(0)

        if consumer_cpu is not None:
            consumer_cpu.clear()  # this run's consumer reports here
        clock = StageClock() if stages else None
        with clock.installed() if clock is not None else contextlib.nullcontext():
            lat = await measure(
                qm, consumer, rate, seconds, per_unit, clock, app_in_loop, after_warm_up,
                async_put,
            )
        if clock is not None:
            print(f"  stages of {name} at {rate:,.0f} msg/s offered:", flush=True)
            clock.report(range(WARM_UP, WARM_UP + len(lat)))
        cpu, after = time.process_time() - cpu, os.times()
        if broker_pid is not None:
            broker_cpu = process_cpu(broker_pid) - broker_cpu
        fws = service.sink_backlogs.forwarders.values()
        n_direct, n = sum(fw.counters.direct for fw in fws), len(lat) + WARM_UP
        if consumer_cpu is not None:
            print("  consumer process CPU (from listening, with the warm-up): " + (
                f"{consumer_cpu[-1] * 1e6 / n:,.0f} us/msg" if consumer_cpu
                else "not reported (the consumer process did not end in time)"), flush=True)
        with_what = ("the warm-up and the reading of the consumer's lines"
                     if consumer_cpu is not None else "the consumer and the warm-up")
        print(
            f"  gateway process CPU (all threads, with {with_what}): "
            f"{cpu * 1e6 / n:,.0f} us/msg (user {(after.user - times.user) * 1e6 / n:,.0f}, "
            f"system {(after.system - times.system) * 1e6 / n:,.0f}; by thread: "
            + ", ".join(
                f"{k} {(v - threads.get(k, 0.0)) * 1e6 / n:,.0f}"
                for k, v in sorted(thread_cpu().items())
                if v - threads.get(k, 0.0) > 0
            )
            + "); handed to the sink "
            f"directly: {n_direct:,} of {n:,}",
            flush=True,
        )
        if broker_pid is not None:
            print(f"  broker process CPU (all of it, during the load): "
                  f"{broker_cpu * 1e6 / len(lat):,.0f} us/msg", flush=True)
        return lat
    finally:
        if gc_policy is not None:
            gc_policy.release()
        await server.stop()
        await host.stop_all()
        await service.stop()
        await qm.close()


def kafka_consumer(bootstrap: str, topic: str) -> Consumer:
    @contextlib.asynccontextmanager
    async def consume(arrived: Arrived) -> AsyncIterator[None]:
        consumer = AIOKafkaConsumer(
            topic,
            bootstrap_servers=bootstrap,
            group_id=None,
            auto_offset_reset="earliest",
            fetch_max_wait_ms=100,
            metadata_max_age_ms=500,
        )
        await consumer.start()

        async def loop() -> None:
            async for msg in consumer:
                arrived(msg.value or b"", time.perf_counter())

        task = asyncio.create_task(loop())
        try:
            yield
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            await consumer.stop()

    return consume


def mqtt_consumer(host: str, port: int, prefix: str) -> Consumer:
    @contextlib.asynccontextmanager
    async def consume(arrived: Arrived) -> AsyncIterator[None]:
        async with aiomqtt.Client(host, port=port, identifier=f"lat-sub-{prefix}") as client:
            await client.subscribe(f"{prefix}/#", qos=1)

            async def loop() -> None:
                async for msg in client.messages:
                    payload = msg.payload if isinstance(msg.payload, bytes) else b""
                    arrived(payload, time.perf_counter())

            task = asyncio.create_task(loop())
            try:
                yield
            finally:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task

    return consume


def consumer_of(argv: list[str]) -> Consumer:
    """``kafka BOOTSTRAP TOPIC`` or ``mqtt HOST PORT PREFIX``."""
    if argv[0] == "kafka" and len(argv) == 3:
        return kafka_consumer(argv[1], argv[2])
    if argv[0] == "mqtt" and len(argv) == 4:
        return mqtt_consumer(argv[1], int(argv[2]), argv[3])
    raise SystemExit(f"consumer: want kafka BOOTSTRAP TOPIC or mqtt HOST PORT PREFIX, not {argv}")


def consumer_child(argv: list[str]) -> int:
    """``--consumer-child KIND ARGS...``: the Kafka or MQTT consumer in its own process,
    as a subscriber of the bridged topics runs. It prints ``ready`` once listening, then
    ``SEQ TIME`` per message received (TIME: perf_counter at receipt, CLOCK_MONOTONIC,
    one clock for all processes; lines written in batches every 20 ms, after the
    receipt time is taken, so the reporting costs little), and at the end (stdin closed)
    ``cpu SECONDS``: its CPU since ``ready``."""
    lines: list[str] = []

    def arrived(payload: bytes, now: float) -> None:
        lines.append(f"{payload[:12].decode(errors='replace')} {now!r}\n")

    async def main() -> None:
        loop = asyncio.get_running_loop()
        async with consumer_of(argv)(arrived):
            print("ready", flush=True)
            cpu = time.process_time()
            closed = loop.run_in_executor(None, sys.stdin.read)
            while not closed.done():
                if lines:
                    sys.stdout.write("".join(lines))
                    sys.stdout.flush()
                    lines.clear()
                await asyncio.sleep(0.02)
            if lines:
                sys.stdout.write("".join(lines))
            print("cpu", repr(time.process_time() - cpu), flush=True)

    asyncio.run(main())
    return 0


def process_consumer(argv: list[str], cpu: list[float]) -> Consumer:
    """The consumer of ``argv`` (see :func:`consumer_of`) in a child process; its CPU
    seconds are appended to ``cpu`` when it ends."""

    @contextlib.asynccontextmanager
    async def consume(arrived: Arrived) -> AsyncIterator[None]:
        child = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "benchmarks.bench_latency", "--consumer-child", *argv,
            stdout=asyncio.subprocess.PIPE, stdin=asyncio.subprocess.PIPE,
        )
        assert child.stdout is not None and child.stdin is not None
        stdout, stdin = child.stdout, child.stdin
        try:
            ready = await asyncio.wait_for(stdout.readline(), 120)
            if ready.strip() != b"ready":
                raise SystemExit(f"the consumer process did not start: {ready!r}")

            async def read() -> None:
                async for line in stdout:
                    fields = line.split()
                    with contextlib.suppress(ValueError):  # not a line of ours
                        if len(fields) == 2 and fields[0] == b"cpu":
                            cpu.append(float(fields[1]))
                        elif len(fields) == 2:
                            arrived(fields[0], float(fields[1]))

            reader = asyncio.create_task(read())
            try:
                yield
            finally:
                stdin.close()
                # the child's last lines and its CPU; a child that does not end in time
                # is killed below (its CPU is then missing, said where it is printed),
                # never masking how the run itself ended
                done, _ = await asyncio.wait({reader}, timeout=30)
                if not done:
                    reader.cancel()
        finally:
            if not stdin.is_closing():
                stdin.close()  # the child did not start: it ends on EOF
            if child.returncode is None:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(child.wait(), 30)
            if child.returncode is None:
                child.kill()
                await child.wait()

    return consume


def report(
    path: str, latencies: list[float], rate: float, per_unit: int, *, goal: bool,
    async_put: bool = True,
) -> None:
    p50, p99 = percentile(latencies, 0.50), percentile(latencies, 0.99)
    print(
        f"{path:28s} {rate:,.0f} msg/s offered, {len(latencies):,} msgs: p50 {p50:6.1f} ms  "
        f"p99 {p99:6.1f} ms  max {max(latencies):6.1f} ms  mean {statistics.mean(latencies):6.1f}",
        flush=True,
    )
    record(
        Row(
            path,
            p99,
            p50,
            GOAL_P99_MS if goal else None,
            kind="latency",
            unit="ms",
            note=f"{rate:,.0f} msg/s offered, {per_unit} per MQ unit of work, "
            + ("asynchronous puts" if async_put else "synchronous puts"),
        )
    )


async def run(
    rates: list[float],
    seconds: float,
    per_unit: int,
    paths: set[str],
    stages: bool = False,
    app_in_loop: bool = False,
    direct: bool = True,
    async_put: bool = True,
    consumer_in_loop: bool = False,
    broker_warm_up: bool = True,
    min_messages: int = 0,
) -> int:
    """The first rate is the goal's (recorded with the goal); the others are info rows.
    Each rate runs ``seconds``, or long enough for ``min_messages``."""
    work = Path(tempfile.mkdtemp(prefix="mqgw-bench-latency-"))
    consumer_cpu: list[float] | None = None if consumer_in_loop else []

    def consumer(argv: list[str]) -> Consumer:
        if consumer_cpu is None:
            return consumer_of(argv)
        return process_consumer(argv, consumer_cpu)

    try:
        if "kafka" in paths:
            kafka = KafkaBroker(work / "kafka")
            kafka.start()
            try:
                # A Kafka broker just started compiles its hot paths (JIT) for its first
                # seconds of traffic, at about a core; a broker a gateway feeds has long
                # done so. One pass at the first rate, not counted, warms it up.
                runs: list[tuple[int | str, float]] = [("w", rates[0])] if broker_warm_up else []
                for i, rate in runs + list(enumerate(rates)):
                    if i == "w":
                        print("  Kafka broker warm-up pass (not counted):", flush=True)
                    config = KafkaPluginConfig.model_validate(
                        {
                            "bootstrap_servers": kafka.bootstrap,
                            "outbound": {
                                "topic_template": f"lat{i}.{{stream}}",
                                "routes": [{"stream": STREAM}],
                            },
                        }
                    )
                    lat = await with_gateway(
                        work,
                        f"kafka{i}",
                        kafka_plugin.create("kafka", config),
                        consumer(["kafka", kafka.bootstrap, f"lat{i}.{STREAM}"]),
                        rate,
                        max(seconds, min_messages / rate),
                        per_unit,
                        stages and i != "w",  # no stage report for the warm-up
                        app_in_loop,
                        direct,
                        async_put,
                        consumer_cpu,
                        kafka.process.pid if kafka.process is not None else None,
                    )
                    if i != "w":
                        report("MQ put -> Kafka consumer", lat, rate, per_unit, goal=i == 0,
                               async_put=async_put)
            finally:
                kafka.stop()
        if "mqtt" in paths:
            mqtt = MosquittoBroker(work / "mosquitto")
            mqtt.start()
            try:
                for i, rate in enumerate(rates):
                    config_m = MqttConfig.model_validate(
                        {
                            "host": mqtt.host,
                            "port": mqtt.port,
                            "client_id": f"lat-gw{i}",
                            "outbound": {
                                "prefix": f"lat{i}",
                                "topics": [f"$SYS/STREAM/{STREAM}/#"],
                            },
                        }
                    )
                    lat = await with_gateway(
                        work,
                        f"mqtt{i}",
                        mqtt_plugin.create("mqtt", config_m),
                        consumer(["mqtt", mqtt.host, str(mqtt.port), f"lat{i}"]),
                        rate,
                        max(seconds, min_messages / rate),
                        per_unit,
                        stages,
                        app_in_loop,
                        direct,
                        async_put,
                        consumer_cpu,
                        mqtt.process.pid if mqtt.process is not None else None,
                    )
                    report("MQ put -> MQTT subscriber", lat, rate, per_unit, goal=i == 0,
                           async_put=async_put)
            finally:
                mqtt.stop()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--rates",
        default="1000,200",
        help="offered msg/s; the first is the goal's, the others are shown for information",
    )
    parser.add_argument("--seconds", type=float, default=3.0, help="of load per path")
    parser.add_argument(
        "--min-messages",
        type=int,
        default=2000,
        help="run a low rate longer, so that each rate measures at least this many messages",
    )
    parser.add_argument(
        "--per-unit", type=int, default=10, help="puts per MQ application unit of work"
    )
    parser.add_argument("--paths", default="kafka,mqtt")
    parser.add_argument(
        "--stages", action="store_true", help="also print p50/p99 of each stage (measurement)"
    )
    parser.add_argument(
        "--app-in-loop",
        action="store_true",
        help="run the MQ application on the gateway's event loop (before issue 16's latency "
        "pass); by default it is its own process over the queue manager's local socket",
    )
    parser.add_argument(
        "--no-direct",
        action="store_true",
        help="no direct hand-over to an idle sink: every delivery through the backlog",
    )
    parser.add_argument(
        "--sync-put",
        action="store_true",
        help="the MQ application waits for each put's reply (by default it puts "
        "asynchronously, MQPMO_ASYNC_RESPONSE, checked at each commit)",
    )
    parser.add_argument(
        "--app-alone",
        type=int,
        default=0,
        metavar="UNITS",
        help="only the MQ application: UNITS units of work back to back over the local "
        "socket, in both orders: sync, async, async, sync (rate and CPU per message)",
    )
    parser.add_argument(
        "--consumer-in-loop",
        action="store_true",
        help="run the Kafka/MQTT consumer on the gateway's event loop (before this option "
        "existed); by default it is its own process, as a subscriber of the bridged topics is",
    )
    parser.add_argument(
        "--no-broker-warm-up",
        action="store_true",
        help="measure on a Kafka broker just started (by default one uncounted pass at the "
        "first rate warms its JIT up first)",
    )
    parser.add_argument(
        "--batch-size", type=int, default=None,
        help="the broker's batch_size (default: the configuration's default), to compare",
    )
    parser.add_argument("--app-child", nargs=5, help=argparse.SUPPRESS)
    parser.add_argument("--consumer-child", nargs="+", help=argparse.SUPPRESS)
    gc_setting.add_argument(parser)
    args = parser.parse_args(argv)
    if args.consumer_child:
        return consumer_child(args.consumer_child)
    gc_setting.configure(args)
    if args.app_child:
        return app_child(args.app_child)
    if args.app_alone:

        async def alone() -> int:
            work = Path(tempfile.mkdtemp(prefix="mqgw-bench-app-"))
            try:
                # both orders, so a drift of the machine's load favours neither side
                for async_put in (False, True, True, False):
                    await app_alone(work, args.app_alone, args.per_unit, async_put)
            finally:
                shutil.rmtree(work, ignore_errors=True)
            return 0

        return asyncio.run(alone())
    rates = [float(r) for r in args.rates.split(",")]
    paths = set(args.paths.split(","))
    if args.batch_size is not None:
        BROKER_SETTINGS["batch_size"] = args.batch_size
        print(f"broker batch_size {args.batch_size} (not the default)", flush=True)
    where = "(and the consumer in its process) " if args.consumer_in_loop else ""
    print(f"GC: the gateway {where}runs with {gc_setting.describe()}; the MQ application "
          f"{'' if args.consumer_in_loop else 'and the consumer, each '}in its own process, "
          "with Python's settings", flush=True)
    return asyncio.run(
        run(
            rates,
            args.seconds,
            args.per_unit,
            paths,
            args.stages,
            args.app_in_loop,
            not args.no_direct,
            not args.sync_put,
            args.consumer_in_loop,
            not args.no_broker_warm_up,
            args.min_messages,
        )
    )


if __name__ == "__main__":
    sys.exit(main())
