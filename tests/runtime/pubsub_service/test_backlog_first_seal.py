"""The first start of a version with the backlog seal on backlogs an older version filled
(an upgrade, typically while a target was down): what is on the backlogs is sealed in
place before anything is forwarded, so every message is delivered, in order, and none
is dead-lettered (gateway/runtime/pubsub_service/first_seal.py).

The old backlog messages are made the way the release before the seal made them (its
``put_of``: Format ``MQGWENV1``, no AccountingToken), on a data directory without a
``backlog.key``; the gateway is ``mqgw run``'s app with the memory plugin as the sink.
"""

from __future__ import annotations

import logging
import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from gateway.mq.embedded.qmgr import EmbeddedQueueManager
from gateway.mq.ibmmq import IBMMQConfig, IBMMQQueueManager
from gateway.mq.port import (
    Browse,
    GetOptions,
    MQError,
    OpenOption,
    PutOptions,
    QueueManager,
)
from gateway.plugin_api import Envelope
from gateway.runtime.app import GatewayApp
from gateway.runtime.backlog_format import (
    BACKLOG_FORMAT,
    backlog_msg_id,
    backlog_queue_name,
    encode_backlog_message,
)
from gateway.runtime.backlog_seal import (
    KEY_FILE,
    KEY_SIZE,
    NEW_KEY_FILE,
    BacklogSeal,
    keep_new_key,
    load_backlog_seal,
)
from gateway.runtime.config import parse_config
from gateway.runtime.pubsub_service.first_seal import CHUNK, seal_in_place
from gateway.runtime.registry import PluginRegistry
from gateway.wire.constants import Persistence
from gateway.wire.mqmd import MQMD
from gateway.wire.reasons import Reason
from plugins.memory import get_bus, reset_buses
from tests.support.mqi_standin import StandIn
from tests.support.pubsub_messages import rfh_message

STOCK = "STOCK.STREAM"
SINK = "mem"
BACKLOG = backlog_queue_name(SINK)
DLQ = "SYSTEM.DEAD.LETTER.QUEUE"


def _define_backlog(max_depth: int = 100_000) -> str:
    """The backlog queue as the release before the seal defined it."""
    return (
        f"DEFINE QLOCAL('{BACKLOG}') DEFPSIST(YES) USAGE(NORMAL) MAXDEPTH({max_depth}) "
        f"MAXMSGL(104857600) DESCR('mqgw backlog of sink {SINK}') REPLACE"
    )


def _old_backlog_message(i: int) -> tuple[MQMD, bytes]:
    """Backlog message ``i`` as the release before the seal put it (its ``put_of``)."""
    md = MQMD(
        msg_id=backlog_msg_id(),
        format=BACKLOG_FORMAT,
        persistence=Persistence.PERSISTENT,
        priority=0,
        put_appl_name="old-publisher",
        put_date="20261101",
        put_time=f"1200{i % 100:02d}00",
        user_identifier="olduser",
    )
    body = encode_backlog_message(
        Envelope(stream=STOCK, topic=f"PRICE/{i}", payload=f"old-{i:05d}".encode())
    )
    return md, body


async def _put_old(qm: QueueManager, messages: list[tuple[MQMD, bytes]]) -> None:
    conn = await qm.connect()
    try:
        backlog = await conn.open(BACKLOG, OpenOption.OUTPUT | OpenOption.SET_ALL_CONTEXT)
        for n, (md, body) in enumerate(messages, 1):
            await backlog.put(md, body, PutOptions(syncpoint=True, set_all_context=True))
            if n % 500 == 0:
                await conn.commit()
        await conn.commit()
    finally:
        await conn.disconnect()


async def _old_data_dir(data_dir: Path, messages: list[tuple[MQMD, bytes]]) -> None:
    """A data directory the release before the seal left: the stream, the sink's backlog
    full of ``messages`` (its target was down: MAXDEPTH reached), no backlog key."""
    qm = EmbeddedQueueManager("QM1", data_dir)
    try:
        qm.run_mqsc(f"DEFINE QLOCAL('{STOCK}') DEFPSIST(YES) REPLACE", stop_on_error=True)
        qm.run_mqsc(_define_backlog(len(messages)), stop_on_error=True)
        await _put_old(qm, messages)
    finally:
        await qm.close()
    assert not (data_dir / KEY_FILE).exists()


def _app(tmp_path: Path) -> GatewayApp:
    registry = PluginRegistry.from_entry_points()
    data = {
        "broker": {"streams": [{"name": STOCK}], "wait_ms": 50},
        "metrics": {"enabled": False},
        "plugins": [
            {
                "name": SINK,
                "plugin": "memory",
                "config": {"bus": SINK, "subscribe": [f"$SYS/STREAM/{STOCK}/#"]},
            }
        ],
    }
    return GatewayApp(parse_config(data, registry, base_dir=tmp_path), registry)


async def _publish(app: GatewayApp, payload: bytes) -> None:
    assert app.qm is not None
    msg = rfh_message(STOCK, [("MQPSCommand", "Publish"), ("MQPSTopic", "PRICE/NEW")], payload)
    msg.md.persistence = Persistence.PERSISTENT
    conn = await app.qm.connect()
    try:
        await conn.put1(STOCK, msg.md, msg.body, PutOptions())
    finally:
        await conn.disconnect()


@pytest.fixture
def buses() -> Iterator[None]:
    reset_buses()
    yield
    reset_buses()


async def test_an_upgrade_delivers_what_an_older_version_left_on_a_backlog(
    tmp_path: Path, buses: None, caplog: pytest.LogCaptureFixture
) -> None:
    """250 unsealed messages (more than two units of work of the sealing) filling the
    backlog of a data directory without a key: all delivered in order, then a
    publication made after the start (held until the backlog has room); nothing
    dead-lettered; the key kept under its name."""
    n = 2 * CHUNK + 50
    data_dir = tmp_path / "data" / "qm"
    await _old_data_dir(data_dir, [_old_backlog_message(i) for i in range(n)])
    app = _app(tmp_path)
    with caplog.at_level(logging.INFO, logger="gateway.runtime.pubsub_service.sink_backlogs"):
        await app.start()
    try:
        await _publish(app, b"new")
        records = await get_bus(SINK).wait_for(n + 1, timeout=30)
        assert [r.payload for r in records] == [
            *(f"old-{i:05d}".encode() for i in range(n)), b"new"
        ]
        assert app.qm is not None
        assert app.qm.queue_depth(DLQ) == 0  # type: ignore[attr-defined]
        counters = app.service.sink_backlogs.counters()[SINK]  # type: ignore[union-attr]
        assert counters.dead_lettered == {}
    finally:
        await app.shutdown()
    key = data_dir / KEY_FILE
    assert len(key.read_bytes()) == KEY_SIZE and (key.stat().st_mode & 0o777) == 0o600
    assert not (data_dir / NEW_KEY_FILE).exists()
    said = [r.getMessage() for r in caplog.records if "backlog key made" in r.getMessage()]
    assert len(said) == 1 and f": {n} message(s)" in said[0], said


async def test_a_start_cut_short_while_sealing_is_finished_in_order(
    tmp_path: Path, buses: None
) -> None:
    """What a start killed after its first sealed unit of work leaves: the new key still
    under ``backlog.key.new``, the first messages sealed with it and moved behind the
    others. The next start seals only the rest, so the original order comes back."""
    n, done = 30, 10
    data_dir = tmp_path / "data" / "qm"
    data_dir.mkdir(parents=True)
    key = os.urandom(KEY_SIZE)
    (data_dir / NEW_KEY_FILE).write_bytes(key)
    seal = BacklogSeal(key)
    messages = [_old_backlog_message(i) for i in range(n)]
    for md, body in messages[:done]:
        md.accounting_token = seal.seal(body)
    await _old_data_dir(data_dir, messages[done:] + messages[:done])
    app = _app(tmp_path)
    await app.start()
    try:
        records = await get_bus(SINK).wait_for(n, timeout=30)
        assert [r.payload for r in records] == [f"old-{i:05d}".encode() for i in range(n)]
        assert app.qm is not None
        assert app.qm.queue_depth(DLQ) == 0  # type: ignore[attr-defined]
    finally:
        await app.shutdown()
    assert (data_dir / KEY_FILE).read_bytes() == key
    assert not (data_dir / NEW_KEY_FILE).exists()


def test_a_new_key_is_kept_only_after_the_sealing(tmp_path: Path) -> None:
    """Made as ``backlog.key.new`` (0600), found again by the next load until kept, then
    ``backlog.key``; a first name left behind by a stop right after keeping it goes."""
    made = load_backlog_seal(tmp_path)
    new = tmp_path / NEW_KEY_FILE
    assert made.new_in == tmp_path and not made.interrupted
    assert (new.stat().st_mode & 0o777) == 0o600 and not (tmp_path / KEY_FILE).exists()
    again = load_backlog_seal(tmp_path)
    assert again.key == made.key and again.interrupted
    keep_new_key(again)
    assert again.new_in is None and not new.exists()
    assert (tmp_path / KEY_FILE).read_bytes() == made.key
    new.write_bytes(made.key)  # stopped between the link and the unlink
    kept = load_backlog_seal(tmp_path)
    assert kept.key == made.key and kept.new_in is None and not new.exists()


# ------------------------------------------------ through the port, IBM MQ alike ----


@pytest.fixture(params=["embedded", "ibmmq"])
async def port(
    request: pytest.FixtureRequest, tmp_path: Path
) -> AsyncIterator[tuple[QueueManager, EmbeddedQueueManager]]:
    """The sealing's queue manager: the embedded one, or the IBM MQ adapter over the
    stand-in MQI (tests/support/mqi_standin.py); and the embedded queue manager that
    runs its MQSC."""
    if request.param == "embedded":
        qm = EmbeddedQueueManager("QM1", tmp_path / "qm")
        try:
            yield qm, qm
        finally:
            await qm.close()
        return
    standin = StandIn(tmp_path / "qm")
    try:
        yield IBMMQQueueManager(IBMMQConfig(q_mgr_name="STANDIN"), mqi=standin.module), standin.qm
    finally:
        standin.close()


async def _browse_all(qm: QueueManager) -> list[tuple[MQMD, bytes]]:
    conn = await qm.connect()
    out: list[tuple[MQMD, bytes]] = []
    try:
        q = await conn.open(BACKLOG, OpenOption.BROWSE)
        how = Browse.FIRST
        while True:
            try:
                m = await q.get(GetOptions(browse=how))
            except MQError as exc:
                assert exc.reason == Reason.NO_MSG_AVAILABLE
                return out
            out.append((m.md, m.body))
            how = Browse.NEXT
    finally:
        await conn.disconnect()


@pytest.mark.parametrize("resuming", [False, True])
async def test_sealing_keeps_order_ids_and_context_through_the_port(
    port: tuple[QueueManager, EmbeddedQueueManager], resuming: bool
) -> None:
    """A full backlog (MAXDEPTH reached) turned over through the port: each message
    got and put back sealed, in order, its ids and context kept."""
    qm, mqsc = port
    n = CHUNK + 7
    mqsc.run_mqsc(_define_backlog(n), stop_on_error=True)
    messages = [_old_backlog_message(i) for i in range(n)]
    seal = BacklogSeal(os.urandom(KEY_SIZE))
    done = 0
    if resuming:  # a start cut short after its first unit of work
        done = CHUNK
        for md, body in messages[:done]:
            md.accounting_token = seal.seal(body)
    await _put_old(qm, messages[done:] + messages[:done])
    sealed = await seal_in_place(qm, [BACKLOG, "SYSTEM.MQGW.SINK.GONE"], seal,
                                 resuming=resuming)
    assert sealed == {BACKLOG: n - done, "SYSTEM.MQGW.SINK.GONE": 0}
    after = await _browse_all(qm)
    assert len(after) == n
    for (md, body), (old_md, old_body) in zip(after, messages, strict=True):
        assert body == old_body
        assert md.msg_id == old_md.msg_id and md.format == BACKLOG_FORMAT
        assert seal.refusal(md, body) == 0
        assert (md.user_identifier.strip(), md.put_appl_name.strip()) == (
            "olduser", "old-publisher")
        assert (md.put_date, md.put_time) == (old_md.put_date, old_md.put_time)
        assert md.persistence == Persistence.PERSISTENT and md.priority == 0
