"""``mqgw streams move`` with sinks, against two real embedded queue managers each
run by an in-process gateway (its broker, its local socket) with a ``memory`` sink
configured on the stream with ``sinks: owner`` (no channels: the sinks' side of the
move; with channels, load and two ``mqgw run`` processes: test_move_end_to_end.py)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from gateway.mq.embedded.qmgr import EmbeddedQueueManager
from gateway.pubsub.engine import PubSubEngine
from gateway.pubsub.options import RegOpt
from gateway.pubsub.sqlite_store import SqliteStore
from gateway.runtime.app import GatewayApp
from gateway.runtime.cli import main
from gateway.runtime.config import load_config
from gateway.runtime.registry import PluginRegistry
from gateway.runtime.streams.move_plan import read_journal
from plugins.memory import get_bus
from tests.support.pubsub_messages import rfh_publication

S, ROUTE = "PRICES", "PRICES.PUB"
ROUTES = {  # with a transmission queue towards the other node (no channel runs)
    "QMA": f"DEFINE QLOCAL(QMB) USAGE(XMITQ)\nDEFINE QALIAS({ROUTE}) TARGET({S})",
    "QMB": "DEFINE QLOCAL(QMA) USAGE(XMITQ)\n"
           f"DEFINE QREMOTE({ROUTE}.QMA) RNAME({S}) RQMNAME(QMA)\n"
           f"DEFINE QALIAS({ROUTE}) TARGET({ROUTE}.QMA)",
}


async def write_configs(tmp: Path, *, sink_on_b: bool = True, owner_on_a: bool = True,
                        enabled_on_a: bool = True, plugin_on_b: str = "memory"
                        ) -> dict[str, Path]:
    out = {}
    for name in ("QMA", "QMB"):
        d = tmp / name
        d.mkdir(parents=True, exist_ok=True)
        # the routes, defined once before the first start (as `mqgw qm mqsc` would)
        if not (d / "qm").exists():  # written again: the configurations only
            qm = EmbeddedQueueManager(name, d / "qm")
            qm.run_mqsc(ROUTES[name], stop_on_error=True)
            await qm.close()
        mode = "owner" if owner_on_a or name == "QMB" else "always"
        sink = (name == "QMA" or sink_on_b)
        enabled = "false" if name == "QMA" and not enabled_on_a else "true"
        plugin = plugin_on_b if name == "QMB" else "memory"
        plugins = (
            "plugins:\n"
            f"  - name: mem\n    plugin: {plugin}\n    enabled: {enabled}\n"
            f"    config: {{bus: {tmp.name}-{name}, record_file: {d / 'sink.jsonl'},\n"
            f"             subscribe: ['$SYS/STREAM/{S}/#']}}\n"
        ) if sink else ""
        cfg = d / "gateway.yaml"
        cfg.write_text(
            f"id: {name}\n"
            f"queue_manager: {{name: {name}, data_dir: qm}}\n"
            f"broker: {{store: pubsub.db, wait_ms: 20, streams: [{{name: {S}, sinks: {mode}}}]}}\n"
            "metrics: {enabled: false}\n" + plugins,
            encoding="utf-8",
        )
        out[name] = cfg
    return out


@contextlib.asynccontextmanager
async def running(cfgs: dict[str, Path]) -> AsyncIterator[dict[str, GatewayApp]]:
    registry = PluginRegistry.from_entry_points()
    apps: dict[str, GatewayApp] = {}
    try:
        for name, cfg in cfgs.items():
            app = GatewayApp(load_config(cfg, registry), registry)
            await app.start()
            apps[name] = app
        yield apps
    finally:
        for app in apps.values():
            await app.shutdown()


def sink_subs(store: Path) -> list[tuple[str, str, int]]:
    s = SqliteStore(store)
    try:
        subs = s.load().subscriptions
    finally:
        s.close()
    return sorted((x.destination.sink, x.topic, x.reg_opts) for x in subs
                  if x.stream == S and x.destination.is_sink)


async def publish(app: GatewayApp, payload: bytes, *, retain: bool = False) -> None:
    msg = rfh_publication(S, "T/1", payload, reply_to_q_mgr="",
                          pairs=[("MQPSPubOpts", "RetainPub")] if retain else [])
    assert app.qm is not None
    async with await app.qm.connect() as conn:
        await conn.put1(ROUTE, msg.md, msg.body)


async def cli(argv: list[str]) -> int:
    return await asyncio.to_thread(main, argv)


def move_argv(cfgs: dict[str, Path], to: str, *extra: str) -> list[str]:
    return ["streams", "move", S, "--to", to, "--node", str(cfgs["QMA"]),
            "--node", str(cfgs["QMB"]), "--timeout", "20", *extra]


def payloads(tmp: Path, name: str) -> list[bytes]:
    return [r.payload for r in get_bus(f"{tmp.name}-{name}").records]


async def until(predicate: object, what: str, timeout: float = 15.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not predicate():  # type: ignore[operator]
        assert asyncio.get_running_loop().time() < deadline, what
        await asyncio.sleep(0.02)


async def test_the_sink_moves_with_the_stream_and_stays_there_across_restarts(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="gateway.runtime.app")
    cfgs = await write_configs(tmp_path)
    # a subscription QMB's store kept from an earlier life: QMB does not own PRICES
    stale = SqliteStore(tmp_path / "QMB" / "pubsub.db")
    engine = PubSubEngine("QMB", stale)
    engine.subscribe_sink("mem", f"$SYS/STREAM/{S}/#")
    engine.commit()
    stale.close()
    store = {n: tmp_path / n / "pubsub.db" for n in cfgs}
    async with running(cfgs) as apps:
        assert sink_subs(store["QMA"]) == [("mem", "#", 0)]
        assert sink_subs(store["QMB"]) == []  # removed at its start
        said = caplog.text
        assert f"sinks: QMA owns {S} ({ROUTE} names it here)" in said
        assert f"sinks: QMA owns {S} ({ROUTE} on QMB names it there)" in said
        assert "removed sink mem's subscription to '#' on PRICES" in said
        await publish(apps["QMA"], b"r1", retain=True)
        await publish(apps["QMA"], b"a1")
        await until(lambda: payloads(tmp_path, "QMA") == [b"r1", b"a1"], "QMA's sink")

        assert await cli(move_argv(cfgs, "QMB")) == 0
        journal = read_journal(tmp_path / "QMB" / "move-PRICES.json")
        assert journal is not None and journal.complete and "sinks" in journal.done
        assert [(m.q_mgr, m.sink) for m in journal.sinks] == [("QMA", "mem")]
        assert sink_subs(store["QMA"]) == []
        assert sink_subs(store["QMB"]) == [("mem", "#", int(RegOpt.NEW_PUBLICATIONS_ONLY))]
        for app in apps.values():  # the move's reply queue is gone again
            assert app.qm is not None
            assert not [q for q in app.qm.catalogue.queues if q.startswith("MQGW.MOVE.")]
        await publish(apps["QMB"], b"b1")
        await until(lambda: payloads(tmp_path, "QMB") == [b"b1"], "QMB's sink")
        assert payloads(tmp_path, "QMA") == [b"r1", b"a1"]  # nothing more, no retained
    # both restart: QMB keeps its sink subscription, QMA makes none
    caplog.clear()
    async with running(cfgs) as apps:
        assert sink_subs(store["QMA"]) == []
        assert [s[:2] for s in sink_subs(store["QMB"])] == [("mem", "#")]
        assert f"sinks: QMB owns {S} ({ROUTE} on QMA names it there)" in caplog.text
        await publish(apps["QMB"], b"c1")
        # QMB's restart sends its sink the retained publication again (as every sink's
        # restart does), then the new one
        await until(lambda: payloads(tmp_path, "QMB")[-1:] == [b"c1"], "QMB's sink")
        assert payloads(tmp_path, "QMA") == [b"r1", b"a1"]
        # and back to QMA
        assert await cli(move_argv(cfgs, "QMA")) == 0
        await publish(apps["QMA"], b"d1")
        await until(lambda: payloads(tmp_path, "QMA")[-1:] == [b"d1"], "QMA's sink")
        assert payloads(tmp_path, "QMB")[-1:] == [b"c1"]
        assert sink_subs(store["QMB"]) == []
    lines = (tmp_path / "QMA" / "sink.jsonl").read_text(encoding="utf-8").splitlines()
    assert len(lines) == 3  # the memory sink's JSONL output: r1, a1, d1


async def test_a_sink_the_new_owner_lacks_refuses_the_move_before_anything_changes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfgs = await write_configs(tmp_path, sink_on_b=False)
    async with running(cfgs) as apps:
        assert await cli(move_argv(cfgs, "QMB")) == 2
        err = capsys.readouterr().err
        assert "QMB has no enabled sink instance mem in its configuration" in err, err
        assert not (tmp_path / "QMB" / "move-PRICES.json").exists()
        assert apps["QMA"].qm is not None
        assert apps["QMA"].qm.catalogue.queues[ROUTE].target == S
        # --leave-sinks keeps its meaning: the stream moves, the sink stays
        assert await cli(move_argv(cfgs, "QMB", "--leave-sinks")) == 0
        assert "leaving sink(s) where they are: mem on QMA" in capsys.readouterr().out
        assert sink_subs(tmp_path / "QMA" / "pubsub.db") == [("mem", "#", 0)]
    # left only until QMA's next start: QMA configures PRICES `sinks: owner` and no
    # longer owns it (what --help and docs/scaling.md say)
    async with running({"QMA": cfgs["QMA"]}):
        assert sink_subs(tmp_path / "QMA" / "pubsub.db") == []


async def test_a_node_whose_start_would_subscribe_the_sink_again_refuses_the_move(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfgs = await write_configs(tmp_path, owner_on_a=False)
    async with running(cfgs):
        assert await cli(move_argv(cfgs, "QMB")) == 2
        err = capsys.readouterr().err
        assert f"QMA does not configure {S} with `sinks: owner`" in err, err


async def test_a_sink_not_enabled_on_the_node_it_leaves_refuses_the_move(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Its subscription is in QMA's store, but QMA's broker has no such sink registered:
    a DeregSub there would take the ordinary subscriber path and leave it."""
    cfgs = await write_configs(tmp_path)
    async with running({"QMA": cfgs["QMA"]}):
        pass  # QMA's sink subscribes, its store keeps the subscription
    await write_configs(tmp_path, enabled_on_a=False)
    store = tmp_path / "QMA" / "pubsub.db"
    assert sink_subs(store) == [("mem", "#", 0)]
    async with running(cfgs) as apps:
        assert await cli(move_argv(cfgs, "QMB")) == 2
        err = capsys.readouterr().err
        assert "QMA has no enabled sink instance mem in its configuration" in err, err
        assert not (tmp_path / "QMB" / "move-PRICES.json").exists()
        assert apps["QMA"].qm is not None
        assert apps["QMA"].qm.catalogue.queues[ROUTE].target == S
        assert sink_subs(store) == [("mem", "#", 0)]


async def test_why_sinks_cannot_move_names_an_unreadable_configuration_and_another_plugin(
    tmp_path: Path,
) -> None:
    from gateway.runtime.streams.move_cli import _why_sinks_cannot_move
    from gateway.runtime.streams.move_plan import MovedSink

    cfgs = await write_configs(tmp_path, plugin_on_b="nonesuch")
    nodes = {n: (c, c.parent / "qm", c.parent / "pubsub.db") for n, c in cfgs.items()}
    moved = [MovedSink(q_mgr="QMA", sink="mem", topic="#", scheme=2)]
    (why,) = _why_sinks_cannot_move(nodes, S, "QMB", moved)
    assert why.startswith("QMB's configuration cannot be read: invalid configuration"), why
    text = cfgs["QMB"].read_text(encoding="utf-8")
    cfgs["QMB"].write_text(text[:text.index("plugins:")] + (
        "plugins:\n  - name: mem\n    plugin: kafka\n"
        "    config: {bootstrap_servers: '127.0.0.1:1'}\n"), encoding="utf-8")
    problems = _why_sinks_cannot_move(nodes, S, "QMB", moved)
    assert any("QMB's sink instance mem is of plugin kafka, not memory" in p
               for p in problems), problems
    cfgs["QMA"].write_text("queue_manager: [\n", encoding="utf-8")
    problems = _why_sinks_cannot_move(nodes, S, "QMB", moved)
    assert problems[0].startswith("QMA's configuration cannot be read"), problems
    assert not any("sinks: owner" in p for p in problems), problems


async def test_a_sink_whose_backlog_is_deep_refuses_the_move_before_anything_changes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A sink whose target is down: its backlog grows on QMA; a move would hold every
    publication of the stream until it had sent them, so it refuses instead."""
    from gateway.runtime.streams import move

    monkeypatch.setattr(move, "SINK_BACKLOG_LIMIT", 20)  # 1,000 in use; same code path
    cfgs = await write_configs(tmp_path)
    async with running(cfgs) as apps:
        qm = apps["QMA"].qm
        assert qm is not None
        bus = get_bus(f"{tmp_path.name}-QMA")
        bus.down = True  # the sink's target is unreachable: sends fail, retriably
        for i in range(30):
            await publish(apps["QMA"], f"p{i}".encode())
        await until(lambda: qm.queue_depth("SYSTEM.MQGW.SINK.mem") == 30, "the backlog")
        assert await cli(move_argv(cfgs, "QMB")) == 2
        err = capsys.readouterr().err
        assert ("sink mem's backlog on QMA holds 30 message(s), more than 20: the sink's "
                "target may be down") in err, err
        assert "--leave-sinks" in err
        assert not (tmp_path / "QMB" / "move-PRICES.json").exists()
        assert qm.catalogue.queues[ROUTE].target == S
        assert not [q for q in qm.catalogue.queues if q.startswith("MQGW.MOVE.")]
        bus.down = False  # the target is back: the backlog empties, the move goes
        await until(lambda: qm.queue_depth("SYSTEM.MQGW.SINK.mem") == 0, "the backlog",
                    timeout=60)
        assert await cli(move_argv(cfgs, "QMB")) == 0
        assert len(payloads(tmp_path, "QMA")) == 30


async def test_a_backlog_key_the_move_cannot_read_refuses_it_before_anything_changes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Step sinks seals its commands with each node's key: one it cannot read must
    stop the move before the routes hold, not in the step."""
    cfgs = await write_configs(tmp_path)
    async with running(cfgs) as apps:
        key = tmp_path / "QMB" / "qm" / "backlog.key"
        aside = key.with_name("aside")
        key.rename(aside)
        try:
            assert await cli(move_argv(cfgs, "QMB")) == 2
        finally:
            aside.rename(key)
        err = capsys.readouterr().err
        assert "QMB: cannot read its backlog key" in err and "Nothing was changed" in err, err
        assert not (tmp_path / "QMB" / "move-PRICES.json").exists()
        for app in apps.values():
            assert app.qm is not None and app.qm.catalogue.queues[ROUTE].target != (
                "MQGW.MOVE.HOLD.PRICES")
        assert await cli(move_argv(cfgs, "QMB")) == 0  # with the key back
