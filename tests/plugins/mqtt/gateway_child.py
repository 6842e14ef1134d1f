"""Child process of the kill test: a gateway (embedded QM, broker service, plugin host,
one mqtt instance with an inbound filter) that reports on stdout.

Usage: gateway_child.py WORK_DIR HOST PORT CLIENT_ID PROTOCOL BASE MODE

MODE ``feedN``: puts N MQRFH publications (payloads 0..N-1) on STOCK.STREAM in one unit
of work and prints ``fed``; the instance forwards them to ``<BASE>-out/STOCK.STREAM/seq``.
MODE ``hang``: registers an MQRFH2 subscriber on SUB.RFH2 for ``from-mqtt/#``, prints
``ready``; the plugin's MQ unit of work puts the publication and then, at commit, prints
``in-commit`` and hangs there (the parent SIGKILLs it). MODE ``run``: prints ``ready``,
then ``mqtt-received <topic> dup=<0|1>`` for each MQTT message and ``got <payload>`` for
each message reaching SUB.RFH2; on SIGTERM stops the gateway and exits 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
from pathlib import Path
from typing import Any

from gateway.mq.port import PutOptions, QueueManager
from gateway.runtime.plugin_host import MQPublisher
from plugins.mqtt import MqttConfig
from plugins.mqtt.connection import Received
from plugins.mqtt.source import MqttSource
from tests.plugins.mqtt.mqtt_harness import STOCK, drain_now, register_mq_subscribers, start_gateway
from tests.support.pubsub_messages import rfh_message


class _HangingConnection:
    def __init__(self, conn: Any) -> None:
        self._conn = conn

    def __getattr__(self, name: str) -> Any:
        return getattr(self._conn, name)

    async def commit(self) -> None:
        print("in-commit", flush=True)
        await asyncio.Event().wait()

    def start_commit(self) -> asyncio.Future[None]:
        """The commit begun without waiting for it (``gateway.mq.port.start_commit``):
        it never ends either."""
        print("in-commit", flush=True)
        return asyncio.get_running_loop().create_future()


class _HangingQM:
    """A queue manager whose units of work never commit (the crash window)."""

    def __init__(self, qm: QueueManager) -> None:
        self._qm = qm

    def __getattr__(self, name: str) -> Any:
        return getattr(self._qm, name)

    async def connect(self) -> Any:
        return _HangingConnection(await self._qm.connect())


async def main(argv: list[str]) -> int:
    work, host, port, client_id, protocol, base, mode = argv
    logging.basicConfig(
        level=logging.DEBUG if "MQGW_CHILD_DEBUG" in os.environ else logging.WARNING
    )
    config = MqttConfig.model_validate(
        {
            "host": host,
            "port": int(port),
            "protocol": protocol,
            "client_id": client_id,
            "session_expiry": 300,
            "outbound": {"topics": [f"$SYS/STREAM/{STOCK}/#"], "prefix": f"{base}-out"},
            "inbound": {
                "filters": [
                    {
                        "filter": f"{base}/#",
                        "strip_prefix": f"{base}/",
                        "topic_prefix": "from-mqtt/",
                    }
                ]
            },
        }
    )
    if mode == "hang":
        import gateway.runtime.plugin_host as plugin_host

        original = plugin_host.PluginHost.publisher_for

        def hanging_publisher(self: plugin_host.PluginHost, instance_name: str) -> MQPublisher:
            real = original(self, instance_name)
            real.qm = _HangingQM(real.qm)
            return real

        plugin_host.PluginHost.publisher_for = hanging_publisher  # type: ignore[method-assign]
    deliver = MqttSource.on_message

    def report(self: MqttSource, received: Received) -> None:
        msg = received.message
        print(f"mqtt-received {msg.topic} dup={int(msg.dup)}", flush=True)
        deliver(self, received)

    MqttSource.on_message = report  # type: ignore[method-assign]
    # feedN: the parent stops the gateway mid-stream, so the stream must last; at the
    # default batch_size (256 since issue 32) 3,000 were all sent before the SIGTERM
    # on a quiet machine. The restart ("run") uses the default.
    batch = 32 if mode.startswith("feed") else None
    gw = await start_gateway(Path(work), config, batch_size=batch)
    if mode == "hang":
        await register_mq_subscribers(gw.qm, "from-mqtt/#")
    print("ready", flush=True)
    if mode.startswith("feed"):
        count = int(mode.removeprefix("feed"))
        conn = await gw.qm.connect()
        for i in range(count):
            msg = rfh_message(
                STOCK,
                [("MQPSCommand", "Publish"), ("MQPSStreamName", STOCK), ("MQPSTopic", "seq")],
                str(i).encode(),
                persistence=1,
            )
            await conn.put1(STOCK, msg.md, msg.body, PutOptions(syncpoint=True))
        await conn.commit()
        await conn.disconnect()
        print("fed", flush=True)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    try:
        while not stop.is_set():
            for r in await drain_now(gw.qm, "SUB.RFH2"):
                print(f"got {r.payload.decode()}", flush=True)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 0.05)
    finally:
        await gw.close()
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main(sys.argv[1:])))
