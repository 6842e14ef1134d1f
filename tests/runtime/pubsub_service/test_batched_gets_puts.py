"""The broker service's batched gets and backlog puts (issue 16) give what the single
gets and single backlog puts gave: same queue contents, order, MQDLH reasons, backout
counts and units of work, at the syncpoint limit and with a poison message inside a
batch. Each scenario runs twice, batched (as shipped) and with the old paths restored
(the handle's ``syncpoint_taker`` hidden, backlog puts kept out of ``put_many``), and
the outcomes are compared."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from gateway.mq.embedded.handle import EmbeddedQueueHandle
from gateway.mq.embedded.qmgr import EmbeddedQueueManager
from gateway.mq.port import GetOptions, MQError, OpenOption
from gateway.plugin_api import Envelope
from gateway.pubsub.topics import Scheme
from gateway.runtime.backlog_format import backlog_queue_name, decode_backlog_message
from gateway.runtime.pubsub_service import BrokerConfig, BrokerService, StreamQueueConfig
from gateway.runtime.pubsub_service import dead_letter as dead_letter_module
from gateway.runtime.pubsub_service.dead_letter import Put, put_all
from gateway.runtime.pubsub_service.errors import BacklogFullError
from gateway.wire.constants import Persistence
from gateway.wire.dlh import unwrap_from_dlq
from gateway.wire.mqmd import MQMD
from gateway.wire.reasons import Reason
from tests.runtime.pubsub_service.conftest import QUEUES
from tests.support.gateway import build_gateway
from tests.support.pubsub_messages import CONTROL, decode, rfh_message
from tests.support.service_client import drain_raw, put, settle

DLQ = "SYSTEM.DEAD.LETTER.QUEUE"
SINK = "mem"
FAN = ("SUB.Q", "SUB2.Q", "SUB.SAME")  # three MQ subscribers of fan/a
#: a fan/a publication counts 5 in its unit (its get, 3 puts, 1 sink delivery): the
#: limit ends batches of 2
MAX_PUTS = 7


@contextmanager
def old_paths(monkeypatch: pytest.MonkeyPatch, old: bool) -> Iterator[None]:
    """Within: the single get per message and the single backlog put, if ``old``."""
    with monkeypatch.context() as mp:
        if old:
            mp.delattr(EmbeddedQueueHandle, "syncpoint_taker")
            # put_all's run test before backlog puts joined put_many (what connections
            # whose puts are round trips still use)
            mp.setattr(dead_letter_module, "_plain", dead_letter_module._plain_delivery)
        yield


class Sink:
    async def send(self, deliveries: Sequence[Envelope]) -> None:
        raise AssertionError("no forwarder runs in these tests")


def regsub(topic: str, queue: str) -> Any:
    return rfh_message(
        CONTROL,
        [
            ("MQPSCommand", "RegSub"),
            ("MQPSTopic", topic),
            ("MQPSQName", queue),
            ("MQPSStreamName", "StreamX"),
        ],
    )


def publication(topic: str, payload: bytes) -> Any:
    return rfh_message(
        "StreamX",
        [("MQPSCommand", "Publish"), ("MQPSTopic", topic)],
        payload,
        persistence=Persistence.PERSISTENT,
    )


async def back_out(qm: EmbeddedQueueManager, queue: str, msg_id: bytes, times: int) -> None:
    """Get ``msg_id`` under syncpoint and back it out ``times`` times (BackoutCount)."""
    async with await qm.connect() as conn:
        handle = await conn.open(queue, OpenOption.INPUT_SHARED)
        for _ in range(times):
            await handle.get(GetOptions(wait_ms=0, syncpoint=True, match_msg_id=msg_id))
            await conn.backout()
        await handle.close()


async def outcome(qm: EmbeddedQueueManager, service: BrokerService) -> dict[str, object]:
    """Everything the scenario left: queues in order, MQDLH reasons, counters."""
    out: dict[str, object] = {}
    for q in (*FAN, "SUB.OTHER"):
        out[q] = [(decode(m.md, m.body).payload, m.md.persistence) for m in await drain_raw(qm, q)]
    dlq: list[tuple[int, str, int, object]] = []
    backlog_q = backlog_queue_name(SINK)
    for m in await drain_raw(qm, DLQ):
        dlh, md, body = unwrap_from_dlq(m.md, m.body)
        dest = dlh.dest_q_name.strip()
        # a backlog message's envelope carries the publication's time: compare the rest
        what: object = body
        if dest == backlog_q:
            e = decode_backlog_message(body)
            what = (e.topic, e.payload)
        dlq.append((dlh.reason, dest, md.backout_count, what))
    out["dlq"] = dlq
    out["boq"] = [(m.body, m.md.backout_count) for m in await drain_raw(qm, "PUB.BACKOUT")]
    backlog = []
    for m in await drain_raw(qm, backlog_queue_name(SINK)):
        e = decode_backlog_message(m.body)
        backlog.append((e.topic, e.payload, m.md.persistence, m.md.priority))
    out["backlog"] = backlog
    c = service.counters  # batches: see unit_sizes (the control queue's vary with timing)
    out["counters"] = (
        c.messages, c.backouts, c.moved_to_backout_queue, c.dead_lettered,
        c.sink_deliveries, c.backlog_full,
    )
    return out


async def scenario(
    path: Path, *, boqname: bool, inhibit_backlog: bool, poison: int
) -> dict[str, object]:
    """Three fan/a subscribers, one of one/b, a sink on the whole stream (its backlog
    filled, not forwarded); 24 publications got in batches the put limit ends; the
    ``poison``-th backed out to BOTHRESH first (moved to BOQNAME, or the DLQ behind an
    MQDLH); a publication with no topic (the engine dead-letters it)."""
    mqsc = QUEUES + "ALTER QLOCAL('StreamX') BOTHRESH(2)" + (
        " BOQNAME(PUB.BACKOUT)\n" if boqname else "\n"
    )
    config = BrokerConfig(
        streams=[StreamQueueConfig(name="StreamX", implicit_stream_naming=True)],
        wait_ms=50,
        retry_delay=0.01,
        max_puts_per_unit=MAX_PUTS,
    )
    gw = build_gateway(path, mqsc=mqsc, config=config)
    qm, service = gw.qm, gw.service
    try:
        service.sink_backlogs.remote.add(SINK)  # its backlog filled here, never forwarded
        service.register_sink(SINK, Sink())
        await service.start()
        await service.subscribe_sink(SINK, "$SYS/STREAM/StreamX/#", scheme=Scheme.TOPIC)
        for q in FAN:
            await put(qm, regsub("fan/a", q))
        await put(qm, regsub("one/b", "SUB.OTHER"))
        await settle(qm, service)
        await service.stop()
        if inhibit_backlog:
            qm.run_mqsc(f"ALTER QLOCAL('{backlog_queue_name(SINK)}') PUT(DISABLED)",
                        stop_on_error=True)
        ids = []
        for i in range(24):
            if i == 11:
                msg = rfh_message("StreamX", [("MQPSCommand", "Publish")], b"no topic")
            else:
                msg = publication("fan/a" if i % 3 else "one/b", b"p%02d" % i)
            ids.append(await put(qm, msg))
        await back_out(qm, "StreamX", ids[poison], 2)
        before = (service.counters.batches, service.counters.messages)
        await service.start()
        await settle(qm, service, "StreamX")
        await service.stop()
        assert qm.queue_depth("StreamX") == 0
        result = await outcome(qm, service)
        result["unit_sizes"] = (
            service.counters.batches - before[0], service.counters.messages - before[1]
        )
        return result
    finally:
        await gw.close()


@pytest.mark.parametrize(
    ("boqname", "inhibit_backlog", "poison"),
    [(True, False, 5), (False, False, 7), (True, True, 1)],
    ids=["poison-to-boqname", "poison-to-dlq", "backlog-put-inhibited"],
)
async def test_batched_service_gives_the_single_get_and_put_outcome(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    boqname: bool,
    inhibit_backlog: bool,
    poison: int,
) -> None:
    with old_paths(monkeypatch, old=True):
        old = await scenario(
            tmp_path / "old", boqname=boqname, inhibit_backlog=inhibit_backlog, poison=poison
        )
    new = await scenario(
        tmp_path / "new", boqname=boqname, inhibit_backlog=inhibit_backlog, poison=poison
    )
    assert new == old
    # and what that outcome is: every fan/a publication on each subscriber, in order
    fan = [b"p%02d" % i for i in range(24) if i % 3 and i not in (11, poison)]
    for q in FAN:
        assert [p for p, _ in new[q]] == fan  # type: ignore[attr-defined]
    assert [p for p, _ in new["SUB.OTHER"]] == [  # type: ignore[attr-defined]
        b"p%02d" % i for i in range(24) if not i % 3 and i not in (11, poison)
    ]
    poisoned = b"p%02d" % poison
    if boqname:
        # moved as is (its RFH and all)
        assert [b[-3:] for b, _ in new["boq"]] == [poisoned]  # type: ignore[attr-defined]
    dlq: list[tuple[int, str, int, bytes]] = new["dlq"]  # type: ignore[assignment]
    reasons = [(r, q) for r, q, _, _ in dlq]
    if not boqname:
        assert (int(Reason.BACKED_OUT), "StreamX") in reasons
        assert [b[-3:] for r, _, _, b in dlq if r == Reason.BACKED_OUT] == [  # type: ignore[index]
            poisoned
        ]
    delivered = [b"p%02d" % i for i in range(24) if i not in (11, poison)]
    if inhibit_backlog:
        backlog = backlog_queue_name(SINK)
        assert [r for r, q in reasons if q == backlog] == [int(Reason.PUT_INHIBITED)] * 22
        assert new["backlog"] == []
    else:
        assert [p for _, p, _, _ in new["backlog"]] == delivered  # type: ignore[attr-defined]
    # the put limit ended the batches (same units as before, compared above): without
    # it the 24 messages would have been one batch of batch_size 32
    batches, messages = new["unit_sizes"]  # type: ignore[misc]
    assert messages == 24 and batches >= 24 // 4


def plain(queue: str, i: int, **kw: Any) -> Put:
    md = MQMD(persistence=Persistence.PERSISTENT, correl_id=i.to_bytes(24, "big"))
    return Put("", queue, md, b"m%d" % i, **kw)


class Recorder:
    def __init__(self) -> None:
        self.calls: list[tuple[str, ...]] = []

    def delivered(self, q_mgr: str, queue: str) -> None:
        self.calls.append(("ok", q_mgr, queue))

    def delivery_failed(self, q_mgr: str, queue: str, reason: int) -> None:
        self.calls.append(("failed", q_mgr, queue, str(reason)))


class RoundTrips:
    """A connection whose puts are round trips, as IBM MQ's client channel: the embedded
    connection behind it without its one-pass ``put_many``; counts the MQOPENs, MQPUTs
    and MQPUT1s made (each a round trip there)."""

    def __init__(self, conn: Any) -> None:
        self._conn = conn
        self.puts = 0
        self.opens = 0

    def __getattr__(self, name: str) -> Any:
        if name in ("put_many", "put_many_in_one_pass"):
            raise AttributeError(name)
        return getattr(self._conn, name)

    async def open(self, *args: Any, **kwargs: Any) -> Any:
        self.opens += 1
        return _CountedHandle(await self._conn.open(*args, **kwargs), self)

    async def put1(self, *args: Any, **kwargs: Any) -> Any:
        self.puts += 1
        return await self._conn.put1(*args, **kwargs)


class _CountedHandle:
    def __init__(self, handle: Any, conn: RoundTrips) -> None:
        self._handle, self._conn = handle, conn

    def __getattr__(self, name: str) -> Any:
        return getattr(self._handle, name)

    async def put(self, *args: Any, **kwargs: Any) -> Any:
        self._conn.puts += 1
        return await self._handle.put(*args, **kwargs)


async def run_put_all(
    path: Path, puts: list[Put], counted: list[tuple[int, int]] | None = None
) -> tuple[object, list[tuple[str, ...]], dict[str, list[tuple[object, ...]]]]:
    """``put_all`` on a fresh queue manager; with ``counted``, through :class:`RoundTrips`
    (its counts of MQOPENs and of MQPUTs + MQPUT1s appended to ``counted``)."""
    qm = EmbeddedQueueManager("QM1", path)
    try:
        for r in qm.run_mqsc(
            "DEFINE QLOCAL(A)\nDEFINE QLOCAL(BL) MAXDEPTH(3)\nDEFINE QLOCAL(BL2)\n"
            "DEFINE QLOCAL(INH) PUT(DISABLED)\nDEFINE QLOCAL(BOQ)\nDEFINE QLOCAL(DLQ)\n"
            "ALTER QMGR DEADQ(DLQ)"
        ):
            assert r.ok, r.lines
        rec = Recorder()
        result: object
        async with await qm.connect() as conn:
            via: Any = conn if counted is None else RoundTrips(conn)
            try:
                done = await put_all(via, puts, "DLQ", rec)
                result = [(p.kind, p.queue) for p in done]
                await conn.commit()
            except (BacklogFullError, MQError) as exc:
                result = (type(exc).__name__, exc.reason)
                await conn.backout()
            if counted is not None:
                counted.append((via.opens, via.puts))
        queues: dict[str, list[tuple[object, ...]]] = {}
        for q in ("A", "BL", "BL2", "INH", "BOQ"):
            msgs = await drain_raw(qm, q)
            queues[q] = [(m.body, m.md.correl_id, m.md.persistence) for m in msgs]
        queues["DLQ"] = []
        for m in await drain_raw(qm, "DLQ"):
            dlh, md, body = unwrap_from_dlq(m.md, m.body)
            queues["DLQ"].append((dlh.reason, dlh.dest_q_name.strip(), body, md.correl_id))
        return result, rec.calls, queues
    finally:
        await qm.close()


async def test_put_all_backlog_puts_through_put_many_same_as_single(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Deliveries, backlog puts (one to a put-inhibited queue: dead-lettered) and a move
    to a backout queue: same queue contents, order, MQDLH reasons and moves."""

    def puts() -> list[Put]:
        return [
            plain("A", 0),
            plain("BL", 1, backpressure=True),
            plain("INH", 2, backpressure=True),
            plain("A", 3),
            plain("BL2", 4, backpressure=True),
            plain("BOQ", 5, kind="backout_queue", source="S"),
            plain("BL", 6, backpressure=True),
            plain("INH", 7),
        ]

    with old_paths(monkeypatch, old=True):
        old = await run_put_all(tmp_path / "old", puts())
    new = await run_put_all(tmp_path / "new", puts())
    assert new[0] == old[0] == [("dead_letter", "DLQ"), ("backout_queue", "BOQ"),
                                ("dead_letter", "DLQ")]
    assert new[2] == old[2]
    assert [b for b, *_ in new[2]["BL"]] == [b"m1", b"m6"]
    assert [(r, q, b) for r, q, b, _ in new[2]["DLQ"]] == [  # type: ignore[misc]
        (int(Reason.PUT_INHIBITED), "INH", b"m2"),
        (int(Reason.PUT_INHIBITED), "INH", b"m7"),
    ]
    assert len(new[2]["DLQ"]) == 2
    # failures told in the same order; deliveries told once per queue between failures
    failures = [c for c in new[1] if c[0] == "failed"]
    assert failures == [c for c in old[1] if c[0] == "failed"]
    assert {c for c in new[1] if c[0] == "ok"} == {c for c in old[1] if c[0] == "ok"}


async def test_put_all_full_backlog_is_backpressure_as_before(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A backlog queue that fills mid-batch raises BacklogFullError as the single put
    did (the batch backs out: nothing of it stays anywhere)."""

    def puts() -> list[Put]:
        return [plain("A", 0)] + [plain("BL", i, backpressure=True) for i in range(1, 6)]

    with old_paths(monkeypatch, old=True):
        old = await run_put_all(tmp_path / "old", puts())
    new = await run_put_all(tmp_path / "new", puts())
    assert new[0] == old[0] == ("BacklogFullError", int(Reason.Q_FULL))
    assert new[2] == old[2]
    # told delivered once per queue between failures (put_many's rule), nothing failed
    assert set(new[1]) == set(old[1]) == {("ok", "QM1", "A"), ("ok", "QM1", "BL")}
    assert all(v == [] for v in new[2].values())


async def test_put_all_round_trip_puts_stop_at_the_first_full_backlog(tmp_path: Path) -> None:
    """Review 18d, F2: where every put is a round trip (IBM MQ), a full sink backlog ends
    the batch at its first Q_FULL, so the batch's later backlog puts are not made (each
    back-pressure retry would make them again); the outcome and what the engine is told
    are the one-pass ones."""

    def puts() -> list[Put]:
        return (
            [plain("A", 0)]
            + [plain("BL", i, backpressure=True) for i in range(1, 7)]
            + [plain("BL2", i, backpressure=True) for i in range(7, 10)]
        )

    counted: list[tuple[int, int]] = []
    one_pass = await run_put_all(tmp_path / "one-pass", puts())
    trips = await run_put_all(tmp_path / "round-trips", puts(), counted)
    assert trips[0] == one_pass[0] == ("BacklogFullError", int(Reason.Q_FULL))
    assert trips[2] == one_pass[2] and all(v == [] for v in trips[2].values())
    assert set(trips[1]) == set(one_pass[1]) == {("ok", "QM1", "A"), ("ok", "QM1", "BL")}
    # A, three BL puts that fit, the one that found BL full; one open per queue
    assert counted == [(2, 5)]


async def test_put_all_round_trips_same_outcome_and_reports_as_one_pass(
    tmp_path: Path,
) -> None:
    """Deliveries and backlog puts that fit, a put-inhibited queue, and a missing backlog
    queue: the same queues, MQDLH reasons and engine reports as in one pass; a queue whose
    open failed is not opened again for the batch's later puts (review 19a, F5), and
    "delivered" is told once per queue between failures (F6)."""

    def puts() -> list[Put]:
        return [
            plain("A", 0), plain("BL", 1, backpressure=True), plain("INH", 2),
            plain("BL2", 3, backpressure=True), plain("A", 4),
            plain("NOBL", 5, backpressure=True), plain("NOBL", 6, backpressure=True),
            plain("BL", 7, backpressure=True), plain("NOBL", 8, backpressure=True),
        ]

    counted: list[tuple[int, int]] = []
    one_pass = await run_put_all(tmp_path / "one-pass", puts())
    trips = await run_put_all(tmp_path / "round-trips", puts(), counted)
    assert trips[0] == one_pass[0] == [("dead_letter", "DLQ")] * 4
    assert trips[2] == one_pass[2]
    assert [b for b, *_ in trips[2]["A"]] == [b"m0", b"m4"]
    assert [b for b, *_ in trips[2]["BL"]] == [b"m1", b"m7"]
    assert [(r, q, b) for r, q, b, _ in trips[2]["DLQ"]] == [  # type: ignore[misc]
        (int(Reason.PUT_INHIBITED), "INH", b"m2"),
        *[(int(Reason.UNKNOWN_OBJECT_NAME), "NOBL", b"m%d" % i) for i in (5, 6, 8)],
    ]
    failures = [c for c in trips[1] if c[0] == "failed"]
    assert failures == [c for c in one_pass[1] if c[0] == "failed"] and len(failures) == 4
    ok = [c for c in trips[1] if c[0] == "ok"]
    assert sorted(ok) == sorted(set(ok)) and set(ok) == {c for c in one_pass[1] if c[0] == "ok"}
    # opens: each delivery run's put_many opens its queues (A; INH; A again), the single
    # backlog puts BL, BL2 and NOBL once (failed, not tried again for m6, m8); puts: the 6
    # that fit or were inhibited at put + 4 MQPUT1s to the DLQ. (The service appends its
    # backlog puts after the deliveries, so its runs do not interleave like this.)
    assert counted == [(6, 10)]
