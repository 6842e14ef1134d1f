"""The memory plugin: protocol conformance, both directions through a whole in-process
gateway (GatewayApp) — the same path a Kafka or MQTT instance takes — and the plugin
contract suite (``tests/plugins/contract.py``)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import pytest
from pydantic import BaseModel

from gateway.plugin_api import (
    Envelope,
    InboundPublication,
    Plugin,
    PluginError,
    PluginInstance,
    PublishRefusedError,
)
from gateway.runtime.app import GatewayApp
from gateway.runtime.config import parse_config
from gateway.runtime.registry import PluginRegistry
from plugins.memory import MemoryConfig, MemoryInstance, get_bus, plugin, reset_buses
from tests.plugins.contract import OUT_FILTER, PluginContract, Seen
from tests.support.gateway import STOCK
from tests.support.names import unique


@pytest.fixture
async def app(tmp_path: Path) -> AsyncIterator[GatewayApp]:
    reset_buses()
    registry = PluginRegistry.from_entry_points()
    data = {
        "broker": {"streams": [{"name": "STOCK.STREAM"}], "wait_ms": 50},
        "metrics": {"enabled": False},
        "plugins": [
            {
                "name": "left",
                "plugin": "memory",
                "config": {
                    "bus": "left",
                    "subscribe": ["$SYS/STREAM/STOCK.STREAM/#"],
                    "record_file": str(tmp_path / "left.jsonl"),
                },
            },
            {
                "name": "right",
                "plugin": "memory",
                "config": {"bus": "right", "subscribe": ["$SYS/STREAM/STOCK.STREAM/#"]},
            },
        ],
    }
    gw = GatewayApp(parse_config(data, registry, base_dir=tmp_path), registry)
    await gw.start()
    async with asyncio.timeout(10):
        while not gw.health()[0]:
            await asyncio.sleep(0.02)
    try:
        yield gw
    finally:
        await gw.shutdown()
        reset_buses()


def test_plugin_object_satisfies_the_protocol() -> None:
    assert isinstance(plugin, Plugin)
    assert plugin.config_model is MemoryConfig
    inst = plugin.create("m", MemoryConfig())
    assert isinstance(inst, PluginInstance)
    assert inst.name == "m" and not inst.healthy()  # not started yet


def test_wrong_config_type_is_a_plugin_error() -> None:
    class Other(BaseModel):
        pass

    with pytest.raises(PluginError, match="MemoryConfig"):
        plugin.create("m", Other())


async def test_inbound_reaches_the_other_instance_in_order(app: GatewayApp, tmp_path: Path) -> None:
    left, right = get_bus("left"), get_bus("right")
    done = [
        right.inject(
            InboundPublication(
                "STOCK.STREAM", "IBM/Latest", f"{i}".encode(), properties={"Seq": str(i)}
            )
        )
        for i in range(50)
    ]
    await asyncio.gather(*done)  # each resolves after its MQ commit
    records = await left.wait_for(50)
    assert [r.payload for r in records] == [f"{i}".encode() for i in range(50)]
    assert [r.properties["Seq"] for r in records] == [str(i) for i in range(50)]
    assert all(r.topic == "IBM/Latest" and r.stream == "STOCK.STREAM" for r in records)
    assert right.records == []  # never back to its origin
    lines = (tmp_path / "left.jsonl").read_text().splitlines()
    assert [json.loads(x)["payload"] for x in lines] == [f"{i}" for i in range(50)]
    assert app.host is not None
    pc = app.host.contexts["right"].publisher.counters
    assert pc.per_stream == {"STOCK.STREAM": 50}


async def test_metrics_count_both_directions(app: GatewayApp) -> None:
    await asyncio.gather(
        *(get_bus("right").inject(InboundPublication("STOCK.STREAM", "T", b"x")) for _ in range(3))
    )
    await get_bus("left").wait_for(3)
    assert app.metrics is not None
    async with asyncio.timeout(10):  # the MQ commit follows the sink's acknowledgement
        while app.health()[1]["queue_depths"]["STOCK.STREAM"]:  # type: ignore[index]
            await asyncio.sleep(0.02)
    text = app.metrics.exposition().decode()
    assert 'mqgw_messages_in_total{plugin="right",stream="STOCK.STREAM"} 3.0' in text
    assert 'mqgw_messages_out_total{plugin="left",stream="STOCK.STREAM"} 3.0' in text
    assert 'mqgw_plugin_up{plugin="left"} 1.0' in text
    assert 'mqgw_queue_depth{queue="STOCK.STREAM"} 0.0' in text
    assert 'mqgw_queue_depth{queue="SYSTEM.DEAD.LETTER.QUEUE"} 0.0' in text
    assert 'mqgw_end_to_end_latency_seconds_count{plugin="left"} 3.0' in text


async def test_bus_down_makes_the_instance_unhealthy(app: GatewayApp) -> None:
    get_bus("left").down = True
    ok, detail = app.health()
    assert not ok and detail["plugins"] == {"left": False, "right": True}
    get_bus("left").down = False
    assert app.health()[0]


async def test_unencodable_publication_is_refused_alone_and_the_source_lives_on(
    app: GatewayApp,
) -> None:
    right, left = get_bus("right"), get_bus("left")
    ok1 = right.inject(InboundPublication("STOCK.STREAM", "T", b"1"))
    bad = right.inject(InboundPublication("STOCK.STREAM", "T", b"x", payload_format="NINECHARS"))
    ok2 = right.inject(InboundPublication("STOCK.STREAM", "T", b"2"))
    results = await asyncio.wait_for(
        asyncio.gather(ok1, bad, ok2, return_exceptions=True), timeout=10
    )
    assert results[0] is None and results[2] is None
    assert isinstance(results[1], PublishRefusedError)
    # The source task survived: a later publication still goes through.
    await asyncio.wait_for(right.inject(InboundPublication("STOCK.STREAM", "T", b"3")), 10)
    records = await left.wait_for(3)
    assert [r.payload for r in records] == [b"1", b"2", b"3"]


async def test_unexpected_publish_error_resolves_injectors_and_keeps_the_source(
    app: GatewayApp, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert app.host is not None
    publisher = app.host.contexts["right"].publisher
    real = publisher.publish
    calls = 0

    async def broken_once(pubs: object) -> None:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise RuntimeError("bug")
        await real(pubs)  # type: ignore[arg-type]

    monkeypatch.setattr(publisher, "publish", broken_once)
    right = get_bus("right")
    with pytest.raises(RuntimeError, match="bug"):
        await asyncio.wait_for(right.inject(InboundPublication("STOCK.STREAM", "T", b"1")), 10)
    await asyncio.wait_for(right.inject(InboundPublication("STOCK.STREAM", "T", b"2")), 10)
    assert [r.payload for r in await get_bus("left").wait_for(1)] == [b"2"]


# ------------------------------------------------------------------ the contract -------


class MemoryDriver:
    """The memory plugin's side of the contract suite: its bus is the target."""

    def __init__(self) -> None:
        self.bus = get_bus(unique("contract-"))
        self.taken = 0

    def instance(self, name: str) -> MemoryInstance:
        return MemoryInstance(name, MemoryConfig(subscribe=[OUT_FILTER], bus=self.bus.name))

    async def read_outbound(self, count: int) -> list[Seen]:
        await self.bus.wait_for(self.taken + count)
        await asyncio.sleep(0.3)  # anything more arriving shortly after is seen too
        records = self.bus.records[self.taken :]
        self.taken = len(self.bus.records)
        return [Seen(r.stream, r.topic, r.payload, dict(r.properties)) for r in records]

    async def inject(self, topic: str, payload: bytes, properties: dict[str, str]) -> None:
        await self.bus.inject(InboundPublication(STOCK, topic, payload, properties=properties))


class TestMemoryContract(PluginContract):
    @pytest.fixture
    def driver(self) -> MemoryDriver:
        return MemoryDriver()


# ---- Exchanges (request/reply): the durable exchange log ------------------------------


async def test_exchanges_ack_after_handler_and_redeliver_on_failure() -> None:
    from plugins.memory.exchange import topic_matches
    from tests.support.exchanges import ExchangeOnlyContext

    reset_buses()
    inst = MemoryInstance("x", MemoryConfig(bus=unique("ex")))
    assert topic_matches("req/+/q", "req/a/q") and not topic_matches("req/+", "req/a/q")
    seen: list[bytes] = []
    fail_once = [True]

    async def handler(envs: Sequence[Envelope]) -> None:
        if fail_once[0]:
            fail_once[0] = False
            raise PluginError("not now", retriable=True)
        seen.extend(e.payload for e in envs)

    # produced before anyone consumes: kept, read when the consumer starts
    await inst.bus.exchanges.append([Envelope("", "req/a", b"1"), Envelope("", "other", b"x")])
    with pytest.raises(PluginError):  # not started: retriable
        await inst.produce([Envelope("", "req/a", b"2")])
    await inst.start(ExchangeOnlyContext())
    await inst.produce([Envelope("", "req/a", b"2")])
    await inst.consume("r1", ["req/#"], handler)
    async with asyncio.timeout(5):
        while len(seen) < 2:
            await asyncio.sleep(0.01)
    assert seen == [b"1", b"2"]  # the failed batch was offered again, in order
    assert inst.bus.exchanges.offsets["r1"] == 3
    inst.bus.down = True
    with pytest.raises(PluginError) as exc:
        await inst.produce([Envelope("", "req/a", b"3")])
    assert exc.value.retriable
    await inst.stop()
