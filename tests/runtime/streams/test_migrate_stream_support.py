"""``mqgw migrate --from-broker OLD`` without ``--from-streams``: the stream set is read
from OLD's retained ``MQ/OLD<padding>/StreamSupport`` publication (PCF) on its admin
stream, asked over 127.0.0.1 channels with a RegSub/DeregSub; no answer is exit 2 naming
what to check."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from gateway.devstack.ports import free_port
from gateway.mq.embedded.network import QueueManagerNode
from gateway.mq.port import OpenOption, PutOptions
from gateway.pubsub.streams import ADMIN_STREAM, DEFAULT_STREAM
from gateway.runtime.cli import main
from gateway.runtime.neighbours.stream_support import stream_support_command
from gateway.runtime.pubsub_service import BrokerConfig, StreamQueueConfig
from gateway.runtime.streams.broker_query import MIGRATION_QUEUE
from tests.runtime.streams.streams_helpers import queue_contents
from tests.support.gateway import build_gateway
from tests.support.pubsub_messages import rfh_message

S, T = "STOCK.STREAM", "BOND.STREAM"


def _gateway_config(tmp: Path, p_old: int, streams: list[str]) -> Path:
    (tmp / "channels.mqsc").write_text(
        "DEFINE QLOCAL(OLD) USAGE(XMITQ) REPLACE\n"
        f"DEFINE CHANNEL(GW.TO.OLD) CHLTYPE(SDR) CONNAME('127.0.0.1({p_old})') XMITQ(OLD) "
        "REPLACE\n"
        "DEFINE CHANNEL(OLD.TO.GW) CHLTYPE(RCVR) REPLACE\n"
    )
    cfg = tmp / "gateway.yaml"
    names = ", ".join(f"{{name: {s}}}" for s in streams)
    cfg.write_text(
        "queue_manager: {name: GW, data_dir: qm, mqsc_file: channels.mqsc}\n"
        f"broker: {{store: pubsub.db, streams: [{names}]}}\n"
        "metrics: {enabled: false}\n"
    )
    return cfg


def test_stream_set_read_from_the_brokers_stream_support(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    p_old, p_gw = free_port(), free_port()
    cfg = _gateway_config(tmp_path, p_old, [S, T])
    old_mqsc = (
        "DEFINE QLOCAL(GW) USAGE(XMITQ)\n"
        f"DEFINE CHANNEL(OLD.TO.GW) CHLTYPE(SDR) CONNAME('127.0.0.1({p_gw})') XMITQ(GW)\n"
        "DEFINE CHANNEL(GW.TO.OLD) CHLTYPE(RCVR)\n"
        f"DEFINE QLOCAL('{S}') DEFPSIST(YES)\nDEFINE QLOCAL('{T}') DEFPSIST(YES)\n"
    )
    migrate = [
        "migrate", "--config", str(cfg), "--from-broker", "OLD",
        "--listen", str(p_gw), "--timeout", "10",
    ]  # fmt: skip

    async def run() -> tuple[int, str, int]:
        async with QueueManagerNode(
            "OLD", tmp_path / "old" / "qm", mqsc=old_mqsc, port=p_old
        ) as node:
            old = build_gateway(
                tmp_path / "old",
                qm=node.qm,
                mqsc="",
                # the admin stream queue is serviced here so the retained publication
                # put on it below is kept (the service does not read it by default)
                config=BrokerConfig(
                    streams=[StreamQueueConfig(name=n) for n in (S, T, ADMIN_STREAM)],
                    wait_ms=50,
                ),
            )
            await old.service.start()
            try:
                # the broker answers, but publishes no StreamSupport (yet): exit 2, said
                first = await asyncio.to_thread(main, migrate)
                first_err = capsys.readouterr().err

                conn = await node.qm.connect()
                h = await conn.open(ADMIN_STREAM, OpenOption.OUTPUT)
                # OLD's retained StreamSupport, as the neighbour links publish a
                # gateway's own: the PCF publication behind an MQRFH Publish (RetainPub)
                cmd = stream_support_command("OLD", (DEFAULT_STREAM, S, T, ADMIN_STREAM))
                assert cmd.queue == ADMIN_STREAM
                await h.put(cmd.md, cmd.body, PutOptions())
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
                    while node.qm.queue_depth(ADMIN_STREAM) or node.qm.queue_depth(S):
                        await asyncio.sleep(0.05)
                await asyncio.sleep(0.3)
                code = await asyncio.to_thread(main, [*migrate, "--copy-retained"])
                # the DeregSub left nothing registered at the old broker
                async with asyncio.timeout(10):
                    while old.service.engine.subscriptions:
                        await asyncio.sleep(0.05)
                return first, first_err, code
            finally:
                await old.service.stop()
                old.store.close()
                old.service.forgiven.close()

    first, first_err, code = asyncio.run(run())
    assert first == 2
    assert "sent no retained StreamSupport publication" in first_err, first_err
    out, err = capsys.readouterr()
    assert code == 0, out + err
    assert f"OLD publishes StreamSupport: {T}, {S}, {DEFAULT_STREAM}" in out
    record = json.loads((tmp_path / "migration.json").read_text())
    assert record["from_q_mgr"] == "OLD"
    assert record["streams"] == sorted([DEFAULT_STREAM, S, T])  # not the admin stream
    assert record["retained_copied"] == 1
    assert queue_contents(tmp_path, MIGRATION_QUEUE) == []


def test_no_answer_names_the_channel_and_transmission_queue(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = _gateway_config(tmp_path, free_port(), [S])  # nothing listens there
    args = [
        "migrate", "--config", str(cfg), "--from-broker", "OLD",
        "--listen", str(free_port()), "--timeout", "1",
    ]  # fmt: skip
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "broker OLD did not answer RegSub within 1 s" in err, err
    # the RegSub and the DeregSub sent behind it (in case the RegSub arrives late)
    assert "sender channel GW.TO.OLD of transmission queue OLD (2 message(s) waiting" in err
    assert "OLD's channel back to GW (our receiver channel(s): OLD.TO.GW)" in err
    assert not (tmp_path / "migration.json").exists()

    # a broker no transmission queue reaches
    args[args.index("OLD")] = "ELSEWHERE"
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "cannot ask ELSEWHERE" in err and "QLOCAL(ELSEWHERE) USAGE(XMITQ)" in err, err
    assert not (tmp_path / "migration.json").exists()
