"""What the networks of processes in tests/support have in common: named child processes
(``mqgw run``, ``mqgw broker``, queue-manager nodes) that a test starts, waits for, stops,
kills and restarts, and the in-test TESTER node whose queues the test reads.

Why one module: tests/support/legacy_network.py, rr_network.py and tree_network.py each
wait for readiness lines, stop and restart processes, show log tails and drain TESTER's
queues; one copy keeps their behaviour the same where it is meant to be.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Iterable, Sequence
from typing import ClassVar

from gateway.mq.embedded.network import QueueManagerNode
from gateway.mq.port import GetOptions, Message, MQError, OpenOption
from gateway.wire.reasons import Reason
from tests.support.gateway_process import ChildProcess


class ProcessNetwork:
    """A network's named processes and its TESTER node. A subclass (a dataclass with a
    ``tester`` field) says which process a name is and what it logs when ready."""

    tester: QueueManagerNode
    #: Seconds :meth:`wait_ready` waits by default.
    start_timeout: ClassVar[float] = 60.0
    #: Seconds between looks at a log or a channel while waiting.
    poll_s: ClassVar[float] = 0.05
    #: Whether a process is ready only once TESTER's channel to it runs.
    tester_channels: ClassVar[bool] = True
    #: Lines per process :meth:`log_tails` shows by default.
    tail_lines: ClassVar[int] = 20
    #: Whether :meth:`close` SIGTERMs every process before waiting for any (they drain in
    #: parallel), rather than stopping them one after the other.
    stop_together: ClassVar[bool] = False

    def process(self, name: str) -> ChildProcess:
        raise NotImplementedError

    def ready_line(self, name: str) -> str:
        raise NotImplementedError

    def names(self) -> Sequence[str]:
        """Every node's name, in the order logs are shown and processes stopped."""
        raise NotImplementedError

    async def wait_ready(self, names: Iterable[str] | None = None,
                         timeout: float | None = None) -> None:
        """Each process (default: all) logged its readiness line and, with
        ``tester_channels``, TESTER's channel to it runs."""
        timeout = self.start_timeout if timeout is None else timeout
        deadline = time.monotonic() + timeout
        for name in self.names() if names is None else names:
            proc = self.process(name)
            while not proc.has_logged(self.ready_line(name)):
                if not proc.running:
                    raise RuntimeError(f"{name} exited:\n{proc.log_tail()}")
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{name} not ready within {timeout:.0f} s:\n"
                                       f"{proc.log_tail()}")
                await asyncio.sleep(self.poll_s)
            while self.tester_channels and not self.tester.channel_running(name):
                if time.monotonic() > deadline:
                    raise TimeoutError(f"channel TESTER.TO.{name} not running")
                await asyncio.sleep(self.poll_s)

    def stop(self, name: str) -> int | None:
        """SIGTERM ``name`` (a clean stop); its exit code."""
        return self.process(name).terminate()

    def kill(self, name: str) -> None:
        """SIGKILL ``name``."""
        self.process(name).kill()

    async def restart(self, name: str) -> None:
        """Start ``name`` again (after stop or kill) and wait until it is ready."""
        self.process(name).start()
        await self.wait_ready([name])

    def log_tail(self, name: str, lines: int = 40) -> str:
        try:
            return self.process(name).log_tail(lines)
        except RuntimeError:  # a node that runs in the test process has no log file
            return "(in this process)"

    def log_tails(self, lines: int | None = None) -> str:
        """Every process's log tail (for assertion messages)."""
        n = self.tail_lines if lines is None else lines
        return "\n".join(f"==== {name} ====\n{self.log_tail(name, n)}" for name in self.names())

    def stop_processes(self, processes: Iterable[ChildProcess], timeout: float = 20.0) -> None:
        """SIGTERM the running ones (SIGKILL after ``timeout``), as ``stop_together`` says."""
        running = [p for p in processes if p.running]
        if self.stop_together:
            for p in running:
                proc = p.process
                if proc is not None and proc.alive():
                    os.kill(proc.pid, signal.SIGTERM)
        for p in running:
            p.terminate(timeout=timeout)

    async def drain(self, queue: str, wait_s: float = 0.5) -> list[Message]:
        """Every message on TESTER's ``queue`` (waiting ``wait_s`` for late ones)."""
        out: list[Message] = []
        async with await self.tester.qm.connect() as conn:
            h = await conn.open(queue, OpenOption.INPUT_SHARED)
            while True:
                try:
                    out.append(await h.get(GetOptions(wait_ms=int(wait_s * 1000))))
                except MQError as exc:
                    if exc.reason != Reason.NO_MSG_AVAILABLE:
                        raise
                    return out
