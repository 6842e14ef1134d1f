"""``mqgw streams move STREAM --to QM --node CONFIG ...``: give a stream another owner
under load (docs/scaling.md, "Moving a stream"), and ``--status``.

Exit status: 0 the move is complete (or there was nothing to move), 1 it stopped
unfinished (a node not running, the drain not finished in ``--timeout``; the journal
keeps its place: run the same command again), 2 usage, configuration or a refused
change.
"""

from __future__ import annotations

import argparse
import asyncio
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from gateway.runtime.streams.cli_support import OK, PROBLEM, err, load

__all__ = ["register_move"]

HELP = """\
Move STREAM's ownership to the node whose queue manager is QM, while publishers keep
publishing: no publication lost or delivered twice to an MQ subscriber, each
publisher's order kept (tested with SIGKILLs of either node and of this command).

Every node (one --node per gateway configuration, all running) services STREAM on its
stream queue and shares it with the others as neighbours; publishers put to the
stream's publishing route, QALIAS(ROUTE), on any node: TARGET(STREAM) on the owner,
elsewhere TARGET of a QREMOTE with RNAME(STREAM) RQMNAME(owner). The move:

  hold:QM     on every node, ROUTE is pointed at a local holding queue
              (MQGW.MOVE.HOLD.<stream>): new publications wait there, none is refused
  drain       waits until everything published before the hold is taken and forwarded
              (no transmission queue holds a message for STREAM, every node's STREAM is
              empty); --timeout bounds the wait, the next run waits again
  retained    the old owner's retained publications of STREAM (read from its pub/sub
              store) are put on the new owner's STREAM as the old owner's forwarded
              publications, ahead of the held ones: the new owner keeps them retained;
              one it holds already is a replay, delivered to nobody
  sinks       (a sink subscribes to STREAM on a node other than QM) once QM has taken
              the retained copies and the old nodes' sink backlogs hold nothing of
              STREAM: each such sink's subscription is made on QM (RegSub naming its
              backlog queue, NewPubsOnly) and removed where it was (DeregSub), by each
              node's broker; each command is sealed with that node's backlog key
              (backlog.key in its queue manager's data directory: run the move as a
              user who may read it), the only authority a broker takes it on
  release:QM  the new owner first, then every other node: the held publications go, in
              their order, to the new owner's STREAM, then ROUTE names it there (a
              QREMOTE <ROUTE>.<QM> is defined on the other nodes). For the moment the
              last held ones move, the holding queue is put-inhibited (a publisher
              putting then gets MQRC 2051 and puts again); ROUTE changes only once the
              holding queue's depth is 0 (puts still being written, units of work)
  finish

Sinks move with the stream when every node that has one subscribed configures the
stream with `sinks: owner` (broker.streams) and has that sink instance enabled, and QM
has the same instance (same plugin) enabled; otherwise the move refuses before changing
anything (exit 2, naming them), unless --leave-sinks: they then stay where they are, on
a node that no longer owns STREAM (`mqgw network check` reports sink-on-non-owner);
on a node that configures STREAM `sinks: owner`, only until its next start, which
removes them (that node no longer owns STREAM).
A sink to move whose backlog queue holds more than 1,000 messages on its old node
refuses the move as well (exit 2, nothing changed): its target may be down, and step
sinks would hold every publication of STREAM until the backlog had sent them.

Each step is idempotent and recorded in a journal (--journal) once done: after a crash
of the command or of a node, run the same command again and it continues where it
stopped. --status shows the journal and every node's route.
"""


def register_move(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "move",
        help="move a stream's ownership to another node, under load, crash-safe",
        description=HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("stream", metavar="STREAM", help="the stream (its queue's name) to move")
    p.add_argument("--to", metavar="QM", help="the new owner's queue manager (not with "
                   "--status)")
    p.add_argument(
        "--node",
        dest="nodes",
        action="append",
        type=Path,
        default=[],
        metavar="CONFIG",
        required=True,
        help="a node's gateway YAML; give every node of the network, the new owner too",
    )
    p.add_argument("--route", help="the publishing route's QALIAS (default: the stream's "
                   "broker.streams route in the new owner's configuration, else STREAM.PUB)")
    p.add_argument(
        "--journal",
        type=Path,
        help="the move's journal (default move-STREAM.json beside the new owner's "
        "configuration; the same file must be given to every run of one move)",
    )
    p.add_argument("--timeout", type=float, default=60.0,
                   help="seconds the drain, and the release's wait for the holding "
                   "queue to empty, may wait in this run (default 60)")
    p.add_argument("--leave-sinks", action="store_true",
                   help="move the stream without its sinks: those subscribed to it on a "
                   "node other than QM stay there (until that node's next start where it "
                   "configures the stream `sinks: owner`: that start removes them); "
                   "without this they move with it, or, when they cannot, the move "
                   "refuses")
    p.add_argument("--status", action="store_true", help="show the move's journal and "
                   "each node's route; change nothing")
    p.set_defaults(func=run_move_command, exit_codes=(
        (0, "moved (with --status: the move is complete or none was started)"),
        (1, "stopped before the end (a node unreachable, the drain timed out): run the "
            "same command again to continue; with --status: the move is not complete"),
        (2, "usage, configuration or a node's state refuses the move"),
    ))


def _err(text: str) -> int:
    return err("streams move", text)


def _nodes(paths: list[Path]) -> dict[str, tuple[Path, Path, Path]] | str:
    """queue manager -> (configuration, data directory, pub/sub store), or an error
    text."""
    from gateway.runtime.config import EmbeddedQueueManagerConfig

    out: dict[str, tuple[Path, Path, Path]] = {}
    for path in paths:
        loaded = load(path)
        if isinstance(loaded, str):
            return loaded
        qmc = loaded.gateway.queue_manager
        if not isinstance(qmc, EmbeddedQueueManagerConfig):
            return f"{path}: a move works on embedded queue managers only"
        if qmc.name in out:
            return f"{path}: queue manager {qmc.name} is given twice"
        out[qmc.name] = (path.resolve(), loaded.path(qmc.data_dir),
                         loaded.path(loaded.gateway.broker.store))
    return out


def _sink_subscriptions(nodes: dict[str, tuple[Path, Path, Path]], stream: str
                        ) -> dict[str, list[Any]]:
    """node -> its sink subscriptions to ``stream`` (MovedSink), read from its pub/sub
    store (read only, as ``mqgw subscriptions`` reads it beside a running gateway)."""
    from gateway.pubsub.sqlite_store import SqliteStore
    from gateway.runtime.streams.move_plan import MovedSink

    out: dict[str, list[Any]] = {}
    for name, (_, _, path) in nodes.items():
        if not path.is_file():
            continue
        store = SqliteStore(path)
        try:
            subs = store.load().subscriptions
        finally:
            store.close()
        out[name] = sorted(
            {MovedSink(q_mgr=name, sink=s.destination.sink, topic=s.topic, scheme=int(s.scheme))
             for s in subs if s.stream == stream and s.destination.sink},
            key=lambda m: (m.sink, m.topic, m.scheme))
    return out


def _why_sinks_cannot_move(nodes: dict[str, tuple[Path, Path, Path]], stream: str, to: str,
                           moved: list[Any]) -> list[str]:
    """What keeps the sink subscriptions ``moved`` from moving to ``to``: a
    configuration that cannot be loaded; a node they leave whose configuration would
    subscribe them again at its next start (the stream not ``sinks: owner``), or has
    not the sink instance enabled (its broker changes only a registered sink's
    subscriptions: the DeregSub would leave it there); a sink instance ``to`` does not
    have enabled, or of another plugin."""
    problems: list[str] = []
    configs = {n: load(c) for n, (c, _, _) in nodes.items()}
    for node in sorted({to, *(m.q_mgr for m in moved)}):
        if isinstance(configs.get(node), str):
            problems.append(f"{node}'s configuration cannot be read: {configs[node]}")

    def sinks_of(node: str) -> dict[str, str]:
        """The enabled plugin instances (each a sink of its broker) -> their plugin."""
        cfg = configs.get(node)
        if cfg is None or isinstance(cfg, str):
            return {}
        return {p.name: p.plugin for p in cfg.gateway.plugins if p.enabled}

    def entry(node: str) -> Any:
        cfg = configs.get(node)
        if cfg is None or isinstance(cfg, str):
            return None
        return next((e for e in cfg.gateway.broker.streams if e.name == stream), None)

    plugin_of: dict[str, str] = {}
    for node in sorted({m.q_mgr for m in moved}):
        if isinstance(configs.get(node), str):
            continue
        e = entry(node)
        if e is None or e.sinks != "owner":
            problems.append(f"{node} does not configure {stream} with `sinks: owner` (its "
                            "next start would subscribe its sinks again)")
        mine = sinks_of(node)
        for sink in sorted({m.sink for m in moved if m.q_mgr == node}):
            if sink in mine:
                plugin_of.setdefault(sink, mine[sink])
            else:
                problems.append(
                    f"{node} has no enabled sink instance {sink} in its configuration (its "
                    "broker changes only a registered sink's subscriptions: the one its "
                    "store keeps would stay; enable the instance there)")
    if not isinstance(configs.get(to), str):
        have = sinks_of(to)
        for sink in sorted({m.sink for m in moved}):
            if sink not in have:
                problems.append(f"{to} has no enabled sink instance {sink} in its configuration")
            elif sink in plugin_of and have[sink] != plugin_of[sink]:
                problems.append(f"{to}'s sink instance {sink} is of plugin {have[sink]}, not "
                                f"{plugin_of[sink]} as where it moves from")
    return problems


def _configured_route(nodes: dict[str, tuple[Path, Path, Path]], stream: str, to: str
                      ) -> str | None:
    """The stream's ``route`` in the new owner's configuration, if it sets one."""
    if to not in nodes:
        return None
    loaded = load(nodes[to][0])
    if isinstance(loaded, str):
        return None
    entry = next((e for e in loaded.gateway.broker.streams if e.name == stream), None)
    return None if entry is None else entry.route


def run_move_command(args: argparse.Namespace) -> int:
    from gateway.runtime.streams.move_plan import journal_path, read_journal

    nodes = _nodes(args.nodes)
    if isinstance(nodes, str):
        return _err(nodes)
    if len(nodes) < 2 and not args.status:
        return _err("give every node with --node (at least the old and the new owner)")
    route = (args.route or _configured_route(nodes, args.stream, args.to or "")
             or f"{args.stream}.PUB")
    if args.journal is not None:
        path = args.journal
    elif args.to and args.to in nodes:
        path = journal_path(nodes[args.to][0].parent, args.stream)
    else:
        return _err(
            "give --journal, or --to QM naming one of the --node queue managers "
            f"({', '.join(nodes)})"
        )
    try:
        journal = read_journal(path)
    except ValueError as exc:
        return _err(str(exc))
    if args.status:
        return asyncio.run(_status(args, nodes, route, path, journal))
    if not args.to:
        return _err("give --to QM (the new owner)")
    if journal is not None and not journal.complete:
        if (journal.stream, journal.to_q_mgr) != (args.stream, args.to):
            return _err(
                f"{path} records an unfinished move of {journal.stream} to "
                f"{journal.to_q_mgr}: finish it first (run it again)"
            )
        if set(journal.nodes) != set(nodes):
            return _err(
                f"{path} records the nodes {', '.join(journal.nodes)}; give the same "
                "--node configurations"
            )
        print(f"continuing the move of {journal.stream} from {journal.from_q_mgr} to "
              f"{journal.to_q_mgr} (done: {', '.join(journal.done) or 'nothing'})")
        return asyncio.run(_continue(args, nodes, path, journal))
    return asyncio.run(_start(args, nodes, route, path))


async def _connect(nodes: dict[str, tuple[Path, Path, Path]]) -> Any:
    from gateway.runtime.streams.move import MoveError, connect_nodes

    try:
        return await connect_nodes({q: d for q, (_, d, _) in nodes.items()})
    except MoveError as exc:
        return str(exc)


async def _start(
    args: argparse.Namespace, nodes: dict[str, tuple[Path, Path, Path]], route: str, path: Path
) -> int:
    from gateway.pubsub.errors import StoreError
    from gateway.runtime.streams.move import close_nodes, read_route
    from gateway.runtime.streams.move_plan import MoveJournal, sinks_off_owner, write_journal

    conns = await _connect(nodes)
    if isinstance(conns, str):
        print(f"mqgw streams move: {conns}")
        return PROBLEM
    try:
        if args.to not in nodes:
            return _err(f"--to {args.to} is not one of the nodes ({', '.join(nodes)})")
        owners: dict[str, list[str]] = {}
        for name, node in conns.items():
            state = await read_route(node, args.stream, route)
            if state.problem:
                return _err(state.problem)
            if state.held:
                return _err(
                    f"{name}'s route {route} holds {args.stream}'s publications but no "
                    f"unfinished move is recorded in {path}: give the journal of that move"
                )
            if args.stream not in await node.queues():
                return _err(f"{name} has no stream queue {args.stream}: every node must "
                            "service the stream (`mqgw streams check --fix`)")
            owners.setdefault(state.owner, []).append(name)
        if len(owners) != 1:
            detail = "; ".join(f"{o} by {', '.join(n)}" for o, n in sorted(owners.items()))
            return _err(f"the nodes disagree on {args.stream}'s owner ({detail}): "
                        f"correct the routes ({route}) first")
        (old,) = owners
        if old == args.to:
            print(f"{args.stream} is owned by {old} already: nothing to move")
            return OK
        if old not in nodes:
            return _err(f"{args.stream}'s owner {old} is not one of the nodes: give its "
                        "configuration with --node")
        try:
            sinks = _sink_subscriptions(nodes, args.stream)
        except StoreError as exc:
            return _err(f"cannot read a node's pub/sub store for its sinks: {exc}")
        left = sinks_off_owner({n: [m.sink for m in v] for n, v in sinks.items()}, args.to)
        moved = [m for n, v in sorted(sinks.items()) if n != args.to for m in v]
        where = "; ".join(f"{', '.join(v)} on {n}" for n, v in left.items())
        if left and args.leave_sinks:
            print(f"leaving sink(s) where they are: {where} (a node configuring "
                  f"{args.stream} `sinks: owner` removes them at its next start)")
            moved = []
        elif left:
            problems = _why_sinks_cannot_move(nodes, args.stream, args.to, moved)
            if problems:
                return _err(
                    f"sink(s) subscribe to {args.stream} on nodes that would not own it: "
                    f"{where}; they cannot move to {args.to}: {'; '.join(problems)} "
                    "(docs/scaling.md, \"Sinks and retained publications\"). Give "
                    "--leave-sinks to move the stream and leave them where they are "
                    "(`mqgw network check` then reports them as sink-on-non-owner; a node "
                    "configuring it `sinks: owner` removes them at its next start)"
                )
            from gateway.runtime.streams.move import (
                SINK_BACKLOG_LIMIT,
                MoveError,
                deep_backlogs,
            )

            for q_mgr in sorted({args.to, *(m.q_mgr for m in moved)}):
                try:  # step sinks seals its commands with it: known now, not then
                    conns[q_mgr].backlog_key()
                except MoveError as exc:
                    return _err(f"{exc}. Nothing was changed")
            if deep := await deep_backlogs(conns, moved):
                return _err(
                    f"{'; '.join(deep)}, more than {SINK_BACKLOG_LIMIT}: the sink's target "
                    "may be down or behind, and step sinks would hold every publication of "
                    f"{args.stream} (the routes held) until the backlog has sent what it "
                    "holds of the stream. Nothing was changed: retry once it has caught up, "
                    "or give --leave-sinks"
                )
            print(f"moving sink(s) with the stream: {where}")
        now = datetime.now(UTC).isoformat(timespec="seconds")
        journal = MoveJournal(
            stream=args.stream, route=route, from_q_mgr=old, to_q_mgr=args.to,
            nodes={q: str(c) for q, (c, _, _) in nodes.items()}, started=now, updated=now,
            sinks=moved,
        )
        write_journal(path, journal)
        print(f"moving {args.stream} from {old} to {args.to} (journal {path})")
        return await _run(args, nodes, conns, path, journal)
    finally:
        await close_nodes(conns)


async def _continue(
    args: argparse.Namespace, nodes: dict[str, tuple[Path, Path, Path]], path: Path, journal: Any
) -> int:
    from gateway.runtime.streams.move import close_nodes
    from gateway.runtime.streams.move_plan import write_journal

    conns = await _connect(nodes)
    if isinstance(conns, str):
        write_journal(path, journal.model_copy(update={"waiting": conns}))
        print(f"mqgw streams move: {conns}; run again when they are")
        return PROBLEM
    try:
        return await _run(args, nodes, conns, path, journal)
    finally:
        await close_nodes(conns)


async def _run(
    args: argparse.Namespace,
    nodes: dict[str, tuple[Path, Path, Path]],
    conns: Any,
    path: Path,
    journal: Any,
) -> int:
    from gateway.runtime.streams.move import MoveError, run_move
    from gateway.runtime.streams.move_plan import write_journal
    from gateway.runtime.streams.move_retained import retained_copies
    from gateway.wire.mqmd import MQMD

    def save(j: Any) -> None:
        write_journal(path, j)

    def retained() -> list[tuple[MQMD, bytes]]:
        """The old owner's retained publications of the stream, read from its pub/sub
        store (read only, beside the running gateway) after the drain."""
        from gateway.pubsub.errors import StoreError
        from gateway.pubsub.sqlite_store import SqliteStore

        store_path = nodes[journal.from_q_mgr][2]
        if not store_path.is_file():
            return []
        try:  # an unreadable store stops the move (exit 1); run it again
            store = SqliteStore(store_path)
            try:
                held = store.load().retained
            finally:
                store.close()
        except StoreError as exc:
            raise MoveError(str(exc)) from exc
        copies = retained_copies(held, journal.stream, from_q_mgr=journal.from_q_mgr,
                                 to_q_mgr=journal.to_q_mgr)
        print(f"copying {len(copies)} retained publication(s) of {journal.stream} to "
              f"{journal.to_q_mgr}", flush=True)
        return copies

    async def starting(step: str) -> None:
        print(f"running: {step}", flush=True)

    journal, why = await run_move(
        journal, conns, save, drain_timeout=args.timeout,
        on_step=lambda step: print(f"done: {step}", flush=True), before_step=starting,
        retained=retained,
    )
    if why is not None:
        print(f"mqgw streams move: stopped: {why}; run the same command again to continue")
        return PROBLEM
    print(f"{journal.stream} is now owned by {journal.to_q_mgr}")
    return OK


async def _status(
    args: argparse.Namespace,
    nodes: dict[str, tuple[Path, Path, Path]],
    route: str,
    path: Path,
    journal: Any,
) -> int:
    from gateway.mq.embedded.client import connect_local
    from gateway.mq.port import MQError
    from gateway.runtime.streams.move import SocketNode, read_route
    from gateway.runtime.streams.move_plan import next_step

    if journal is None:
        print(f"no move of {args.stream} recorded in {path}")
    else:
        route = journal.route
        nxt = next_step(journal)
        print(f"move of {journal.stream} from {journal.from_q_mgr} to {journal.to_q_mgr}: "
              + ("complete" if nxt is None else f"next step {nxt}"))
        print(f"  started {journal.started}, updated {journal.updated}")
        print(f"  done: {', '.join(journal.done) or 'nothing'}")
        if journal.sinks:
            print("  sinks moved: " + ", ".join(f"{m.sink} from {m.q_mgr}"
                                                for m in journal.sinks))
        if journal.waiting:
            print(f"  stopped: {journal.waiting}")
    for name, (_, data_dir, _) in nodes.items():
        try:
            conn = await connect_local(data_dir, appl_name="mqgw streams move")
        except MQError as exc:
            print(f"  {name}: not reachable ({exc})")
            continue
        try:
            state = await read_route(SocketNode(name, conn), args.stream, route)
        finally:
            await conn.disconnect()
        said = state.problem or ("holding new publications" if state.held
                                 else f"routes to {state.owner}")
        print(f"  {name}: {route} {said}")
    return OK if journal is None or journal.complete else PROBLEM
