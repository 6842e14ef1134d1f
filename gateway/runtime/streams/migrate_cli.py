"""``mqgw migrate``: take over a legacy broker's role (docs/neighbours.md, Migration).

The stream set comes from ``--from-streams`` or, with ``--from-broker QM`` alone, from
the broker's StreamSupport publication; ``--copy-retained`` copies its retained
publications. Both ask the broker over channels with our queue manager run as a network
node (the gateway stopped). Exit status: 0 recorded and complete, 1 recorded but
incomplete (streams to service), 2 usage, configuration or broker error.
"""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path
from typing import Any

from gateway.runtime.streams.cli_support import OK, PROBLEM, err, load

__all__ = ["register_migrate", "route_hint", "run_migrate"]


def _err(text: str) -> int:
    return err("migrate", text)


def register_migrate(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    m = subparsers.add_parser(
        "migrate",
        help="take over a legacy broker's role: record its stream set (then fixed)",
        description=(
            "Record the stream set of the legacy broker the gateway takes over (given with "
            "--from-streams, or read from the broker's MQ/<QM>/StreamSupport publication "
            "with --from-broker alone; naming the channels to check when the broker does "
            "not answer within --timeout). The set is "
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
    m.add_argument(
        "--progress",
        action="store_true",
        help="with --copy-retained: show progress (streams copied) on stderr even when it "
        "is not a terminal (on a terminal it is always shown)",
    )
    m.set_defaults(func=run_migrate, exit_codes=(
        (0, "recorded, and every migrated stream is serviced"),
        (1, "recorded, but the migration is incomplete (streams to add are printed)"),
        (2, "usage or configuration error, or the broker did not answer"),
    ))


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
        return _err("give --from-broker QM and/or --from-streams S1,S2[,...]")
    # The record lives next to the store; read the path without the record's checks.
    store = _store_of(args.config)
    if isinstance(store, str):
        return _err(store)
    path = migration_path(store)
    try:
        existing = read_migration(path)
    except ValueError as exc:
        existing = None
        if not args.restart:
            return _err(f"{exc}; `mqgw migrate --restart` replaces it")
    if existing is not None and not args.restart:
        return _err(
            f"a migration from {existing.from_q_mgr or 'a stream list'} is recorded "
            f"({', '.join(existing.streams)}); the stream set is fixed: start a new "
            "migration with `mqgw migrate --restart --from-streams ...`",
        )
    if args.restart:
        path.unlink(missing_ok=True)
        if args.from_streams is None and args.from_broker is None:
            print(f"migration record {path} removed")
            return OK
    loaded = load(args.config)
    if isinstance(loaded, str):
        return _err(loaded)
    notes: list[str] = []
    if args.from_streams is not None:
        streams = sorted({s.strip() for s in args.from_streams.split(",") if s.strip()})
    else:
        read = _read_stream_support(args, loaded)
        if isinstance(read, str):
            return _err(read)
        streams = read.streams
        print(f"{args.from_broker} publishes StreamSupport: {', '.join(streams) or '(none)'}")
        if read.warning:
            notes.append(read.warning)
    for s in streams:
        try:
            validate_stream_name(s)
        except Exception as exc:  # CommandError names the rule broken
            return _err(f"{s!r} is not a stream name: {exc}")
    extra = sorted(serviced_streams(loaded) - set(streams) - {DEFAULT_STREAM})
    if extra:
        return _err(
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
            return _err("--copy-retained needs --from-broker QM")
        outcome = _copy_retained(args, loaded, streams)
        if isinstance(outcome, str):
            return _err(outcome)
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


def copied_streams(result: Any) -> int:
    """Streams whose retained publications were copied (a failed one is not counted)."""
    return sum(1 for stream in result.copied if stream not in result.failed)


def _stream_detail(stream: str, part: Any) -> str:
    if stream in part.failed:
        return f"{stream}: failed"
    return f"{stream}: {part.copied.get(stream, 0)} retained"


def _copy_retained(args: argparse.Namespace, loaded: Any, streams: list[str]) -> Any:
    """Copy the broker's retained publications on ``streams``: the result, or an error
    text. One stream at a time, with a progress line per stream on stderr (live on a
    terminal or with ``--progress``, the summary always)."""
    from gateway.runtime.progress import Progress
    from gateway.runtime.streams.retained_copy import RetainedCopyResult, copy_retained

    progress = Progress("mqgw migrate", "streams copied", force=args.progress)

    async def work(_qm: Any, conn: Any) -> Any:
        result = RetainedCopyResult()
        for stream in streams:
            part = await copy_retained(conn, args.from_broker, [stream], timeout=args.timeout)
            result.copied.update(part.copied)
            result.failed.update(part.failed)
            progress.update(copied_streams(result), _stream_detail(stream, part))
        return result

    outcome = _on_node(args, loaded, streams, work)
    if not isinstance(outcome, str):
        progress.finish(
            f"{sum(outcome.copied.values())} retained publication(s) of {len(streams)} "
            f"stream(s), {len(outcome.failed)} failed"
        )
    return outcome


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
