"""Helpers of the streams tests: a gateway config and its embedded queue manager
prepared as a network left it (dead-lettered publications, messages waiting)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from gateway.mq.embedded.qmgr import EmbeddedQueueManager
from gateway.mq.port import GetOptions, MQError, OpenOption, PutOptions
from gateway.wire.formats import FMT_RF_HEADER
from gateway.wire.mqmd import MQMD
from gateway.wire.reasons import Reason


def write_config(tmp: Path, streams: list[str]) -> Path:
    cfg = tmp / "gateway.yaml"
    names = ", ".join(f"{{name: {s}}}" for s in streams)
    cfg.write_text(
        "queue_manager: {name: GW, data_dir: qm}\n"
        f"broker: {{store: pubsub.db, streams: [{names}]}}\n"
        "metrics: {enabled: false}\n"
    )
    return cfg


def prepare(
    tmp: Path, queues: list[str], dead_lettered: dict[str, int], waiting: dict[str, int]
) -> dict[str, list[bytes]]:
    """The gateway's queue manager with ``queues`` defined, publications for streams
    dead-lettered with 2085 (as a receiving channel does) and messages waiting on
    queues. Returns the MsgIds dead-lettered per stream."""

    async def run() -> dict[str, list[bytes]]:
        ids: dict[str, list[bytes]] = {}
        async with EmbeddedQueueManager("GW", tmp / "qm") as qm:
            for q in queues:
                qm.run_mqsc(f"DEFINE QLOCAL('{q}') REPLACE")
            conn = await qm.connect()
            for stream, n in dead_lettered.items():
                for i in range(n):
                    md = MQMD(
                        format=FMT_RF_HEADER, encoding=546, coded_char_set_id=819, persistence=1
                    )
                    out = await conn.put_dead_letter(
                        md,
                        b"RFH publication %d" % i,
                        Reason.UNKNOWN_OBJECT_NAME,
                        stream,
                        syncpoint=True,
                    )
                    ids.setdefault(stream, []).append(out.msg_id)
            await conn.commit()
            for q, n in waiting.items():
                h = await conn.open(q, OpenOption.OUTPUT)
                for i in range(n):
                    await h.put(MQMD(persistence=1), b"waiting %d" % i, PutOptions())
                await h.close()
            await conn.disconnect()
        return ids

    return asyncio.run(run())


def queue_contents(tmp: Path, q: str) -> list[tuple[MQMD, bytes]]:
    async def run() -> list[tuple[MQMD, bytes]]:
        async with EmbeddedQueueManager("GW", tmp / "qm") as qm:
            conn = await qm.connect()
            try:
                h = await conn.open(q, OpenOption.INPUT_SHARED)
            except MQError:
                return []
            out = []
            while True:
                try:
                    m = await h.get(GetOptions())
                except MQError:
                    break
                out.append((m.md, m.body))
            await conn.backout()
            await conn.disconnect()
            return out

    return asyncio.run(run())
