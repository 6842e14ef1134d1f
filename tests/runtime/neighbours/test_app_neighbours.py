"""`mqgw run` with neighbours: the links start with the gateway, neighbours.db sits next
to the pub/sub store, /healthz and /metrics carry each neighbour."""

from __future__ import annotations

import asyncio
from pathlib import Path

from gateway.runtime.app import GatewayApp
from gateway.runtime.config import parse_config
from gateway.runtime.registry import PluginRegistry


async def test_healthz_and_metrics_show_each_neighbour(tmp_path: Path) -> None:
    data = {
        "broker": {"streams": [{"name": "BULLETIN.STREAM"}], "wait_ms": 50},
        "metrics": {"enabled": False},
        "neighbours": [{"q_mgr": "BROKERA", "streams": ["BULLETIN.STREAM"]}],
    }
    registry = PluginRegistry.from_entry_points()
    app = GatewayApp(parse_config(data, registry, base_dir=tmp_path), registry)
    await app.start()
    try:
        assert app.links is not None
        assert (tmp_path / "data" / "neighbours.db").is_file()

        def neighbours() -> list[dict[str, object]]:
            items = app.health()[1]["neighbours"]
            assert isinstance(items, list)
            return items

        async with asyncio.timeout(10):
            # No channel to BROKERA: the join cannot be put, and says so.
            while not (neighbours() and neighbours()[0]["last_error"]):
                await asyncio.sleep(0.05)
        (item,) = neighbours()
        assert item["q_mgr"] == "BROKERA" and item["state"] == "joining"
        assert item["common_streams"] == ["BULLETIN.STREAM", "SYSTEM.BROKER.DEFAULT.STREAM"]
        assert "cannot put to BROKERA" in str(item["last_error"])
        assert app.metrics is not None
        scraped = app.metrics.exposition().decode()
        assert 'mqgw_neighbour_active{neighbour="BROKERA"} 0.0' in scraped
        assert 'mqgw_neighbour_commands_total{neighbour="BROKERA",result="put_failed"}' in scraped
        serviced = [q for q, _ in app.service.serviced_queues] if app.service else []
        assert "SYSTEM.BROKER.ADMIN.STREAM" in serviced
    finally:
        await app.shutdown()
