"""A bridge benchmark's gateway with its sink instance in ONE worker process (issue 16).

Shared by bench_bridge_mqtt and bench_bridge_kafka: the gateway is configured the way a
user would (``GatewayApp`` from a configuration with ``workers: [{name: w1, plugins:
[<the sink>]}]``, the stream queue defined by ``queue_manager.mqsc_file``), so the main
process runs the embedded queue manager and the broker service and the worker runs the
plugin and its forwarder over the queue manager's local socket.

Timed as the in-process configuration is: from the moment the publications are on the
stream queue with the sink connected, to the moment every one is acknowledged by the
sink and committed off the stream queue and the sink's backlog queue. The worker's start
and its plugin's connection are not timed (as ``host.start`` is not in process): the N
publications are put first in open units of work (at most 5,000 per connection, the
queue manager's limit being 10,000) while the worker starts, and committed at the start
of the timed part (the commit is timed: a small cost against the worker). The exact
count (no loss, no duplicate) is the caller's check on the broker side.
"""

from __future__ import annotations

import asyncio
import cProfile
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks import gc_setting
from gateway.mq.embedded.qmgr import EmbeddedQueueManager
from gateway.mq.port import PutOptions
from gateway.runtime.app import GatewayApp
from gateway.runtime.config import parse_config
from gateway.runtime.registry import PluginRegistry
from gateway.wire.mqmd import MQMD

#: Publications per open unit of work while the worker starts.
CHUNK = 5000
_TICK = os.sysconf("SC_CLK_TCK")


@dataclass(slots=True)
class WorkerRun:
    """One timed run with the sink in a worker."""

    messages: int
    seconds: float
    #: CPU seconds of the main process (every thread) and of the worker process
    main_cpu: float
    worker_cpu: float
    #: CPU seconds of the main process's event-loop thread (the rest of ``main_cpu`` is
    #: its other threads: the queue manager's SQLite writer, plugin client threads)
    loop_cpu: float
    #: envelopes the worker's sink acknowledged (its last status line) and its batches
    delivered: int
    batches: int

    @property
    def rate(self) -> float:
        return self.messages / self.seconds


def _cpu_of(pid: int | None) -> float:
    """CPU seconds (user + system) of process ``pid`` so far."""
    if pid is None:
        return 0.0
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            fields = f.read().rsplit(") ", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / _TICK


async def run_with_worker(
    *,
    work: Path,
    stream: str,
    n: int,
    batch: int,
    wait_ms: int,
    plugin: str,
    config: dict[str, Any],
    publication: Callable[[int], tuple[MQMD, bytes]],
    time_limit: float,
    label: str = "",
    workers: int = 1,
    profile: cProfile.Profile | None = None,
) -> WorkerRun:
    """Start the gateway with the ``plugin`` instance ``sink`` in worker ``w1``, put
    ``n`` publications, time until bridged (see module docstring). ``workers=0``: the
    same gateway application with the instance in process (for comparison);
    ``profile``: enabled for the timed part (the main process only)."""
    name = "sink"
    tmp = work / f"worker{workers}-{label or plugin}-{batch}"
    tmp.mkdir(parents=True, exist_ok=True)
    (tmp / "queues.mqsc").write_text(
        f"DEFINE QLOCAL('{stream}') DEFPSIST(YES) MAXDEPTH({n + 1000}) REPLACE\n",
        encoding="utf-8",
    )
    registry = PluginRegistry.from_entry_points()
    loaded = parse_config(
        {
            "queue_manager": {"data_dir": str(tmp / "qm"), "mqsc_file": "queues.mqsc"},
            "broker": {"store": str(tmp / "pubsub.db"), "batch_size": batch,
                       "wait_ms": wait_ms, "streams": [{"name": stream}]},
            "metrics": {"enabled": False},
            "logging": {"level": "warning"},
            "plugins": [{"name": name, "plugin": plugin, "config": config}],
            "workers": [{"name": "w1", "plugins": [name]}] if workers else [],
            # what `mqgw run` applies once started (benchmarks/gc_setting.py)
            "gc": gc_setting.GATEWAY_GC.model_dump(),
        },
        registry,
        base_dir=tmp,
    )
    app = GatewayApp(loaded, registry)
    await app.start()
    try:
        qm = app.qm
        assert isinstance(qm, EmbeddedQueueManager) and app.service is not None
        backlog = app.service.backlogs[name]
        worker = app.workers[0] if app.workers else None
        conns = []
        opts = PutOptions(syncpoint=True)
        for low in range(0, n, CHUNK):
            conn = await qm.connect()
            conns.append(conn)
            for i in range(low, min(n, low + CHUNK)):
                md, body = publication(i)
                await conn.put1(stream, md, body, opts)
        deadline = time.perf_counter() + 60
        while not app.health()[0]:
            if time.perf_counter() > deadline:
                raise SystemExit(f"the {plugin} sink is not up in 60 s")
            await asyncio.sleep(0.02)
        pid = worker.pid if worker is not None else None
        w0 = _cpu_of(pid)
        if profile is not None:
            profile.enable()
        started, cpu, loop = time.perf_counter(), time.process_time(), time.thread_time()
        for conn in conns:
            await conn.commit()
        deadline = started + time_limit
        while qm.queue_depth(stream) or qm.queue_depth(backlog):
            if time.perf_counter() > deadline:
                raise SystemExit(f"{plugin} sink in a worker, batch {batch}: not done in "
                                 f"{time_limit} s ({qm.queue_depth(stream)} on the stream "
                                 f"queue, {qm.queue_depth(backlog)} on the backlog)")
            await asyncio.sleep(0.002)
        elapsed = time.perf_counter() - started
        main_cpu, loop_cpu = time.process_time() - cpu, time.thread_time() - loop
        if profile is not None:
            profile.disable()
        worker_cpu = _cpu_of(pid) - w0
        for conn in conns:
            await conn.disconnect()
        if worker is not None:
            await asyncio.sleep(worker.spec.status_interval + 0.2)  # its next status line
            sink = worker.status.get("sinks", {}).get(name, {})
            delivered, batches = int(sink.get("delivered", 0)), int(sink.get("batches", 0))
        else:
            counters = app.service.forwarder_counters()[name]
            delivered, batches = counters.delivered, counters.batches
    finally:
        await app.shutdown()
    return WorkerRun(n, elapsed, main_cpu, worker_cpu, loop_cpu, delivered, batches)
