"""``mqgw run`` as an operator runs it: a real process, SIGTERM mid-stream, restart.

Proves: SIGTERM drains, flushes and commits, then exits 0; nothing is lost or
duplicated across the stop and restart, for an MQ subscriber and for a plugin sink
(the memory plugin's record file); ``/metrics`` and ``/healthz`` answer on 127.0.0.1;
an invalid config exits 2 naming the key.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from gateway.devstack.ports import free_port
from gateway.mq.embedded.qmgr import EmbeddedQueueManager
from gateway.mq.port import GetOptions, MQError, OpenOption, PutOptions
from gateway.wire.reasons import Reason
from tests.support.pubsub_messages import CONTROL, rfh2_message, rfh_message

PYTHON = sys.executable
N = 3000  # the stop must land while the stream is being worked off


def _write_config(tmp: Path, port: int) -> Path:
    (tmp / "queues.mqsc").write_text("DEFINE QLOCAL(SUB.Q) REPLACE\n")
    cfg = tmp / "gateway.yaml"
    cfg.write_text(
        f"""
id: gw-test
queue_manager:
  data_dir: qm
  mqsc_file: queues.mqsc
broker:
  store: pubsub.db
  streams: [{{name: STOCK.STREAM}}]
  batch_size: 8
  wait_ms: 50
metrics: {{port: {port}}}
logging: {{format: json, level: info}}
plugins:
  - name: mem
    plugin: memory
    config:
      subscribe: ["$SYS/STREAM/STOCK.STREAM/#"]
      record_file: {tmp / "records.jsonl"}
"""
    )
    return cfg


def _start(cfg: Path, log: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [PYTHON, "-m", "gateway.runtime.cli", "run", "--config", str(cfg)],
        stdout=subprocess.DEVNULL,
        stderr=log.open("ab"),
        cwd=cfg.parent,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )


def _get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=2) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def _wait_healthy(
    port: int, proc: subprocess.Popen[bytes], timeout: float = 20
) -> dict[str, object]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, "gateway exited during start-up"
        try:
            status, body = _get(port, "/healthz")
            if status == 200:
                detail: dict[str, object] = json.loads(body)
                return detail
        except OSError:
            pass
        time.sleep(0.05)
    raise AssertionError("gateway did not become healthy")


def _metric(text: str, name: str, **labels: str) -> float:
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(name):
            continue
        head, _, value = line.rpartition(" ")
        if all(f'{k}="{v}"' in head for k, v in labels.items()):
            total += float(value)
    return total


def _stop(proc: subprocess.Popen[bytes]) -> int:
    proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise


async def _put_all(tmp: Path, messages: list[object]) -> None:
    qm = EmbeddedQueueManager("QM1", tmp / "qm")
    qm.run_mqsc("DEFINE QLOCAL('STOCK.STREAM') REPLACE\nDEFINE QLOCAL(SUB.Q) REPLACE")
    try:
        conn = await qm.connect()
        for m in messages:
            await conn.put1(m.queue, m.md, m.body, PutOptions(syncpoint=True))  # type: ignore[attr-defined]
        await conn.commit()
        await conn.disconnect()
    finally:
        await qm.close()


async def _depth(tmp: Path, queue: str) -> int:
    qm = EmbeddedQueueManager("QM1", tmp / "qm")
    try:
        return qm.queue_depth(queue)
    finally:
        await qm.close()


async def _depths_and_payloads(tmp: Path) -> tuple[int, list[bytes]]:
    """(messages left on STOCK.STREAM, payloads on SUB.Q in order, non-destructive)."""
    qm = EmbeddedQueueManager("QM1", tmp / "qm")
    try:
        left = qm.queue_depth("STOCK.STREAM")
        conn = await qm.connect()
        h = await conn.open("SUB.Q", OpenOption.BROWSE)
        from gateway.mq.port import Browse

        payloads: list[bytes] = []
        opts = GetOptions(browse=Browse.FIRST)
        while True:
            try:
                m = await h.get(opts)
            except MQError as exc:
                assert exc.reason == Reason.NO_MSG_AVAILABLE
                break
            payloads.append(m.body[-8:])
            opts = GetOptions(browse=Browse.NEXT)
        await h.close()
        await conn.disconnect()
        return left, payloads
    finally:
        await qm.close()


def _records(tmp: Path) -> list[str]:
    """The payloads the memory sink has written whole: a line still being appended
    (no newline yet) while the gateway runs is left for the next look."""
    path = tmp / "records.jsonl"
    if not path.exists():
        return []
    whole, _, _partial = path.read_text().rpartition("\n")
    return [json.loads(line)["payload"] for line in whole.splitlines() if line]


@pytest.mark.slow
def test_sigterm_mid_stream_then_restart_loses_and_duplicates_nothing(tmp_path: Path) -> None:
    port = free_port()
    cfg = _write_config(tmp_path, port)
    log = tmp_path / "gateway.log"
    regsub = rfh2_message(
        CONTROL,
        [("Command", "RegSub"), ("Topic", "$SYS/STREAM/STOCK.STREAM/#"), ("QName", "SUB.Q")],
    )
    asyncio.run(_put_all(tmp_path, [regsub]))

    # Phase 0: subscriptions (the MQRFH2 subscriber, the plugin's sink) become durable.
    proc = _start(cfg, log)
    try:
        detail = _wait_healthy(port, proc)
        assert detail["plugins"] == {"mem": True}
        status, text = _get(port, "/metrics")
        assert status == 200 and "mqgw_queue_depth" in text
        assert _get(port, "/nothing")[0] == 404
        time.sleep(0.3)
    finally:
        assert _stop(proc) == 0

    publications = [
        rfh_message(
            "STOCK.STREAM",
            [("MQPSCommand", "Publish"), ("MQPSStreamName", "STOCK.STREAM"), ("MQPSTopic", "IBM")],
            f"{i:08d}".encode(),
        )
        for i in range(N)
    ]
    asyncio.run(_put_all(tmp_path, publications))

    # Phase 1: stop while the stream is being worked off.
    proc = _start(cfg, log)
    try:
        _wait_healthy(port, proc)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            out = _metric(_get(port, "/metrics")[1], "mqgw_messages_out_total", plugin="mem")
            if out > 0:
                break
            time.sleep(0.01)
    finally:
        assert _stop(proc) == 0
    left, payloads = asyncio.run(_depths_and_payloads(tmp_path))
    records = _records(tmp_path)
    assert len(payloads) > 0 and left > 0, (
        f"the stop should have come mid-stream: {len(payloads)} delivered, {left} left"
    )
    assert len(payloads) + left == N  # every publication either delivered or still queued
    # The sink's copies of the committed ones: delivered, or waiting on its backlog queue
    # (the stream's commit does not wait for the sink; the backlog does).
    backlog = asyncio.run(_depth(tmp_path, "SYSTEM.MQGW.SINK.mem"))
    assert len(records) + backlog == len(payloads)
    assert records == [p.decode() for p in payloads[: len(records)]]

    # Phase 2: restart and finish.
    proc = _start(cfg, log)
    try:
        _wait_healthy(port, proc)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and len(_records(tmp_path)) < N:
            time.sleep(0.05)
        status, text = _get(port, "/metrics")
        assert _metric(text, "mqgw_end_to_end_latency_seconds_count", plugin="mem") > 0
    finally:
        assert _stop(proc) == 0
    left, payloads = asyncio.run(_depths_and_payloads(tmp_path))
    expected = [f"{i:08d}" for i in range(N)]
    assert left == 0
    assert [p.decode() for p in payloads] == expected  # once each, in order
    assert _records(tmp_path) == expected
    lines = [json.loads(line) for line in log.read_text().splitlines() if line.startswith("{")]
    assert any(rec["msg"].startswith("gateway gw-test started") for rec in lines)
    assert sum(rec["msg"].startswith("gateway gw-test stopping") for rec in lines) == 3
    assert all(rec["level"] != "error" for rec in lines), [
        r for r in lines if r["level"] == "error"
    ]


def test_invalid_config_exits_2_naming_the_key(tmp_path: Path) -> None:
    cfg = tmp_path / "gateway.yaml"
    cfg.write_text("broker:\n  batch_size: 0\nplugins:\n  - {name: x, plugin: nope}\n")
    run = subprocess.run(
        [PYTHON, "-m", "gateway.runtime.cli", "run", "--config", str(cfg)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 2
    assert "broker.batch_size:" in run.stderr
    assert "plugins[0].plugin:" in run.stderr


def test_check_prints_a_summary(tmp_path: Path) -> None:
    cfg = _write_config(tmp_path, 0)
    run = subprocess.run(
        [PYTHON, "-m", "gateway.runtime.cli", "run", "--config", str(cfg), "--check"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 0, run.stderr
    assert "gateway gw-test" in run.stdout and "plugin instance mem: memory" in run.stdout
    assert not (tmp_path / "qm").exists()  # --check writes nothing


def test_unreachable_ibmmq_queue_manager_exits_1_with_the_reason(tmp_path: Path) -> None:
    cfg = tmp_path / "gateway.yaml"
    cfg.write_text(
        "queue_manager: {type: ibmmq, name: QMX, host: 127.0.0.1, port: 1}\n"
        "metrics: {enabled: false}\nlogging: {format: text}\n"
    )
    run = subprocess.run(
        [PYTHON, "-m", "gateway.runtime.cli", "run", "--config", str(cfg)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 1, run.stderr
    assert "cannot start" in run.stderr and "MQRC" in run.stderr


def test_sigusr1_dumps_every_thread_stack_and_the_gateway_goes_on(tmp_path: Path) -> None:
    """``kill -USR1``: where each thread is, on stderr, for a stop or a wait that hangs;
    the gateway keeps serving and still stops cleanly."""
    port = free_port()
    cfg = _write_config(tmp_path, port)
    log = tmp_path / "gateway.log"
    proc = _start(cfg, log)
    try:
        _wait_healthy(port, proc)
        proc.send_signal(signal.SIGUSR1)
        def event_loop_dumped() -> bool:  # the main thread's stack comes last
            text = log.read_text()
            return "most recent call first" in text and ("_run_once" in text
                                                         or "run_forever" in text)

        deadline = time.monotonic() + 20
        while not event_loop_dumped() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert event_loop_dumped(), log.read_text()[-2000:]
        assert proc.poll() is None, "SIGUSR1 ended the gateway"
        assert _get(port, "/healthz")[0] == 200
    finally:
        code = _stop(proc)
    assert code == 0, log.read_text()[-2000:]
