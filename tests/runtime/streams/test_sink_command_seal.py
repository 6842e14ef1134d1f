"""Who may change a sink's subscriptions: whoever holds the gateway's backlog key
(docs/security.md, "Sink subscriptions"). Against a real in-process gateway (its
embedded queue manager, its broker, a ``memory`` sink on a ``sinks: owner`` stream):
commands arriving over a channel with the gateway's own user identifier, unsealed,
mis-sealed, stale, DeregAll, for a stream not ``sinks: owner``: all refused, dead-
lettered with MQRC_NOT_AUTHORIZED and counted; a sealed recent one is taken."""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from pathlib import Path

import pytest

from gateway.mq.embedded.context import process_user
from gateway.mq.port import GetOptions, MQError, OpenOption, PutOptions
from gateway.pubsub.options import RegOpt
from gateway.pubsub.streams import CONTROL_QUEUE
from gateway.pubsub.topics import Scheme
from gateway.runtime.app import GatewayApp
from gateway.runtime.backlog_seal import KEY_FILE
from gateway.runtime.sink_command_seal import seal_command
from gateway.runtime.streams.move_plan import MovedSink
from gateway.runtime.streams.move_sinks import sink_command
from gateway.wire.constants import ENC_NATIVE, MsgType
from gateway.wire.dlh import unwrap_from_dlq
from gateway.wire.folder import Element
from gateway.wire.formats import FMT_RF_HEADER_2
from gateway.wire.mqmd import MQMD
from gateway.wire.reasons import Reason
from gateway.wire.rfh2 import MQRFH2, encode_rfh2
from gateway.wire.xqh import wrap_for_xmitq
from tests.runtime.streams.test_move_sinks_cli import S, running, until, write_configs

BACKLOG = "SYSTEM.MQGW.SINK.mem"
OWNED = [("mem", "#", 0)]  # QMA's sink subscription to PRICES, made at its start


def subs(app: GatewayApp) -> list[tuple[str, str, str, int]]:
    assert app.service is not None
    return sorted((s.destination.sink, s.stream, s.topic, s.reg_opts)
                  for s in app.service.engine.subscriptions if s.destination.is_sink)


def regsub(topic: str, *, command: str = "RegSub", reg_opt: str = "NewPubsOnly",
           **md_fields: object) -> tuple[MQMD, bytes]:
    """An MQRFH2 sink command naming mem's backlog queue at QMA."""
    psc = Element("psc")
    psc.add("Command", command)
    if reg_opt:
        psc.add("RegOpt", reg_opt)
    if topic:
        psc.add("Topic", topic)
    psc.add("QMgrName", "QMA")
    psc.add("QName", BACKLOG)
    body = encode_rfh2(MQRFH2(folders=[psc]), ENC_NATIVE, ccsid=1208)
    md = MQMD(format=FMT_RF_HEADER_2, encoding=ENC_NATIVE, coded_char_set_id=1208,
              msg_type=MsgType.REQUEST, msg_id=os.urandom(24), reply_to_q="SINK.ANSWERS",
              reply_to_q_mgr="QMA")
    return dataclasses.replace(md, **md_fields), body  # type: ignore[arg-type]


def key_of(tmp: Path) -> bytes:
    return (tmp / "QMA" / "qm" / KEY_FILE).read_bytes()


async def put_local(app: GatewayApp, md: MQMD, body: bytes) -> None:
    """Put with all context set, as the move does."""
    assert app.qm is not None
    async with await app.qm.connect() as conn:
        h = await conn.open(CONTROL_QUEUE, OpenOption.OUTPUT | OpenOption.SET_ALL_CONTEXT)
        try:
            await h.put(md, body, PutOptions(set_all_context=True))
        finally:
            await h.close()


async def dead_letters(app: GatewayApp, want: int) -> list[tuple[int, bytes]]:
    """(MQDLH reason, original body) of the first ``want`` dead letters."""
    assert app.qm is not None
    dlq = app.qm.catalogue.qmgr.dead_letter_q_name
    out: list[tuple[int, bytes]] = []
    async with await app.qm.connect() as conn:
        h = await conn.open(dlq, OpenOption.INPUT_SHARED)
        try:
            deadline = time.monotonic() + 15
            while len(out) < want and time.monotonic() < deadline:
                try:
                    msg = await h.get(GetOptions(wait_ms=500))
                except MQError as exc:
                    if exc.reason == Reason.NO_MSG_AVAILABLE:
                        continue
                    raise
                dlh, _, body = unwrap_from_dlq(msg.md, msg.body)
                out.append((dlh.reason, body))
        finally:
            await h.close()
    return out


def refusals(app: GatewayApp) -> int:
    assert app.authoriser is not None
    return app.authoriser.refusals[("mq", "sink_subscription")]


async def test_a_command_over_a_channel_with_the_gateways_user_changes_no_sink(
    tmp_path: Path,
) -> None:
    """The reviewer's attack: a transmission-queue message for QMA's control queue,
    put with all context as a sender channel delivers it: the gateway's own user
    identifier, a ReplyToQMgr that is no neighbour."""
    cfgs = await write_configs(tmp_path)
    async with running({"QMA": cfgs["QMA"]}) as apps:
        app = apps["QMA"]
        assert subs(app) == [("mem", S, "#", 0)]
        attacks = [
            regsub("SYSTEM.SECRET/#", reg_opt=""),
            regsub(f"$SYS/STREAM/{S}/SECRET/#", reg_opt=""),
            regsub("", command="DeregSub", reg_opt="DeregAll"),
            regsub(f"$SYS/STREAM/{S}/#", command="DeregSub", reg_opt=""),
        ]
        assert app.qm is not None
        async with await app.qm.connect() as conn:
            for md, body in attacks:
                md.user_identifier = process_user()
                md.reply_to_q_mgr = "EVIL"
                xmd, xbody = wrap_for_xmitq(md, body, CONTROL_QUEUE, "QMA")
                await conn.deliver_transmission(xmd, xbody)
        got = await dead_letters(app, 8)  # each command, and each answer to EVIL
        commands = sorted(reason for reason, body in got if BACKLOG.encode() in body
                          and b"pscr" not in body)
        assert commands == [Reason.NOT_AUTHORIZED] * 4, got
        assert subs(app) == [("mem", S, "#", 0)]  # unchanged
        assert refusals(app) == 4


async def test_only_a_recent_sealed_command_for_an_owner_stream_is_taken(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="gateway.pubsub.handlers")
    cfgs = await write_configs(tmp_path)
    async with running({"QMA": cfgs["QMA"]}) as apps:
        app = apps["QMA"]
        assert app.qm is not None
        app.qm.run_mqsc("DEFINE QLOCAL(SINK.ANSWERS)", stop_on_error=True)
        key = key_of(tmp_path)
        # stale: sealed with the key, put 10 minutes ago (a captured command replayed)
        md, body = regsub(f"$SYS/STREAM/{S}/T/#")
        seal_command(key, md, body, time.time() - 600)
        await put_local(app, md, body)
        # mis-sealed: another key
        md, body = regsub(f"$SYS/STREAM/{S}/T/#")
        seal_command(os.urandom(32), md, body, time.time())
        await put_local(app, md, body)
        # a stream this node does not configure `sinks: owner` (the default stream)
        md, body = regsub("T/#")
        seal_command(key, md, body, time.time())
        await put_local(app, md, body)
        # DeregAll, sealed
        md, body = regsub(f"$SYS/STREAM/{S}/#", command="DeregSub", reg_opt="DeregAll")
        seal_command(key, md, body, time.time())
        await put_local(app, md, body)
        got = await dead_letters(app, 4)
        assert sorted(r for r, _ in got) == [Reason.NOT_AUTHORIZED] * 4, got
        assert refusals(app) == 4
        assert subs(app) == [("mem", S, "#", 0)]
        # sealed and recent: taken (as the move sends it)
        sub = MovedSink(q_mgr="QMA", sink="mem", topic="T/#", scheme=int(Scheme.TOPIC))
        md, body = sink_command(sub, S, register=True, q_mgr="QMA", reply_q="SINK.ANSWERS",
                                msg_id=os.urandom(24))
        seal_command(key, md, body, time.time())
        await put_local(app, md, body)
        await until(lambda: len(subs(app)) == 2, "the sealed RegSub taken")
        assert subs(app) == [("mem", S, "#", 0),
                             ("mem", S, "T/#", int(RegOpt.NEW_PUBLICATIONS_ONLY))]
        assert f"sink mem subscribed to 'T/#' on {S} by a sealed RegSub" in caplog.text
        assert refusals(app) == 4
        # whoever puts it, however it arrives: the seal is the authority (a DeregSub
        # over a channel with a user that is not the gateway's)
        md, body = sink_command(sub, S, register=False, q_mgr="QMA", reply_q="SINK.ANSWERS",
                                msg_id=os.urandom(24))
        md.user_identifier = "nobody"
        seal_command(key, md, body, time.time())
        async with await app.qm.connect() as conn:
            await conn.deliver_transmission(*wrap_for_xmitq(md, body, CONTROL_QUEUE, "QMA"))
        await until(lambda: len(subs(app)) == 1, "the sealed DeregSub taken")
        assert subs(app) == [("mem", S, "#", 0)]
        assert refusals(app) == 4
