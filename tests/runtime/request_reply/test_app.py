"""The service inside a whole GatewayApp: the embedded QM defines the reply queue, plugin
instances are attached after their start, metrics and /healthz show the counters, and a
restart of the app on the same data delivers a reply that came while it was down."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from gateway.plugin_api import Envelope
from gateway.runtime.app import GatewayApp, data_paths
from gateway.runtime.config import parse_config
from gateway.runtime.registry import PluginRegistry
from plugins.memory import get_bus, reset_buses
from tests.network.network_helpers import wait_for
from tests.runtime.request_reply.conftest import echo


def _config(tmp_path: Path) -> dict[str, Any]:
    return {
        "queue_manager": {"name": "GWAPP", "data_dir": str(tmp_path / "qm")},
        "broker": {"wait_ms": 50},
        "metrics": {"enabled": False},
        "plugins": [{"name": "req", "plugin": "memory", "config": {"bus": "app"}}],
        "request_reply": {
            "sweep_interval": 0.1,
            "requests": [{"name": "local", "plugin": "req", "source": "ask",
                          "destination": "APP.SERVICE@GWAPP"}],
        },
    }


async def _started(tmp_path: Path) -> GatewayApp:
    registry = PluginRegistry.from_entry_points()
    app = GatewayApp(parse_config(_config(tmp_path), registry, base_dir=tmp_path), registry)
    await app.start()
    assert app.node is not None
    app.node.qm.run_mqsc("DEFINE QLOCAL(APP.SERVICE) REPLACE", stop_on_error=True)
    async with asyncio.timeout(10):
        while not app.health()[0]:
            await asyncio.sleep(0.02)
    return app


async def test_request_reply_in_the_app_survives_a_restart(tmp_path: Path) -> None:
    reset_buses()
    app = await _started(tmp_path)
    try:
        assert app.node is not None and "MQGW.REPLY" in app.node.qm.catalogue.queues
        bus = get_bus("app")
        await bus.exchanges.append([Envelope("", "ask", b"1", reply_topic="ans",
                                             correlation_data=b"a")])
        await echo(app.node.qm, "APP.SERVICE")
        (first,) = await bus.exchanges.wait_on("ans", 1)
        assert first.payload == b"re:1"
        await bus.exchanges.append([Envelope("", "ask", b"2", reply_topic="ans",
                                             correlation_data=b"b")])
        rr = app.request_reply
        assert rr is not None
        await wait_for(lambda: rr.stats().get("requests_sent") == 2)
        health = app.health()[1]["request_reply"]
        assert isinstance(health, dict) and health["requests_sent"] == 2
        assert app.metrics is not None
        text = app.metrics.exposition().decode()
        assert 'mqgw_request_reply_total{event="requests_sent",route="local"} 2.0' in text
        qm = app.node.qm
        # answered just before the stop: the reply reaches the requester before the
        # stop or, from the reply queue, after the restart (never twice, never lost)
        await echo(qm, "APP.SERVICE")
    finally:
        await app.shutdown()
    app = await _started(tmp_path)  # same data: queue, store and bus offsets
    try:
        await bus.exchanges.wait_on("ans", 2)
        assert [e.payload for e in bus.exchanges.on("ans")] == [b"re:1", b"re:2"]
    finally:
        await app.shutdown()
        reset_buses()


async def test_run_check_writes_names_every_file_a_run_writes(tmp_path: Path) -> None:
    """``run --check`` lists ``writes:`` for backups (docs/operations.md): everything a
    run leaves in its directory is one of them or inside one of them."""
    reset_buses()
    data = tmp_path / "data"
    config = _config(data)
    config["broker"]["store"] = str(data / "pubsub.db")
    config["request_reply"]["store"] = str(data / "request_reply.db")
    registry = PluginRegistry.from_entry_points()
    loaded = parse_config(config, registry, base_dir=tmp_path)
    app = GatewayApp(loaded, registry)
    await app.start()
    await app.shutdown()
    listed = data_paths(loaded)
    written = sorted(data.iterdir())
    assert {p.name for p in written} >= {"qm", "pubsub.db", "neighbours.db", "request_reply.db"}
    companions = ("-wal", "-shm", ".lock")  # SQLite's journal and a store's lock file
    for path in written:
        name = path.name
        for suffix in companions:
            name = name.removesuffix(suffix)
        assert path.with_name(name) in listed, f"{path.name} is written but not in {listed}"

