"""BrokerService failure paths: an unusable dead-letter queue, an idle port that never
suspends, reconnect failures, bad stream queue names, the CLI's config errors and what a
failing sink does (only its backlog message backs out)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from pathlib import Path

import pytest
from pydantic import ValidationError

from gateway.mq.embedded.qmgr import EmbeddedQueueManager
from gateway.mq.port import Connection, MQError, OpenOption, QueueHandle
from gateway.plugin_api import Envelope
from gateway.pubsub.errors import CommandError
from gateway.pubsub.streams import resolve_stream
from gateway.runtime.backlog_format import backlog_queue_name
from gateway.runtime.pubsub_service import BrokerConfig, BrokerService, StreamQueueConfig
from gateway.runtime.pubsub_service.cli import main
from gateway.wire.constants import MsgType
from gateway.wire.reasons import Reason
from tests.support.pubsub_messages import CONTROL, rfh_message
from tests.support.service_client import drain, drain_raw, put, settle

DLQ = "SYSTEM.DEAD.LETTER.QUEUE"


async def test_unusable_dlq_blocks_logs_and_counts_nothing_until_fixed(
    qm: EmbeddedQueueManager, service: BrokerService, caplog: pytest.LogCaptureFixture
) -> None:
    qm.run_mqsc(f"ALTER QLOCAL({DLQ}) PUT(DISABLED)", stop_on_error=True)
    # a malformed command: answered and dead-lettered
    await put(
        qm,
        rfh_message(
            CONTROL, [("MQPSCommand", "Bogus")], reply_to_q="REPLY.Q", msg_type=MsgType.REQUEST
        ),
    )
    with caplog.at_level(logging.WARNING, logger="gateway.runtime.pubsub_service.service"):
        deadline = time.monotonic() + 5
        while service.counters.dead_letter_failures < 2 and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
    assert service.counters.dead_letter_failures >= 2
    assert service.counters.dead_lettered == 0  # nothing was dead-lettered
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert errors and DLQ in errors[0].getMessage()
    assert str(int(Reason.PUT_INHIBITED)) in errors[0].getMessage()
    assert not any("dead-lettered" in r.getMessage() for r in caplog.records)
    assert await drain(qm, "REPLY.Q") == []  # the response was backed out with it
    # the operator fixes the DLQ: the message goes through, counted once
    qm.run_mqsc(f"ALTER QLOCAL({DLQ}) PUT(ENABLED)", stop_on_error=True)
    await settle(qm, service, CONTROL, timeout=20)
    assert service.counters.dead_lettered == 1, (service.counters, qm.queue_depth(CONTROL))
    dead = await drain_raw(qm, DLQ)
    assert len(dead) == 1, "the malformed command must be on the dead-letter queue"
    assert dead[0].md.format == "MQDEAD"
    replies = await drain(qm, "REPLY.Q")  # the negative response, committed with it
    assert [r.get("MQPSCompCode") for r in replies] == ["2"]


async def test_unusable_backout_queue_is_not_counted_as_a_move(
    qm: EmbeddedQueueManager, service: BrokerService
) -> None:
    """A sink's poison backlog message cannot be moved while its BOQNAME refuses puts:
    nothing is counted as moved until the operator fixes the queue, then exactly once."""
    qm.run_mqsc("ALTER QLOCAL(PUB.BACKOUT) PUT(DISABLED)", stop_on_error=True)
    failing = RaisingSink()
    service.register_sink("bad", failing)  # defines its backlog queue
    qm.run_mqsc(
        f"ALTER QLOCAL('{backlog_queue_name('bad')}') BOTHRESH(1) BOQNAME(PUB.BACKOUT)",
        stop_on_error=True,
    )
    await service.stop()
    await service.start()  # the forwarder re-reads BOTHRESH/BOQNAME
    await service.subscribe_sink("bad", "$SYS/STREAM/StreamX/poison")
    await put(qm, rfh_message("StreamX", [("MQPSCommand", "Publish"), ("MQPSTopic", "poison")]))
    deadline = time.monotonic() + 5
    while service.counters.dead_letter_failures < 1 and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
    assert service.counters.dead_letter_failures >= 1
    assert service.counters.moved_to_backout_queue == 0
    qm.run_mqsc("ALTER QLOCAL(PUB.BACKOUT) PUT(ENABLED)", stop_on_error=True)
    deadline = time.monotonic() + 20
    while service.counters.moved_to_backout_queue < 1 and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
    assert len(await drain_raw(qm, "PUB.BACKOUT")) == 1
    assert service.counters.moved_to_backout_queue == 1
    assert qm.queue_depth("StreamX") == 0  # the stream itself never waited


async def test_start_logs_the_dlq_and_its_origin(
    qm: EmbeddedQueueManager, config: BrokerConfig, caplog: pytest.LogCaptureFixture
) -> None:
    from gateway.pubsub.engine import PubSubEngine
    from gateway.pubsub.store import MemoryStore

    config.dead_letter_queue = "MY.DLQ"
    svc = BrokerService(qm, PubSubEngine(qm.name, MemoryStore()), config)
    with caplog.at_level(logging.INFO, logger="gateway.runtime.pubsub_service.service"):
        await svc.start()
        await asyncio.sleep(0.1)
        await svc.stop()
    lines = [r.getMessage() for r in caplog.records if "dead-letter queue" in r.getMessage()]
    assert any(CONTROL in line for line in lines)
    # the embedded QM answers DEADQ itself; otherwise the setting is named as the origin
    assert all(("DEADQ" in line) or ("MY.DLQ" in line) for line in lines)


async def test_an_idle_port_that_never_suspends_does_not_freeze_the_loop(
    qm: EmbeddedQueueManager, service: BrokerService
) -> None:
    service.config.wait_ms = 0  # bypasses validation: a port returning 2033 at once
    ticks = 0
    stop_at = time.monotonic() + 0.5
    while time.monotonic() < stop_at and ticks < 1000:
        await asyncio.sleep(0.01)
        ticks += 1
    assert ticks >= 10  # the loop kept running other tasks


def test_config_refuses_wait_ms_zero_and_slash_in_stream_queue() -> None:
    with pytest.raises(ValidationError):
        BrokerConfig(wait_ms=0)
    with pytest.raises(ValidationError):
        StreamQueueConfig(name="A/B")
    assert StreamQueueConfig(name="Stream.X_1%").name == "Stream.X_1%"


def test_resolve_stream_refuses_a_queue_name_with_a_slash() -> None:
    with pytest.raises(CommandError) as err:
        resolve_stream(None, "A/B", True, is_stream_command=True)
    assert err.value.reason == Reason.STREAM_ERROR
    assert resolve_stream(None, "A.B", True, is_stream_command=True) == "A.B"


def test_cli_bad_batch_size_is_one_line_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["--qmgr", "QM1", "--qmgr-path", str(tmp_path / "qm"), "--store"]
    assert main([*args, str(tmp_path / "s.db"), "--batch-size", "0"]) == 2
    err = capsys.readouterr().err.strip()
    assert "batch_size" in err and "\n" not in err and "Traceback" not in err


class _TrackingConnection:
    """Delegates to a real connection; ``open`` of ``fail_queue`` fails once."""

    def __init__(self, inner: Connection, owner: _TrackingQM) -> None:
        self.inner = inner
        self.owner = owner
        self.disconnected = False

    @property
    def q_mgr_name(self) -> str:
        return self.inner.q_mgr_name

    async def open(self, q_name: str, options: OpenOption, q_mgr_name: str = "") -> QueueHandle:
        if self.owner.fail_opens > 0:
            self.owner.fail_opens -= 1
            raise MQError(Reason.UNKNOWN_OBJECT_NAME, "injected")
        return await self.inner.open(q_name, options, q_mgr_name)

    async def disconnect(self) -> None:
        self.disconnected = True
        await self.inner.disconnect()

    def __getattr__(self, name: str) -> object:
        return getattr(self.inner, name)


class _TrackingQM:
    def __init__(self, inner: EmbeddedQueueManager) -> None:
        self.inner = inner
        self.name = inner.name
        self.fail_opens = 0
        self.connections: list[_TrackingConnection] = []

    async def connect(self) -> _TrackingConnection:
        conn = _TrackingConnection(await self.inner.connect(), self)
        self.connections.append(conn)
        return conn


async def test_reconnect_disconnects_a_connection_whose_open_failed(
    qm: EmbeddedQueueManager, config: BrokerConfig
) -> None:
    from gateway.pubsub.engine import PubSubEngine
    from gateway.pubsub.store import MemoryStore

    tqm = _TrackingQM(qm)
    config.reconnect_delay = 0.0  # the public seam: no pause between attempts
    svc = BrokerService(tqm, PubSubEngine(qm.name, MemoryStore()), config)  # type: ignore[arg-type]
    old = await tqm.connect()
    q = await svc._open_input(old, "StreamX", True)
    tqm.fail_opens = 2
    new, q2 = await svc._reconnect(old, q)
    failed = tqm.connections[1:3]
    assert len(failed) == 2 and all(c.disconnected for c in failed)
    assert new is tqm.connections[3] and not new.disconnected
    await q2.handle.close()
    await new.disconnect()


class RaisingSink:
    def __init__(self) -> None:
        self.calls = 0
        self.failed = asyncio.Event()

    async def send(self, deliveries: Sequence[Envelope]) -> None:
        self.calls += 1
        self.failed.set()
        raise ValueError("poison for this sink")


def _regsub_streamx(topic: str) -> object:
    pairs = [
        ("MQPSCommand", "RegSub"),
        ("MQPSTopic", topic),
        ("MQPSQName", "SUB.Q"),
        ("MQPSStreamName", "StreamX"),
    ]
    return rfh_message(CONTROL, pairs)


async def test_raising_sink_backs_its_backlog_message_out_not_the_stream(
    qm: EmbeddedQueueManager, service: BrokerService
) -> None:
    """A sink raising (not retriably) backs out its own backlog message (BackoutCount
    + 1); the publication's MQ delivery is committed once, the stream is not held."""
    await put(qm, _regsub_streamx("bad/1"))  # type: ignore[arg-type]
    await settle(qm, service, CONTROL)
    sink = RaisingSink()
    service.register_sink("bad", sink)
    await service.subscribe_sink("bad", "$SYS/STREAM/StreamX/bad/1")
    service.config.retry_delay = 5.0  # hold the next attempt while we look
    await service.stop()
    await service.start()  # the forwarder takes the new retry_delay
    await put(
        qm, rfh_message("StreamX", [("MQPSCommand", "Publish"), ("MQPSTopic", "bad/1")], b"b")
    )
    await asyncio.wait_for(sink.failed.wait(), 5)
    await asyncio.sleep(0.1)
    await service.stop()
    assert sink.calls == 1
    assert await drain_raw(qm, "StreamX") == []
    [back] = await drain_raw(qm, backlog_queue_name("bad"))
    assert back.md.backout_count == 1 and back.body.endswith(b"b")
    assert [m.payload for m in await drain(qm, "SUB.Q")] == [b"b"]  # delivered once
