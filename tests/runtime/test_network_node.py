"""``mqgw run`` as a network node (issue 13 item 1): ``queue_manager.listener_port`` and
``address_book`` plus the mqsc_file's channels make the gateway's embedded queue manager
exchange messages with another queue manager over 127.0.0.1 channels."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from gateway.mq.embedded.network import QueueManagerNode
from gateway.mq.embedded.qmgr import EmbeddedQueueManager
from gateway.mq.port import GetOptions, OpenOption
from gateway.runtime.app import GatewayApp
from gateway.runtime.config import parse_config
from gateway.runtime.errors import ConfigErrors, GatewayRuntimeError
from gateway.runtime.network_node import parse_address_book
from gateway.runtime.registry import PluginRegistry
from gateway.wire.constants import Persistence
from gateway.wire.mqmd import MQMD
from tests.network.network_helpers import wait_for

#: GW's side: an xmitq and sender to QM2 (CONNAME by name: the address book), a receiver
#: for QM2's sender and a local queue QM2 puts to.
GW_MQSC = """\
DEFINE QLOCAL(QM2) USAGE(XMITQ) REPLACE
DEFINE CHANNEL(GW.TO.QM2) CHLTYPE(SDR) CONNAME('QM2') XMITQ(QM2) REPLACE
DEFINE CHANNEL(QM2.TO.GW) CHLTYPE(RCVR) REPLACE
DEFINE QLOCAL(IN.Q) REPLACE
"""
QM2_MQSC = """\
DEFINE CHANNEL(GW.TO.QM2) CHLTYPE(RCVR) REPLACE
DEFINE QLOCAL(OUT.Q) REPLACE
"""


def _config(tmp_path: Path, qm2_port: int, **qm: Any) -> dict[str, Any]:
    (tmp_path / "gw.mqsc").write_text(GW_MQSC)
    return {
        "queue_manager": {
            "name": "GW",
            "data_dir": "qm",
            "mqsc_file": "gw.mqsc",
            "address_book": {"QM2": f"127.0.0.1:{qm2_port}"},
            **qm,
        },
        "broker": {"store": "pubsub.db", "wait_ms": 50},
        "metrics": {"enabled": False},
    }


async def _get(qm: EmbeddedQueueManager, queue: str) -> bytes:
    async with await qm.connect() as conn:
        h = await conn.open(queue, OpenOption.INPUT_SHARED)
        return (await h.get(GetOptions(wait_ms=10_000))).body


async def _put(qm: EmbeddedQueueManager, queue: str, q_mgr: str, body: bytes) -> None:
    async with await qm.connect() as conn:
        md = MQMD(format="MQSTR", persistence=Persistence.PERSISTENT)
        await conn.put1(queue, md, body, q_mgr_name=q_mgr)


async def test_gateway_and_node_exchange_messages_over_channels(tmp_path: Path) -> None:
    qm2 = QueueManagerNode("QM2", tmp_path / "qm2", mqsc=QM2_MQSC)
    await qm2.start()
    registry = PluginRegistry.from_entry_points()
    app = GatewayApp(
        parse_config(_config(tmp_path, qm2.port, listener_port=0), registry,
                     base_dir=tmp_path),
        registry,
    )
    try:
        await app.start()
        assert app.node is not None and app.node.listener is not None
        gw_port = app.node.port
        assert gw_port > 0
        # QM2 learns GW's port only now (any free port): its sender is defined at run time.
        qm2.qm.run_mqsc(
            "DEFINE QLOCAL(GW) USAGE(XMITQ) REPLACE\n"
            f"DEFINE CHANNEL(QM2.TO.GW) CHLTYPE(SDR) CONNAME('127.0.0.1({gw_port})') "
            "XMITQ(GW) REPLACE\n",
            stop_on_error=True,
        )
        assert isinstance(app.qm, EmbeddedQueueManager)
        await _put(app.qm, "OUT.Q", "QM2", b"gw to qm2")  # through GW's xmitq QM2
        assert await _get(qm2.qm, "OUT.Q") == b"gw to qm2"
        await _put(qm2.qm, "IN.Q", "GW", b"qm2 to gw")  # through the gateway's listener
        assert await _get(app.qm, "IN.Q") == b"qm2 to gw"
        assert app.qm.queue_depth("QM2") == 0
    finally:
        await app.shutdown()
        await qm2.stop()
    assert app.qm is not None and getattr(app.qm, "closed", True)


async def test_without_listener_the_mqsc_channels_still_run(tmp_path: Path) -> None:
    qm2 = QueueManagerNode("QM2", tmp_path / "qm2", mqsc=QM2_MQSC)
    await qm2.start()
    registry = PluginRegistry.from_entry_points()
    app = GatewayApp(parse_config(_config(tmp_path, qm2.port), registry, base_dir=tmp_path),
                     registry)
    try:
        await app.start()
        assert app.node is not None and app.node.listener is None
        assert isinstance(app.qm, EmbeddedQueueManager)
        await _put(app.qm, "OUT.Q", "QM2", b"no listener needed to send")
        assert await _get(qm2.qm, "OUT.Q") == b"no listener needed to send"
        await wait_for(lambda: app.node is not None and app.node.channel_running("QM2"))
    finally:
        await app.shutdown()
        await qm2.stop()


async def test_listener_port_in_use_is_a_clear_start_error(tmp_path: Path) -> None:
    qm2 = QueueManagerNode("QM2", tmp_path / "qm2", mqsc=QM2_MQSC)
    await qm2.start()
    registry = PluginRegistry.from_entry_points()
    app = GatewayApp(
        parse_config(_config(tmp_path, qm2.port, listener_port=qm2.port), registry,
                     base_dir=tmp_path),
        registry,
    )
    try:
        with pytest.raises(GatewayRuntimeError, match=r"queue_manager\.listener_port"):
            await app.start()
    finally:
        await qm2.stop()
    # the failed start closed the store: a second queue manager can open the directory
    again = EmbeddedQueueManager("GW", tmp_path / "qm")
    await again.close()


def test_mqsc_error_names_the_file_and_line(tmp_path: Path) -> None:
    registry = PluginRegistry.from_entry_points()
    data = _config(tmp_path, 1)
    (tmp_path / "gw.mqsc").write_text("DEFINE QLOCAL(A) REPLACE\nDEFINE QLOCAL(B) COLOUR(RED)\n")
    app = GatewayApp(parse_config(data, registry, base_dir=tmp_path), registry)

    async def start() -> None:
        await app.start()

    with pytest.raises(GatewayRuntimeError, match=r"gw\.mqsc.*line 2"):
        asyncio.run(start())


@pytest.mark.parametrize(
    ("key", "value", "fragment"),
    [
        ("listener_port", -1, "listener_port"),
        ("listener_port", 70000, "listener_port"),
        ("address_book", {"QM2": "127.0.0.1"}, "address_book"),
        ("address_book", {"QM2": "127.0.0.1:x"}, "address_book"),
        ("address_book", {"": "127.0.0.1:1414"}, "address_book"),
    ],
)
def test_bad_listener_settings_are_refused(
    tmp_path: Path, key: str, value: object, fragment: str
) -> None:
    registry = PluginRegistry.from_entry_points()
    data = _config(tmp_path, 1)
    data["queue_manager"][key] = value
    with pytest.raises(ConfigErrors, match=fragment):
        parse_config(data, registry, base_dir=tmp_path)


def test_parse_address_book() -> None:
    assert parse_address_book({"A": "127.0.0.1:1", "B": "host.example:65535"}) == {
        "A": ("127.0.0.1", 1), "B": ("host.example", 65535)}
    with pytest.raises(ValueError, match="B: 'h:0'"):
        parse_address_book({"B": "h:0"})


def test_an_address_book_entry_can_list_the_instances_of_a_node() -> None:
    assert parse_address_book({"HA": "hosta:1414, hostb:1415", "ONE": "h:1"}) == {
        "HA": [("hosta", 1414), ("hostb", 1415)], "ONE": ("h", 1)}
    for bad, says in {"hosta:1414,": "address 2 is empty", "a:1,,b:2": "address 2 is empty",
                      "a:1,b": "address 2 is 'b', not host:port",
                      ",".join(["h:1"] * 9): "at most 8"}.items():
        with pytest.raises(ValueError, match=says):
            parse_address_book({"HA": bad})
