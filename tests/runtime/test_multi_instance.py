"""Multi-instance nodes from outside (docs/operations.md, "High availability"): separate
``mqgw run`` processes on one configuration and data directory, read through /healthz,
/metrics, their logs and ``mqgw status``.

* Without ``--multi-instance`` a second run refuses to start, naming the holder; an
  active instance started without it permits no standby (IBM MQ's ``strmqm -x``).
* A frozen (SIGSTOP) active instance keeps the lock: the standby stays standby for a
  window many times longer than it takes to notice a free lock (measured in the same
  test by the SIGKILL that follows), so a split brain cannot happen; SIGCONT and the
  frozen one serves on.
"""

from __future__ import annotations

import contextlib
import os
import re
import time
import urllib.request
from pathlib import Path

import pytest

from gateway.devstack.ports import free_ports
from gateway.runtime.standby import POLL_S
from tests.support.gateway_process import write_config
from tests.support.instances import Instance, mqgw_status, mqgw_status_text

pytestmark = [pytest.mark.subprocess, pytest.mark.slow]

#: Start-up bound of one instance (a Python process on two busy cores).
START_S = 60.0
#: How long a frozen active instance is watched (at least this many standby polls).
FROZEN_POLLS = 20


def _config(tmp_path: Path) -> Path:
    return write_config(tmp_path / "gateway.yaml", {
        "id": "ha-test",
        "queue_manager": {"name": "HATEST", "data_dir": "qm", "listener_port": 0},
        "broker": {"store": "pubsub.db"},
        "metrics": {"host": "127.0.0.1", "port": "${MQGW_METRICS_PORT:-9464}", "dashboard": False},
        "logging": {"format": "text", "level": "info"},
        "shutdown_timeout": 10.0,
    })


def _metric(port: int, name: str) -> float | None:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        text = r.read().decode()
    found = re.search(rf"^{name}\{{[^}}]*\}} (\S+)$", text, re.M)
    return float(found.group(1)) if found else None


def _stop(*instances: Instance) -> None:
    for i in instances:
        if i.running:
            with contextlib.suppress(ProcessLookupError):
                i.thaw()
            i.terminate()


def test_a_second_run_refuses_unless_both_permit_a_standby(tmp_path: Path) -> None:
    config = _config(tmp_path)
    a_port, b_port = free_ports(2)
    a = Instance("a", config, a_port, multi_instance=False)
    b = Instance("b", config, b_port, multi_instance=False)
    c = Instance("c", config, b_port, multi_instance=True)
    a.start()
    try:
        a.wait_for("active", lambda: a.role() == "active", START_S)
        b.start()
        deadline = time.monotonic() + START_S
        while b.running and time.monotonic() < deadline:
            time.sleep(0.05)
        assert b.exit_code() == 1, b.log_tail()
        assert f"in use by pid {a.pid} on host" in b.log_since_start(), b.log_tail()
        assert "--multi-instance" in b.log_since_start()

        c.start()  # permits a standby itself, but the active one does not
        deadline = time.monotonic() + START_S
        while c.running and time.monotonic() < deadline:
            time.sleep(0.05)
        assert c.exit_code() == 1, c.log_tail()
        assert "permits no standby" in c.log_since_start(), c.log_tail()
        assert a.role() == "active"
        code, text = mqgw_status_text(config)
        assert code == 0, text
        assert f"active instance: pid {a.pid} on host " in text, text
        assert "(permits no standby)" in text and "standby instances: none" in text, text
    finally:
        _stop(a, b, c)
    code, text = mqgw_status_text(config)
    assert code == 1 and "active instance: none" in text, text


def test_a_standby_waits_out_a_frozen_active_and_takes_over_a_killed_one(
    tmp_path: Path,
) -> None:
    config = _config(tmp_path)
    a_port, b_port = free_ports(2)
    a, b = Instance("a", config, a_port), Instance("b", config, b_port)
    a.start()
    try:
        a.wait_for("active", lambda: a.role() == "active", START_S)
        b.start()
        b.wait_for("standby", lambda: b.role() == "standby", START_S)
        assert b.has_logged(f"standby: waiting for the lock on {tmp_path / 'qm'} held by "
                            f"pid {a.pid} on host")
        assert _metric(a_port, "mqgw_instance_active") == 1
        assert _metric(b_port, "mqgw_instance_active") == 0
        code, status = mqgw_status(config)
        assert code == 0
        assert status["active"]["pid"] == a.pid
        assert [s["pid"] for s in status["standbys"]] == [b.pid]

        # frozen: the kernel keeps its lock; the standby polls on and never gets it
        a.freeze()
        frozen_at = time.monotonic()
        window = FROZEN_POLLS * POLL_S
        while time.monotonic() - frozen_at < window:
            assert b.role() == "standby", b.log_tail()
            time.sleep(POLL_S / 2)
        code, status = mqgw_status(config)
        assert code == 0 and status["active"]["pid"] == a.pid, status
        assert not b.has_logged("active since"), b.log_tail()
        a.thaw()
        a.wait_for("answering again", lambda: a.role() == "active", START_S)
        assert (a.health() or {}).get("status") == "ok", a.health()

        # killed: the kernel frees the lock and the standby takes it within a few polls
        killed_at = time.monotonic()
        a.kill()
        b.wait_for("taking the lock", lambda: b.has_logged("active since"), START_S)
        noticed = time.monotonic() - killed_at
        b.wait_for("active", lambda: b.role() == "active", START_S)
        took_over = time.monotonic() - killed_at
        print(f"frozen window {window:.1f} s; lock taken {noticed:.2f} s and /healthz "
              f"active {took_over:.2f} s after the SIGKILL")
        # the frozen window was long enough to show the standby would have taken a free
        # lock in it (noticing includes a poll and the log line reaching the file)
        assert noticed < window, (noticed, window)
        assert _metric(b_port, "mqgw_instance_active") == 1
        since = _metric(b_port, "mqgw_instance_active_since_seconds")
        assert since is not None and since > time.time() - took_over - 5
        code, status = mqgw_status(config)
        assert code == 0 and status["active"]["pid"] == b.pid and status["standbys"] == []
    finally:
        _stop(a, b)
    code, status = mqgw_status(config)
    assert code == 1 and status["active"] is None, status  # a clean stop ends the record


def test_a_takeover_waits_for_an_admin_command_holding_the_stopped_directory(
    tmp_path: Path,
) -> None:
    """Between the active instance's end and the takeover, ``mqgw qm`` on the stopped
    node opens the queue manager's directory itself; the standby that then takes the
    node's lock waits for it rather than fail to open the queue manager."""
    from gateway.mq.embedded.store import MessageStore

    config = _config(tmp_path)
    a_port, b_port = free_ports(2)
    a, b = Instance("a", config, a_port), Instance("b", config, b_port)
    a.start()
    try:
        a.wait_for("active", lambda: a.role() == "active", START_S)
        b.start()
        b.wait_for("standby", lambda: b.role() == "standby", START_S)
        b.freeze()  # so the command below opens the directory before the takeover
        a.kill()
        admin = MessageStore(tmp_path / "qm")  # what `mqgw qm` does on a stopped node
        try:
            b.thaw()
            b.wait_for("the wait for the command", lambda: b.has_logged(
                "waiting for the command that has the queue manager's data directory "
                f"open (pid {os.getpid()})"), START_S)
            assert b.running and b.role() == "standby"
        finally:
            admin.close()
        b.wait_for("active", lambda: b.role() == "active", START_S)
        assert (b.health() or {}).get("status") == "ok", b.health()
    finally:
        _stop(a, b)


def test_a_standby_stopped_while_waiting_exits_0_and_leaves_the_active_alone(
    tmp_path: Path,
) -> None:
    config = _config(tmp_path)
    a_port, b_port = free_ports(2)
    a, b = Instance("a", config, a_port), Instance("b", config, b_port)
    a.start()
    try:
        a.wait_for("active", lambda: a.role() == "active", START_S)
        b.start()
        b.wait_for("standby", lambda: b.role() == "standby", START_S)
        assert b.terminate() == 0, b.log_tail()
        assert b.has_logged("standby: stopped while waiting for the lock"), b.log_tail()
        code, status = mqgw_status(config)
        assert code == 0 and status["active"]["pid"] == a.pid and status["standbys"] == []
        assert (a.health() or {}).get("status") == "ok", a.health()
    finally:
        _stop(a, b)
