"""Starting, watching and stopping worker processes from the main process.

One :class:`WorkerProcess` per ``workers:`` group. It spawns
``python -m gateway.runtime.workers.child``, writes the spec line to its stdin and keeps
that pipe open as the worker's lifeline (closing it, or the main process dying, stops
the worker), reads its status lines, and when the worker exits without being asked
restarts it after a backoff (0.5 s doubling to the group's ``restart_max_delay``, back
to 0.5 s after a minute of running), logging the exit status and counting the restart
(``mqgw_worker_restarts_total``). Stopping sends ``stop``, waits, then SIGTERM, then
SIGKILL: no worker outlives the gateway.

Nothing is lost when a worker dies: its forwarders' gets are in units of work on the
queue manager's socket, which the queue manager backs out when the socket closes.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from gateway.runtime.workers.spec import WorkerSpec

__all__ = ["WorkerCollector", "WorkerProcess"]

log = logging.getLogger(__name__)

#: First pause before a restart, and the running time after which it is reset.
FIRST_RESTART_DELAY = 0.5
STABLE_AFTER_S = 60.0
#: Seconds a worker gets after SIGTERM before SIGKILL.
KILL_AFTER_S = 3.0
#: Longest status line read from a worker's stdout (a longer one, e.g. a plugin
#: library printing there, is a broken worker: killed and restarted).
LINE_LIMIT = 1 << 20
#: Worker exit statuses that no restart can mend (child.EXIT_SPEC, child.EXIT_FATAL).
EXIT_SPEC, EXIT_FATAL = 2, 3


def _count(value: Any) -> int:
    """A status line's ``delivered`` figure, 0 when it is not a count."""
    try:
        return max(0, int(value))
    except (TypeError, ValueError, OverflowError):
        return 0


def _status_of(line: bytes) -> dict[str, Any] | None:
    """The status a worker's stdout line carries, or None (not JSON, not a status, or
    a ``sinks`` that is not a mapping of mappings: ignored, never trusted)."""
    try:
        status = json.loads(line)
    except ValueError:
        return None
    if not isinstance(status, dict) or status.get("type") != "status":
        return None
    sinks = status.get("sinks", {})
    if not isinstance(sinks, dict) or not all(isinstance(v, dict) for v in sinks.values()):
        return None
    return status


def _python_path() -> str:
    """The directory holding the ``gateway`` package (and ``plugins``), first on the
    worker's PYTHONPATH so it imports the same code as the main process."""
    root = str(Path(__file__).resolve().parents[3])
    old = os.environ.get("PYTHONPATH", "")
    return root + (os.pathsep + old if old else "")


class WorkerProcess:
    """Supervises one worker process (see module docstring)."""

    def __init__(
        self,
        spec: WorkerSpec,
        *,
        restart_max_delay: float = 30.0,
        on_fatal: Callable[[str], None] | None = None,
    ) -> None:
        self.spec = spec
        self.name = spec.group
        self.restart_max_delay = restart_max_delay
        self.on_fatal = on_fatal
        #: figures for metrics and health
        self.starts = 0
        self.restarts = 0
        self.last_exit: int | None = None
        self.status: dict[str, Any] = {}
        #: status of earlier worker lives: their delivered counts, so totals only grow
        self._carried: dict[str, int] = {}
        self.proc: asyncio.subprocess.Process | None = None
        self._stopping = False
        self._task: asyncio.Task[None] | None = None
        self._first_status = asyncio.Event()

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None and self.proc.returncode is None else None

    @property
    def up(self) -> bool:
        return self.pid is not None

    def delivered(self) -> dict[str, int]:
        """Envelopes acknowledged by each sink of the group, over every life of the
        worker (what a killed worker had sent but not committed is sent again: counted
        twice, as the sink received it twice)."""
        out = dict(self._carried)
        for name, s in self.status.get("sinks", {}).items():
            out[name] = out.get(name, 0) + _count(s.get("delivered", 0))
        return out

    def healthy(self) -> dict[str, bool]:
        sinks = self.status.get("sinks", {})
        return {p.name: self.up and bool(sinks.get(p.name, {}).get("healthy"))
                for p in self.spec.plugins}

    async def start(self) -> None:
        """Spawn the worker and watch it (returns once it is spawned)."""
        self._stopping = False
        await self._spawn()
        self._task = asyncio.create_task(self._watch(), name=f"worker:{self.name}")

    async def wait_started(self, timeout: float) -> bool:
        """True once the worker wrote its first status line (tests, benchmarks)."""
        try:
            async with asyncio.timeout(timeout):
                await self._first_status.wait()
        except TimeoutError:
            return False
        return True

    def _command(self) -> list[str]:
        return [sys.executable, "-m", "gateway.runtime.workers.child"]

    async def _spawn(self) -> None:
        env = {**os.environ, "PYTHONPATH": _python_path()}
        self.spec.parent_pid = os.getpid()
        self._first_status.clear()
        self.proc = await asyncio.create_subprocess_exec(
            *self._command(),
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, env=env,
            limit=LINE_LIMIT,
        )
        assert self.proc.stdin is not None
        self.proc.stdin.write(self.spec.to_line())
        await self.proc.stdin.drain()
        self.starts += 1
        log.info("worker %s started (pid %d): %s", self.name, self.proc.pid,
                 ", ".join(p.name for p in self.spec.plugins))

    async def _read_status(self, proc: asyncio.subprocess.Process) -> None:
        assert proc.stdout is not None
        while True:
            line = await proc.stdout.readline()
            if not line:
                return
            status = _status_of(line)
            if status is not None:
                self.status = status
                self._first_status.set()

    async def _life(self, proc: asyncio.subprocess.Process) -> int:
        """Watch one life of the worker to its exit status. Whatever goes wrong while
        reading it (an overlong line, a broken pipe) is logged and the worker killed:
        it then counts as an exit, and is restarted like one."""
        try:
            await self._read_status(proc)
        except Exception:
            log.exception("worker %s (pid %d): cannot read its status: killing it",
                          self.name, proc.pid)
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
        return await proc.wait()

    async def _watch(self) -> None:
        delay = FIRST_RESTART_DELAY
        while True:
            proc = self.proc
            assert proc is not None
            began = time.monotonic()
            code = await self._life(proc)
            self.last_exit = code
            self._carry()
            if self._stopping:
                return
            if code in (EXIT_SPEC, EXIT_FATAL) and self.on_fatal is not None:
                # no restart can mend these: a spec it cannot read, a config that
                # can never work
                self.on_fatal(f"worker {self.name}: exited with status {code}: "
                              + ("a plugin instance cannot start with its configuration"
                                 if code == EXIT_FATAL else "it cannot read its spec")
                              + " (see its log)")
                return
            if time.monotonic() - began > STABLE_AFTER_S:
                delay = FIRST_RESTART_DELAY
            log.error("worker %s (pid %d) exited with status %d: restarting in %.1f s "
                      "(its sinks' backlogs wait on their queues meanwhile)",
                      self.name, proc.pid, code, delay)
            self.restarts += 1
            await asyncio.sleep(delay)
            delay = min(self.restart_max_delay, delay * 2)
            if self._stopping:
                return
            try:
                await self._spawn()
            except Exception as exc:  # the old, exited proc stays: the loop retries
                log.error("worker %s cannot be started: %s", self.name, exc)
            if self._stopping:
                return  # stop() came during the spawn: it stops the new worker

    def _carry(self) -> None:
        for name, s in self.status.get("sinks", {}).items():
            self._carried[name] = self._carried.get(name, 0) + _count(s.get("delivered", 0))
        self.status = {}

    async def stop(self, timeout: float) -> None:
        """Ask the worker to stop (it finishes or backs out its batches), then SIGTERM,
        then SIGKILL; returns when it has exited."""
        self._stopping = True
        proc = self.proc
        await self._stop_proc(proc, timeout)
        if self._task is not None:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                async with asyncio.timeout(KILL_AFTER_S):
                    await self._task
            self._task.cancel()
            self._task = None
        if self.proc is not proc:  # spawned by a restart while this stop waited
            await self._stop_proc(self.proc, timeout)

    async def _stop_proc(self, proc: asyncio.subprocess.Process | None, timeout: float) -> None:
        if proc is not None and proc.returncode is None:
            if proc.stdin is not None:
                with contextlib.suppress(Exception):
                    proc.stdin.write(b"stop\n")
                    await proc.stdin.drain()
                    proc.stdin.close()
            for sig, wait in (("stop", timeout), ("term", KILL_AFTER_S), ("kill", None)):
                if sig == "term":
                    log.error("worker %s did not stop in %.1f s: SIGTERM", self.name, timeout)
                    with contextlib.suppress(ProcessLookupError):
                        proc.terminate()
                elif sig == "kill":
                    log.error("worker %s did not stop after SIGTERM: SIGKILL", self.name)
                    with contextlib.suppress(ProcessLookupError):
                        proc.kill()
                try:
                    async with asyncio.timeout(wait):
                        await proc.wait()
                    break
                except TimeoutError:
                    continue


class WorkerCollector:
    """``mqgw_worker_*`` metrics of the supervised workers."""

    def __init__(self, workers: Callable[[], list[WorkerProcess]]) -> None:
        self._workers = workers

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        up = GaugeMetricFamily("mqgw_worker_up", "1 while the worker process runs",
                               labels=["worker"])
        restarts = CounterMetricFamily(
            "mqgw_worker_restarts", "Restarts of a worker process after it exited unasked",
            labels=["worker"])
        delivered = CounterMetricFamily(
            "mqgw_worker_sink_delivered",
            "Envelopes acknowledged by a sink forwarded in a worker process",
            labels=["worker", "plugin"])
        for w in self._workers():
            up.add_metric([w.name], 1.0 if w.up else 0.0)
            restarts.add_metric([w.name], float(w.restarts))
            for plugin, n in w.delivered().items():
                delivered.add_metric([w.name, plugin], float(n))
        yield up
        yield restarts
        yield delivered
