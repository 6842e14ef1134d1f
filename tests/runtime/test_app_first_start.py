"""The first start of a gateway with publications already queued (issue 12 item 9):
every configured route's subscription exists before the broker service's first get, so
nothing queued before the plugin has started is lost — it waits on the route's backlog."""

from __future__ import annotations

import asyncio
from pathlib import Path

from gateway.mq.embedded.qmgr import EmbeddedQueueManager
from gateway.mq.port import OpenOption, PutOptions
from gateway.runtime.app import GatewayApp
from gateway.runtime.backlog_format import backlog_queue_name
from gateway.runtime.config import parse_config
from gateway.runtime.registry import PluginRegistry
from plugins.memory import get_bus, reset_buses
from tests.support.pubsub_messages import rfh_message

STOCK = "STOCK.STREAM"
N = 3000


async def _queue_publications(data_dir: Path, count: int) -> None:
    qm = EmbeddedQueueManager("QM1", data_dir)
    try:
        qm.run_mqsc(f"DEFINE QLOCAL('{STOCK}') DEFPSIST(YES) MAXDEPTH(10000) REPLACE")
        conn = await qm.connect()
        stream = await conn.open(STOCK, OpenOption.OUTPUT)
        for i in range(count):
            msg = rfh_message(
                STOCK, [("MQPSCommand", "Publish"), ("MQPSTopic", "IBM")], f"{i:06d}".encode()
            )
            await stream.put(msg.md, msg.body, PutOptions(syncpoint=True))
            if i % 500 == 499:
                await conn.commit()
        await conn.commit()
        await conn.disconnect()
    finally:
        await qm.close()


async def test_publications_queued_before_the_first_start_all_reach_the_route(
    tmp_path: Path,
) -> None:
    reset_buses()
    await _queue_publications(tmp_path / "data" / "qm", N)
    registry = PluginRegistry.from_entry_points()
    data = {
        "broker": {"streams": [{"name": STOCK}], "wait_ms": 50, "batch_size": 200},
        "metrics": {"enabled": False},
        "plugins": [
            {
                "name": "mem",
                "plugin": "memory",
                "config": {"bus": "mem", "subscribe": [f"$SYS/STREAM/{STOCK}/#"]},
            }
        ],
    }
    app = GatewayApp(parse_config(data, registry, base_dir=tmp_path), registry)
    await app.start()
    try:
        records = await get_bus("mem").wait_for(N, timeout=50)
        assert [r.payload for r in records] == [f"{i:06d}".encode() for i in range(N)]
        assert app.qm is not None
        depth = app.qm.queue_depth  # type: ignore[attr-defined]
        async with asyncio.timeout(10):
            while depth(STOCK) or depth(backlog_queue_name("mem")):
                await asyncio.sleep(0.05)
        assert depth("SYSTEM.DEAD.LETTER.QUEUE") == 0
    finally:
        await app.shutdown()
        reset_buses()


async def test_a_route_whose_plugin_cannot_start_yet_holds_its_deliveries(
    tmp_path: Path,
) -> None:
    """Kafka unreachable at the first start: the plugin keeps retrying its start, and
    the route's publications wait on its backlog queue instead of finding no subscriber."""
    n = 20
    await _queue_publications(tmp_path / "data" / "qm", n)
    registry = PluginRegistry.from_entry_points()
    data = {
        "broker": {"streams": [{"name": STOCK}], "wait_ms": 50},
        "metrics": {"enabled": False},
        "plugins": [
            {
                "name": "kafka",
                "plugin": "kafka",
                "config": {
                    "bootstrap_servers": "127.0.0.1:1",  # nothing listens there
                    "request_timeout_ms": 1000,
                    "outbound": {"topic_template": "t.{stream}", "routes": [{"stream": STOCK}]},
                },
            }
        ],
    }
    app = GatewayApp(parse_config(data, registry, base_dir=tmp_path), registry)
    await app.start()
    try:
        assert app.qm is not None
        depth = app.qm.queue_depth  # type: ignore[attr-defined]
        async with asyncio.timeout(20):
            while depth(STOCK) or depth(backlog_queue_name("kafka")) < n:
                await asyncio.sleep(0.05)
        assert depth(backlog_queue_name("kafka")) == n
        assert depth("SYSTEM.DEAD.LETTER.QUEUE") == 0
        ok, detail = app.health()
        assert not ok and detail["queue_depths"][backlog_queue_name("kafka")] == n  # type: ignore[index]
    finally:
        await app.shutdown()


async def test_a_retained_publication_reaches_a_route_once_per_start(tmp_path: Path) -> None:
    """The route's planned subscription (made before the first get) and the plugin's own
    subscribe at start are one subscription: its retained publication is handed over once
    per start, as to an MQ subscriber that registers again — not once for each."""
    reset_buses()
    qm_dir = tmp_path / "data" / "qm"
    qm = EmbeddedQueueManager("QM1", qm_dir)
    try:
        qm.run_mqsc(f"DEFINE QLOCAL('{STOCK}') DEFPSIST(YES) REPLACE")
        conn = await qm.connect()
        stream = await conn.open(STOCK, OpenOption.OUTPUT)
        msg = rfh_message(
            STOCK,
            [("MQPSCommand", "Publish"), ("MQPSTopic", "IBM"), ("MQPSPubOpts", "RetainPub")],
            b"retained",
        )
        await stream.put(msg.md, msg.body, PutOptions(syncpoint=True))
        await conn.commit()
        await conn.disconnect()
    finally:
        await qm.close()
    registry = PluginRegistry.from_entry_points()
    data = {
        "broker": {"streams": [{"name": STOCK}], "wait_ms": 50},
        "metrics": {"enabled": False},
        "plugins": [
            {
                "name": "mem",
                "plugin": "memory",
                "config": {"bus": "mem", "subscribe": [f"$SYS/STREAM/{STOCK}/#"]},
            }
        ],
    }
    for start in (1, 2):
        app = GatewayApp(parse_config(data, registry, base_dir=tmp_path), registry)
        await app.start()
        try:
            bus = get_bus("mem")
            await bus.wait_for(start, timeout=20)
            await asyncio.sleep(1.0)  # a second hand-over would arrive within this
            assert [r.payload for r in bus.records] == [b"retained"] * start
        finally:
            await app.shutdown()
    reset_buses()
