"""Worker processes (``workers:``): the queue manager's batched get, the configuration
checks, and a gateway whose memory sinks are forwarded by two worker processes — start,
forwarding in order, health and metrics, a kill -9 of a worker mid-run (restarted with
nothing lost and each stream's order kept), and a stop that leaves no process behind."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
from pathlib import Path
from typing import Any

import pytest

from gateway.mq.embedded.client import connect_local
from gateway.mq.embedded.qm_server import QueueManagerServer
from gateway.mq.embedded.qmgr import EmbeddedQueueManager
from gateway.mq.port import GetOptions, MQError, OpenOption, PutOptions
from gateway.plugin_api import Envelope
from gateway.runtime.app import GatewayApp
from gateway.runtime.config import parse_config
from gateway.runtime.errors import ConfigErrors
from gateway.runtime.plugin_host import publish_command_of
from gateway.runtime.registry import PluginRegistry
from gateway.wire.mqmd import MQMD
from gateway.wire.reasons import Reason

STREAMS = ["S1.STREAM", "S2.STREAM", "S3.STREAM", "S4.STREAM"]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie is not a running worker: it has exited and waits to be reaped
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            return f.read().split(") ", 1)[1][0] != "Z"
    except OSError:
        return False


# ------------------------------------------------------------ the batched get ---------


async def test_get_batch_takes_what_is_there_in_one_unit_of_work(tmp_path: Path) -> None:
    qm = EmbeddedQueueManager("QMB", tmp_path / "qm")
    qm.run_mqsc("DEFINE QLOCAL(Q1)", stop_on_error=True)
    server = QueueManagerServer(qm)
    await server.start()
    try:
        conn = await connect_local(tmp_path / "qm")
        h = await conn.open("Q1", OpenOption.INPUT_SHARED | OpenOption.OUTPUT)
        for i in range(5):
            await h.put(MQMD(), f"m{i}".encode())
        got = await h.get_batch(GetOptions(wait_ms=0, syncpoint=True), 3)
        assert [m.body for m in got] == [b"m0", b"m1", b"m2"]
        await conn.backout()  # back on the queue, in their order, BackoutCount 1
        got = await h.get_batch(GetOptions(wait_ms=0, syncpoint=True), 10)
        assert [m.body for m in got] == [f"m{i}".encode() for i in range(5)]
        assert [m.md.backout_count for m in got] == [1, 1, 1, 0, 0]
        await conn.commit()
        with pytest.raises(MQError) as empty:
            await h.get_batch(GetOptions(wait_ms=10, syncpoint=True), 10)
        assert empty.value.reason == Reason.NO_MSG_AVAILABLE
        with pytest.raises(MQError) as bad:
            await h.get_batch(GetOptions(), 0)
        assert bad.value.reason == Reason.OPTIONS_ERROR
        await conn.disconnect()
    finally:
        await server.stop()
        await qm.close()


# ------------------------------------------------------------ configuration -----------


def _config(tmp_path: Path, workers: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    return {
        "queue_manager": {"data_dir": str(tmp_path / "qm")},
        "broker": {"store": str(tmp_path / "pubsub.db"), "wait_ms": 50, "retry_delay": 0.05,
                   "streams": [{"name": s} for s in STREAMS]},
        "metrics": {"enabled": False},
        "shutdown_timeout": 10,
        "plugins": [
            {"name": f"mem{i}", "plugin": "memory",
             "config": {"bus": f"b{i}", "subscribe": [f"$SYS/STREAM/{s}/#"],
                        "record_file": str(tmp_path / f"mem{i}.jsonl")}}
            for i, s in enumerate(STREAMS)
        ],
        "workers": workers,
        **extra,
    }


@pytest.mark.parametrize(
    ("workers", "extra", "message"),
    [
        ([{"name": "w1", "plugins": ["nope"]}], {}, "not an enabled instance"),
        ([{"name": "w1", "plugins": ["mem0"]}, {"name": "w2", "plugins": ["mem0"]}], {},
         "is in workers 'w1' and 'w2'"),
        ([{"name": "w1", "plugins": ["mem0"]}, {"name": "w1", "plugins": ["mem1"]}], {},
         "two workers are called 'w1'"),
        ([{"name": "w1", "plugins": []}], {}, "at least 1 item"),
        ([{"name": "w1", "plugins": ["mem0"]}],
         {"queue_manager": {"type": "ibmmq", "name": "QM1"}}, "need the embedded queue manager"),
        ([{"name": "w1", "plugins": ["mem0"]}],
         {"request_reply": {"requests": [{"name": "r", "plugin": "mem0", "source": "req",
                                          "destination": "SVC.Q"}]}},
         "serves request/reply routes"),
    ],
)
def test_config_errors_name_the_problem(
    tmp_path: Path, workers: list[dict[str, Any]], extra: dict[str, Any], message: str
) -> None:
    registry = PluginRegistry.from_entry_points()
    with pytest.raises(ConfigErrors) as exc:
        parse_config(_config(tmp_path, workers, **extra), registry, base_dir=tmp_path)
    assert message in str(exc.value)


def test_no_workers_is_the_default(tmp_path: Path) -> None:
    registry = PluginRegistry.from_entry_points()
    loaded = parse_config(_config(tmp_path, []), registry, base_dir=tmp_path)
    assert loaded.gateway.workers == []


def test_workers_log_at_debug_when_the_gateway_does(tmp_path: Path) -> None:
    """``mqgw -vv run`` sets the root logger to debug: the workers' specs carry that,
    else the configured level."""
    from gateway.runtime.workers import worker_specs

    registry = PluginRegistry.from_entry_points()
    cfg = _config(tmp_path, [{"name": "w1", "plugins": ["mem0"]}])
    cfg["logging"] = {"level": "warning"}
    loaded = parse_config(cfg, registry, base_dir=tmp_path)

    def level() -> str:
        (spec,) = worker_specs(loaded, socket="qm.sock", backlogs={"mem0": "BL.MEM0"},
                               dead_letter_queue="DLQ", serviced_queues=[], instances={},
                               backlog_key=bytes(32))
        return spec.log_level

    root = logging.getLogger()
    saved = root.level
    try:
        root.setLevel(logging.INFO)
        assert level() == "warning"
        root.setLevel(logging.DEBUG)
        assert level() == "debug"
    finally:
        root.setLevel(saved)


# ------------------------------------------------------------ the running gateway -----


async def _publish(app: GatewayApp, per_stream: int, start: int = 0) -> None:
    assert app.qm is not None
    conn = await app.qm.connect()
    try:
        for s in STREAMS:
            h = await conn.open(s, OpenOption.OUTPUT)
            for i in range(start, start + per_stream):
                md, body = publish_command_of(Envelope(s, f"T{i % 3}", f"{s}:{i:06d}".encode()))
                await h.put(md, body, PutOptions(syncpoint=True))
                if i % 100 == 99:
                    await conn.commit()
            await conn.commit()
            await h.close()
    finally:
        await conn.disconnect()


def _records(tmp_path: Path) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {s: [] for s in STREAMS}
    for i in range(len(STREAMS)):
        f = tmp_path / f"mem{i}.jsonl"
        if not f.exists():
            continue
        for line in f.read_text(encoding="utf-8").splitlines():
            try:
                rec = json.loads(line)
            except ValueError:  # a line being written
                continue
            stream, seq = rec["payload"].split(":")
            out[stream].append(int(seq))
    return out


async def _wait_all(tmp_path: Path, n: int, timeout: float) -> dict[str, list[int]]:
    async with asyncio.timeout(timeout):
        while True:
            recs = _records(tmp_path)
            if all(len(set(v)) >= n for v in recs.values()):
                return recs
            await asyncio.sleep(0.1)


def _check_order(recs: dict[str, list[int]], n: int) -> None:
    """Nothing lost, and each stream's first deliveries in publication order (a
    redelivery after a crash repeats a suffix: at-least-once, never reordered)."""
    for s, seqs in recs.items():
        first: list[int] = []
        seen: set[int] = set()
        for x in seqs:
            if x not in seen:
                seen.add(x)
                first.append(x)
        assert first == list(range(n)), f"{s}: lost or reordered"


async def _started(app: GatewayApp) -> None:
    async with asyncio.timeout(20):
        for w in app.workers:
            assert await w.wait_started(20)
        while not app.health()[0]:
            await asyncio.sleep(0.05)


async def test_two_workers_forward_in_order_and_stop_without_orphans(tmp_path: Path) -> None:
    registry = PluginRegistry.from_entry_points()
    data = _config(tmp_path, [{"name": "w1", "plugins": ["mem0", "mem1"]},
                              {"name": "w2", "plugins": ["mem2", "mem3"]}])
    data["metrics"] = {"enabled": True, "port": 0}
    app = GatewayApp(parse_config(data, registry, base_dir=tmp_path), registry)
    await app.start()
    pids: list[int] = []
    try:
        await _started(app)
        pids = [w.pid for w in app.workers if w.pid is not None]
        assert len(pids) == 2 and os.getpid() not in pids
        assert app.service is not None and app.service.sink_backlogs.forwarders == {}
        await _publish(app, 200)
        recs = await _wait_all(tmp_path, 200, 30)
        _check_order(recs, 200)
        assert all(len(v) == 200 for v in recs.values())  # no crash: no duplicate
        ok, detail = app.health()
        assert ok and set(detail["plugins"]) == {"mem0", "mem1", "mem2", "mem3"}  # type: ignore[arg-type]
        assert app.metrics is not None
        async with asyncio.timeout(5):
            while sum(sum(w.delivered().values()) for w in app.workers) < 800:
                await asyncio.sleep(0.1)
        text = app.metrics.exposition().decode()
        assert 'mqgw_worker_up{worker="w1"} 1.0' in text
        assert 'mqgw_worker_restarts_total{worker="w2"} 0.0' in text
        assert 'mqgw_worker_sink_delivered_total{plugin="mem2",worker="w2"} 200.0' in text
    finally:
        await app.shutdown()
    assert pids and not any(_alive(p) for p in pids)
    assert app.workers == []


async def test_kill_9_of_a_worker_mid_run_loses_nothing_and_keeps_order(
    tmp_path: Path,
) -> None:
    registry = PluginRegistry.from_entry_points()
    data = _config(tmp_path, [{"name": "w1", "plugins": ["mem0", "mem1"]},
                              {"name": "w2", "plugins": ["mem2", "mem3"]}])
    data["broker"]["batch_size"] = 16  # many small units of work: the kill lands inside one
    app = GatewayApp(parse_config(data, registry, base_dir=tmp_path), registry)
    await app.start()
    n = 500
    try:
        await _started(app)
        w1 = app.workers[0]
        victim = w1.pid
        assert victim is not None
        publishing = asyncio.create_task(_publish(app, n))
        async with asyncio.timeout(20):
            while len(_records(tmp_path)["S1.STREAM"]) < 100:
                await asyncio.sleep(0.01)
        os.kill(victim, signal.SIGKILL)
        async with asyncio.timeout(20):
            while w1.restarts < 1 or w1.pid is None:
                await asyncio.sleep(0.05)
        assert w1.pid != victim and not _alive(victim)
        await publishing
        recs = await _wait_all(tmp_path, n, 40)
        _check_order(recs, n)
        assert len(recs["S3.STREAM"]) == n  # the other worker was not disturbed
        assert app.workers[1].restarts == 0
    finally:
        await app.shutdown()
    assert not any(_alive(p) for p in [victim] if p is not None)


async def test_a_worker_exits_when_the_main_process_closes_its_lifeline(
    tmp_path: Path,
) -> None:
    registry = PluginRegistry.from_entry_points()
    app = GatewayApp(parse_config(_config(tmp_path, [{"name": "w1", "plugins": ["mem0"]}]),
                                  registry, base_dir=tmp_path), registry)
    await app.start()
    try:
        await _started(app)
        w = app.workers[0]
        proc = w.proc
        assert proc is not None and proc.stdin is not None
        w._stopping = True  # as if the main process were gone: no restart
        proc.stdin.close()  # what the kernel does for a main process killed with -9
        async with asyncio.timeout(10):
            code = await proc.wait()
        assert code == 0
    finally:
        await app.shutdown()


async def test_a_worker_refuses_a_spec_it_cannot_read() -> None:
    import sys

    for line in (b"not json\n", b'{"version": 99}\n', b""):
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "gateway.runtime.workers.child",
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        async with asyncio.timeout(20):
            _, err = await proc.communicate(line)
        assert proc.returncode == 2, err
        assert b"worker spec" in err


def _children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children", encoding="ascii") as f:
            return [int(p) for p in f.read().split()]
    except OSError:
        return []


async def test_kill_9_of_mqgw_run_leaves_no_worker_behind(tmp_path: Path) -> None:
    import sys

    import yaml

    data = _config(tmp_path, [{"name": "w1", "plugins": ["mem0"]}])
    data["logging"] = {"level": "warning"}
    cfg = tmp_path / "gateway.yaml"
    cfg.write_text(yaml.safe_dump(data), encoding="utf-8")
    mqgw = Path(sys.executable).with_name("mqgw")
    main = await asyncio.create_subprocess_exec(
        str(mqgw), "run", "--config", str(cfg), stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL)
    worker = 0
    try:
        async with asyncio.timeout(30):
            while not worker:
                for child in _children(main.pid):
                    with open(f"/proc/{child}/cmdline", "rb") as f:
                        if b"gateway.runtime.workers.child" in f.read():
                            worker = child
                await asyncio.sleep(0.1)
        os.kill(main.pid, signal.SIGKILL)
        await main.wait()
        async with asyncio.timeout(15):  # the lifeline closed: the worker stops by itself
            while _alive(worker):
                await asyncio.sleep(0.1)
    finally:
        if main.returncode is None:
            main.kill()
            await main.wait()
        if worker and _alive(worker):
            os.kill(worker, signal.SIGKILL)
            pytest.fail("the worker outlived its main process")


def _previous_release_spec_line() -> bytes:
    """A spec line as the main process of the release before the backlog seal wrote it:
    spec version 1, no ``backlog_key``."""
    raw = {
        "group": "w1", "socket": "qm.sock", "gateway_id": "gw", "dead_letter_queue": "DLQ",
        "serviced_queues": [], "version": 1,
        "plugins": [{"name": "mem0", "plugin": "memory", "config": {}, "backlog": "BL"}],
    }
    return json.dumps(raw).encode() + b"\n"


def test_a_spec_of_the_release_before_the_backlog_key_is_refused_by_its_version() -> None:
    """A worker started from a newer installation than its running main process (or
    the other way round) says the versions differ, not that a key is missing."""
    from gateway.runtime.workers.spec import SPEC_VERSION, WorkerSpec

    with pytest.raises(ValueError, match=f"worker spec version 1 is not {SPEC_VERSION}"):
        WorkerSpec.from_line(_previous_release_spec_line())


def test_a_workers_spec_does_not_show_its_backlog_key() -> None:
    from gateway.runtime.workers.spec import PluginSpec, WorkerSpec

    key = "5a" * 32
    spec = WorkerSpec("w1", "qm.sock", "gw", [PluginSpec("mem0", "memory",
                                                         {"password": "hunter2"}, "BL")],
                      "DLQ", [], backlog_key=key)
    assert key not in repr(spec) and "hunter2" not in repr(spec)
    assert WorkerSpec.from_line(spec.to_line()).backlog_key == key
