"""Worker processes: a multi-stream gateway on more than one core (docs/performance.md,
"Worker processes"; configuration in docs/config-reference.md, ``workers``).

The broker service (the engine, its subscription store) and the embedded queue manager
(its SQLite store) stay in the main process. Each ``workers:`` group of plugin
instances runs in a process of its own: those instances' clients (aiokafka, paho, ...)
and their sink forwarders, which take the deliveries the broker service puts on each
sink's backlog queue over the queue manager's local socket (batched gets, one round
trip per batch) and commit after the sink's acknowledgement, exactly as in process.

* :mod:`.spec` — what a worker is told (one JSON line on stdin);
* :mod:`.child` — the worker process;
* :mod:`.supervisor` — start, watch (restart with backoff, metrics), stop.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from gateway.plugin_api import DeclaresSubscriptions, PluginError, PluginInstance
from gateway.runtime.config import LoadedConfig
from gateway.runtime.workers.spec import PluginSpec, WorkerSpec
from gateway.runtime.workers.supervisor import WorkerCollector, WorkerProcess

__all__ = [
    "PluginSpec",
    "RemoteSink",
    "WorkerCollector",
    "WorkerProcess",
    "WorkerSpec",
    "worker_specs",
]


class RemoteSink:
    """What the main process registers for a sink forwarded by a worker: the broker
    service fills its backlog queue; no forwarder here ever calls it."""

    def __init__(self, name: str, worker: str) -> None:
        self.name = name
        self.worker = worker

    async def send(self, deliveries: Sequence[object]) -> None:
        raise PluginError(f"sink {self.name} is forwarded by worker {self.worker}",
                          retriable=True)


def worker_specs(
    loaded: LoadedConfig,
    *,
    socket: str,
    backlogs: dict[str, str],
    dead_letter_queue: str,
    serviced_queues: Sequence[str],
    instances: dict[str, PluginInstance],
    backlog_key: bytes,
) -> list[WorkerSpec]:
    """One spec per ``workers:`` group (the instances were created in the main process
    only for their planned subscriptions; the worker makes its own)."""
    cfg = loaded.gateway
    broker = cfg.broker
    # `mqgw -vv run` logs at debug whatever the configuration says: the workers too
    log_level = "debug" if logging.getLogger().isEnabledFor(logging.DEBUG) else cfg.logging.level
    kinds = {p.name: p for p in cfg.plugins}
    out: list[WorkerSpec] = []
    for w in cfg.workers:
        plugins: list[PluginSpec] = []
        for name in w.plugins:
            inst = instances.get(name)
            planned: list[tuple[str, int]] = (
                [(t, int(s)) for t, s in inst.planned_subscriptions()]
                if isinstance(inst, DeclaresSubscriptions) else []
            )
            plugins.append(PluginSpec(name, kinds[name].plugin, dict(kinds[name].config),
                                      backlogs[name], planned))
        out.append(WorkerSpec(
            group=w.name, socket=socket, gateway_id=cfg.gateway_id, plugins=plugins,
            dead_letter_queue=dead_letter_queue, serviced_queues=list(serviced_queues),
            batch_size=broker.batch_size, wait_ms=broker.wait_ms,
            default_backout_threshold=broker.default_backout_threshold,
            retry_delay=broker.retry_delay, sink_retry_max_delay=broker.sink_retry_max_delay,
            shutdown_timeout=cfg.shutdown_timeout, log_format=cfg.logging.format,
            log_level=log_level, gc=cfg.gc.model_dump(), backlog_key=backlog_key.hex(),
        ))
    return out
