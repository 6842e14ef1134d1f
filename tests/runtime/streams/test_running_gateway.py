"""While the gateway runs it owns its queue manager: ``mqgw streams check`` then reads
the same report from its ``/healthz``, and ``/metrics`` carries the per-stream gauges."""

from __future__ import annotations

import asyncio
import urllib.request
from pathlib import Path

import pytest

from gateway.devstack.ports import free_port
from gateway.runtime.app import GatewayApp
from gateway.runtime.cli import main
from gateway.runtime.config import load_config
from gateway.runtime.registry import PluginRegistry
from gateway.runtime.streams.migration import MigrationRecord, write_migration

T, S = "STOCK.STREAM", "SPORTS.STREAM"


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as resp:
        return str(resp.read().decode())


def test_check_reads_healthz_of_the_running_gateway(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    port = free_port()
    cfg = tmp_path / "gateway.yaml"
    cfg.write_text(
        "queue_manager: {name: GW, data_dir: qm}\n"
        f"broker: {{store: pubsub.db, streams: [{{name: {T}}}], wait_ms: 50}}\n"
        f"metrics: {{port: {port}}}\n"
    )
    # a migrated stream the gateway neither has a queue for nor services
    write_migration(tmp_path / "migration.json", MigrationRecord(from_q_mgr="OLD", streams=[T, S]))
    loaded = load_config(cfg, PluginRegistry.from_entry_points())

    async def run() -> tuple[int, int, str]:
        app = GatewayApp(loaded, PluginRegistry.from_entry_points())
        await app.start()
        try:
            metrics = await asyncio.to_thread(_get, f"http://127.0.0.1:{port}/metrics")
            code = await asyncio.to_thread(main, ["streams", "check", "--config", str(cfg)])
            fix = await asyncio.to_thread(main, ["streams", "check", "--config", str(cfg), "--fix"])
        finally:
            await app.shutdown()
        return code, fix, metrics

    code, fix, metrics = asyncio.run(run())
    out, err = capsys.readouterr()
    assert code == 1, out + err
    assert "the gateway is running: report from" in out
    (row,) = [line for line in out.splitlines() if line.startswith(S)]
    assert row.split() == [S, "MISSING", "NO", "0", "-", "0"]
    assert "migration incomplete (from OLD)" in out
    assert fix == 2 and "need the gateway stopped" in err
    assert f'mqgw_stream_queue_missing{{stream="{S}"}} 1.0' in metrics
    assert f'mqgw_stream_queue_missing{{stream="{T}"}} 0.0' in metrics
    assert f'mqgw_stream_dead_lettered{{stream="{T}"}} 0.0' in metrics
    assert "mqgw_migration_incomplete 1.0" in metrics
