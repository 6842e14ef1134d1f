"""``mqgw migrate --from-broker OLD --copy-retained``: the gateway's queue manager runs
as a network node for the copy, asks the legacy broker over channels with documented
commands, and the broker's retained publications wait on our stream queue as retained
Publish commands."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from gateway.devstack.ports import free_port
from gateway.mq.embedded.network import QueueManagerNode
from gateway.mq.port import OpenOption, PutOptions
from gateway.runtime.cli import main
from gateway.runtime.pubsub_service import BrokerConfig, StreamQueueConfig
from tests.runtime.streams.streams_helpers import queue_contents
from tests.support.gateway import build_gateway
from tests.support.pubsub_messages import rfh_message

S = "STOCK.STREAM"


def test_migrate_copies_retained_publications(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    p_old, p_gw = free_port(), free_port()
    (tmp_path / "channels.mqsc").write_text(
        "DEFINE QLOCAL(OLD) USAGE(XMITQ) REPLACE\n"
        f"DEFINE CHANNEL(GW.TO.OLD) CHLTYPE(SDR) CONNAME('127.0.0.1({p_old})') XMITQ(OLD) "
        "REPLACE\n"
        "DEFINE CHANNEL(OLD.TO.GW) CHLTYPE(RCVR) REPLACE\n"
    )
    cfg = tmp_path / "gateway.yaml"
    cfg.write_text(
        "queue_manager: {name: GW, data_dir: qm, mqsc_file: channels.mqsc}\n"
        f"broker: {{store: pubsub.db, streams: [{{name: {S}}}]}}\n"
        "metrics: {enabled: false}\n"
    )
    old_mqsc = (
        "DEFINE QLOCAL(GW) USAGE(XMITQ)\n"
        f"DEFINE CHANNEL(OLD.TO.GW) CHLTYPE(SDR) CONNAME('127.0.0.1({p_gw})') XMITQ(GW)\n"
        "DEFINE CHANNEL(GW.TO.OLD) CHLTYPE(RCVR)\n"
        f"DEFINE QLOCAL('{S}') DEFPSIST(YES)\n"
    )

    async def run() -> int:
        async with QueueManagerNode(
            "OLD", tmp_path / "old" / "qm", mqsc=old_mqsc, port=p_old
        ) as node:
            old = build_gateway(
                tmp_path / "old",
                qm=node.qm,
                mqsc="",
                config=BrokerConfig(streams=[StreamQueueConfig(name=S)], wait_ms=50),
            )
            await old.service.start()
            try:
                conn = await node.qm.connect()
                h = await conn.open(S, OpenOption.OUTPUT)
                m = rfh_message(
                    S,
                    [
                        ("MQPSCommand", "Publish"),
                        ("MQPSStreamName", S),
                        ("MQPSTopic", "IBM"),
                        ("MQPSPubOpts", "RetainPub"),
                    ],
                    b"120",
                    reply_to_q_mgr="OLD",
                )
                await h.put(m.md, m.body, PutOptions())
                await conn.disconnect()
                async with asyncio.timeout(10):
                    while node.qm.queue_depth(S):
                        await asyncio.sleep(0.05)
                await asyncio.sleep(0.3)
                return await asyncio.to_thread(
                    main,
                    [
                        "migrate", "--config", str(cfg), "--from-streams", S,
                        "--from-broker", "OLD", "--copy-retained", "--listen", str(p_gw),
                        "--timeout", "15", "--progress",
                    ],
                )  # fmt: skip
            finally:
                await old.service.stop()
                old.store.close()
                old.service.forgiven.close()

    code = asyncio.run(run())
    out, err = capsys.readouterr()
    assert code == 0, out + err
    assert f"retained publications on {S}: 1 copied from OLD" in out
    # --progress on a stderr that is no terminal: a plain line per stream, then the summary
    live, summary = err.splitlines()[-2:]
    assert live == f"mqgw migrate: 1 streams copied ({S}: 1 retained)"
    assert summary.startswith("mqgw migrate: 1 streams copied in ")
    assert summary.endswith("(1 retained publication(s) of 1 stream(s), 0 failed)")
    record = json.loads((tmp_path / "migration.json").read_text())
    assert record["retained_copied"] == 1 and record["from_q_mgr"] == "OLD"
    ((_md, body),) = queue_contents(tmp_path, S)
    assert b"MQPSPubOpts RetainPub" in body and body.endswith(b"120")


def test_copy_retained_needs_a_listener_port(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = tmp_path / "gateway.yaml"
    cfg.write_text("queue_manager: {name: GW, data_dir: qm}\nbroker: {store: pubsub.db}\n")
    args = ["migrate", "--config", str(cfg), "--from-streams", S, "--copy-retained"]
    assert main(args) == 2
    assert "needs --from-broker" in capsys.readouterr().err
    assert main([*args, "--from-broker", "OLD"]) == 2
    assert "--listen PORT" in capsys.readouterr().err
    assert not (tmp_path / "migration.json").exists()


def test_progress_counts_only_the_streams_copied(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A stream whose copy failed is not counted as copied, live or in the summary (the
    broker's answers stubbed: the counting, not the copy, is under test here)."""
    import argparse

    from gateway.runtime.streams import migrate_cli, retained_copy

    async def fake_copy(_conn: object, _broker: str, streams: list[str],
                        timeout: float) -> retained_copy.RetainedCopyResult:
        (stream,) = streams
        await asyncio.sleep(0.25)  # past the live line's 0.2 s spacing: one line each
        result = retained_copy.RetainedCopyResult()
        if stream == "BAD.STREAM":
            result.failed[stream] = "no answer"
        else:
            result.copied[stream] = 2
        return result

    def fake_on_node(_args: object, _loaded: object, _queues: list[str], work: object) -> object:
        return asyncio.run(work(None, None))  # type: ignore[operator]

    monkeypatch.setattr(retained_copy, "copy_retained", fake_copy)
    monkeypatch.setattr(migrate_cli, "_on_node", fake_on_node)
    args = argparse.Namespace(progress=True, from_broker="OLD", timeout=1.0)
    outcome = migrate_cli._copy_retained(args, None, [S, "BAD.STREAM", "NEWS.STREAM"])
    assert outcome.failed == {"BAD.STREAM": "no answer"}
    lines = capsys.readouterr().err.splitlines()
    assert lines[:3] == [
        f"mqgw migrate: 1 streams copied ({S}: 2 retained)",
        "mqgw migrate: 1 streams copied (BAD.STREAM: failed)",
        "mqgw migrate: 2 streams copied (NEWS.STREAM: 2 retained)",
    ]
    assert lines[-1].startswith("mqgw migrate: 2 streams copied in ")
    assert lines[-1].endswith("(4 retained publication(s) of 3 stream(s), 1 failed)")
