"""``mqgw streams move`` against two real embedded queue managers served on their local
sockets (no brokers, no channels: what the steps do to the definitions and messages),
and the command's refusals and ``--status``."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from gateway.mq.embedded.qmgr import EmbeddedQueueManager
from gateway.mq.port import Browse, GetOptions, MQError, OpenOption
from gateway.pubsub.engine import PubSubEngine
from gateway.pubsub.neighbours import Neighbour, NeighbourKind, NeighbourRole
from gateway.pubsub.outcome import InboundMessage
from gateway.pubsub.sqlite_store import SqliteStore
from gateway.pubsub.store import MemoryStore
from gateway.pubsub.streams import DEFAULT_STREAM
from gateway.runtime.cli import main
from gateway.runtime.streams.move import close_nodes, connect_nodes, read_route, run_move
from gateway.runtime.streams.move_plan import (
    MoveJournal,
    read_journal,
    record_done,
    write_journal,
)
from gateway.runtime.streams.move_retained import retained_copies
from gateway.wire.mqmd import MQMD
from gateway.wire.reasons import Reason
from gateway.wire.xqh import unwrap_from_xmitq
from tests.support.pubsub_messages import rfh_publication
from tests.support.served_qm import served_queue_manager

S, ROUTE = "PRICES", "PRICES.PUB"
OWNER_A = {
    "QMA": f"DEFINE QLOCAL({S}) MAXDEPTH(20000)\nDEFINE QLOCAL(QMB) USAGE(XMITQ)\n"
           f"DEFINE QALIAS({ROUTE}) TARGET({S})",
    "QMB": f"DEFINE QLOCAL({S}) MAXDEPTH(20000)\nDEFINE QLOCAL(QMA) USAGE(XMITQ)\n"
           f"DEFINE QREMOTE({ROUTE}.QMA) RNAME({S}) RQMNAME(QMA)\n"
           f"DEFINE QALIAS({ROUTE}) TARGET({ROUTE}.QMA)",
}


def configs(tmp: Path) -> dict[str, Path]:
    out = {}
    for name in ("QMA", "QMB"):
        d = tmp / name
        d.mkdir(parents=True, exist_ok=True)
        cfg = d / "gateway.yaml"
        cfg.write_text(
            f"queue_manager: {{name: {name}, data_dir: qm}}\n"
            f"broker: {{store: pubsub.db, streams: [{{name: {S}}}]}}\n"
            "metrics: {enabled: false}\n",
            encoding="utf-8",
        )
        out[name] = cfg
    return out


@contextlib.asynccontextmanager
async def served(tmp: Path, mqsc: dict[str, str]) -> AsyncIterator[dict[str, EmbeddedQueueManager]]:
    async with served_queue_manager(tmp / "QMA" / "qm", mqsc["QMA"], "QMA") as a, \
            served_queue_manager(tmp / "QMB" / "qm", mqsc["QMB"], "QMB") as b:
        yield {"QMA": a, "QMB": b}


def move_argv(cfgs: dict[str, Path], *extra: str) -> list[str]:
    return ["streams", "move", S, "--node", str(cfgs["QMA"]), "--node", str(cfgs["QMB"]),
            *extra]


async def cli(argv: list[str]) -> int:
    """The command in a thread of its own (its own event loop), the sockets served here."""
    return await asyncio.to_thread(main, argv)


async def put_route(qm: EmbeddedQueueManager, payloads: list[bytes]) -> None:
    async with await qm.connect() as conn:
        for p in payloads:
            await conn.put1(ROUTE, MQMD(persistence=1), p)


async def messages(qm: EmbeddedQueueManager, queue: str) -> list[tuple[MQMD, bytes]]:
    async with await qm.connect() as conn:
        h = await conn.open(queue, OpenOption.BROWSE)
        out: list[tuple[MQMD, bytes]] = []
        browse = Browse.FIRST
        while True:
            try:
                m = await h.get(GetOptions(browse=browse))
            except MQError as exc:
                assert exc.reason == Reason.NO_MSG_AVAILABLE
                return out
            browse = Browse.NEXT
            out.append((m.md, m.body))


async def bodies(qm: EmbeddedQueueManager, queue: str) -> list[bytes]:
    """The bodies on ``queue``, a transmission queue's unwrapped (bound for QMB's S)."""
    out: list[bytes] = []
    for md, body in await messages(qm, queue):
        if md.format.strip() == "MQXMIT":
            x = unwrap_from_xmitq(md, body)
            assert (x.remote_q_name, x.remote_q_mgr_name) == (S, "QMB")
            out.append(x.body)
        else:
            out.append(body)
    return out


async def test_held_publications_reach_the_new_owner_in_order_and_the_routes_follow(
    tmp_path: Path,
) -> None:
    cfgs = configs(tmp_path)
    async with served(tmp_path, OWNER_A) as qms:
        nodes = await connect_nodes({n: tmp_path / n / "qm" for n in qms})
        journal = MoveJournal(stream=S, route=ROUTE, from_q_mgr="QMA", to_q_mgr="QMB",
                              nodes={n: str(c) for n, c in cfgs.items()})
        saved: list[MoveJournal] = []

        async def during(step: str) -> None:
            if step == "drain":  # both routes hold: publishers are not refused
                for name, qm in qms.items():
                    await put_route(qm, [f"{name}-{i}".encode() for i in range(5)])
                    assert await bodies(qm, "MQGW.MOVE.HOLD.PRICES") == [
                        f"{name}-{i}".encode() for i in range(5)]
                    # it holds as many as the stream queue would
                    assert qm.catalogue.queues["MQGW.MOVE.HOLD.PRICES"].max_depth == 20000

        try:
            j, why = await run_move(journal, nodes, saved.append, before_step=during, poll=0)
            assert why is None and j.complete
            assert [(await read_route(nodes[n], S, ROUTE)).owner for n in nodes] == ["QMB"] * 2
        finally:
            await close_nodes(nodes)
        # QMB's held ones are on its stream queue; QMA's on its way there, in order
        assert await bodies(qms["QMB"], S) == [f"QMB-{i}".encode() for i in range(5)]
        assert await bodies(qms["QMA"], "QMB") == [f"QMA-{i}".encode() for i in range(5)]
        for qm in qms.values():
            assert "MQGW.MOVE.HOLD.PRICES" not in qm.catalogue.queues
        # after the move, a publisher on QMA goes to QMB's stream queue
        await put_route(qms["QMA"], [b"after"])
        assert (await bodies(qms["QMA"], "QMB"))[-1] == b"after"
        assert saved[-1].done == [
            "hold:QMA", "hold:QMB", "drain", "retained", "sinks", "release:QMB",
            "release:QMA", "finish"]

        # run again: nothing to move; --status shows the routes
        assert await cli(move_argv(cfgs, "--to", "QMB")) == 0
        assert await cli(move_argv(cfgs, "--to", "QMB", "--status")) == 0


async def test_the_command_records_its_journal_and_refuses_what_it_cannot_do(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfgs = configs(tmp_path)
    # nodes not running: stopped unfinished, nothing recorded
    assert await cli(move_argv(cfgs, "--to", "QMB")) == 1
    assert "not running" in capsys.readouterr().out
    assert not (tmp_path / "QMB" / "move-PRICES.json").exists()
    # the nodes disagree on the owner
    disagree = dict(OWNER_A, QMB=f"DEFINE QLOCAL({S})\nDEFINE QALIAS({ROUTE}) TARGET({S})")
    async with served(tmp_path, disagree):
        assert await cli(move_argv(cfgs, "--to", "QMB")) == 2
        assert "disagree" in capsys.readouterr().err
    for d in ("QMA", "QMB"):  # fresh queue managers
        shutil.rmtree(tmp_path / d / "qm")
    async with served(tmp_path, OWNER_A):
        assert await cli(move_argv(cfgs, "--to", "QMC")) == 2  # not a node
        capsys.readouterr()
        assert await cli(move_argv(cfgs, "--to", "QMB")) == 0
        out = capsys.readouterr().out
        assert "PRICES is now owned by QMB" in out and "done: release:QMA" in out
        journal = read_journal(tmp_path / "QMB" / "move-PRICES.json")
        assert journal is not None and journal.complete
        assert await cli(move_argv(cfgs, "--to", "QMB", "--status")) == 0
        out = capsys.readouterr().out
        assert "complete" in out and "QMA: PRICES.PUB routes to QMB" in out
        # and back, the QREMOTE PRICES.PUB.QMA redefined on QMB
        assert await cli(move_argv(cfgs, "--to", "QMA")) == 0
        assert "PRICES is now owned by QMA" in capsys.readouterr().out


async def test_an_unfinished_move_is_continued_and_another_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfgs = configs(tmp_path)
    async with served(tmp_path, OWNER_A) as qms:
        # the move stopped after holding QMA's route (as if killed there)
        nodes = await connect_nodes({n: tmp_path / n / "qm" for n in qms})
        journal = MoveJournal(stream=S, route=ROUTE, from_q_mgr="QMA", to_q_mgr="QMB",
                              nodes={n: str(c.resolve()) for n, c in cfgs.items()})
        path = tmp_path / "QMB" / "move-PRICES.json"

        async def stop(step: str) -> None:
            if step == "hold:QMB":
                raise KeyboardInterrupt

        with pytest.raises(KeyboardInterrupt):
            await run_move(journal, nodes, lambda j: write_journal(path, j), before_step=stop)
        await close_nodes(nodes)
        assert await cli(move_argv(cfgs, "--to", "QMB", "--status")) == 1
        out = capsys.readouterr().out
        assert "next step hold:QMB" in out and "QMA: PRICES.PUB holding new publications" in out
        # another move of the stream while this one is unfinished: refused
        assert await cli(move_argv(cfgs, "--to", "QMA", "--journal", str(path))) == 2
        assert "unfinished move of PRICES to QMB" in capsys.readouterr().err
        # the same command continues it
        assert await cli(move_argv(cfgs, "--to", "QMB")) == 0
        out = capsys.readouterr().out
        assert "continuing the move" in out and "\ndone: hold:QMA\n" not in out
        assert "done: hold:QMB" in out


async def test_a_message_a_channel_has_got_but_not_committed_counts_as_in_transmission(
    tmp_path: Path,
) -> None:
    """A sender channel gets a batch under syncpoint: a browse no longer sees those
    messages, yet they may be publications still on their way. The drain must wait."""
    configs(tmp_path)
    async with served(tmp_path, OWNER_A) as qms:
        await put_route(qms["QMB"], [b"on its way"])  # QMB -> xmitq QMA
        nodes = await connect_nodes({n: tmp_path / n / "qm" for n in qms})
        try:
            assert await nodes["QMB"].in_transmission(S) == 1
            async with await qms["QMB"].connect() as channel:
                h = await channel.open("QMA", OpenOption.INPUT_SHARED)
                await h.get(GetOptions(syncpoint=True))  # the batch, not committed
                assert await nodes["QMB"].in_transmission(S) == 1
                await channel.backout()
        finally:
            await close_nodes(nodes)


async def test_a_batch_left_uncommitted_by_a_killed_move_is_moved_first(
    tmp_path: Path,
) -> None:
    """A move killed inside a batch leaves its gets uncommitted until its connection is
    cleaned up; the move run again must not move the held messages behind them first."""
    cfgs = configs(tmp_path)
    hold = "MQGW.MOVE.HOLD.PRICES"
    async with served(tmp_path, OWNER_A) as qms:
        nodes = await connect_nodes({n: tmp_path / n / "qm" for n in qms})
        journal = MoveJournal(stream=S, route=ROUTE, from_q_mgr="QMA", to_q_mgr="QMB",
                              nodes={n: str(c) for n, c in cfgs.items()})
        for step in ("hold:QMA", "hold:QMB", "drain"):
            journal = record_done(journal, step)
        qms["QMB"].run_mqsc(f"DEFINE QLOCAL({hold})", stop_on_error=True)
        async with await qms["QMB"].connect() as conn:
            for i in range(6):
                await conn.put1(hold, MQMD(persistence=1), b"%d" % i)
        killed = await qms["QMB"].connect()  # the killed move's batch: 0..2 got
        h = await killed.open(hold, OpenOption.INPUT_SHARED)
        for _ in range(3):
            await h.get(GetOptions(syncpoint=True))

        async def clean_up() -> None:
            await asyncio.sleep(0.3)
            await killed.disconnect()  # what the server does at the EOF: backs out

        try:
            cleaner = asyncio.create_task(clean_up())
            j, why = await run_move(journal, nodes, lambda _: None, poll=0)
            await cleaner
            assert why is None and j.complete
        finally:
            await close_nodes(nodes)
        assert await bodies(qms["QMB"], S) == [b"%d" % i for i in range(6)]


async def test_a_put_still_being_written_when_the_hold_ends_is_moved_before_the_route(
    tmp_path: Path,
) -> None:
    """A publisher's persistent put that passed the holding queue's put check just
    before the release put-inhibited it is visible only once hardened: if the route
    changed meanwhile, that publication stayed behind in the holding queue (the
    queue's delete refused) while the publisher's next ones went the new way, and the
    next move released it after them (the fault suite's 1-after-the-next-100)."""
    cfgs = configs(tmp_path)
    hold = "MQGW.MOVE.HOLD.PRICES"
    async with served(tmp_path, OWNER_A) as qms:
        qmb = qms["QMB"]
        written = asyncio.Event()
        original = qmb._store_put

        async def slow_store_put(q: Any, msg: Any) -> None:
            if q.name == hold:
                await written.wait()  # the disk is slow: the put is in flight
            await original(q, msg)

        qmb._store_put = slow_store_put  # type: ignore[method-assign]
        nodes = await connect_nodes({n: tmp_path / n / "qm" for n in qms})
        journal = MoveJournal(stream=S, route=ROUTE, from_q_mgr="QMA", to_q_mgr="QMB",
                              nodes={n: str(c) for n, c in cfgs.items()})
        putting: list[asyncio.Task[None]] = []

        async def during(step: str) -> None:
            if step == "release:QMB":  # the route holds: this put goes to the hold queue
                putting.append(asyncio.create_task(put_route(qmb, [b"in flight"])))
                while not qmb._queues[hold].pending_puts:
                    await asyncio.sleep(0.01)

        async def disk_catches_up() -> None:
            # once the route left the holding queue, or after a moment (not an
            # assertion: only when the write completes)
            deadline = asyncio.get_running_loop().time() + 0.5
            while asyncio.get_running_loop().time() < deadline:
                alias = qmb.catalogue.queues.get(ROUTE)
                if putting and alias is not None and alias.target != hold:
                    break
                await asyncio.sleep(0.01)
            written.set()

        try:
            catching_up = asyncio.create_task(disk_catches_up())
            j, why = await run_move(journal, nodes, lambda _: None, before_step=during,
                                    poll=0.01)
            assert why is None and j.complete
            await catching_up
            await asyncio.gather(*putting)
            await put_route(qmb, [b"after"])
        finally:
            await close_nodes(nodes)
        assert await bodies(qmb, S) == [b"in flight", b"after"]
        assert hold not in qmb.catalogue.queues


def subscribe_sink(store: Path, sink: str, topic: str) -> None:
    """A sink's durable subscription, as its gateway's start leaves it in the store."""
    s = SqliteStore(store)
    try:
        engine = PubSubEngine(store.parent.name, s)
        engine.subscribe_sink(sink, topic)
        engine.commit()
    finally:
        s.close()


async def test_a_sink_on_a_node_that_would_not_own_the_stream_refuses_the_move(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A move does not move sinks: it says so and which ones, and moves only when told
    to leave them (they keep getting the stream through their node's proxy)."""
    cfgs = configs(tmp_path)
    subscribe_sink(tmp_path / "QMA" / "pubsub.db", "kafka", f"$SYS/STREAM/{S}/#")
    subscribe_sink(tmp_path / "QMA" / "pubsub.db", "other", "$SYS/STREAM/OTHER/#")
    subscribe_sink(tmp_path / "QMB" / "pubsub.db", "mqtt", f"$SYS/STREAM/{S}/#")
    async with served(tmp_path, OWNER_A) as qms:
        assert await cli(move_argv(cfgs, "--to", "QMB")) == 2
        said = capsys.readouterr().err
        assert "kafka on QMA" in said and "--leave-sinks" in said
        assert "other" not in said and "mqtt" not in said  # another stream; the new owner
        assert not (tmp_path / "QMB" / "move-PRICES.json").exists()
        assert qms["QMA"].catalogue.queues[ROUTE].target == S  # nothing changed
        assert await cli(move_argv(cfgs, "--to", "QMB", "--leave-sinks")) == 0
        out = capsys.readouterr().out
        assert "leaving sink(s) where they are: kafka on QMA" in out
        assert "PRICES is now owned by QMB" in out
        # back to QMA: QMB's sink is left behind, so refused again
        assert await cli(move_argv(cfgs, "--to", "QMA")) == 2
        assert "mqtt on QMB" in capsys.readouterr().err


def retain_at(store: Path, q_mgr: str, topic: str, payload: bytes) -> bytes:
    """``q_mgr``'s broker took a retained publication of ``topic`` (committed to its
    store, as a running gateway does); its MsgId."""
    s = SqliteStore(store)
    try:
        engine = PubSubEngine(q_mgr, s)
        msg = rfh_publication(S, topic, payload, pairs=[("MQPSPubOpts", "RetainPub"),
                                                       ("MQPSRegOpts", "Anon")])
        outcome = engine.handle(msg)
        assert outcome.reason == 0, outcome
        engine.commit()
    finally:
        s.close()
    return msg.md.msg_id


async def test_the_old_owners_retained_publications_reach_the_new_owner_before_the_held(
    tmp_path: Path,
) -> None:
    """Retained publications only the old owner held are at the new owner after the
    move: copied as the old owner's forwards, ahead of the held publications; a copy
    put again (a move run again) is kept once and delivered to nobody."""
    cfgs = configs(tmp_path)
    ids = {t: retain_at(tmp_path / "QMA" / "pubsub.db", "QMA", t, f"{t} v1".encode())
           for t in ("R/1", "R/2")}
    async with served(tmp_path, OWNER_A) as qms:
        nodes = await connect_nodes({n: tmp_path / n / "qm" for n in qms})
        journal = MoveJournal(stream=S, route=ROUTE, from_q_mgr="QMA", to_q_mgr="QMB",
                              nodes={n: str(c) for n, c in cfgs.items()})

        async def during(step: str) -> None:
            if step == "retained":
                await put_route(qms["QMB"], [b"held"])

        def copies() -> list[tuple[MQMD, bytes]]:
            s = SqliteStore(tmp_path / "QMA" / "pubsub.db")
            try:
                return retained_copies(s.load().retained, S, from_q_mgr="QMA",
                                       to_q_mgr="QMB")
            finally:
                s.close()

        try:
            j, why = await run_move(journal, nodes, lambda _: None, before_step=during,
                                    poll=0, retained=copies)
            assert why is None and j.complete
        finally:
            await close_nodes(nodes)
        on_b = await messages(qms["QMB"], S)
    assert [b for _, b in on_b][-1] == b"held"
    forwards = on_b[:-1]
    assert [md.msg_id for md, _ in forwards] == [ids["R/1"], ids["R/2"]]
    # QMB's broker takes them as QMA's forwards: kept retained, sent back to no one
    b_engine = PubSubEngine("QMB", MemoryStore(), neighbours={
        "QMA": Neighbour("QMA", NeighbourKind.GATEWAY, NeighbourRole.PARENT,
                         frozenset({S, DEFAULT_STREAM}))})
    for md, body in forwards:
        out = b_engine.handle(InboundMessage(S, md, body))
        assert out.reason == 0 and out.deliveries == [] and out.forwards == []
    assert {r.topic: r.publication.payload for r in b_engine.retained(S)} == {
        "R/1": b"R/1 v1", "R/2": b"R/2 v1"}
    # put twice (the move run again after a crash): a replay, delivered to nobody
    _, had = b_engine.subscribe_sink("kafka", f"$SYS/STREAM/{S}/#")
    assert len(had) == 2  # a subscriber there gets them once, from the retained copies
    # the store's commit, then MQ's (the broker service's order): the copies are settled
    b_engine.settle_retained(b_engine.commit())
    md, body = forwards[0]
    again = b_engine.handle(InboundMessage(S, md, body))
    assert again.reason == 0 and again.deliveries == [] and again.forwards == []


async def test_the_command_copies_the_old_owners_retained_publications(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfgs = configs(tmp_path)
    msg_id = retain_at(tmp_path / "QMA" / "pubsub.db", "QMA", "R/1", b"v1")
    async with served(tmp_path, OWNER_A) as qms:
        assert await cli(move_argv(cfgs, "--to", "QMB")) == 0
        assert "copying 1 retained publication(s) of PRICES to QMB" in capsys.readouterr().out
        (md, _), = await messages(qms["QMB"], S)
        assert md.msg_id == msg_id and md.reply_to_q_mgr == "QMA"


async def test_an_unreadable_pub_sub_store_is_a_clear_refusal(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfgs = configs(tmp_path)
    (tmp_path / "QMA" / "pubsub.db").write_bytes(b"not a database " * 100)
    async with served(tmp_path, OWNER_A) as qms:
        assert await cli(move_argv(cfgs, "--to", "QMB")) == 2
        assert "cannot read a node's pub/sub store" in capsys.readouterr().err
        assert qms["QMA"].catalogue.queues[ROUTE].target == S  # nothing changed
