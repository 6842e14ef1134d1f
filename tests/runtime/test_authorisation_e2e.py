"""The three bypasses of issue 15, end to end through a running gateway (``GatewayApp``
built from gateway.yaml data, embedded queue manager, real Kafka for (a)), each now
refused with the reason in the reply and on the dead-letter queue, and counted:

(a) a Kafka record choosing a stream outside its route's allow-list (``mq.stream``
    header, ``$SYS/STREAM/`` key) — and a route whose allow-list names a protected
    stream, which the runtime's plugin bound still refuses;
(b) an MQ application publishing on SYSTEM.BROKER.ADMIN.STREAM (MQRFH on the stream
    queue, MQRFH2 through the control queue);
(c) system, broker-serviced and transmission queues registered as subscriber queues.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from gateway.devstack import KafkaBroker
from gateway.mq.port import QueueManager
from gateway.pubsub.outcome import InboundMessage
from gateway.runtime.app import GatewayApp
from gateway.runtime.config import parse_config
from gateway.runtime.pubsub_service import DEAD_LETTER_QUEUE
from gateway.runtime.registry import PluginRegistry
from gateway.wire.constants import MsgType
from gateway.wire.dlh import unwrap_from_dlq
from gateway.wire.formats import FMT_RF_HEADER_1, FMT_RF_HEADER_2
from plugins.kafka.mapping import NOT_AUTHORIZED_REASON
from tests.plugins.kafka.kafka_harness import consume, headers_of, produce
from tests.support.names import unique
from tests.support.pubsub_messages import CONTROL, rfh2_message, rfh_message
from tests.support.service_client import drain, drain_raw, wait_for_queue
from tests.support.service_client import put as put_as_gateway_user

ADMIN = "SYSTEM.BROKER.ADMIN.STREAM"
STOCK = "STOCK.STREAM"
XMITQ = "QM2.XMITQ"
MQSC = f"""
DEFINE QLOCAL(SUB.ADMIN) REPLACE
DEFINE QLOCAL(SUB.STOCK) REPLACE
DEFINE QLOCAL(REPLY.Q) REPLACE
DEFINE QLOCAL({XMITQ}) USAGE(XMITQ) REPLACE
"""
NOT_AUTHORIZED = "3081"


async def put(qm: QueueManager, msg: InboundMessage) -> None:
    """Put as an MQ application whose UserIdentifier is 'app1' (the test messages'),
    not the gateway's own user (which the queue manager would give an in-process put)."""
    await put_as_gateway_user(qm, msg, set_identity=True)


def _config(tmp_path: Path, plugins: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    (tmp_path / "qm.mqsc").write_text(MQSC, encoding="utf-8")
    return {
        "queue_manager": {"name": "QM1", "data_dir": "qm", "mqsc_file": "qm.mqsc"},
        "broker": {"streams": [{"name": STOCK}], "wait_ms": 50, "retry_delay": 0.05},
        "metrics": {"enabled": False},
        "plugins": plugins or [],
    }


async def _running(data: dict[str, Any], tmp_path: Path) -> GatewayApp:
    registry = PluginRegistry.from_entry_points()
    app = GatewayApp(parse_config(data, registry, base_dir=tmp_path), registry)
    await app.start()
    async with asyncio.timeout(30):
        while not app.health()[0]:
            await asyncio.sleep(0.05)
    return app


@pytest.fixture
async def app(tmp_path: Path) -> AsyncIterator[GatewayApp]:
    gw = await _running(_config(tmp_path), tmp_path)
    try:
        yield gw
    finally:
        await gw.shutdown()


def _metric(app: GatewayApp, entrance: str, reason: str) -> float:
    assert app.metrics is not None
    line = f'mqgw_authorisation_refused_total{{entrance="{entrance}",reason="{reason}"}} '
    for text in app.metrics.exposition().decode().splitlines():
        if text.startswith(line):
            return float(text[len(line) :])
    return 0.0


async def _dead_letters(app: GatewayApp, count: int) -> list[tuple[int, str]]:
    """(MQDLH Reason, DestQName) of ``count`` dead-lettered messages."""
    assert app.qm is not None
    out: list[tuple[int, str]] = []
    async with asyncio.timeout(20):
        while len(out) < count:
            for m in await drain_raw(app.qm, DEAD_LETTER_QUEUE):
                dlh, _, _ = unwrap_from_dlq(m.md, m.body)
                out.append((dlh.reason, dlh.dest_q_name.strip()))
            if len(out) < count:
                await asyncio.sleep(0.05)
    return out


async def _subscribe_admin(app: GatewayApp) -> None:
    """An MQ subscriber of the admin stream: what a bypass would reach."""
    assert app.qm is not None
    await put(
        app.qm,
        rfh_message(
            CONTROL,
            [
                ("MQPSCommand", "RegSub"),
                ("MQPSStreamName", ADMIN),
                ("MQPSTopic", "*"),
                ("MQPSQName", "SUB.ADMIN"),
            ],
            reply_to_q="REPLY.Q",
            msg_type=MsgType.REQUEST,
        ),
    )
    (ok,) = await wait_for_queue(app.qm, "REPLY.Q", 1)
    assert ok.get("MQPSReason") == "0"


# ------------------------------------------------------------------ (b) ---------------


async def test_b_publishing_on_the_admin_stream_is_refused(
    app: GatewayApp, caplog: pytest.LogCaptureFixture
) -> None:
    assert app.qm is not None
    caplog.set_level(logging.WARNING, logger="gateway.pubsub.handlers")
    await _subscribe_admin(app)
    await put(
        app.qm,
        rfh_message(
            ADMIN,
            [("MQPSCommand", "Publish"), ("MQPSTopic", "MQ/SA/Broker/forged")],
            b"forged v1",
            reply_to_q="REPLY.Q",
            msg_type=MsgType.REQUEST,
        ),
    )
    await put(
        app.qm,
        rfh2_message(
            CONTROL,
            [("Command", "Publish"), ("Topic", f"$SYS/STREAM/{ADMIN}/MQ/SA/forged")],
            b"forged v2",
            reply_to_q="REPLY.Q",
            msg_type=MsgType.REQUEST,
        ),
    )
    # The two requests go to different queues (the admin stream queue, the control
    # queue), which the service serves independently: the replies may come in either
    # order. Tell them apart by their header format (MQRFH for v1, MQRFH2 for v2).
    replies = await wait_for_queue(app.qm, "REPLY.Q", 2)
    assert sorted(r.fmt for r in replies) == sorted([FMT_RF_HEADER_1, FMT_RF_HEADER_2])
    v1, v2 = sorted(replies, key=lambda r: r.fmt != FMT_RF_HEADER_1)
    assert v1.get("MQPSCompCode") == "2"
    assert v1.get("MQPSReason") == NOT_AUTHORIZED
    assert v1.get("MQPSReasonText") == "MQRCCF_NOT_AUTHORIZED"
    assert v2.get("pscr/Completion") == "error"
    assert v2.get("pscr/Response/Reason") == NOT_AUTHORIZED
    assert sorted(await _dead_letters(app, 2)) == [(3081, ADMIN), (3081, CONTROL)]
    await asyncio.sleep(0.3)
    # Only the gateway's own admin publications (its retained stream support) arrive.
    admin = await drain(app.qm, "SUB.ADMIN")
    assert not {m.payload for m in admin} & {b"forged v1", b"forged v2"}
    assert all("StreamSupport" in (m.topic or "") for m in admin)
    assert _metric(app, "mq", "protected_stream") == 2
    assert any(
        "MQRCCF_NOT_AUTHORIZED" in r.getMessage() and ADMIN in r.getMessage()
        for r in caplog.records
    )
    # The default stream and named streams stay open to applications.
    await put(
        app.qm,
        rfh_message(
            STOCK,
            [("MQPSCommand", "Publish"), ("MQPSTopic", "IBM")],
            b"fine",
            reply_to_q="REPLY.Q",
            msg_type=MsgType.REQUEST,
        ),
    )
    (ok,) = await wait_for_queue(app.qm, "REPLY.Q", 1)
    assert ok.get("MQPSReason") == "0"


# ------------------------------------------------------------------ (c) ---------------


async def test_c_system_stream_and_transmission_queues_are_no_subscriber_queues(
    app: GatewayApp,
) -> None:
    assert app.qm is not None
    forbidden = {
        "SYSTEM.ADMIN.COMMAND.QUEUE": "system_queue",
        STOCK: "broker_queue",
        XMITQ: "transmission_queue",
    }
    for queue in forbidden:
        await put(
            app.qm,
            rfh_message(
                CONTROL,
                [("MQPSCommand", "RegSub"), ("MQPSTopic", "Anything"), ("MQPSQName", queue)],
                reply_to_q="REPLY.Q",
                msg_type=MsgType.REQUEST,
            ),
        )
    replies = await wait_for_queue(app.qm, "REPLY.Q", 3)
    for r in replies:
        assert r.get("MQPSReason") == NOT_AUTHORIZED
        assert r.get("MQPSParmId") == "MQPSQName"
    dead = await _dead_letters(app, 3)
    assert dead == [(3081, CONTROL)] * 3
    assert app.service is not None and app.service.engine.subscriptions == []
    for reason in forbidden.values():
        assert _metric(app, "mq", reason) == 1
    # An ordinary queue is still accepted.
    await put(
        app.qm,
        rfh_message(
            CONTROL,
            [("MQPSCommand", "RegSub"), ("MQPSTopic", "Anything"), ("MQPSQName", "SUB.STOCK")],
            reply_to_q="REPLY.Q",
            msg_type=MsgType.REQUEST,
        ),
    )
    (ok,) = await wait_for_queue(app.qm, "REPLY.Q", 1)
    assert ok.get("MQPSReason") == "0"


# ------------------------------------------------------------------ (a) ---------------


async def test_a_kafka_record_cannot_escape_its_route(
    kafka_broker: KafkaBroker, tmp_path: Path
) -> None:
    plain, lax, dlq = unique("authz-in"), unique("authz-lax"), unique("authz-dlq")
    kafka = {
        "name": "kafka-main",
        "plugin": "kafka",
        "config": {
            "bootstrap_servers": kafka_broker.bootstrap,
            "outbound": {"enabled": False},
            "inbound": {
                "group_id": unique("g"),
                "dead_letter_topic": dlq,
                "topics": [
                    {"kafka_topic": plain, "stream": STOCK, "topic": "Orders/X"},
                    # A route that lets its records choose the admin stream: the
                    # runtime's policy for plugin instances still refuses it.
                    {"kafka_topic": lax, "stream": STOCK, "allowed_streams": [ADMIN]},
                ],
            },
        },
    }
    app = await _running(_config(tmp_path, [kafka]), tmp_path)
    try:
        assert app.qm is not None
        await _subscribe_admin(app)
        await put(
            app.qm,
            rfh_message(
                CONTROL,
                [
                    ("MQPSCommand", "RegSub"),
                    ("MQPSStreamName", STOCK),
                    ("MQPSTopic", "*"),
                    ("MQPSQName", "SUB.STOCK"),
                ],
                reply_to_q="REPLY.Q",
                msg_type=MsgType.REQUEST,
            ),
        )
        (ok,) = await wait_for_queue(app.qm, "REPLY.Q", 1)
        assert ok.get("MQPSReason") == "0"
        await produce(
            kafka_broker.bootstrap,
            plain,
            [
                (b"Orders/1", b"escape by header", [("mq.stream", ADMIN.encode())]),
                (f"$SYS/STREAM/{ADMIN}/MQ/SA/x".encode(), b"escape by key", []),
                (b"Orders/2", b"legitimate", []),
            ],
        )
        await produce(
            kafka_broker.bootstrap,
            lax,
            [(b"MQ/SA/y", b"escape through a lax route", [("mq.stream", ADMIN.encode())])],
        )
        got = await wait_for_queue(app.qm, "SUB.STOCK", 1, timeout=60)
        assert [m.payload for m in got] == [b"legitimate"]
        dead = await consume(kafka_broker.bootstrap, dlq, 3)
        assert sorted(r.value for r in dead) == [
            b"escape by header",
            b"escape by key",
            b"escape through a lax route",
        ]
        for r in dead:
            h = headers_of(r)
            assert h["mq.dlh.reason"] == str(NOT_AUTHORIZED_REASON).encode()
            assert ADMIN.encode() in h["mqgw.error"]
        admin = await drain(app.qm, "SUB.ADMIN")
        assert all("StreamSupport" in (m.topic or "") for m in admin)
        assert _metric(app, "plugin:kafka-main", "stream_not_in_route") == 2
        assert _metric(app, "plugin:kafka-main", "protected_stream") == 1
    finally:
        await app.shutdown()
