"""Connection lists across a takeover, from outside (docs/operations.md, "High
availability", "Connection lists").

Two ``mqgw run --multi-instance`` processes of one node on one data directory, each told
its own channel listener port (``MQGW_LISTENER_PORT``): only the active one listens. A
neighbour queue manager (this process) sends to the node over a sender channel whose
CONNAME lists the standby's port first, then the active's; an MQ application (this
process) gets what arrives over the node's local socket with a reconnecting client,
under syncpoint. The active instance is SIGKILLed mid-traffic: the standby takes over,
the channel finds the other port, the application reconnects, and every message sent
before and after the kill is got and committed in the order sent. None is lost: one got
in a unit of work the kill backed out is got again (the application is told
MQRC_BACKED_OUT); one whose commit the kill interrupted is reported MQRC_CALL_INTERRUPTED
and got again only if that commit had not been done.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gateway.devstack.ports import free_ports
from gateway.mq.embedded.client_reconnect import ReconnectPolicy, connect_reconnecting
from gateway.mq.port import GetOptions, MQError, OpenOption, PutOptions
from gateway.runtime.network_node import start_node
from gateway.wire.mqmd import MQMD
from gateway.wire.reasons import Reason
from tests.support.gateway_process import write_config
from tests.support.instances import Instance

pytestmark = [pytest.mark.subprocess, pytest.mark.slow]

#: Start-up / takeover bound of one instance (a Python process on two busy cores).
START_S = 60.0
BEFORE, AFTER = 20, 20


def _config(tmp_path: Path) -> Path:
    (tmp_path / "node.mqsc").write_text(
        "DEFINE CHANNEL(NB.TO.HAR) CHLTYPE(RCVR) REPLACE\n"
        "DEFINE QLOCAL(IN.Q) REPLACE\n")
    return write_config(tmp_path / "gateway.yaml", {
        "id": "ha-reconnect",
        "queue_manager": {"name": "HAR", "data_dir": "qm", "mqsc_file": "node.mqsc",
                          "listener_port": "${MQGW_LISTENER_PORT}"},
        "broker": {"store": "pubsub.db"},
        "metrics": {"host": "127.0.0.1", "port": "${MQGW_METRICS_PORT}", "dashboard": False},
        "logging": {"format": "text", "level": "info"},
        "shutdown_timeout": 10.0,
    })


class Consumer:
    """An MQ application on the node's local socket: get under syncpoint, commit; a unit
    the connection's break backed out is backed out here too and done again."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        #: what it got and committed, in order, or whose commit the kill interrupted
        #: (2549: done or not; if not, the message is got again)
        self.committed: list[bytes] = []
        self.interrupted: list[bytes] = []
        self.backed_out = 0
        self.reconnects = 0
        self.got_at: dict[bytes, float] = {}
        self.stop = asyncio.Event()

    async def run(self) -> None:
        conn = await connect_reconnecting(
            self.data_dir, appl_name="ha consumer",
            policy=ReconnectPolicy(initial_s=0.05, max_s=0.5, timeout_s=START_S))
        try:
            q = await conn.open("IN.Q", OpenOption.INPUT_SHARED)
            while not self.stop.is_set():
                try:
                    msg = await q.get(GetOptions(wait_ms=200, syncpoint=True))
                    await conn.commit()
                except MQError as exc:
                    if exc.reason == Reason.NO_MSG_AVAILABLE:
                        continue
                    if exc.reason == Reason.CALL_INTERRUPTED:  # the commit met the kill
                        self.interrupted.append(msg.body)
                        self.committed.append(msg.body)
                        continue
                    assert exc.reason == Reason.BACKED_OUT, exc  # the unit the kill ended
                    self.backed_out += 1
                    await conn.backout()
                    continue
                self.committed.append(msg.body)
                self.got_at.setdefault(msg.body, time.monotonic())
        finally:
            self.reconnects = conn.reconnects
            await conn.disconnect()


async def _wait(what: str, check: object, timeout: float) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not check():  # type: ignore[operator]
        assert loop.time() < deadline, f"{what} not within {timeout:.0f} s"
        await asyncio.sleep(0.05)


async def test_channel_and_local_client_follow_the_active_instance(tmp_path: Path) -> None:
    config = _config(tmp_path)
    m_a, m_b, l_a, l_b = free_ports(4)
    a = Instance("a", config, m_a, env={"MQGW_LISTENER_PORT": str(l_a)})
    b = Instance("b", config, m_b, env={"MQGW_LISTENER_PORT": str(l_b)})
    neighbour = None
    consumer = Consumer(tmp_path / "qm")
    task: asyncio.Task[None] | None = None
    try:
        a.start()
        await asyncio.to_thread(a.wait_for, "active", lambda: a.role() == "active", START_S)
        b.start()
        await asyncio.to_thread(b.wait_for, "standby", lambda: b.role() == "standby",
                                START_S)
        # the standby's port first: it does not listen, so the active's is taken
        neighbour = await start_node("NB", tmp_path / "nb", mqsc=(
            "DEFINE QLOCAL(HAR.XMIT) USAGE(XMITQ)\n"
            "DEFINE QREMOTE(TO.HAR) RNAME(IN.Q) RQMNAME(HAR) XMITQ(HAR.XMIT)\n"
            f"DEFINE CHANNEL(NB.TO.HAR) CHLTYPE(SDR) XMITQ(HAR.XMIT) "
            f"CONNAME('127.0.0.1({l_b}), 127.0.0.1({l_a})')\n"))
        sender = neighbour.senders[("MANUAL", "NB.TO.HAR")]
        task = asyncio.create_task(consumer.run())
        sent: list[bytes] = []
        conn = await neighbour.qm.connect()

        async def send(count: int) -> None:
            for _ in range(count):
                body = f"m{len(sent):04d}".encode()
                await conn.put1("TO.HAR", MQMD(format="MQSTR", persistence=1), body,
                                PutOptions(syncpoint=True))
                await conn.commit()
                sent.append(body)

        await send(BEFORE)
        await _wait("the messages before the kill", lambda: len(consumer.committed) >= BEFORE,
                    START_S)
        assert sender.address == f"127.0.0.1({l_a})"
        await send(BEFORE // 2)  # in flight at the kill
        killed_at = time.monotonic()
        a.kill()
        await asyncio.to_thread(b.wait_for, "active", lambda: b.role() == "active", START_S)
        await send(AFTER)
        await _wait("every message", lambda: set(consumer.committed) >= set(sent), START_S)
        assert sender.address == f"127.0.0.1({l_b})"
        shown = neighbour.channel_status("NB.TO.HAR")[0]  # DISPLAY CHSTATUS: the address used
        assert f"CONNAME(127.0.0.1({l_b}))" in shown and "STATUS(RUNNING)" in shown, shown
        in_flight_at = consumer.got_at[sent[BEFORE + BEFORE // 2 - 1]] - killed_at
        consumer.stop.set()
        await asyncio.wait_for(task, START_S)
        await conn.disconnect()
        # nothing lost, in the order sent (one channel, one getter); a message twice only
        # where its commit was interrupted (2549) and had not been done
        seen = list(dict.fromkeys(consumer.committed))
        assert seen == sent, (consumer.committed, sent)
        twice = {m for m in consumer.committed if consumer.committed.count(m) > 1}
        assert twice <= set(consumer.interrupted), (twice, consumer.interrupted)
        assert consumer.reconnects >= 1
        print(f"reconnects {consumer.reconnects}, units backed out by the kill "
              f"{consumer.backed_out}, commits interrupted {len(consumer.interrupted)}, "
              f"got twice {len(twice)}, channel errors {sender.stats.errors}; the last "
              f"message sent before the kill got {in_flight_at:.2f} s after it")
    finally:
        consumer.stop.set()
        if task is not None and not task.done():
            task.cancel()
            with contextlib.suppress(BaseException):
                await task
        if neighbour is not None:
            await neighbour.stop()
        for i in (a, b):
            if i.running:
                i.terminate()


def _mqgw_run(config: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    (metrics_port,) = free_ports(1)
    return subprocess.run(
        [sys.executable, "-m", "gateway.runtime.cli", "run", "--config", str(config), *extra],
        capture_output=True, text=True, timeout=START_S, check=False, cwd=config.parent,
        env={**os.environ, "MQGW_METRICS_PORT": str(metrics_port), "MQGW_LISTENER_PORT": "0"})


def test_a_malformed_list_is_refused_with_what_is_wrong(tmp_path: Path) -> None:
    config = _config(tmp_path)
    (tmp_path / "node.mqsc").write_text(
        "DEFINE QLOCAL(HA.XMIT) USAGE(XMITQ)\n"
        "DEFINE CHANNEL(TO.HA) CHLTYPE(SDR) XMITQ(HA.XMIT) "
        "CONNAME('127.0.0.1(1414),,127.0.0.1(1415)')\n")
    done = _mqgw_run(config)
    assert done.returncode != 0, done.stdout + done.stderr
    assert ("node.mqsc: line 2: CONNAME(127.0.0.1(1414),,127.0.0.1(1415)): address 2 is "
            "empty (a stray comma?)") in done.stdout + done.stderr, done.stderr
    text = config.read_text().replace("  listener_port:", "  address_book: {HA: 'a:1,'}\n"
                                                         "  listener_port:")
    config.write_text(text)
    done = _mqgw_run(config, "--check")
    assert done.returncode == 2, done.stdout + done.stderr
    assert "queue_manager.address_book" in done.stderr
    assert "HA: 'a:1,': address 2 is empty (a stray comma?)" in done.stderr
