"""Both cores (issue 16 item 4): 4 streams through the gateway with 0, 1 and 2 workers.

One gateway (``GatewayApp``: embedded queue manager, broker service, 4 stream queues,
4 ``memory`` plugin instances, one subscribed to each stream) run three times on the
same pre-loaded data: everything in one process (0 workers, today's default), the 4
sinks forwarded by 1 worker process, then by 2 (2 sinks each). Each run pre-loads N
persistent 1 KiB MQRFH2 publications per stream while the gateway is stopped, then times
from the gateway's start (worker processes and plugin connections included) until every
stream queue and every backlog queue is empty (each message counts until its sink's forwarder
committed it after the sink's acknowledgement). Printed per run: msg/s, the main
process's CPU seconds per 1,000 messages (``time.process_time``: what the workers took
off it) and the ratio to the in-process run.

First, the local protocol's cost per message (``--protocol``, on by default): a get per
round trip over the socket against ``get_batch`` (one round trip per batch) and the
in-process get, on the same queue, under syncpoint.

The memory sink costs almost nothing, so this is the worst case for workers (the broker
service's share stays in the main process); a Kafka or MQTT client is 24-35% of the
outbound loop (docs/performance.md) and moves to the workers with its sink.
``--sink mqtt``: the same with the ``mqtt`` plugin (MQTT 5, QoS 1, a commit only after
the PUBACKs) to a local Mosquitto, the realistic case.
Run: .venv/bin/python -m benchmarks.bench_workers [--messages N] [--repeat R] [--sink mqtt]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.summary import Row, record
from gateway.devstack import MosquittoBroker
from gateway.mq.embedded.client import connect_local
from gateway.mq.embedded.qm_server import QueueManagerServer
from gateway.mq.embedded.qmgr import EmbeddedQueueManager
from gateway.mq.port import GetOptions, MQError, OpenOption, PutOptions
from gateway.plugin_api import Envelope
from gateway.runtime.app import GatewayApp
from gateway.runtime.config import parse_config
from gateway.runtime.plugin_host import publish_command_of
from gateway.runtime.registry import PluginRegistry
from gateway.wire.mqmd import MQMD
from plugins.memory import reset_buses

STREAMS = ["S1.STREAM", "S2.STREAM", "S3.STREAM", "S4.STREAM"]
PAYLOAD = b"x" * 1024
TIME_LIMIT_S = 120.0


def _plugin(i: int, stream: str, sink: dict[str, Any] | None) -> dict[str, Any]:
    name = f"mem{i}" if sink is None else f"mqtt{i}"
    if sink is None:
        return {"name": name, "plugin": "memory",
                "config": {"bus": name, "subscribe": [f"$SYS/STREAM/{stream}/#"]}}
    return {"name": name, "plugin": "mqtt",
            "config": {"host": sink["host"], "port": sink["port"],
                       "client_id": f"bench-workers-{sink['run']}-{i}",
                       "outbound": {"prefix": f"bw{sink['run']}/{i}",
                                    "topics": [f"$SYS/STREAM/{stream}/#"]}}}


def _config(tmp: Path, workers: int, sink: dict[str, Any] | None = None) -> dict[str, Any]:
    plugins = [_plugin(i, s, sink) for i, s in enumerate(STREAMS)]
    names = [p["name"] for p in plugins]
    groups: list[dict[str, Any]] = []
    if workers:
        per = len(names) // workers
        groups = [{"name": f"w{k + 1}", "plugins": names[k * per:(k + 1) * per]}
                  for k in range(workers)]
    return {
        "queue_manager": {"data_dir": str(tmp / "qm")},
        "broker": {"store": str(tmp / "pubsub.db"), "batch_size": 256,
                   "streams": [{"name": s} for s in STREAMS]},
        "metrics": {"enabled": False},
        "logging": {"level": "warning"},
        "plugins": plugins,
        "workers": groups,
    }


async def _preload(qm: EmbeddedQueueManager, n: int) -> None:
    conn = await qm.connect()
    try:
        for s in STREAMS:
            h = await conn.open(s, OpenOption.OUTPUT)
            for i in range(n):
                md, body = publish_command_of(Envelope(s, f"T{i % 16}", PAYLOAD))
                await h.put(md, body, PutOptions(syncpoint=True))
                if i % 500 == 499:
                    await conn.commit()
            await conn.commit()
            await h.close()
    finally:
        await conn.disconnect()


def _left(app: GatewayApp) -> int:
    """Messages not yet delivered: each counts once, on its stream queue until the
    broker's commit, then on its backlog until the forwarder's (a put inside an open
    unit of work is not counted yet: its stream message still is)."""
    qm = app.qm
    assert isinstance(qm, EmbeddedQueueManager) and app.service is not None
    queues = [qm._queues[q] for q in [*STREAMS, *app.service.backlogs.values()]]
    return sum(q.depth - q.pending_puts for q in queues)


async def run_once(
    workers: int, n: int, sink: dict[str, Any] | None = None
) -> tuple[float, float, int]:
    """(msg/s, main-process CPU s per 1,000 messages, messages timed)."""
    reset_buses()
    registry = PluginRegistry.from_entry_points()
    with tempfile.TemporaryDirectory(prefix="mqgw-bench-workers-") as d:
        tmp = Path(d)
        loaded = parse_config(_config(tmp, workers, sink), registry, base_dir=tmp)
        # first start: define the queues and register the subscriptions, then stop
        app = GatewayApp(loaded, registry)
        await app.start()
        await app.shutdown()
        qm = EmbeddedQueueManager("QM1", tmp / "qm")
        try:
            await _preload(qm, n)
        finally:
            await qm.close()
        app = GatewayApp(loaded, registry)
        # Timed from the start: the broker service serves the stream queues at once, so
        # timing from "workers up" would leave out the main process's work done while
        # they start (and favour workers); their start-up is counted instead.
        left0 = 4 * n
        t0, c0 = time.perf_counter(), time.process_time()
        await app.start()
        try:
            deadline = t0 + TIME_LIMIT_S
            while _left(app) and time.perf_counter() < deadline:
                await asyncio.sleep(0.005)
            t1, c1 = time.perf_counter(), time.process_time()
            left1 = _left(app)
            await asyncio.sleep(0.6)  # the workers' next status line
            batches = sum(s["batches"] for w in app.workers
                          for s in w.status.get("sinks", {}).values())
            if not app.workers and app.service is not None:
                batches = sum(c.batches for c in app.service.forwarder_counters().values())
            if left1:
                raise RuntimeError(f"{left1} messages still queued after {TIME_LIMIT_S:.0f} s")
        finally:
            await app.shutdown()
    done = left0 - left1
    print(f"    ({workers} workers: {done / max(batches, 1):.0f} messages per forwarder batch)")
    return done / (t1 - t0), (c1 - c0) / done * 1000, done


async def protocol_cost(n: int) -> dict[str, tuple[float, float]]:
    """Microseconds per message, (wall clock, CPU of this process: client, server and the
    queue manager's writer thread): in-process get, socket get, socket get_batch(256) with
    a packed MQMD per message (the first form) and compact (one descriptor per batch and
    each message's changes, what the client asks for). Packed and compact run twice, in
    both orders; their figures are the means."""
    out: dict[str, tuple[float, float]] = {}
    with tempfile.TemporaryDirectory(prefix="mqgw-bench-proto-") as d:
        qm = EmbeddedQueueManager("QMP", Path(d) / "qm")
        qm.run_mqsc("DEFINE QLOCAL(P.Q) MAXDEPTH(100000)", stop_on_error=True)
        server = QueueManagerServer(qm)
        await server.start()
        try:
            local = await qm.connect()
            put = await local.open("P.Q", OpenOption.OUTPUT)
            # packed and compact twice, in both orders (a fixed order would carry the
            # order's bias); each label's figure is the mean of its two runs
            runs: dict[str, list[tuple[float, float]]] = {}
            for label in ("in-process get", "socket get", "socket get_batch(256), packed",
                          "socket get_batch(256)", "socket get_batch(256)",
                          "socket get_batch(256), packed"):
                for _ in range(n):
                    await put.put(MQMD(), PAYLOAD, PutOptions(syncpoint=True))
                await local.commit()
                conn = local if label == "in-process get" else await connect_local(Path(d) / "qm")
                h: Any = await conn.open("P.Q", OpenOption.INPUT_SHARED)
                got = 0
                t0, c0 = time.perf_counter(), time.process_time()
                while got < n:
                    opts = GetOptions(wait_ms=0, syncpoint=True)
                    try:
                        if "(256)" in label:  # packed: an MQMD per message (before)
                            got += len(await h.get_batch(opts, 256,
                                                         compact=not label.endswith("packed")))
                        else:
                            await h.get(opts)
                            got += 1
                    except MQError:
                        break
                    if got % 256 == 0:
                        await conn.commit()
                await conn.commit()
                runs.setdefault(label, []).append(
                    ((time.perf_counter() - t0) / max(got, 1) * 1e6,
                     (time.process_time() - c0) / max(got, 1) * 1e6))
                await h.close()
                if conn is not local:
                    await conn.disconnect()
            await local.disconnect()
            for label, values in runs.items():
                out[label] = (sum(v[0] for v in values) / len(values),
                              sum(v[1] for v in values) / len(values))
        finally:
            await server.stop()
            await qm.close()
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=3000, help="publications per stream")
    parser.add_argument("--repeat", type=int, default=1, help="runs of each configuration")
    parser.add_argument("--no-protocol", action="store_true", help="skip the protocol cost")
    parser.add_argument("--protocol-only", action="store_true",
                        help="only the protocol cost (no gateway runs)")
    parser.add_argument("--sink", choices=("memory", "mqtt"), default="memory",
                        help="memory plugin (default) or mqtt to a local Mosquitto, QoS 1")
    args = parser.parse_args(argv)
    print(f"4 streams x {args.messages} persistent 1 KiB publications, {args.sink} sinks; "
          f"{os.cpu_count()} CPUs")
    with contextlib.ExitStack() as stack:
        broker: MosquittoBroker | None = None
        if args.sink == "mqtt":
            work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="mqgw-bw-")))
            broker = stack.enter_context(MosquittoBroker(work / "mosquitto"))
        return _measure(args, broker)


def _measure(args: argparse.Namespace, broker: MosquittoBroker | None) -> int:
    if not args.no_protocol:
        cost = asyncio.run(protocol_cost(min(args.messages, 5000)))
        for label, (us, cpu) in cost.items():
            print(f"  {label:<32} {us:8.1f} us/msg  (CPU {cpu:6.1f} us/msg)")
        if args.protocol_only:
            return 0
    rates: dict[int, list[float]] = {0: [], 1: [], 2: []}
    for r in range(args.repeat):
        for workers in (0, 1, 2):
            sink = (None if broker is None else
                    {"host": broker.host, "port": broker.port, "run": f"{r}-{workers}"})
            rate, cpu, done = asyncio.run(run_once(workers, args.messages, sink))
            rates[workers].append(rate)
            base = rates[0][r]
            print(f"  run {r + 1}: {workers} worker(s): {rate:8,.0f} msg/s  "
                  f"main CPU {cpu:6.3f} s/1000 msg  ({done} msgs)  "
                  f"ratio to in-process {rate / base:5.2f}", flush=True)
    best = {k: max(v) for k, v in rates.items()}
    print(f"scaling (best of {args.repeat}): 0 -> {best[0]:,.0f}, 1 -> {best[1]:,.0f} "
          f"({best[1] / best[0]:.2f}x), 2 -> {best[2]:,.0f} msg/s ({best[2] / best[0]:.2f}x); "
          f"1 -> 2 workers {best[2] / best[1]:.2f}x")
    record(Row(f"4 streams, 2 workers vs in-process ({args.sink} sinks)", best[2], best[0],
               None,
               kind="info", note=f"1 worker {best[1] / best[0]:.2f}x"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
