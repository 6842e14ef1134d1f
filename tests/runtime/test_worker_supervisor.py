"""The worker supervisor's own robustness (review F6), with stand-in worker processes
(a few lines of Python, no queue manager): a worker whose stdout breaks the status
reader (an overlong line) or whose status is malformed is restarted, not left
unsupervised; a stop that comes while a restart spawns leaves no worker running; a
worker that cannot read its spec is fatal, not restarted for ever."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest

from gateway.runtime.workers import supervisor
from gateway.runtime.workers.spec import PluginSpec, WorkerSpec
from gateway.runtime.workers.supervisor import WorkerProcess

GOOD = '{"type": "status", "sinks": {"m": {"delivered": 7, "healthy": true}}}'

#: Each life appends a line to LIVES; life k (0-based) runs BEHAVIOUR[min(k, last)].
SCRIPT = """
import sys, time
lives, behaviour = sys.argv[1], sys.argv[2:]
with open(lives, "a") as f:
    f.write("x\\n")
with open(lives) as f:
    k = len(f.read().splitlines()) - 1
what = behaviour[min(k, len(behaviour) - 1)]
sys.stdin.readline()  # the spec line
if what == "long":
    sys.stdout.write("y" * 5000 + "\\n"); sys.stdout.flush()
elif what == "bad-status":
    sys.stdout.write('{"type": "status", "sinks": {"m": {"delivered": "lots"}}}\\n')
    sys.stdout.write('{"type": "status", "sinks": ["m"]}\\n')
    sys.stdout.flush()
    sys.exit(1)
elif what == "exit1":
    sys.exit(1)
elif what == "exit2":
    sys.exit(2)
sys.stdout.write(GOOD + "\\n"); sys.stdout.flush()
sys.stdin.readline()  # "stop" or EOF
""".replace("GOOD", repr(GOOD))


def _spec() -> WorkerSpec:
    return WorkerSpec(
        group="g", socket="/nonexistent", gateway_id="gw",
        plugins=[PluginSpec("m", "memory", {}, "BACKLOG.M")],
        dead_letter_queue="DLQ", serviced_queues=[],
    )


class StandIn(WorkerProcess):
    def __init__(self, lives: Path, *behaviour: str, **kw: object) -> None:
        super().__init__(_spec(), **kw)  # type: ignore[arg-type]
        self.lives = lives
        self.behaviour = behaviour

    def _command(self) -> list[str]:
        return [sys.executable, "-c", SCRIPT, str(self.lives), *self.behaviour]

    def life_count(self) -> int:
        return len(self.lives.read_text().splitlines()) if self.lives.exists() else 0


def _running(proc: asyncio.subprocess.Process | None) -> bool:
    return proc is not None and proc.returncode is None


@pytest.fixture(autouse=True)
def _fast(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(supervisor, "FIRST_RESTART_DELAY", 0.05)
    monkeypatch.setattr(supervisor, "LINE_LIMIT", 1024)


async def test_an_overlong_stdout_line_kills_and_restarts_the_worker(tmp_path: Path) -> None:
    w = StandIn(tmp_path / "lives", "long", "good")
    await w.start()
    first = w.proc
    try:
        assert await w.wait_started(20)  # the second life's status
        assert w.restarts == 1 and w.life_count() == 2
        assert first is not None and first.returncode is not None  # killed
        assert w.proc is not first and _running(w.proc)
        assert w.delivered() == {"m": 7} and w.healthy() == {"m": True}
    finally:
        await w.stop(5)
    assert not _running(w.proc)


async def test_a_malformed_status_is_ignored_and_the_worker_restarted(tmp_path: Path) -> None:
    w = StandIn(tmp_path / "lives", "bad-status", "good")
    await w.start()
    try:
        async with asyncio.timeout(20):
            while not (w.restarts and w.status):
                await asyncio.sleep(0.02)
        assert w.restarts == 1 and w.last_exit == 1
        assert w.delivered() == {"m": 7}  # the malformed lines counted nothing
    finally:
        await w.stop(5)
    assert not _running(w.proc)


async def test_a_stop_during_a_restart_spawn_leaves_no_worker_running(tmp_path: Path) -> None:
    gate = asyncio.Event()
    spawning = asyncio.Event()

    class SlowRespawn(StandIn):
        async def _spawn(self) -> None:
            if self.starts:  # a restart: held until the test lets it go on
                spawning.set()
                await gate.wait()
            await super()._spawn()

    w = SlowRespawn(tmp_path / "lives", "exit1", "good")
    await w.start()
    async with asyncio.timeout(20):
        await spawning.wait()
    stopping = asyncio.create_task(w.stop(5))
    await asyncio.sleep(0.05)
    gate.set()  # the restart spawns a worker after stop() began
    async with asyncio.timeout(20):
        await stopping
    assert w.starts == 2 and w.life_count() == 2
    assert not _running(w.proc)


async def test_a_worker_that_cannot_read_its_spec_is_fatal(tmp_path: Path) -> None:
    fatal: list[str] = []
    w = StandIn(tmp_path / "lives", "exit2", "good", on_fatal=fatal.append)
    await w.start()
    try:
        async with asyncio.timeout(20):
            while not fatal:
                await asyncio.sleep(0.02)
        await asyncio.sleep(0.3)
        assert w.restarts == 0 and w.life_count() == 1
        assert "status 2" in fatal[0]
    finally:
        await w.stop(5)
