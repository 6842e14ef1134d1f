"""cProfile of each bridge path's timed part: top-N tables (docs/performance.md).

Runs the gateway side of a benchmark (no raw baseline) with cProfile enabled only while
the path is timed: from ``BrokerService.start`` (outbound and fan-out paths: the backlog
is put before) or from the inbound benchmark's ``timed`` (inbound paths: the external
broker is loaded before). Prints, per path, the top ``--top`` functions by own time and
by cumulative time as Markdown tables (module paths shortened to the repository or the
package), plus the share of the profile spent in the event loop's selector (idle).

Not a benchmark (``make bench`` does not run it): cProfile slows Python code down about
twofold, so rates printed here are not figures. Run:
.venv/bin/python -m benchmarks.profile_paths [--paths kafka_out,mqtt_out,...] [--messages N]
[--cpu RUNS] (no profiler: CPU us per message of each run instead of the tables)
[--phases] (kafka_out, kafka_hand, mqtt_out, mqtt_hand side by side: CPU us per message
per phase -- stream-queue get, decode, match, delivery build, sink, acknowledgements, MQ
commit, idle -- from one plain and one profiled run of each; see :func:`phases`)
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import io
import pstats
import shutil
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from benchmarks import bench_bridge_kafka, bench_bridge_mqtt, bench_inbound, bench_pubsub
from gateway.devstack import KafkaBroker, MosquittoBroker
from gateway.runtime.plugin_host import PluginHost
from gateway.runtime.pubsub_service import BrokerService

PATHS = ("kafka_out", "mqtt_out", "kafka_in", "mqtt_in", "fanout")
#: not in the default list: the broker service's own work alone (stream queue, backlog,
#: forwarder) with a ``memory`` sink, no external broker; and the hand-written bridges
#: (benchmarks/hand_bridge.py, batch 256) the bridge benchmarks compare the gateway with
EXTRA_PATHS = ("memory_out", "memory_backlog", "kafka_hand", "mqtt_hand", "confluent_out")
#: ``--phases``: these paths side by side, CPU us per message per phase
PHASE_PATHS = ("kafka_out", "kafka_hand", "mqtt_out", "mqtt_hand")
#: ``memory_backlog`` is ``memory_out`` with the direct hand-over off: every delivery goes
#: through the sink's backlog queue (a sink that lags), the forwarder gets it from there


async def memory_bridge(
    work: Path, n: int, batch: int, direct: bool = True
) -> tuple[int, float]:
    """``bench_bridge_kafka.bridge`` with a ``memory`` sink instead of Kafka: (messages
    the sink got, seconds). Same publications, stream queue, batch and commits."""
    from gateway.mq.embedded.qmgr import EmbeddedQueueManager
    from gateway.mq.port import PutOptions
    from gateway.pubsub.engine import PubSubEngine
    from gateway.pubsub.sqlite_store import SqliteStore
    from gateway.runtime.plugin_host import PluginHost
    from gateway.runtime.pubsub_service import BrokerConfig, StreamQueueConfig
    from plugins.memory import MemoryConfig, get_bus, plugin, reset_buses

    stream = bench_bridge_kafka.STREAM
    reset_buses()
    qm = EmbeddedQueueManager("QMBENCH", work / "qm-memory")
    qm.run_mqsc(f"DEFINE QLOCAL('{stream}') DEFPSIST(YES) MAXDEPTH(1000000) REPLACE")
    store = SqliteStore(work / "pubsub-memory.db", synchronous="NORMAL")
    service = BrokerService(
        qm,
        PubSubEngine(qm.name, store),
        BrokerConfig(streams=[StreamQueueConfig(name=stream)], batch_size=batch, wait_ms=100),
    )
    if not direct:
        service.sink_backlogs.direct_ack_timeout = 0  # never hand over: via the backlog
    host = PluginHost(qm, service, "bench")
    config = MemoryConfig(bus="prof", subscribe=[f"$SYS/STREAM/{stream}/#"])
    bus = get_bus("prof")
    try:
        await host.start(plugin.create("memory", config))
        conn = await qm.connect()
        opts = PutOptions(syncpoint=True)
        for i in range(n):
            md, body = bench_bridge_kafka._publication(i)
            await conn.put1(stream, md, body, opts)
            if i % 500 == 499:
                await conn.commit()
        await conn.commit()
        await conn.disconnect()
        started = time.monotonic()
        await service.start()
        deadline = started + bench_bridge_kafka.TIME_LIMIT_S
        backlog = service.backlogs["memory"]
        while (
            len(bus.records) < n or qm.queue_depth(stream) or qm.queue_depth(backlog)
        ) and time.monotonic() < deadline:
            await asyncio.sleep(0.005)
        took = time.monotonic() - started
        done = len(bus.records)
    finally:
        await host.stop_all()
        await service.stop()
        await qm.close()
        store.close()
    return done, took


class Window:
    """One profiler, switched on when the timed part starts.

    With ``cpu_only`` no profiler runs: the window records the process's CPU seconds
    (``time.process_time``: every thread, the queue manager's writer included) and the
    wall seconds between start and stop, for CPU per message without cProfile's overhead.
    """

    def __init__(self, cpu_only: bool = False) -> None:
        self.profile = cProfile.Profile()
        self.cpu_only = cpu_only
        self.on = False
        self.cpu = 0.0
        self.wall = 0.0
        #: CPU seconds of the thread that switched the window (the event loop's)
        self.loop_cpu = 0.0

    def start(self) -> None:
        if not self.on:
            self.on = True
            self.cpu -= time.process_time()
            self.loop_cpu -= time.thread_time()
            self.wall -= time.perf_counter()
            if not self.cpu_only:
                self.profile.enable()

    def stop(self) -> None:
        if self.on:
            if not self.cpu_only:
                self.profile.disable()
            self.cpu += time.process_time()
            self.loop_cpu += time.thread_time()
            self.wall += time.perf_counter()
            self.on = False


def _short(filename: str) -> str:
    for marker in ("/site-packages/", "/lib/python3"):
        if marker in filename:
            return filename.split(marker, 1)[1].removeprefix(".11/").removeprefix("11/")
    root = str(Path(__file__).resolve().parent.parent) + "/"
    return filename.removeprefix(root)


def tables(window: Window, top: int) -> str:
    stats = pstats.Stats(window.profile, stream=io.StringIO())
    raw: dict[Any, Any] = stats.stats  # type: ignore[attr-defined]
    total = sum(v[2] for v in raw.values()) or 1e-9
    rows = [
        (f"{_short(f)}:{line}({name})", cc, nc, tt, ct)
        for (f, line, name), (cc, nc, tt, ct, _callers) in raw.items()
    ]
    idle = sum(row[3] for row in rows if "select.epoll" in row[0])
    out = [
        f"profiled {total:.2f} s of the event-loop thread; in epoll (waiting for sockets and "
        f"for the queue manager's writer thread: fsync) {idle / total:.0%}",
        "",
    ]
    for title, key in (("own time", 3), ("cumulative time", 4)):
        out.append(f"| top {top} by {title} | calls | own s | cum s | own % |")
        out.append("|---|---:|---:|---:|---:|")
        for name, _cc, nc, tt, ct in sorted(rows, key=lambda r: r[key], reverse=True)[:top]:
            out.append(f"| `{name}` | {nc:,} | {tt:.2f} | {ct:.2f} | {tt / total:.0%} |")
        out.append("")
    return "\n".join(out)


# ------------------------------------------------------------------ phases ------------

IDLE = "event loop idle (epoll: sockets, the writer thread)"
#: Phases in table order; "writer thread" is not from the profile (see :func:`phases`).
PHASES = (
    "stream-queue get (embedded QM)",
    "MQRFH2/MQMD decode (gateway.wire)",
    "topic match / engine (gateway.pubsub)",
    "delivery build (mapping, envelope, record/properties)",
    "gateway runtime (service loop, hand-over, sink glue)",
    "hand-written bridge loop",
    "sink: client send (aiokafka / librdkafka produce / paho publish)",
    "sink: client network + acknowledgements",
    "MQ commit, event-loop side",
    "event loop scheduling (asyncio)",
    "benchmark harness (counting subscriber, polling)",
    "other",
)
_COMMIT_WORDS = ("commit", "complete", "flush", "writer", "durable", "settle", "_done")


def phase_of(filename: str, func: str) -> str | None:
    """The phase of a function's own time by where it lives (None: a builtin or a
    general-purpose stdlib function, whose time goes to its callers' phases)."""
    f = _short(filename)
    if "select.epoll" in func:
        return IDLE
    if "_socket.socket" in func:
        return PHASES[7]  # send/recv on the clients' sockets (the only ones on these paths)
    if f.startswith("benchmarks/hand_bridge.py"):
        return PHASES[5]
    if f.startswith("benchmarks/bench_bridge_") and func in ("send", "hand", "bench_hand"):
        return PHASES[3]  # the hand-written bridge's record / properties
    if f.startswith("benchmarks/"):
        return PHASES[10]
    if f.startswith("gateway/wire/"):
        return PHASES[1]
    if f.startswith(("gateway/mq/embedded/", "gateway/mq/port.py")):
        if f.endswith("store.py") or any(w in func.lower() for w in _COMMIT_WORDS):
            return PHASES[8]
        return PHASES[0]
    if f.startswith(("gateway/pubsub/deliveries.py", "gateway/plugin_api",
                     "gateway/runtime/envelopes.py")) or f.endswith("/mapping.py"):
        return PHASES[3]
    if f.startswith("gateway/pubsub/"):
        return PHASES[2]
    if "cimpl." in func:  # confluent-kafka's C extension (produce, len, poll)
        return PHASES[6]
    if f.startswith("plugins/kafka/clients/confluent_client.py"):
        return PHASES[6] if func in ("send", "send_many", "__init__") else PHASES[7]
    if f.startswith(("gateway/", "plugins/")):
        return PHASES[4]
    if f.startswith("aiokafka/"):
        if f.startswith(("aiokafka/producer/producer.py", "aiokafka/producer/message_acc",
                         "aiokafka/record/", "aiokafka/partitioner", "aiokafka/util")):
            return PHASES[6]
        return PHASES[7]
    if f.startswith(("paho/", "aiomqtt/")):
        if func in ("_handle_publish", "_handle_on_message", "_on_message", "messages",
                    "_messages", "__anext__"):
            return PHASES[10]
        if func in ("publish", "_send_publish", "_packet_queue", "_pending_call",
                    "__init__", "pack", "_pack_remaining_length", "_pack_str16"):
            return PHASES[6]
        return PHASES[7]
    if f.startswith(("asyncio/", "selectors.py")):
        return PHASES[9]
    return None


def phase_seconds(window: Window) -> dict[str, float]:
    """Own time of every profiled function summed by :func:`phase_of`; a function with no
    phase of its own is split over its callers (by the own time each call site gave it,
    up the call graph a few levels)."""
    stats = pstats.Stats(window.profile, stream=io.StringIO())
    raw: dict[Any, Any] = stats.stats  # type: ignore[attr-defined]
    out: dict[str, float] = {}

    def give(key: Any, amount: float, depth: int) -> None:
        phase = phase_of(key[0], key[2])
        if phase is None:
            callers = raw.get(key, (0, 0, 0, 0, {}))[4]
            weights = {c: (e[2] or e[3] or e[1]) for c, e in callers.items()}
            total = sum(weights.values())
            if depth < 8 and total > 0:
                for caller, w in weights.items():
                    give(caller, amount * w / total, depth + 1)
                return
            phase = PHASES[-1]
        out[phase] = out.get(phase, 0.0) + amount

    for key, (_cc, _nc, tt, _ct, _callers) in raw.items():
        if tt:
            give(key, tt, 0)
    return out


def phases(names: list[str], n: int, work: Path) -> str:
    """CPU us per message per phase of each path, side by side (Markdown).

    Each path runs twice: without the profiler (CPU of the whole process and of the
    event-loop thread over the timed part, wall time), then under cProfile (the shares).
    A phase's figure is its share of the event-loop thread's profiled busy time (epoll
    excluded) times that thread's unprofiled CPU per message; the other threads' CPU
    (the queue manager's writer: SQLite and fsync of each commit) is its own row; idle
    is the epoll share of the profiled wall time times the unprofiled wall per message.
    """
    columns: dict[str, dict[str, float]] = {}
    for name in names:
        plain = Window(cpu_only=True)
        run_dir = work / f"phases-{name}-cpu"
        run_dir.mkdir(parents=True, exist_ok=True)
        _check_all(name, run_path(name, n, run_dir, plain, stop_early=True), n)
        prof = Window()
        run_dir = work / f"phases-{name}-prof"
        run_dir.mkdir(parents=True, exist_ok=True)
        _check_all(name, run_path(name, n, run_dir, prof, stop_early=True), n)
        seconds = phase_seconds(prof)
        idle = seconds.pop(IDLE, 0.0)
        busy = sum(seconds.values()) or 1e-9
        loop_us = plain.loop_cpu / n * 1e6
        col = {phase: seconds.get(phase, 0.0) / busy * loop_us for phase in PHASES}
        col["writer thread: MQ commit (SQLite, fsync), other threads"] = (
            (plain.cpu - plain.loop_cpu) / n * 1e6
        )
        col["total CPU (process)"] = plain.cpu / n * 1e6
        col["event-loop thread CPU"] = loop_us
        col[IDLE + ", wall"] = idle / (idle + busy) * plain.wall / n * 1e6
        col["wall"] = plain.wall / n * 1e6
        columns[name] = col
        print(f"{name}: CPU {plain.cpu / n * 1e6:,.0f} us/msg (event-loop thread {loop_us:,.0f}),"
              f" wall {plain.wall / n * 1e6:,.0f} us/msg", flush=True)
    rows = list(next(iter(columns.values())))
    out = ["| us per message | " + " | ".join(names) + " |",
           "|---|" + "---:|" * len(names)]
    for row in rows:
        out.append(f"| {row} | " + " | ".join(f"{columns[c][row]:,.0f}" for c in names) + " |")
    return "\n".join(out)


def profiled_service_start(window: Window, stop_early: bool = False) -> Callable[[], None]:
    """Switch ``window`` on as the broker service starts; with ``stop_early`` also off
    as the benchmark's teardown begins (``PluginHost.stop_all`` or
    ``BrokerService.stop``, whichever first), so only the timed part is in it."""
    original = BrokerService.start
    original_stop, original_stop_all = BrokerService.stop, PluginHost.stop_all

    async def start(self: BrokerService) -> None:
        window.start()
        await original(self)

    async def stop(self: BrokerService) -> None:
        window.stop()
        await original_stop(self)

    async def stop_all(self: PluginHost) -> None:
        window.stop()
        await original_stop_all(self)

    BrokerService.start = start  # type: ignore[method-assign]
    if stop_early:
        BrokerService.stop = stop  # type: ignore[method-assign]
        PluginHost.stop_all = stop_all  # type: ignore[method-assign]

    def undo() -> None:
        BrokerService.start = original  # type: ignore[method-assign]
        BrokerService.stop = original_stop  # type: ignore[method-assign]
        PluginHost.stop_all = original_stop_all  # type: ignore[method-assign]

    return undo


def profiled_timed(window: Window) -> Callable[[], None]:
    original = bench_inbound.timed

    async def timed(*args: Any) -> float:
        window.start()
        return await original(*args)

    bench_inbound.timed = timed  # type: ignore[assignment]

    def undo() -> None:
        bench_inbound.timed = original

    return undo


def _check_all(name: str, result: Any, n: int) -> None:
    """The per-message figures divide by ``n``: a run that stopped at its time limit
    with fewer messages (where its result tells the count) fails instead."""
    got = getattr(result, "sent", None)
    if got is None and isinstance(result, tuple) and result and isinstance(result[0], int):
        got = result[0]
    if isinstance(got, int) and got < n:
        raise SystemExit(f"{name}: {got} of {n} messages within the time limit: "
                         "per-message figures would be wrong")


def run_path(name: str, n: int, work: Path, window: Window, stop_early: bool = False) -> Any:
    """Run path ``name`` once with ``window`` switched on for its timed part; its result."""
    if name.endswith("_in"):
        undo = profiled_timed(window)
    else:
        undo = profiled_service_start(window, stop_early)
    body: Callable[[], Awaitable[Any]]
    result: Any
    try:
        if name == "kafka_hand":
            kafka = KafkaBroker(work / f"kafka-{name}")
            kafka.start()
            try:
                body = lambda: bench_bridge_kafka.hand(  # noqa: E731
                    kafka.bootstrap, work, n, 256, "hand", window.start, window.stop
                )
                result = asyncio.run(body())
            finally:
                window.stop()
                kafka.stop()
        elif name == "mqtt_hand":
            mqtt = MosquittoBroker(work / f"mqtt-{name}")
            mqtt.start()
            try:
                body = lambda: bench_bridge_mqtt.bench_hand(  # noqa: E731
                    mqtt, n, 256, work, window.start, window.stop
                )
                result = asyncio.run(body())
            finally:
                window.stop()
                mqtt.stop()
        elif name in ("kafka_out", "confluent_out", "kafka_in"):
            kafka = KafkaBroker(work / f"kafka-{name}")
            kafka.start()
            try:
                if name.endswith("_out"):
                    backend = "confluent" if name == "confluent_out" else "aiokafka"
                    body = lambda: bench_bridge_kafka.bridge(  # noqa: E731
                        kafka.bootstrap, work, n, 256, "prof", backend=backend
                    )
                else:
                    body = lambda: bench_inbound.kafka_gateway(  # noqa: E731
                        kafka.bootstrap, work, n, 60.0
                    )
                result = asyncio.run(body())
            finally:
                window.stop()
                kafka.stop()
        elif name in ("mqtt_out", "mqtt_in"):
            mqtt = MosquittoBroker(work / f"mqtt-{name}")
            mqtt.start()
            try:
                if name == "mqtt_out":
                    body = lambda: bench_bridge_mqtt.bench_gateway(mqtt, n, 256, work)  # noqa: E731
                else:
                    body = lambda: bench_inbound.mqtt_gateway(mqtt, work, n, 60.0)  # noqa: E731
                result = asyncio.run(body())
            finally:
                window.stop()
                mqtt.stop()
        elif name in ("memory_out", "memory_backlog"):
            try:
                result = asyncio.run(memory_bridge(work, n, 256, name == "memory_out"))
            finally:
                window.stop()
        else:
            try:
                result = asyncio.run(bench_pubsub.bench_service(1000, max_pubs=100))
            finally:
                window.stop()
    finally:
        undo()
    return result


def profile(name: str, n: int, work: Path, top: int, cpu_only: bool = False) -> str:
    window = Window(cpu_only)
    result = run_path(name, n, work, window)
    if cpu_only:
        done = result[0] if isinstance(result, tuple) else n
        return (
            f"{name}: {result!r}  CPU {window.cpu * 1e6 / max(done, 1):,.0f} us/msg "
            f"(process, all threads; wall {window.wall * 1e6 / max(done, 1):,.0f} us/msg)"
        )
    return f"### {name} (result under the profiler: {result!r})\n\n" + tables(window, top)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--paths",
        default=",".join(PATHS),
        help=f"comma-separated, of {', '.join(PATHS + EXTRA_PATHS)}",
    )
    parser.add_argument("--messages", type=int, default=5000)
    parser.add_argument("--top", type=int, default=15)
    parser.add_argument(
        "--cpu",
        type=int,
        default=0,
        metavar="RUNS",
        help="no profiler: print the process CPU us per message of RUNS runs per path (best first)",
    )
    parser.add_argument(
        "--phases",
        action="store_true",
        help=f"CPU us per message per phase, side by side (default paths: "
        f"{','.join(PHASE_PATHS)}): each path once without and once under the profiler",
    )
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="mqgw-profile-"))
    try:
        if args.phases:
            names = args.paths.split(",") if args.paths != ",".join(PATHS) else PHASE_PATHS
            print(phases(list(names), args.messages, work), flush=True)
            return 0
        for name in args.paths.split(","):
            if args.cpu:
                for run in range(args.cpu):
                    run_dir = work / f"cpu{run}"
                    run_dir.mkdir(exist_ok=True)
                    print(profile(name, args.messages, run_dir, args.top, True), flush=True)
            else:
                print(profile(name, args.messages, work, args.top), flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
