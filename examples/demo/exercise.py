"""Drive every path once: start the gateway the demo configures, play the legacy MQ apps
and the modern clients against it, and run the ohlc loop when asked.

:func:`exercise` is the demo's core; tests/examples/test_gateway_e2e.py runs it against
the test session's brokers, :mod:`examples.demo.cli` against brokers it starts itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from examples.demo import legacy_process
from examples.demo.bars import BarBook, expected_bars, tick_schedule
from examples.demo.modern_clients import (
    kafka_consumer,
    kafka_producer,
    mqtt_publisher,
    mqtt_subscriber,
)
from examples.demo.ohlc_job import JobRun, log_tail, mqgw_command, run_ohlc_job
from examples.demo.paths import (
    BARS_TOPIC,
    BULLETIN,
    KAFKA_IN,
    MQTT_IN,
    OHLC_PATHS,
    OHLC_RFH2_Q,
    OHLC_RFH_Q,
    PATHS,
    REPLY_Q,
    RFH2_SUB_Q,
    RFH_SUB_Q,
    SHORT_NAMES,
    STOCK,
    SYMBOLS,
    TICKS_TOPIC,
    PathStats,
)
from gateway.runtime.app import GatewayApp
from gateway.runtime.config import parse_config
from gateway.runtime.registry import PluginRegistry


def gateway_config(work: Path, bootstrap: str, mqtt_host: str, mqtt_port: int) -> dict[str, Any]:
    """The gateway the demo runs (examples/demo.yaml is the same as a file)."""
    queues = (RFH_SUB_Q, RFH2_SUB_Q, OHLC_RFH_Q, OHLC_RFH2_Q, REPLY_Q)
    (work / "demo.mqsc").write_text("".join(f"DEFINE QLOCAL({q}) REPLACE\n" for q in queues))
    return {
        "id": "mqgw-demo",
        "queue_manager": {"name": "QM1", "data_dir": "qm", "mqsc_file": "demo.mqsc"},
        "broker": {
            "store": "pubsub.db",
            "streams": [{"name": STOCK}, {"name": BULLETIN}],
            "wait_ms": 100,
        },
        "metrics": {"enabled": True, "port": 0},
        "logging": {"format": "text", "level": "warning"},
        "plugins": [
            {
                "name": "kafka",
                "plugin": "kafka",
                "config": {
                    "bootstrap_servers": bootstrap,
                    "outbound": {
                        "routes": [
                            {"stream": STOCK, "topic": "#"},
                            {"stream": BULLETIN, "topic": "#"},
                        ]
                    },
                    "inbound": {
                        "topics": [
                            {"kafka_topic": KAFKA_IN, "stream": STOCK},
                            # The ohlc job's bars (key/mq.topic OHLC/1m/<SYMBOL>).
                            {"kafka_topic": BARS_TOPIC, "stream": STOCK},
                        ]
                    },
                },
            },
            {
                "name": "mqtt",
                "plugin": "mqtt",
                "config": {
                    "host": mqtt_host,
                    "port": mqtt_port,
                    "outbound": {
                        "prefix": "mq",
                        "topics": [f"$SYS/STREAM/{STOCK}/#", f"$SYS/STREAM/{BULLETIN}/#"],
                    },
                    "inbound": {
                        "filters": [
                            {
                                "filter": f"{MQTT_IN}/#",
                                "strip_prefix": f"{MQTT_IN}/",
                                "stream": STOCK,
                            }
                        ]
                    },
                },
            },
        ],
    }


class Progress:
    """One live line: rewritten in place on a terminal, a line every 2 s otherwise."""

    def __init__(self) -> None:
        self.tty = sys.stdout.isatty()
        self.last = 0.0
        self.text = ""

    def show(self, stats: dict[str, PathStats], names: Sequence[str], final: bool = False) -> None:
        now = time.monotonic()
        if not (final or self.tty or now - self.last >= 2.0):
            return
        self.last = now
        parts = [f"{SHORT_NAMES[n]} {stats[n].received}/{stats[n].sent}" for n in names]
        text = "  " + "  ".join(parts)
        if self.tty:
            sys.stdout.write("\r" + text + ("\n" if final else ""))
        elif text != self.text:
            sys.stdout.write(text + "\n")
        self.text = text
        sys.stdout.flush()


async def wait_delivered(
    stats: dict[str, PathStats], names: Sequence[str], timeout: float, progress: Progress
) -> None:
    """Until every named path is complete or ``timeout`` s passed, showing progress."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        progress.show(stats, names)
        if all(stats[n].complete for n in names):
            break
        await asyncio.sleep(0.25)
    progress.show(stats, names, final=True)


@dataclass
class DemoRun:
    """Everything the summary reports."""

    stats: dict[str, PathStats]
    book: BarBook
    job: JobRun | None = None
    #: Process groups started (name -> pgid), to prove nothing outlives the demo.
    process_groups: dict[str, int] = field(default_factory=dict)
    failure: str = ""


async def exercise(
    bootstrap: str,
    mqtt_host: str,
    mqtt_port: int,
    count: int,
    timeout: float,
    work: Path,
    run: DemoRun | None = None,
    analytics: bool = False,
) -> dict[str, PathStats]:
    """Run the gateway against running brokers and drive every path; the statistics.

    Without ``run`` (tests/examples/test_gateway_e2e.py) only the eight bridge paths are
    counted; ``analytics`` adds the ohlc loop (a Spark process) to ``run``'s rows.
    """
    if run is None:
        run = DemoRun(stats={name: PathStats() for name in PATHS}, book=BarBook())
    stats = run.stats
    ticks = tick_schedule(count, time.time())
    run.book.expected = expected_bars(ticks)
    for name in OHLC_PATHS:
        if name not in stats:
            continue
        if analytics:
            stats[name].sent = len(run.book.expected)
        else:
            stats[name].skipped = "skipped (--no-analytics)"
    registry = PluginRegistry.from_entry_points()
    loaded = parse_config(
        gateway_config(work, bootstrap, mqtt_host, mqtt_port), registry, base_dir=work
    )
    app = GatewayApp(loaded, registry)
    stop = asyncio.Event()
    tasks: list[asyncio.Task[None]] = []
    progress = Progress()
    await app.start()
    try:
        async with asyncio.timeout(60):
            while not app.health()[0]:
                await asyncio.sleep(0.1)
        port = app.http.port if app.http else 0
        print(f"  gateway up: embedded QM1, streams {STOCK} and {BULLETIN}; "
              f"metrics http://127.0.0.1:{port}/metrics")
        # the legacy applications are processes of their own, connected to the
        # gateway's queue manager through its local socket (docs/embedded-qm.md)
        qm_dir = work / "qm"
        print(f"  legacy MQ applications: separate processes on {qm_dir}/qm.sock")
        await legacy_process.register(qm_dir)
        kafka_ready, mqtt_ready = asyncio.Event(), asyncio.Event()
        tasks = [
            asyncio.create_task(kafka_consumer(bootstrap, stats, kafka_ready, stop)),
            asyncio.create_task(mqtt_subscriber(mqtt_host, mqtt_port, stats, mqtt_ready, stop)),
            asyncio.create_task(legacy_process.read(qm_dir, stats, run.book, stop)),
        ]
        async with asyncio.timeout(60):
            await kafka_ready.wait()
            await mqtt_ready.wait()
        await asyncio.sleep(1.0)  # subscriptions registered, consumers assigned
        first = time.strftime("%H:%M", time.gmtime(ticks[0].put_cs // 100)) if ticks else "-"
        print(f"[2/4] sending {count} messages on each path; {len(ticks)} ticks for "
              f"{', '.join(SYMBOLS)} put-timed over the two minutes from {first}Z")
        await legacy_process.publish(qm_dir, ticks, count, stats, work)
        await kafka_producer(bootstrap, count, stats)
        await mqtt_publisher(mqtt_host, mqtt_port, count, stats)
        await wait_delivered(stats, PATHS, timeout, progress)
        if not analytics:
            print("[3/4] analytics skipped (--no-analytics)")
        elif not stats[PATHS[0]].complete:
            run.failure = "the ticks did not all reach Kafka: the ohlc job was not run"
            print(f"[3/4] {run.failure}")
        else:
            run.job = JobRun(
                argv=[*mqgw_command(), "analytics", "ohlc", "--bootstrap", bootstrap,
                      "--topics", TICKS_TOPIC, "--out", str(work / "analytics"), "--once"],
                log_path=work / "ohlc-job.log",
            )
            print("[3/4] ticks are in Kafka: running the Spark ohlc job once "
                  f"(its log: {run.job.log_path})")
            print("    $ " + " ".join(["mqgw", *run.job.argv[len(mqgw_command()):]]))
            await run_ohlc_job(bootstrap, work, max(timeout, 300.0), run.job)
            run.process_groups["ohlc job"] = run.job.pgid
            if run.job.returncode == 0:
                print(f"    ohlc job done in {run.job.seconds:.1f} s; waiting for "
                      f"{len(run.book.expected)} bars at {OHLC_RFH_Q} and {OHLC_RFH2_Q}")
                await wait_delivered(stats, list(OHLC_PATHS), timeout, progress)
            else:
                run.failure = (f"the ohlc job exited with {run.job.returncode}; "
                               f"last lines of {run.job.log_path}:\n"
                               + log_tail(run.job.log_path))
                print("    " + run.failure)
    finally:
        stop.set()
        for t in tasks:
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await asyncio.wait_for(t, 5)
        await app.shutdown()
    return stats
