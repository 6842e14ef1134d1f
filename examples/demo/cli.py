"""``python -m examples.demo`` (``make demo``): start Kafka and Mosquitto, run the demo,
print the summary, and stop everything it started (also on Ctrl-C and SIGTERM)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import examples.demo
from examples.demo.bars import BarBook
from examples.demo.exercise import DemoRun, exercise
from examples.demo.legacy_apps import DemoError
from examples.demo.paths import OHLC_PATHS, PATHS, PathStats
from examples.demo.summary import report, write_json_summary


async def run_demo(
    count: int, timeout: float, work: Path, analytics: bool, run: DemoRun
) -> bool:
    """Start Mosquitto and Kafka, run :func:`exercise`, stop them; True when all delivered."""
    from gateway.devstack.kafka import KafkaBroker
    from gateway.devstack.mosquitto import MosquittoBroker

    # SIGTERM stops the demo like Ctrl-C does: cancelled, it stops what it started.
    task = asyncio.current_task()
    if task is not None:
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)
    print("[1/4] starting Mosquitto and Kafka on 127.0.0.1 (free ports) ...")
    mqtt = MosquittoBroker(work / "mosquitto")
    kafka = KafkaBroker(work / "kafka")
    try:
        await asyncio.to_thread(mqtt.start)
        if mqtt.process is not None:
            run.process_groups["mosquitto"] = mqtt.process.pid
        await asyncio.to_thread(kafka.start)
        if kafka.process is not None:
            run.process_groups["kafka"] = kafka.process.pid
        print(f"  Mosquitto on {mqtt.host}:{mqtt.port}, Kafka on {kafka.bootstrap}")
        await exercise(kafka.bootstrap, mqtt.host, mqtt.port, count, timeout, work,
                       run=run, analytics=analytics)
    except DemoError as exc:
        run.failure = f"{exc.step}: {exc}"
        print(f"demo: {run.failure}")
    finally:
        print("[4/4] stopping the gateway, Kafka and Mosquitto ...")
        await asyncio.to_thread(kafka.stop)
        await asyncio.to_thread(mqtt.stop)
    return report(run)


def configure_logging(work: Path) -> Path:
    """Warnings to the console, everything from INFO to ``<work>/gateway.log``."""
    log_path = work / "gateway.log"
    root = logging.getLogger()
    root.setLevel(logging.INFO)
    console = logging.StreamHandler(sys.stderr)
    console.setLevel(logging.WARNING)
    console.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    # aiokafka logs start-up races (topic not created yet) at ERROR; they resolve alone,
    # so they go to the file only.
    console.addFilter(lambda record: not record.name.startswith("aiokafka"))
    to_file = logging.FileHandler(log_path, encoding="utf-8")
    to_file.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root.addHandler(console)
    root.addHandler(to_file)
    logging.getLogger("aiokafka").setLevel(logging.WARNING)
    return log_path


def main(argv: Sequence[str] | None = None) -> int:
    """The demo's command line; the exit status (0 only when every path delivered all)."""
    parser = argparse.ArgumentParser(
        prog="python -m examples.demo", description=(examples.demo.__doc__ or "").split("\n")[0]
    )
    parser.add_argument("--count", type=int, default=200,
                        help="messages per path, and ticks (default %(default)s)")
    parser.add_argument("--timeout", type=float, default=90.0,
                        help="seconds to wait for delivery on each phase (default %(default)s)")
    parser.add_argument("--no-analytics", action="store_true",
                        help="skip the Spark ohlc job (the bars row says skipped)")
    parser.add_argument("--json-summary", type=Path, metavar="PATH",
                        help="also write the summary table as JSON to PATH")
    parser.add_argument("--keep", action="store_true",
                        help="keep the work directory (logs, queue manager, Kafka data)")
    args = parser.parse_args(argv)
    if args.count < 1:
        parser.error("--count must be at least 1")
    work = Path(tempfile.mkdtemp(prefix="mqgw-demo-"))
    gateway_log = configure_logging(work)
    print(f"mqgw demo: {args.count} messages per path"
          + ("" if not args.no_analytics else ", analytics skipped"))
    print(f"  work directory {work}: logs gateway.log, kafka/kafka.log, "
          "mosquitto/mosquitto.log, ohlc-job.log")
    print("  (removed at the end unless --keep; kept when the demo fails; Ctrl-C stops "
          "everything)")
    run = DemoRun(
        stats={name: PathStats() for name in (*PATHS, *OHLC_PATHS)}, book=BarBook()
    )
    started = time.monotonic()
    ok = False
    try:
        ok = asyncio.run(run_demo(args.count, args.timeout, work, not args.no_analytics, run))
    except (KeyboardInterrupt, asyncio.CancelledError):
        run.failure = "interrupted"
        print("\ndemo: interrupted; everything it started is stopped")
    finally:
        seconds = time.monotonic() - started
        if args.json_summary:
            write_json_summary(args.json_summary, run, ok, args.count, seconds)
        logging.getLogger().handlers.clear()
        if args.keep or not ok:
            print(f"work directory kept: {work} (gateway log: {gateway_log}); "
                  f"clean up with: rm -rf {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
            print("nothing left running; work directory removed")
        print(f"demo took {seconds:.1f} s")
    return 0 if ok else 1

