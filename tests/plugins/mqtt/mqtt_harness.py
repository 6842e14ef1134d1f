"""MQTT-side helpers of the mqtt plugin tests: the shared in-process gateway
(``tests.support.gateway``) with one ``mqtt`` instance, legacy MQ applications (real
MQRFH/MQRFH2 commands), a plain aiomqtt client, and a restartable Mosquitto on a fixed
port with persistence (for back-pressure tests)."""

from __future__ import annotations

import asyncio
import contextlib
import time
import weakref
from pathlib import Path
from typing import Any

import aiomqtt
from paho.mqtt.properties import Properties

from gateway.devstack.mosquitto import find_mosquitto, mqtt_handshake
from gateway.devstack.ports import free_port
from gateway.devstack.process import ServiceProcess, spawn
from gateway.mq.embedded.qmgr import EmbeddedQueueManager
from gateway.wire.mqmd import MQMD
from plugins.mqtt import MqttConfig, plugin
from tests.support import gateway as support_gateway
from tests.support.gateway import (
    BULLETIN,
    CONTROL,
    DEFAULT,
    STOCK,
    InProcessGateway,
    bridge_config,
)
from tests.support.names import unique
from tests.support.pubsub_messages import Received, rfh2_message, rfh_message, rfh_publication
from tests.support.service_client import drain, put, wait_for_queue

__all__ = [
    "BULLETIN",
    "CONTROL",
    "DEFAULT",
    "STOCK",
    "FixedPortMosquitto",
    "Gateway",
    "client",
    "collect",
    "delete_rfh",
    "drain_now",
    "publish_rfh",
    "publish_rfh2",
    "put_raw",
    "register_mq_subscribers",
    "start_gateway",
    "unique",
    "user_props",
    "wait_for_queue",
]

#: The gateway of these tests (the shared in-process one).
Gateway = InProcessGateway


async def start_gateway(
    path: Path,
    config: MqttConfig,
    *,
    name: str = "mqtt",
    gateway_id: str = "gw-test",
    mqsc: str = support_gateway.BRIDGE_QUEUES,
    batch_size: int | None = None,
) -> InProcessGateway:
    """Start (or restart on ``path``) the test gateway with one mqtt instance
    (``batch_size``: the broker's, if not its default)."""
    broker: dict[str, object] = {"sink_retry_max_delay": 0.5}
    if batch_size is not None:
        broker["batch_size"] = batch_size
    return await support_gateway.start_gateway(
        path,
        plugin.create(name, config),
        config=bridge_config(**broker),
        gateway_id=gateway_id,
        mqsc=mqsc,
    )


# ------------------------------------------------------------ legacy MQ applications -----


async def publish_rfh(
    qm: EmbeddedQueueManager,
    stream: str,
    topic: str,
    payload: bytes,
    *,
    retain: bool = False,
    persistence: int = 1,
    pairs: list[tuple[str, str]] | None = None,
    expiry: int = -1,
) -> None:
    """An MQ Publish/Subscribe V6 (MQRFH) publisher naming its stream explicitly."""
    extra = [("MQPSPubOpts", "RetainPub")] if retain else []
    message = rfh_publication(
        stream, topic, payload, pairs=extra + (pairs or []), persistence=persistence,
        expiry=expiry,
    )
    await put(qm, message)


async def publish_rfh2(
    qm: EmbeddedQueueManager,
    full_topic: str,
    payload: bytes,
    *,
    usr: dict[str, str] | None = None,
    retain: bool = False,
    persistence: int = 1,
    expiry: int = -1,
) -> None:
    """An MQRFH2 publisher; a named stream is written as ``$SYS/STREAM/<s>/`` prefix."""
    from gateway.wire.folder import Element

    psc = [("Command", "Publish"), ("Topic", full_topic)]
    if retain:
        psc.append(("PubOpt", "RetainPub"))
    folders = [Element.from_pairs("usr", usr)] if usr else []
    await put(
        qm,
        rfh2_message(
            DEFAULT, psc, payload, folders=folders, persistence=persistence, expiry=expiry
        ),
    )


async def put_raw(qm: EmbeddedQueueManager, queue: str, md: MQMD, body: bytes) -> None:
    conn = await qm.connect()
    try:
        await conn.put1(queue, md, body)
    finally:
        await conn.disconnect()


async def delete_rfh(qm: EmbeddedQueueManager, stream: str, topic: str) -> None:
    nv = [("MQPSCommand", "DeletePub"), ("MQPSStreamName", stream), ("MQPSTopic", topic)]
    await put(qm, rfh_message(stream, nv))


async def register_mq_subscribers(qm: EmbeddedQueueManager, topic: str) -> None:
    """An MQRFH subscriber on SUB.RFH and an MQRFH2 subscriber on SUB.RFH2 (default
    stream), both confirmed by their replies. ``topic`` is ``<literal>/#``: MQRFH uses
    character wildcards, so its subscriber registers ``<literal>/*``."""
    rfh_topic = topic[:-1] + "*" if topic.endswith("#") else topic
    await put(
        qm,
        rfh_message(
            CONTROL,
            [("MQPSCommand", "RegSub"), ("MQPSTopic", rfh_topic), ("MQPSQName", "SUB.RFH")],
            reply_to_q="REPLY.Q",
            msg_type=1,
        ),
    )
    await put(
        qm,
        rfh2_message(
            CONTROL,
            [("Command", "RegSub"), ("Topic", topic), ("QName", "SUB.RFH2")],
            reply_to_q="REPLY.Q",
            msg_type=1,
        ),
    )
    replies = await wait_for_queue(qm, "REPLY.Q", 2)
    outcomes = [
        (r.get("MQPSReason"), r.get("pscr/Completion"), r.get("pscr/Reason")) for r in replies
    ]
    assert outcomes == [("0", None, None), (None, "ok", None)], outcomes


async def drain_now(qm: EmbeddedQueueManager, queue: str) -> list[Received]:
    """Whatever is on ``queue`` right now (destructively; may be nothing)."""
    return await drain(qm, queue)


# ------------------------------------------------------------------- MQTT clients -----


def client(host: str, port: int, *, v5: bool = True, **kwargs: Any) -> aiomqtt.Client:
    return aiomqtt.Client(
        host,
        port=port,
        identifier=kwargs.pop("identifier", unique("test-")),
        protocol=aiomqtt.ProtocolVersion.V5 if v5 else aiomqtt.ProtocolVersion.V311,
        **kwargs,
    )


class _Inbox:
    """Reads a client's messages in the background, so waiting with a timeout never
    cancels a read that already took a message off aiomqtt's queue."""

    def __init__(self, sub: aiomqtt.Client) -> None:
        self.messages: list[aiomqtt.Message] = []
        self.taken = 0
        self.changed = asyncio.Event()
        self.task = asyncio.create_task(self._read(sub))

    async def _read(self, sub: aiomqtt.Client) -> None:
        with contextlib.suppress(aiomqtt.MqttError):
            async for message in sub.messages:
                self.messages.append(message)
                self.changed.set()

    async def wait_for(self, total: int) -> None:
        while len(self.messages) < total:
            self.changed.clear()
            await self.changed.wait()


_INBOXES: weakref.WeakKeyDictionary[aiomqtt.Client, _Inbox] = weakref.WeakKeyDictionary()


async def collect(
    sub: aiomqtt.Client, count: int, timeout: float = 20, *, quiet: float = 0.3
) -> list[aiomqtt.Message]:
    """The next ``count`` messages, plus anything more arriving within ``quiet`` s."""
    inbox = _INBOXES.get(sub)
    if inbox is None:
        inbox = _INBOXES[sub] = _Inbox(sub)
    async with asyncio.timeout(timeout):
        await inbox.wait_for(inbox.taken + count)
    if quiet > 0:
        seen = -1
        while seen != len(inbox.messages):
            seen = len(inbox.messages)
            await asyncio.sleep(quiet)
    got = inbox.messages[inbox.taken :]
    inbox.taken = len(inbox.messages)
    return got


def user_props(message: aiomqtt.Message) -> list[tuple[str, str]]:
    props: Properties | None = message.properties
    return list(getattr(props, "UserProperty", None) or [])


# ----------------------------------------------------- a restartable Mosquitto -----


class FixedPortMosquitto:
    """Mosquitto on one port across restarts, with persistence, so MQTT sessions and
    queued messages survive a restart (the session fixture's broker keeps none)."""

    def __init__(self, work_dir: Path) -> None:
        self.work_dir = work_dir
        self.host = "127.0.0.1"
        self.port = free_port()
        self.process: ServiceProcess | None = None
        work_dir.mkdir(parents=True, exist_ok=True)
        self.conf = work_dir / "mosquitto.conf"
        self.conf.write_text(
            f"listener {self.port} 127.0.0.1\n"
            "allow_anonymous true\n"
            "persistence true\n"
            "user root\n"
            f"persistence_location {work_dir}/\n"
            "autosave_interval 0\n"
            "log_dest stderr\n"
            "max_inflight_messages 1000\n"
            "max_queued_messages 100000\n",
            encoding="utf-8",
        )

    def start(self) -> None:
        self.process = spawn(
            "mosquitto",
            [find_mosquitto(), "-c", str(self.conf)],
            log_path=self.work_dir / "mosquitto.log",
            cwd=self.work_dir,
        )
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if mqtt_handshake(self.host, self.port):
                return
            time.sleep(0.05)
        raise AssertionError(f"mosquitto did not start:\n{self.process.log_tail()}")

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop(10)
            self.process = None
