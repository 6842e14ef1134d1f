"""``mqgw streams check [--fix] [--replay-dlq] [--write-config] [--json]``,
``mqgw streams move`` (:mod:`gateway.runtime.streams.move_cli`) and ``mqgw migrate``
(its parser and command: :mod:`gateway.runtime.streams.migrate_cli`).

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
import urllib.error
import urllib.request
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gateway.runtime.streams.cli_support import OK, PROBLEM, err, load
from gateway.runtime.streams.migrate_cli import register_migrate
from gateway.runtime.streams.move_cli import register_move

if TYPE_CHECKING:
    from gateway.runtime.streams.check import StreamCheckJson, StreamReportJson

__all__ = ["register"]


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
            "queue with reason 2085."
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
    p.add_argument(
        "--progress",
        action="store_true",
        help="with --fix/--replay-dlq: show progress on stderr even when it is not a "
        "terminal (on a terminal it is always shown)",
    )
    p.set_defaults(func=run_check, exit_codes=(
        (0, "every stream is well"), (1, "a problem (listed)"),
        (2, "usage or configuration error"),
    ))
    register_move(sub)
    register_migrate(subparsers)


# ------------------------------------------------------------------ streams check ---


def run_check(args: argparse.Namespace) -> int:
    if args.write_config and not args.fix:
        return err("streams check", "--write-config goes with --fix")
    loaded = load(args.config)
    if isinstance(loaded, str):
        return err("streams check", loaded)
    from gateway.runtime.config import EmbeddedQueueManagerConfig

    qmc = loaded.gateway.queue_manager
    if not isinstance(qmc, EmbeddedQueueManagerConfig):
        return err(
            "streams check",
            "only the embedded queue manager can be checked from the command line; with "
            "IBM MQ read the running gateway's /healthz (streams section)",
        )
    data_dir = loaded.path(qmc.data_dir)
    if not data_dir.is_dir():
        return err(
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
    from gateway.runtime.progress import Progress
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

    # --fix and --replay-dlq: one count of repairs (queues defined + publications
    # replayed) on stderr, live on a terminal or with --progress, the summary always.
    progress = (
        Progress("mqgw streams check", "repairs", force=args.progress)
        if args.fix or args.replay_dlq
        else None
    )
    defined = replayed = 0
    conn = await qm.connect()
    try:
        report = await collect_report(conn, loaded)
        notes: list[str] = []
        if args.fix:
            for f in report.streams:
                if not f.queue_exists:
                    try:
                        define_stream_queue(qm, f.stream)
                    except Exception as exc:  # MQSCError, or the name MQ refuses
                        return err(
                            "streams check",
                            f"cannot define stream queue {f.stream!r} (wanted by "
                            f"{', '.join(f.wanted_by)}): {exc}",
                        )
                    notes.append(f"defined stream queue {f.stream}")
                    defined += 1
                    if progress is not None:
                        progress.update(defined, f"defined {f.stream}")
            unserviced = sorted({f.stream for f in report.streams if not f.serviced})
            if unserviced and args.write_config:
                try:
                    add_streams_to_config(args.config, unserviced)
                except (OSError, ValueError, AttributeError, TypeError) as exc:
                    return err(
                        "streams check",
                        f"cannot add {', '.join(unserviced)} to broker.streams in "
                        f"{args.config}: {exc}",
                    )
                notes.append(
                    f"added {', '.join(unserviced)} to broker.streams in {args.config} "
                    f"(previous file kept as {args.config.name}.bak); restart the gateway"
                )
                reloaded = load(args.config)
                if isinstance(reloaded, str):
                    return err("streams check", reloaded)
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

            def on_batch(total: int) -> None:
                if progress is not None:
                    progress.update(defined + total, f"replayed {total} of {len(items)}")

            moved, error = await replay_dead_lettered(
                conn, report.dead_letter_queue, items, on_batch=on_batch
            )
            replayed = sum(moved.values())
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
    if progress is not None:
        progress.finish(
            f"{defined} stream queue(s) defined, {replayed} publication(s) replayed"
        )
    _print(args, report.to_json(), report.text(), notes)
    return OK if report.ok else PROBLEM


def _print(
    args: argparse.Namespace, data: StreamReportJson, text: str, notes: list[str]
) -> None:
    if args.json:
        out: StreamCheckJson = {**data, "actions": notes}
        print(json.dumps(out))
    else:
        for n in notes:
            print(n)
        print(text)


def _check_running(args: argparse.Namespace, loaded: Any, why: str) -> int:
    """The data directory is locked: most likely the gateway runs. Ask its /healthz."""
    if args.fix or args.replay_dlq:
        return err(
            "streams check",
            f"{why}\n--fix and --replay-dlq need the gateway stopped (they change its queue "
            "manager): stop it (SIGTERM), repair, start it again",
        )
    mc = loaded.gateway.metrics
    if not mc.enabled:
        return err("streams check", f"{why}\n(metrics are disabled: nothing to ask instead)")
    host = "127.0.0.1" if mc.host in ("0.0.0.0", "::", "") else mc.host
    url = f"http://{host}:{mc.port}/healthz"
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            detail = json.loads(resp.read())
    except urllib.error.HTTPError as exc:  # 503 still carries the JSON
        detail = json.loads(exc.read() or b"{}")
    except (OSError, ValueError) as exc:
        return err("streams check", f"{why}\nand {url} does not answer ({exc})")
    streams = detail.get("streams") if isinstance(detail, dict) else None
    if not isinstance(streams, dict):
        return err("streams check", f"{why}\nand {url} carries no streams report yet")
    from gateway.runtime.streams.check import StreamReport

    try:
        report = StreamReport.from_json(streams)
    except (KeyError, TypeError, ValueError) as exc:
        return err("streams check", f"{why}\nand {url} carries an unreadable report ({exc!r})")
    _print(args, report.to_json(), report.text(), [f"the gateway is running: report from {url}"])
    return OK if report.ok else PROBLEM
