"""The seed's first failure mode end to end on the embedded queue manager: a neighbour's
publications for a stream whose queue was deleted land on the DLQ (reason 2085);
``mqgw streams check`` exits 1 naming the queue and the count; ``--fix --replay-dlq``
repairs it and, once the gateway runs again, the publications reach the subscriber."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

import pytest

from gateway.mq.embedded.connection import EmbeddedConnection
from gateway.mq.embedded.qmgr import EmbeddedQueueManager
from gateway.mq.port import GetOptions, MQError, OpenOption, PutOptions
from gateway.runtime.app import GatewayApp
from gateway.runtime.cli import main
from gateway.runtime.config import load_config
from gateway.runtime.registry import PluginRegistry
from gateway.wire.reasons import Reason
from tests.support.pubsub_messages import (
    CONTROL,
    Received,
    decode,
    rfh2_message,
    rfh_message,
)

B = "BULLETIN.STREAM"
T = TypeVar("T")
N = 6


async def _serve_briefly(cfg: Path, until: float = 10.0, want_subs: int = 0) -> None:
    """Run the gateway in-process until its subscriptions and queues settle."""
    app = GatewayApp(
        load_config(cfg, PluginRegistry.from_entry_points()), PluginRegistry.from_entry_points()
    )
    await app.start()
    try:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + until
        while loop.time() < deadline:
            qm = app.qm
            assert app.service is not None and isinstance(qm, EmbeddedQueueManager)
            busy = qm.queue_depth(CONTROL) + (qm.queue_depth(B) if B in qm.catalogue.queues else 0)
            if busy == 0 and len(app.service.engine.subscriptions) >= want_subs:
                await asyncio.sleep(0.3)  # let the last batch commit
                return
            await asyncio.sleep(0.05)
        raise AssertionError("the gateway did not settle")
    finally:
        await app.shutdown()


async def _with_qm(
    tmp: Path, fn: Callable[[EmbeddedQueueManager, EmbeddedConnection], Awaitable[T]]
) -> T:
    async with EmbeddedQueueManager("GW", tmp / "qm") as qm:
        conn = await qm.connect()
        try:
            return await fn(qm, conn)
        finally:
            await conn.disconnect()


def test_missing_stream_queue_dlq_then_fix_replay_delivers(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = tmp_path / "gateway.yaml"
    cfg.write_text(
        "queue_manager: {name: GW, data_dir: qm}\n"
        f"broker: {{store: pubsub.db, streams: [{{name: {B}}}], wait_ms: 50}}\n"
        "metrics: {enabled: false}\n"
    )

    async def subscribe(qm: EmbeddedQueueManager, conn: EmbeddedConnection) -> None:
        qm.run_mqsc("DEFINE QLOCAL(SUB.Q) REPLACE")
        reg = rfh2_message(
            CONTROL,
            [("Command", "RegSub"), ("Topic", f"$SYS/STREAM/{B}/#"), ("QName", "SUB.Q")],
            reply_to_q_mgr="GW",
        )
        h = await conn.open(CONTROL, OpenOption.OUTPUT)
        await h.put(reg.md, reg.body, PutOptions())

    asyncio.run(_with_qm(tmp_path, subscribe))
    asyncio.run(_serve_briefly(cfg, want_subs=1))

    # the stream queue is deleted; a neighbour's publications arrive on the channel and
    # the receiving side dead-letters them (MQDLH reason 2085, DestQName the stream)
    pubs = [
        rfh_message(
            B,
            [("MQPSCommand", "Publish"), ("MQPSStreamName", B), ("MQPSTopic", "news/a")],
            b"pub %d" % i,
        )
        for i in range(N)
    ]

    async def lose(qm: EmbeddedQueueManager, conn: EmbeddedConnection) -> None:
        qm.run_mqsc(f"DELETE QLOCAL('{B}')")
        for p in pubs:
            with pytest.raises(MQError) as exc:
                await conn.open(B, OpenOption.OUTPUT)
            assert exc.value.reason == Reason.UNKNOWN_OBJECT_NAME
            await conn.put_dead_letter(p.md, p.body, Reason.UNKNOWN_OBJECT_NAME, B)

    asyncio.run(_with_qm(tmp_path, lose))

    assert main(["streams", "check", "--config", str(cfg)]) == 1
    out = capsys.readouterr().out
    assert f"stream queue {B} is missing" in out
    assert f"{N} publication(s) for {B} on SYSTEM.DEAD.LETTER.QUEUE (reason 2085)" in out

    assert main(["streams", "check", "--config", str(cfg), "--fix", "--replay-dlq"]) == 0
    out = capsys.readouterr().out
    assert f"replayed {N} publication(s)" in out and "all well" in out

    asyncio.run(_serve_briefly(cfg, want_subs=1))

    async def received(qm: EmbeddedQueueManager, conn: EmbeddedConnection) -> list[Received]:
        h = await conn.open("SUB.Q", OpenOption.INPUT_SHARED)
        got: list[Received] = []
        while True:
            try:
                m = await h.get(GetOptions())
            except MQError:
                return got
            got.append(decode(m.md, m.body))

    got = asyncio.run(_with_qm(tmp_path, received))
    publications = [r for r in got if r.payload.startswith(b"pub ")]
    assert [r.payload for r in publications] == [b"pub %d" % i for i in range(N)]  # once each
    assert all(r.topic == f"$SYS/STREAM/{B}/news/a" for r in publications)
