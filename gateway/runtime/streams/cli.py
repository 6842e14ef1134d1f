"""``mqgw streams check [--fix] [--replay-dlq] [--write-config] [--json]`` and
``mqgw migrate``.

``streams check`` opens the gateway's embedded queue manager itself, so it works with the
gateway stopped. While the gateway runs, its data directory is locked (one process owns
an embedded queue manager): the check then reads the running gateway's ``/healthz``
(which carries the same report under ``streams``) when metrics are enabled, and refuses
``--fix``/``--replay-dlq`` (exit 2: stop the gateway first). Exit status: 0 all well,
1 a problem (left after the repairs asked for), 2 usage or configuration error.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

__all__ = ["register"]

OK, PROBLEM, USAGE = 0, 1, 2


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    streams = subparsers.add_parser(
        "streams",
        help="check (and repair) the stream queues the gateway must support",
        description="Stream union, provisioning and health (docs/neighbours.md).",
    )
    sub = streams.add_subparsers(dest="streams_command", metavar="SUBCOMMAND", required=True)
    p = sub.add_parser(
        "check",
        help="compare the stream union with the stream queues and what is serviced",
        description=(
            "For every stream of the union (serviced streams, neighbours' streams, a "
            "migrated broker's streams): does its queue exist, is it serviced, its depth "
            "and oldest message, and how many of its publications are on the dead-letter "
            "queue with reason 2085. Exit 0 all well, 1 a problem, 2 usage/config error."
        ),
    )
    p.add_argument("--config", type=Path, default=Path("gateway.yaml"), help="gateway YAML")
    p.add_argument("--fix", action="store_true", help="define missing stream queues")
    p.add_argument(
        "--write-config",
        action="store_true",
        help="with --fix: add unserviced streams to broker.streams in the YAML file",
    )
    p.add_argument(
        "--replay-dlq",
        action="store_true",
        help="put dead-lettered publications back on their (existing) stream queue",
    )
    p.add_argument("--json", action="store_true", help="the report as one JSON object")
    p.set_defaults(func=run_check)

    m = subparsers.add_parser(
        "migrate",
        help="take over a legacy broker's role: record its stream set (then fixed)",
        description=(
            "Record the stream set of the legacy broker the gateway takes over (given with "
            "--from-streams, or read from the broker's MQ/<QM>/StreamSupport publication "
            "with --from-broker alone; exit 2 naming the channels to check when the broker "
            "does not answer within --timeout). The set is "
            "fixed afterwards: a configuration adding or removing a stream is refused until "
            "`mqgw migrate --restart` starts a new migration. `mqgw streams check` reports "
            "the migration incomplete until every migrated stream is serviced."
        ),
    )
    m.add_argument("--config", type=Path, default=Path("gateway.yaml"), help="gateway YAML")
    m.add_argument(
        "--from-streams",
        help="the legacy broker's streams: S1,S2,... (default with --from-broker: read "
        "from the broker's retained StreamSupport publication)",
    )
    m.add_argument(
        "--from-broker",
        metavar="QM",
        help="the legacy broker's queue manager; without --from-streams its stream set is "
        "asked over channels (needs the gateway stopped, channels both ways in "
        "queue_manager.mqsc_file and --listen PORT or queue_manager.listener_port)",
    )
    m.add_argument("--restart", action="store_true", help="discard the recorded migration first")
    m.add_argument(
        "--copy-retained",
        action="store_true",
        help="with --from-broker: copy the broker's retained publications (needs the "
        "gateway stopped and channels both ways in queue_manager.mqsc_file)",
    )
    m.add_argument(
        "--listen",
        type=int,
        metavar="PORT",
        help="port of our listener for the broker's channel back to us (default: "
        "queue_manager.listener_port)",
    )
    m.add_argument("--timeout", type=float, default=10.0, help="seconds per broker answer")
    m.set_defaults(func=run_migrate)


def _err(command: str, text: str) -> int:
    print(f"mqgw {command}: {text}", file=sys.stderr)
    return USAGE


def _load(path: Path) -> Any:
    """The loaded configuration, or an error text."""
    from gateway.runtime.config import load_config
    from gateway.runtime.errors import ConfigErrors
    from gateway.runtime.registry import PluginRegistry

    try:
        return load_config(path, PluginRegistry.from_entry_points())
    except ConfigErrors as exc:
        return f"invalid configuration {path}: " + "; ".join(map(str, exc.errors))


# ------------------------------------------------------------------ streams check ---


def run_check(args: argparse.Namespace) -> int:
    if args.write_config and not args.fix:
        return _err("streams check", "--write-config goes with --fix")
    loaded = _load(args.config)
    if isinstance(loaded, str):
        return _err("streams check", loaded)
    from gateway.runtime.config import EmbeddedQueueManagerConfig

    qmc = loaded.gateway.queue_manager
    if not isinstance(qmc, EmbeddedQueueManagerConfig):
        return _err(
            "streams check",
            "only the embedded queue manager can be checked from the command line; with "
            "IBM MQ read the running gateway's /healthz (streams section)",
        )
    data_dir = loaded.path(qmc.data_dir)
    if not data_dir.is_dir():
        return _err(
            "streams check",
            f"no queue manager at {data_dir} (has the gateway ever run with this config?)",
        )
    return asyncio.run(_check(args, loaded, qmc.name, data_dir))


async def _check(args: argparse.Namespace, loaded: Any, name: str, data_dir: Path) -> int:
    from gateway.mq.embedded.qmgr import EmbeddedQueueManager, QueueManagerUnavailableError

    try:
        qm = EmbeddedQueueManager(name, data_dir, appl_name="mqgw streams")
    except QueueManagerUnavailableError as exc:
        return _check_running(args, loaded, str(exc))
    try:
        return await _check_open(args, loaded, qm)
    finally:
        await qm.close()


async def _check_open(args: argparse.Namespace, loaded: Any, qm: Any) -> int:
    from gateway.runtime.streams.health import collect_report
    from gateway.runtime.streams.migration import (
        migration_path,
        read_migration,
        write_migration,
    )
    from gateway.runtime.streams.observe import browse_dead_lettered
    from gateway.runtime.streams.repair import (
        add_streams_to_config,
        define_stream_queue,
        replay_dead_lettered,
        streams_yaml,
    )

    conn = await qm.connect()
    try:
        report = await collect_report(conn, loaded)
        notes: list[str] = []
        if args.fix:
            for f in report.streams:
                if not f.queue_exists:
                    define_stream_queue(qm, f.stream)
                    notes.append(f"defined stream queue {f.stream}")
            unserviced = sorted({f.stream for f in report.streams if not f.serviced})
            if unserviced and args.write_config:
                add_streams_to_config(args.config, unserviced)
                notes.append(
                    f"added {', '.join(unserviced)} to broker.streams in {args.config} "
                    f"(previous file kept as {args.config.name}.bak); restart the gateway"
                )
                reloaded = _load(args.config)
                if isinstance(reloaded, str):
                    return _err("streams check", reloaded)
                loaded = reloaded
            elif unserviced:
                notes.append(
                    "the broker must service these streams; add to the configuration "
                    f"(or run again with --write-config):\n{streams_yaml(unserviced)}"
                )
        if args.replay_dlq:
            if args.fix:  # queues defined since the first look
                report = await collect_report(conn, loaded)
            present = [f.stream for f in report.streams if f.queue_exists]
            items = await browse_dead_lettered(conn, report.dead_letter_queue, present)
            moved, error = await replay_dead_lettered(conn, report.dead_letter_queue, items)
            for stream, n in sorted(moved.items()):
                notes.append(f"replayed {n} publication(s) from the dead-letter queue to {stream}")
            if error is not None:
                notes.append(
                    f"replay stopped: {error} (that batch was backed out: its publications "
                    "are still on the dead-letter queue; repair and run again)"
                )
        if args.fix or args.replay_dlq:
            report = await collect_report(conn, loaded)
        path = migration_path(loaded.path(loaded.gateway.broker.store))
        record = read_migration(path)
        if record is not None and not record.complete and not report.migration_pending:
            write_migration(path, record.model_copy(update={"complete": True}))
            notes.append(f"migration from {report.migrated_from} complete: stream set fixed")
    finally:
        await conn.disconnect()
    _print(args, report.to_json(), report.text(), notes)
    return OK if report.ok else PROBLEM


def _print(args: argparse.Namespace, data: dict[str, Any], text: str, notes: list[str]) -> None:
    if args.json:
        print(json.dumps({**data, "actions": notes}))
    else:
        for n in notes:
            print(n)
        print(text)


def _check_running(args: argparse.Namespace, loaded: Any, why: str) -> int:
    """The data directory is locked: most likely the gateway runs. Ask its /healthz."""
    if args.fix or args.replay_dlq:
        return _err(
            "streams check",
            f"{why}\n--fix and --replay-dlq need the gateway stopped (they change its queue "
            "manager): stop it (SIGTERM), repair, start it again",
        )
    mc = loaded.gateway.metrics
    if not mc.enabled:
        return _err("streams check", f"{why}\n(metrics are disabled: nothing to ask instead)")
    host = "127.0.0.1" if mc.host in ("0.0.0.0", "::", "") else mc.host
    url = f"http://{host}:{mc.port}/healthz"
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            detail = json.loads(resp.read())
    except urllib.error.HTTPError as exc:  # 503 still carries the JSON
        detail = json.loads(exc.read() or b"{}")
    except (OSError, ValueError) as exc:
        return _err("streams check", f"{why}\nand {url} does not answer ({exc})")
    streams = detail.get("streams") if isinstance(detail, dict) else None
    if not isinstance(streams, dict):
        return _err("streams check", f"{why}\nand {url} carries no streams report yet")
    from gateway.runtime.streams.check import StreamReport

    try:
        report = StreamReport.from_json(streams)
    except (KeyError, TypeError, ValueError) as exc:
        return _err("streams check", f"{why}\nand {url} carries an unreadable report ({exc!r})")
    _print(args, report.to_json(), report.text(), [f"the gateway is running: report from {url}"])
    return OK if report.ok else PROBLEM


# ------------------------------------------------------------------ migrate ---------


def run_migrate(args: argparse.Namespace) -> int:
    from gateway.pubsub.streams import DEFAULT_STREAM, validate_stream_name
    from gateway.runtime.streams.migration import (
        MigrationRecord,
        migration_path,
        read_migration,
        write_migration,
    )
    from gateway.runtime.streams.repair import streams_yaml
    from gateway.runtime.streams.union import serviced_streams

    if args.from_streams is None and args.from_broker is None and not args.restart:
        return _err("migrate", "give --from-broker QM and/or --from-streams S1,S2[,...]")
    # The record lives next to the store; read the path without the record's checks.
    store = _store_of(args.config)
    if isinstance(store, str):
        return _err("migrate", store)
    path = migration_path(store)
    try:
        existing = read_migration(path)
    except ValueError as exc:
        existing = None
        if not args.restart:
            return _err("migrate", f"{exc}; `mqgw migrate --restart` replaces it")
    if existing is not None and not args.restart:
        return _err(
            "migrate",
            f"a migration from {existing.from_q_mgr or 'a stream list'} is recorded "
            f"({', '.join(existing.streams)}); the stream set is fixed: start a new "
            "migration with `mqgw migrate --restart --from-streams ...`",
        )
    if args.restart:
        path.unlink(missing_ok=True)
        if args.from_streams is None and args.from_broker is None:
            print(f"migration record {path} removed")
            return OK
    loaded = _load(args.config)
    if isinstance(loaded, str):
        return _err("migrate", loaded)
    notes: list[str] = []
    if args.from_streams is not None:
        streams = sorted({s.strip() for s in args.from_streams.split(",") if s.strip()})
    else:
        read = _read_stream_support(args, loaded)
        if isinstance(read, str):
            return _err("migrate", read)
        streams = read.streams
        print(f"{args.from_broker} publishes StreamSupport: {', '.join(streams) or '(none)'}")
        if read.warning:
            notes.append(read.warning)
    for s in streams:
        try:
            validate_stream_name(s)
        except Exception as exc:  # CommandError names the rule broken
            return _err("migrate", f"{s!r} is not a stream name: {exc}")
    extra = sorted(serviced_streams(loaded) - set(streams) - {DEFAULT_STREAM})
    if extra:
        return _err(
            "migrate",
            f"broker.streams services {', '.join(extra)}, which the migrated broker does "
            "not have; the stream set after a migration is the migrated broker's: remove "
            "them or name them in --from-streams",
        )
    notes += [
        "durable subscriptions: not copied (a legacy broker shows them through documented "
        "messages only when it publishes the MQ/SA/<qm>/Subscribers/AllIdentities "
        "metatopic; reading it is not implemented)",
    ]
    copied = 0
    if args.copy_retained:
        if not args.from_broker:
            return _err("migrate", "--copy-retained needs --from-broker QM")
        outcome = _copy_retained(args, loaded, streams)
        if isinstance(outcome, str):
            return _err("migrate", outcome)
        for stream, n in sorted(outcome.copied.items()):
            copied += n
            notes.append(f"retained publications on {stream}: {n} copied from {args.from_broker}")
        for stream, why in sorted(outcome.failed.items()):
            notes.append(f"retained publications on {stream}: not copied: {why}")
    elif args.from_broker:
        notes.append(
            "retained publications: not copied (run again with --restart --copy-retained "
            "while the broker is reachable, or let the publishers republish)"
        )
    record = MigrationRecord(
        from_q_mgr=args.from_broker or "", streams=streams, notes=notes, retained_copied=copied
    )
    write_migration(path, record)
    print(f"migration recorded in {path}: streams {', '.join(streams)}")
    for n in notes:
        print(n)
    pending = sorted(set(streams) - serviced_streams(loaded))
    if pending:
        print(
            "the migration is incomplete until the broker services every migrated stream; "
            f"add to the configuration:\n{streams_yaml(pending)}\n"
            "then `mqgw streams check --fix`"
        )
        return PROBLEM
    return OK


def _on_node(args: argparse.Namespace, loaded: Any, queues: list[str], work: Any) -> Any:
    """Run our queue manager as a network node (listener + the channels of its
    mqsc_file), define ``queues`` (stream queues) and the migration queue, then
    ``await work(node.qm, conn)``. Its result, or an error text."""
    from gateway.mq.embedded.network import QueueManagerNode
    from gateway.mq.port import MQError
    from gateway.runtime.config import EmbeddedQueueManagerConfig
    from gateway.runtime.streams.broker_query import MIGRATION_QUEUE
    from gateway.runtime.streams.repair import define_stream_queue

    qmc = loaded.gateway.queue_manager
    if not isinstance(qmc, EmbeddedQueueManagerConfig):
        return (
            "asking the broker works with the embedded queue manager only (give the "
            "stream set with --from-streams)"
        )
    port = args.listen if args.listen is not None else getattr(qmc, "listener_port", None)
    if port is None:
        return (
            "asking the broker needs our listener's port (it answers over its channel "
            "back to us): give --listen PORT or queue_manager.listener_port (or give the "
            "stream set with --from-streams)"
        )
    mqsc = loaded.path(qmc.mqsc_file).read_text(encoding="utf-8") if qmc.mqsc_file else ""

    async def run() -> Any:
        node = QueueManagerNode(qmc.name, loaded.path(qmc.data_dir), mqsc=mqsc, port=port)
        try:
            await node.start()
        except MQError as exc:
            return f"cannot open the queue manager (is the gateway running?): {exc}"
        try:
            qm = node.qm
            for name in [*queues, MIGRATION_QUEUE]:
                if name not in qm.catalogue.queues:
                    define_stream_queue(qm, name)
            conn = await qm.connect()
            try:
                return await work(qm, conn)
            finally:
                await conn.disconnect()
        finally:
            await node.stop()

    return asyncio.run(run())


def _copy_retained(args: argparse.Namespace, loaded: Any, streams: list[str]) -> Any:
    """Copy the broker's retained publications on ``streams``: the result, or an error
    text."""
    from gateway.runtime.streams.retained_copy import copy_retained

    async def work(_qm: Any, conn: Any) -> Any:
        return await copy_retained(conn, args.from_broker, streams, timeout=args.timeout)

    return _on_node(args, loaded, streams, work)


def _read_stream_support(args: argparse.Namespace, loaded: Any) -> Any:
    """The broker's StreamSupport (its stream set), or an error text that names the
    channels and transmission queue to check when the broker did not answer."""
    from gateway.mq.port import MQError
    from gateway.runtime.streams.broker_stream_set import (
        StreamSupportError,
        ask_stream_support,
    )

    broker = args.from_broker

    async def work(qm: Any, conn: Any) -> Any:
        try:
            return await ask_stream_support(conn, broker, timeout=args.timeout)
        except StreamSupportError as exc:
            if exc.answered:
                return f"cannot read {broker}'s stream set: {exc}"
            return f"cannot read {broker}'s stream set: {exc}; {route_hint(qm, broker)}"
        except MQError as exc:
            return f"cannot ask {broker}: {exc}; {route_hint(qm, broker)}"

    return _on_node(args, loaded, [], work)


def route_hint(qm: Any, broker: str) -> str:
    """What to check when ``broker`` does not answer: our transmission queue towards it
    (and what waits there), the sender channel serving it, our receiver channels."""
    from gateway.mq.embedded.objects import ChannelType

    cat = qm.catalogue
    own = cat.q_mgr_name
    q = cat.queues.get(broker)
    xmitq = broker if q is not None and q.is_xmitq else cat.qmgr.default_xmit_q_name
    receivers = sorted(c.name for c in cat.channels.values() if c.chltype == ChannelType.RCVR)
    back = (
        f"and {broker}'s channel back to {own} (our receiver channel(s): "
        f"{', '.join(receivers) or 'none defined'})"
    )
    if not xmitq:
        return (
            f"no transmission queue reaches {broker}: define QLOCAL({broker}) USAGE(XMITQ) "
            f"and a sender channel serving it in queue_manager.mqsc_file, {back}"
        )
    senders = sorted(
        c.name
        for c in cat.channels.values()
        if c.chltype == ChannelType.SDR and c.xmit_q_name == xmitq
    )
    depth = qm.queue_depth(xmitq)
    return (
        f"check the sender channel {', '.join(senders) or '(none serves it!)'} of "
        f"transmission queue {xmitq} ({depth} message(s) waiting there) {back}"
    )


def _store_of(config: Path) -> Path | str:
    """The pub/sub store a configuration names, read without the migration check."""
    import yaml

    try:
        data = yaml.safe_load(config.read_text(encoding="utf-8")) or {}
    except (OSError, yaml.YAMLError) as exc:
        return f"cannot read {config}: {exc}"
    broker = data.get("broker") if isinstance(data, dict) else None
    store = Path(str((broker or {}).get("store", "data/pubsub.db")))
    return store if store.is_absolute() else config.resolve().parent / store
