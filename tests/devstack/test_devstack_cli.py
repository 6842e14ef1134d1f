"""`mqgw devstack up|status|down` end to end: real processes, stopped by pid, none left."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gateway.devstack.process import pid_alive, process_start_time, spawn


def _mqgw(state_dir: Path, *args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "gateway.runtime.cli",
            "devstack",
            "--state-dir",
            str(state_dir),
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def test_without_state_status_says_not_running_and_down_is_a_no_op(tmp_path: Path) -> None:
    status = _mqgw(tmp_path, "status")
    assert status.returncode == 3
    assert "not running" in status.stdout
    down = _mqgw(tmp_path, "down")
    assert down.returncode == 0
    assert "nothing to stop" in down.stdout


@pytest.mark.kafka
@pytest.mark.mqtt
@pytest.mark.slow
def test_up_status_down_leaves_no_process(tmp_path: Path) -> None:
    up = _mqgw(tmp_path, "up")
    state_file = tmp_path / "state.json"
    try:
        assert up.returncode == 0, up.stderr
        state = json.loads(state_file.read_text())
        services = {s["name"]: s for s in state["services"]}
        assert set(services) == {"kafka", "mqtt"}
        assert f"MQGW_KAFKA_BOOTSTRAP={services['kafka']['address']}" in up.stdout
        assert f"MQGW_MQTT_PORT={services['mqtt']['address'].rsplit(':', 1)[1]}" in up.stdout
        assert "kafka.Kafka" in _cmdline(services["kafka"]["pid"])
        assert "mosquitto" in _cmdline(services["mqtt"]["pid"])
        for svc in services.values():
            assert pid_alive(svc["pid"], svc["start_time"])

        status = _mqgw(tmp_path, "status", "--json")
        assert status.returncode == 0, status.stdout + status.stderr
        report = json.loads(status.stdout)
        assert report["running"] is True
        assert all(s["answering"] for s in report["services"])

        again = _mqgw(tmp_path, "up")
        assert again.returncode == 0
        assert "already up" in again.stdout
        assert json.loads(state_file.read_text()) == state  # nothing new started
    finally:
        down = _mqgw(tmp_path, "down")
    assert down.returncode == 0, down.stdout + down.stderr
    for svc in services.values():
        assert not pid_alive(svc["pid"], svc["start_time"]), svc
    assert not state_file.exists()
    assert not Path(state["work_dir"]).exists()


def test_down_never_signals_a_recycled_pid(tmp_path: Path) -> None:
    """A recorded pid now owned by another process (other start time) is left alone."""
    bystander = spawn("bystander", ["sleep", "60"], log_path=tmp_path / "b.log", cwd=tmp_path)
    try:
        start = process_start_time(bystander.pid)
        assert start is not None
        work_dir = tmp_path / "work"
        work_dir.mkdir()
        record = {
            "name": "kafka",
            "pid": bystander.pid,
            "start_time": start - 1,
            "argv": ["java"],
            "log_path": str(work_dir / "kafka.log"),
            "address": "127.0.0.1:1",
        }
        (tmp_path / "state.json").write_text(
            json.dumps({"work_dir": str(work_dir), "services": [record]})
        )
        down = _mqgw(tmp_path, "down")
        assert down.returncode == 0
        assert "was not running" in down.stdout
        assert bystander.alive()
    finally:
        bystander.stop()


def test_corrupt_state_file_is_reported(tmp_path: Path) -> None:
    (tmp_path / "state.json").write_text("{not json")
    result = _mqgw(tmp_path, "down")
    assert result.returncode == 1
    assert "not a devstack state file" in result.stderr


@pytest.mark.mqtt
def test_dead_service_shows_in_status_and_up_replaces_it(tmp_path: Path) -> None:
    first = _mqgw(tmp_path, "up", "--only", "mqtt")
    assert first.returncode == 0, first.stderr
    old_state = json.loads((tmp_path / "state.json").read_text())
    old = old_state["services"][0]
    try:
        # the broker dies behind the CLI's back (we started it: kill it by its pid)
        os.kill(old["pid"], signal.SIGKILL)
        deadline = time.monotonic() + 5
        while pid_alive(old["pid"], old["start_time"]) and time.monotonic() < deadline:
            time.sleep(0.02)
        status = _mqgw(tmp_path, "status")
        assert status.returncode == 1
        assert "dead" in status.stdout

        again = _mqgw(tmp_path, "up", "--only", "mqtt")
        assert again.returncode == 0, again.stderr
        assert "partly dead" in again.stdout
        assert f"logs are kept in {old_state['work_dir']}" in again.stdout
        new = json.loads((tmp_path / "state.json").read_text())["services"][0]
        assert (new["pid"], new["start_time"]) != (old["pid"], old["start_time"])
        assert pid_alive(new["pid"], new["start_time"])
        assert _mqgw(tmp_path, "status").returncode == 0
    finally:
        down = _mqgw(tmp_path, "down")
        shutil.rmtree(old_state["work_dir"], ignore_errors=True)
    assert down.returncode == 0
    assert not pid_alive(new["pid"], new["start_time"])


@pytest.mark.mqtt
@pytest.mark.mosquitto_clients
def test_up_secure_mqtt_listeners_check_ca_and_password(tmp_path: Path) -> None:
    """`up --secure`: Mosquitto's TLS+password listener takes the written user and CA and
    refuses a wrong password (mosquitto_pub as the outside client)."""
    up = _mqgw(tmp_path, "up", "--secure", "--only", "mqtt")
    try:
        assert up.returncode == 0, up.stderr
        work_dir = Path(json.loads((tmp_path / "state.json").read_text())["work_dir"])
        described = work_dir / "mqtt-secure.txt"
        assert described.stat().st_mode & 0o077 == 0
        facts = dict(line.split(" ", 1) for line in described.read_text().splitlines())
        port = {k.split()[0]: v for k, v in (
            line.split(" ", 1)[1].rsplit(" ", 1) for line in described.read_text().splitlines()
            if line.startswith("listener "))}["tls-password"].rsplit(":", 1)[1]
        user, password = facts["user"].split(" password ")

        def pub(pw: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run(
                ["mosquitto_pub", "-h", "127.0.0.1", "-p", port, "--cafile", facts["ca_file"],
                 "-u", user, "-P", pw, "-t", "devstack/secure", "-m", "hello", "-q", "1"],
                capture_output=True, text=True, timeout=20, check=False)

        ok = pub(password)
        assert ok.returncode == 0, ok.stderr
        refused = pub(password + "x")
        assert refused.returncode != 0 and "not authori" in refused.stderr.lower()
    finally:
        down = _mqgw(tmp_path, "down")
    assert down.returncode == 0, down.stdout + down.stderr
