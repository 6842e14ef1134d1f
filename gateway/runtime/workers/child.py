"""A worker process: the forwarders and clients of a group of plugin instances.

Started by :class:`~gateway.runtime.workers.supervisor.WorkerProcess` as
``python -m gateway.runtime.workers.child``; its first stdin line is the
:class:`~gateway.runtime.workers.spec.WorkerSpec`. It connects to the embedded queue
manager of the main process over the local socket (:mod:`gateway.mq.embedded.client`)
and runs, per plugin instance, the same :class:`SinkForwarder` the main process would
run (get a batch under syncpoint, ``send``, commit after the acknowledgement) and the
instance itself (its publisher puts inbound publications over the same socket).

Guarantees across a crash come from the queue manager, not from this process: what a
forwarder holds is an open unit of work on the socket; a worker that dies (kill -9
included) closes the socket and the queue manager backs the unit of work out, so the
messages are on the backlog queue again, in their order, for the next worker.

Lifeline: the worker stops (finishing or backing out the batch in hand) on SIGTERM, on a
``stop`` line or end of file on stdin (the main process closed the pipe or died), and
when the kernel tells it its parent died (PR_SET_PDEATHSIG). SIGINT is ignored: a
terminal's Ctrl-C reaches the whole process group, and the main process stops the
workers in its own order. Every ``status_interval`` it writes one JSON status line to
stdout (forwarder figures, plugin health) for the main process's metrics.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import json
import logging
import os
import signal
import sys
from typing import Any

from gateway.mq.embedded.client import ClientQueueManager
from gateway.plugin_api import PluginError, PluginInstance, Sink
from gateway.pubsub.topics import Scheme
from gateway.runtime.backlog_seal import BacklogSeal
from gateway.runtime.config import _fit_send_timeout
from gateway.runtime.gc_policy import GcConfig, apply_gc_policy
from gateway.runtime.plugin_host import MQPublisher
from gateway.runtime.pubsub_service.sink_forwarder import SinkForwarder
from gateway.runtime.registry import PluginRegistry
from gateway.runtime.workers.spec import PluginSpec, WorkerSpec

log = logging.getLogger(__name__)

#: Exit status of a worker whose plugin can never start with its configuration (the
#: main process stops the gateway, as it does for such an instance in process).
EXIT_FATAL = 3
#: Exit status when the spec line is missing or wrong.
EXIT_SPEC = 2

_PR_SET_PDEATHSIG = 1


class WorkerContext:
    """The :class:`~gateway.plugin_api.PluginContext` of an instance in a worker. Its
    planned subscriptions were made by the main process (with the retained hand-over onto
    the backlog); subscribing to anything else needs the engine, which is not here."""

    def __init__(self, name: str, gateway_id: str, publisher: MQPublisher,
                 planned: list[tuple[str, int]]) -> None:
        self._name = name
        self._gateway_id = gateway_id
        self._publisher = publisher
        self._planned = {(t, int(s)) for t, s in planned}

    @property
    def gateway_id(self) -> str:
        return self._gateway_id

    @property
    def instance_name(self) -> str:
        return self._name

    @property
    def publisher(self) -> MQPublisher:
        return self._publisher

    async def subscribe(self, topic: str, *, scheme: Scheme = Scheme.TOPIC) -> None:
        if (topic, int(scheme)) in self._planned:
            return  # made (durably) by the main process before the worker started
        raise PluginError(
            f"plugin instance {self._name} runs in a worker: it can only subscribe to what "
            f"it declares in planned_subscriptions(), not {topic!r}"
        )

    async def unsubscribe(self, topic: str, *, scheme: Scheme = Scheme.TOPIC) -> bool:
        raise PluginError(f"plugin instance {self._name} runs in a worker: "
                          "unsubscribe from the main process's configuration")


class Worker:
    """The running worker (see module docstring)."""

    def __init__(self, spec: WorkerSpec, registry: PluginRegistry | None = None) -> None:
        self.spec = spec
        self.registry = registry or PluginRegistry.from_entry_points()
        self.qm = ClientQueueManager(spec.socket, appl_name=f"mqgw worker {spec.group}")
        self.stop = asyncio.Event()
        self._fw_stop = asyncio.Event()
        self.instances: dict[str, PluginInstance] = {}
        self.contexts: dict[str, WorkerContext] = {}
        self.started: set[str] = set()
        self.forwarders: dict[str, SinkForwarder] = {}
        self.fatal = ""

    def _create(self, p: PluginSpec) -> PluginInstance:
        plugin = self.registry.get(p.plugin)
        cfg = plugin.config_model.model_validate(p.config)
        cfg = _fit_send_timeout(p.name, cfg, self.spec.shutdown_timeout)
        return plugin.create(p.name, cfg)

    def _sink_of(self, name: str) -> Sink | None:
        return self.instances[name] if name in self.started else None

    async def run(self) -> int:
        spec = self.spec
        seal = BacklogSeal(bytes.fromhex(spec.backlog_key))  # checked by amain
        for p in spec.plugins:
            self.instances[p.name] = self._create(p)
            publisher = MQPublisher(self.qm, origin=p.name, gateway_id=spec.gateway_id,
                                    serviced_queues=set(spec.serviced_queues))
            self.contexts[p.name] = WorkerContext(p.name, spec.gateway_id, publisher, p.planned)
            self.forwarders[p.name] = SinkForwarder(
                self.qm, p.name, lambda n=p.name: self._sink_of(n), p.backlog,  # type: ignore[misc]
                dead_letter_queue=spec.dead_letter_queue, batch_size=spec.batch_size,
                wait_ms=spec.wait_ms, default_backout_threshold=spec.default_backout_threshold,
                retry_delay=spec.retry_delay, retry_max_delay=spec.sink_retry_max_delay,
                stopping=self._fw_stop, seal=seal,
            )
        gc_config = GcConfig.model_validate(spec.gc)  # refused before anything runs
        tasks = [asyncio.create_task(fw.run(), name=f"sink:{n}")
                 for n, fw in self.forwarders.items()]
        tasks += [asyncio.create_task(self._start_plugin(n), name=f"plugin:{n}")
                  for n in self.instances]
        status = asyncio.create_task(self._report(), name="status")
        log.info("worker %s started (pid %d): %s", spec.group, os.getpid(),
                 ", ".join(self.instances))
        # start-up complete (spec read, socket client, instances and forwarders built)
        gc_policy = apply_gc_policy(gc_config, who=f"worker {spec.group}")
        try:
            return await self._run_until_stopped(spec, tasks, status)
        finally:
            gc_policy.release()

    async def _run_until_stopped(
        self, spec: WorkerSpec, tasks: list[asyncio.Task[None]], status: asyncio.Task[None]
    ) -> int:
        """Serve until asked to stop, then stop the forwarders and plugins."""
        await self.stop.wait()
        self._fw_stop.set()
        budget = spec.shutdown_timeout * 0.6
        try:
            async with asyncio.timeout(budget):
                await asyncio.gather(*tasks, return_exceptions=True)
        except TimeoutError:
            log.error("worker %s: forwarders took longer than %.1f s to stop", spec.group, budget)
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for name in reversed(list(self.instances)):
            with contextlib.suppress(Exception):
                async with asyncio.timeout(max(1.0, spec.shutdown_timeout * 0.3)):
                    if name in self.started:
                        try:
                            await self.instances[name].flush()
                        finally:
                            await self.instances[name].stop()
            self.started.discard(name)
            with contextlib.suppress(Exception):
                await self.contexts[name].publisher.close()
        status.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await status
        self._write_status()
        log.info("worker %s stopped", spec.group)
        return EXIT_FATAL if self.fatal else 0

    async def _start_plugin(self, name: str) -> None:
        """Start like the main process does: retriable failures with jittered backoff."""
        import random

        inst, delay = self.instances[name], 0.5
        while not self.stop.is_set():
            self.started.add(name)
            try:
                await inst.start(self.contexts[name])
                log.info("plugin instance %s started in worker %s", name, self.spec.group)
                return
            except PluginError as exc:
                self.started.discard(name)
                if not exc.retriable:
                    self.fatal = f"plugin instance {name} cannot start: {exc}"
                    log.error("%s", self.fatal)
                    self.stop.set()
                    return
                log.warning("plugin instance %s cannot start yet: %s", name, exc)
            except Exception:
                self.started.discard(name)
                log.exception("plugin instance %s failed to start; retrying", name)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.stop.wait(), delay * random.uniform(0.5, 1.5))
            delay = min(30.0, delay * 2)

    def status(self) -> dict[str, Any]:
        sinks: dict[str, Any] = {}
        for name, fw in self.forwarders.items():
            c = fw.counters
            healthy = False
            with contextlib.suppress(Exception):
                healthy = name in self.started and bool(self.instances[name].healthy())
            sinks[name] = {"delivered": c.delivered, "batches": c.batches, "retries": c.retries,
                           "backouts": c.backouts, "down": c.down, "healthy": healthy,
                           "dead_lettered": sum(c.dead_lettered.values())}
        return {"type": "status", "pid": os.getpid(), "sinks": sinks}

    def _write_status(self) -> None:
        with contextlib.suppress(OSError, ValueError):
            sys.stdout.buffer.write(json.dumps(self.status()).encode() + b"\n")
            sys.stdout.buffer.flush()

    async def _report(self) -> None:
        while True:
            self._write_status()
            await asyncio.sleep(self.spec.status_interval)


def _die_with_parent() -> None:
    """Linux: SIGTERM when the parent dies (the stdin lifeline covers the rest)."""
    with contextlib.suppress(Exception):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)


async def _lifeline(reader: asyncio.StreamReader, stop: asyncio.Event) -> None:
    while not stop.is_set():
        line = await reader.readline()
        if not line or line.strip() == b"stop":
            stop.set()
            return


async def amain() -> int:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    try:
        spec = WorkerSpec.from_line(await reader.readline())
        BacklogSeal(bytes.fromhex(spec.backlog_key))
    except ValueError as exc:
        print(f"mqgw worker: {exc}", file=sys.stderr)
        return EXIT_SPEC
    from gateway.runtime.logs import configure_logging

    configure_logging(spec.log_format, spec.log_level)
    if spec.parent_pid and os.getppid() != spec.parent_pid:
        log.error("worker %s: the main process is gone already", spec.group)
        return 0
    worker = Worker(spec)
    loop.add_signal_handler(signal.SIGTERM, worker.stop.set)
    life = asyncio.create_task(_lifeline(reader, worker.stop))
    try:
        return await worker.run()
    finally:
        life.cancel()


def main() -> None:
    _die_with_parent()
    sys.exit(asyncio.run(amain()))


if __name__ == "__main__":
    main()
