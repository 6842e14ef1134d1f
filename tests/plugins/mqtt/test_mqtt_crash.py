"""An inbound MQTT message is acknowledged only after its MQ unit of work committed:
kill the gateway (a child process) between receipt and commit, restart it, and the
broker redelivers the message into the persistent session — exactly one copy reaches
the MQ subscriber."""

from __future__ import annotations

import asyncio
import contextlib
import sys
from pathlib import Path

import pytest

from gateway.devstack import MosquittoBroker
from tests.plugins.mqtt.mqtt_harness import client, collect, unique

pytestmark = [pytest.mark.mqtt, pytest.mark.slow]

CHILD = "tests.plugins.mqtt.gateway_child"
REPO = Path(__file__).resolve().parents[3]


async def spawn_child(*args: str) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        CHILD,
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        cwd=REPO,
    )


async def read_until(proc: asyncio.subprocess.Process, wanted: str, log: list[str]) -> None:
    assert proc.stdout is not None
    try:
        await asyncio.wait_for(_read_until(proc, wanted, log), 30)
    except TimeoutError:
        raise AssertionError(f"no {wanted!r} within 30 s:\n" + "".join(log)) from None


async def _read_until(proc: asyncio.subprocess.Process, wanted: str, log: list[str]) -> None:
    assert proc.stdout is not None
    if True:
        while True:
            raw = await proc.stdout.readline()
            if not raw:
                raise AssertionError(f"child exited before {wanted!r}:\n" + "".join(log))
            line = raw.decode()
            log.append(line)
            if line.strip() == wanted or line.startswith(wanted):
                return


async def read_for(proc: asyncio.subprocess.Process, seconds: float, log: list[str]) -> None:
    assert proc.stdout is not None
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(seconds):
            while raw := await proc.stdout.readline():
                log.append(raw.decode())


async def kill(proc: asyncio.subprocess.Process) -> None:
    if proc.returncode is None:
        proc.kill()
        await proc.wait()


@pytest.mark.parametrize("protocol", ["5", "3.1.1"])
async def test_killed_between_receipt_and_commit_message_is_redelivered_once(
    mqtt_broker: MosquittoBroker, tmp_path: Path, protocol: str
) -> None:
    base = unique("crash")
    args = [str(tmp_path), mqtt_broker.host, str(mqtt_broker.port), unique("gw-"), protocol, base]
    first_log: list[str] = []
    first = await spawn_child(*args, "hang")
    try:
        await read_until(first, "ready", first_log)
        async with client(mqtt_broker.host, mqtt_broker.port) as pub:
            await pub.publish(f"{base}/k1", b"m1", qos=1)
        await read_until(first, "in-commit", first_log)
    finally:
        await kill(first)  # SIGKILL: no clean disconnect, nothing flushed
    assert first.returncode == -9
    assert any(line.startswith(f"mqtt-received {base}/k1 dup=0") for line in first_log)

    second_log: list[str] = []
    second = await spawn_child(*args, "run")
    try:
        await read_until(second, "got m1", second_log)
        await read_for(second, 2.0, second_log)  # a duplicate would show up here
        assert second.returncode is None
        second.terminate()
        assert await asyncio.wait_for(second.wait(), 30) == 0
    finally:
        await kill(second)
    await read_for(second, 1.0, second_log)
    got = [line.strip() for line in second_log if line.startswith("got ")]
    assert got == ["got m1"], second_log
    # the copy came back from the broker's session, flagged as a redelivery
    assert any(line.startswith(f"mqtt-received {base}/k1 dup=1") for line in second_log), second_log


async def test_sigterm_mid_stream_then_restart_loses_and_duplicates_nothing(
    mqtt_broker: MosquittoBroker, tmp_path: Path
) -> None:
    """The gateway process gets SIGTERM while forwarding MQ → MQTT: it drains, commits
    and exits 0; restarted, it forwards the rest. Every publication arrives once, in
    order."""
    n = 3000
    base = unique("term")
    args = [str(tmp_path), mqtt_broker.host, str(mqtt_broker.port), unique("gw-"), "5", base]
    async with client(mqtt_broker.host, mqtt_broker.port) as sub:
        await sub.subscribe(f"{base}-out/#", qos=1)
        log: list[str] = []
        first = await spawn_child(*args, f"feed{n}")
        try:
            await read_until(first, "ready", log)
            await read_until(first, "fed", log)
            received = await collect(sub, 200, timeout=30, quiet=0.0)
            first.terminate()
            assert await asyncio.wait_for(first.wait(), 30) == 0, log
        finally:
            await kill(first)
        received += await collect(sub, 0, quiet=0.5)  # what the drain still sent
        assert len(received) < n, "SIGTERM came after the stream had ended"
        second = await spawn_child(*args, "run")
        try:
            await read_until(second, "ready", log)
            received += await collect(sub, n - len(received), timeout=60, quiet=1.0)
            second.terminate()
            assert await asyncio.wait_for(second.wait(), 30) == 0, log
        finally:
            await kill(second)
    payloads = [int(m.payload) for m in received]  # type: ignore[arg-type]
    assert payloads == list(range(n))
