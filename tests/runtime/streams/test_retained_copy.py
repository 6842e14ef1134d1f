"""``copy_retained`` against a broker on another embedded queue manager reached over
channels: documented commands only (RegSub ``*`` InformIfRet, DeregSub), the retained
publications re-published as retained on our stream queue."""

from __future__ import annotations

import asyncio
from pathlib import Path

from gateway.mq.embedded.network import Network
from gateway.mq.embedded.topology import topology_from_dict
from gateway.mq.port import GetOptions, OpenOption, PutOptions
from gateway.pubsub.streams import DEFAULT_STREAM
from gateway.runtime.pubsub_service import BrokerConfig, StreamQueueConfig
from gateway.runtime.streams.retained_copy import MIGRATION_QUEUE, copy_retained
from gateway.wire.rfh import decode_rfh
from tests.support.gateway import build_gateway
from tests.support.pubsub_messages import rfh_message

S = "STOCK.STREAM"

OLD = f"""
DEFINE QLOCAL(GW) USAGE(XMITQ)
DEFINE CHANNEL(OLD.TO.GW) CHLTYPE(SDR) CONNAME('GW') XMITQ(GW)
DEFINE CHANNEL(GW.TO.OLD) CHLTYPE(RCVR)
DEFINE QLOCAL('{S}') DEFPSIST(YES)
"""
GW = f"""
DEFINE QLOCAL(OLD) USAGE(XMITQ)
DEFINE CHANNEL(GW.TO.OLD) CHLTYPE(SDR) CONNAME('OLD') XMITQ(OLD)
DEFINE CHANNEL(OLD.TO.GW) CHLTYPE(RCVR)
DEFINE QLOCAL('{S}') DEFPSIST(YES)
DEFINE QLOCAL({MIGRATION_QUEUE})
"""


def test_retained_publications_copied_with_documented_commands(tmp_path: Path) -> None:
    async def run() -> None:
        topo = topology_from_dict(
            {"queue_managers": {"OLD": {"mqsc": OLD}, "GW": {"mqsc": GW}}}, tmp_path
        )
        async with Network(topo, tmp_path / "data") as net:
            old = build_gateway(
                tmp_path / "old",
                qm=net["OLD"].qm,
                mqsc="",
                config=BrokerConfig(streams=[StreamQueueConfig(name=S)], wait_ms=50),
            )
            await old.service.start()
            try:
                conn = await net["OLD"].qm.connect()
                h = await conn.open(S, OpenOption.OUTPUT)
                for topic, text in [("IBM", b"120"), ("HAL", b"7"), ("IBM", b"121")]:
                    m = rfh_message(
                        S,
                        [
                            ("MQPSCommand", "Publish"),
                            ("MQPSStreamName", S),
                            ("MQPSTopic", topic),
                            ("MQPSPubOpts", "RetainPub"),
                        ],
                        text,
                        reply_to_q_mgr="OLD",
                    )
                    await h.put(m.md, m.body, PutOptions())
                await conn.disconnect()
                async with asyncio.timeout(10):
                    while net["OLD"].qm.queue_depth(S):
                        await asyncio.sleep(0.05)
                await asyncio.sleep(0.3)

                gw = await net["GW"].qm.connect()
                result = await copy_retained(gw, "OLD", [S, DEFAULT_STREAM], timeout=10)
                assert result.failed == {}
                assert result.copied == {S: 2, DEFAULT_STREAM: 0}
                q = await gw.open(S, OpenOption.INPUT_SHARED)
                copies = {}
                for _ in range(2):
                    msg = await q.get(GetOptions())
                    rfh, used = decode_rfh(msg.body, msg.md.encoding, ccsid=1208)
                    assert rfh.get("MQPSCommand") == "Publish"
                    assert rfh.get("MQPSStreamName") == S
                    assert rfh.get_all("MQPSPubOpts") == ["RetainPub"]
                    copies[rfh.get("MQPSTopic")] = msg.body[used:]
                assert copies == {"IBM": b"121", "HAL": b"7"}
                assert net["GW"].qm.queue_depth(MIGRATION_QUEUE) == 0

                # nothing left registered at the old broker
                async with asyncio.timeout(10):
                    while old.service.engine.subscriptions:
                        await asyncio.sleep(0.05)

                # a broker no channel reaches: said per stream, nothing copied
                unknown = await copy_retained(gw, "NOWHERE", [S], timeout=1)
                assert unknown.copied == {}
                assert "NOWHERE" in unknown.failed[S], unknown.failed
                await gw.disconnect()
            finally:
                await old.service.stop()
                old.store.close()
                old.service.forgiven.close()

    asyncio.run(run())
