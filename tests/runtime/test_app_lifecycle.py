"""GatewayApp lifecycle edge cases: a plugin whose start raises an unexpected exception
is retried (and logged) instead of silently never starting; a shutdown whose broker drain
hangs still stops the plugins; no new stream batch is taken once a shutdown begins;
plugin send timeouts fit inside the shutdown budget."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

import pytest

from gateway.mq.embedded.qmgr import EmbeddedQueueManager
from gateway.plugin_api import PluginContext
from gateway.pubsub.outcome import InboundMessage
from gateway.runtime.app import GatewayApp
from gateway.runtime.config import parse_config
from gateway.runtime.registry import PluginRegistry
from plugins.memory import MemoryInstance, reset_buses
from tests.support.pubsub_messages import rfh_publication
from tests.support.service_client import put_at_once


def _data(shutdown_timeout: float = 30.0) -> dict[str, Any]:
    return {
        "broker": {"streams": [{"name": "STOCK.STREAM"}], "wait_ms": 50},
        "metrics": {"enabled": False},
        "shutdown_timeout": shutdown_timeout,
        "plugins": [
            {
                "name": "mem",
                "plugin": "memory",
                "config": {"bus": "mem", "subscribe": ["$SYS/STREAM/STOCK.STREAM/#"]},
            }
        ],
    }


async def test_unexpected_start_exception_is_logged_and_retried(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    reset_buses()
    real_start = MemoryInstance.start
    calls = 0

    async def flaky_start(self: MemoryInstance, context: PluginContext) -> None:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise RuntimeError("plugin bug on first start")
        await real_start(self, context)

    monkeypatch.setattr(MemoryInstance, "start", flaky_start)
    registry = PluginRegistry.from_entry_points()
    app = GatewayApp(parse_config(_data(), registry, base_dir=tmp_path), registry)
    caplog.set_level(logging.ERROR, logger="gateway.runtime.app")
    await app.start()
    try:
        async with asyncio.timeout(10):
            while not app.health()[0]:
                await asyncio.sleep(0.02)
        assert calls == 2
        assert app.plugin_start_errors == 1
        assert app.metrics is not None
        scraped = app.metrics.exposition().decode()
        assert 'mqgw_errors_total{component="plugins",kind="start_error"} 1.0' in scraped
        assert app.fatal is None
        assert any(
            "plugin bug on first start" in r.getMessage() or r.exc_info for r in caplog.records
        )
    finally:
        await app.shutdown()


async def test_shutdown_stops_plugins_even_when_the_drain_hangs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    reset_buses()
    registry = PluginRegistry.from_entry_points()
    app = GatewayApp(
        parse_config(_data(shutdown_timeout=1.0), registry, base_dir=tmp_path), registry
    )
    await app.start()
    async with asyncio.timeout(10):
        while not app.health()[0]:
            await asyncio.sleep(0.02)
    assert app.service is not None and app.host is not None
    real_stop = app.service.stop

    async def hanging_stop() -> None:
        await asyncio.sleep(3600)

    stopped: list[bool] = []
    real_stop_all = app.host.stop_all

    async def recording_stop_all() -> None:
        await real_stop_all()
        stopped.append(True)

    monkeypatch.setattr(app.service, "stop", hanging_stop)
    monkeypatch.setattr(app.host, "stop_all", recording_stop_all)
    tasks = list(app._tasks)
    async with asyncio.timeout(5):
        await app.shutdown()
    assert stopped == [True]
    assert all(t.done() for t in tasks)
    await real_stop()


def _publications(n: int) -> list[InboundMessage]:
    return [rfh_publication("STOCK.STREAM", "IBM", f"{i:08d}".encode()) for i in range(n)]


async def test_no_stream_batch_is_taken_while_the_slower_stops_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The neighbour links stop before the drain, and their reader takes time to end
    its wait; meanwhile the stream stays where the stop found it (but for the batches
    in flight) instead of being worked off by a gateway told to stop."""
    reset_buses()
    registry = PluginRegistry.from_entry_points()
    data = _data()
    data["broker"]["batch_size"] = 8
    app = GatewayApp(parse_config(data, registry, base_dir=tmp_path), registry)
    await app.start()
    try:
        qm, links = app.qm, app.links
        assert isinstance(qm, EmbeddedQueueManager) and links is not None
        n = 2000
        await put_at_once(qm, _publications(n))  # the stream is full when served
        async with asyncio.timeout(10):
            while qm.queue_depth("STOCK.STREAM") == n:
                await asyncio.sleep(0.005)
        depths: list[int] = []
        real_links_stop = links.stop

        async def slow_links_stop() -> None:
            depths.append(qm.queue_depth("STOCK.STREAM"))
            await asyncio.sleep(0.5)  # the service worked off thousands a second here
            depths.append(qm.queue_depth("STOCK.STREAM"))
            await real_links_stop()

        monkeypatch.setattr(links, "stop", slow_links_stop)
        before = qm.queue_depth("STOCK.STREAM")
    finally:
        async with asyncio.timeout(20):
            await app.shutdown()
    at_links_stop, after_wait = depths
    assert after_wait > 0, "the stop should have come mid-stream"
    # At most two batches of 8 in flight when the shutdown begins: one whose commit is
    # under way (its gets count in the depth until it ends) and the one being handled.
    assert before - after_wait <= 2 * 8, (before, at_links_stop, after_wait)


async def test_a_stop_requested_during_start_up_is_not_undone(tmp_path: Path) -> None:
    """A SIGTERM that comes while the gateway starts: the broker's start must not clear
    it, so the streams are not served by a gateway about to shut down."""
    reset_buses()
    registry = PluginRegistry.from_entry_points()
    app = GatewayApp(parse_config(_data(), registry, base_dir=tmp_path), registry)
    app.request_stop()
    await app.start()
    try:
        qm = app.qm
        assert isinstance(qm, EmbeddedQueueManager)
        await put_at_once(qm, _publications(50))
        await asyncio.sleep(0.5)  # served, they would be gone in a few milliseconds
        assert qm.queue_depth("STOCK.STREAM") == 50
    finally:
        await app.shutdown()


def test_plugin_send_timeout_is_clamped_below_the_shutdown_budget(
    caplog: pytest.LogCaptureFixture,
) -> None:
    registry = PluginRegistry.from_entry_points()
    data: dict[str, Any] = {
        "shutdown_timeout": 20,
        "plugins": [
            {"name": "k1", "plugin": "kafka", "config": {"send_timeout_s": 45}},
            {"name": "k2", "plugin": "kafka", "config": {"send_timeout_s": 5}},
            {"name": "k3", "plugin": "kafka", "config": {}},
        ],
    }
    caplog.set_level(logging.WARNING, logger="gateway.runtime.config")
    loaded = parse_config(data, registry)
    sends = {n: c.send_timeout_s for n, c in loaded.plugin_configs.items()}
    assert sends == {"k1": 10.0, "k2": 5.0, "k3": 10.0}
    warned = [r.getMessage() for r in caplog.records]
    assert len(warned) == 1 and "k1" in warned[0]
