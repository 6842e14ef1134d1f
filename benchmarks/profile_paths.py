"""cProfile of each bridge path's timed part: top-N tables for docs/performance.md.

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
from gateway.runtime.pubsub_service import BrokerService

PATHS = ("kafka_out", "mqtt_out", "kafka_in", "mqtt_in", "fanout")
#: not in the default list: the broker service's own work alone (stream queue, backlog,
#: forwarder) with a ``memory`` sink, no external broker
EXTRA_PATHS = ("memory_out", "memory_backlog")
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

    def start(self) -> None:
        if not self.on:
            self.on = True
            self.cpu -= time.process_time()
            self.wall -= time.perf_counter()
            if not self.cpu_only:
                self.profile.enable()

    def stop(self) -> None:
        if self.on:
            if not self.cpu_only:
                self.profile.disable()
            self.cpu += time.process_time()
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


def profiled_service_start(window: Window) -> Callable[[], None]:
    original = BrokerService.start

    async def start(self: BrokerService) -> None:
        window.start()
        await original(self)

    BrokerService.start = start  # type: ignore[method-assign]

    def undo() -> None:
        BrokerService.start = original  # type: ignore[method-assign]

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


def profile(name: str, n: int, work: Path, top: int, cpu_only: bool = False) -> str:
    window = Window(cpu_only)
    undo = profiled_timed(window) if name.endswith("_in") else profiled_service_start(window)
    body: Callable[[], Awaitable[Any]]
    try:
        if name in ("kafka_out", "kafka_in"):
            kafka = KafkaBroker(work / f"kafka-{name}")
            kafka.start()
            try:
                if name == "kafka_out":
                    body = lambda: bench_bridge_kafka.bridge(  # noqa: E731
                        kafka.bootstrap, work, n, 256, "prof"
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
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="mqgw-profile-"))
    try:
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
