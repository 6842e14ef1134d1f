"""``mqgw qm mqsc|put|get|browse|dlq``: IBM MQ's administration programs for the
embedded queue manager (runmqsc, amqsput, amqsget, amqsbcg, runmqdlq).

Every sub-command works on a running gateway (through the queue manager's local socket,
docs/embedded-qm.md) and on a stopped data directory (opening it), choosing by itself;
``-v`` says which. The queue manager is named by the gateway's configuration (``-c``,
default ./gateway.yaml: its ``queue_manager.data_dir``) or by ``--data-dir`` directly.
The help text is :data:`DESCRIPTION`; the exit statuses are stated per sub-command.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gateway.mq.embedded.admin import AdminSession

__all__ = ["register"]

Provider = Callable[[str], list[list[str]]]

DESCRIPTION = """\
IBM MQ's administration programs for the embedded queue manager: runmqsc, amqsput,
amqsget, amqsbcg and runmqdlq as mqgw qm mqsc, put, get, browse and dlq.

Every sub-command works on a running gateway (through the queue manager's local socket,
docs/embedded-qm.md) and on a stopped data directory (opening it), choosing by itself;
-v says which. The queue manager is named by the gateway's configuration (-c, default
./gateway.yaml: its queue_manager.data_dir) or by --data-dir directly.
"""

#: What every ``mqgw qm`` sub-command may end with besides its own statuses.
UNREACHABLE = (2, "usage, or the queue manager cannot be reached")
MQ_CALL_FAILED = (1, "an MQ call failed")


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser(
        "qm",
        help="administer the embedded queue manager, running or stopped "
        "(runmqsc, amqsput, amqsget, amqsbcg, dead-letter handler)",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = p.add_subparsers(dest="qm_command", metavar="SUBCOMMAND", required=True)

    def common(name: str, help_: str) -> argparse.ArgumentParser:
        s = sub.add_parser(name, help=help_, description=help_)
        where = s.add_mutually_exclusive_group()
        where.add_argument("-c", "--config", type=Path, default=None,
                           help="the gateway's configuration (default ./gateway.yaml)")
        where.add_argument("--data-dir", type=Path, default=None,
                           help="the queue manager's data directory itself")
        s.add_argument("-v", "--verbose", dest="qm_verbose", action="store_true",
                       help="say whether the running gateway or the data directory was used")
        return s

    m = common("mqsc", "run MQSC commands (runmqsc) from FILE or stdin")
    m.add_argument("file", nargs="?", default="-", metavar="FILE",
                   help="MQSC script (default - : stdin)")
    m.set_defaults(func=_run(_mqsc), exit_codes=(
        (0, "every command processed"), MQ_CALL_FAILED, UNREACHABLE,
        (10, "some MQSC commands failed (as runmqsc)"),
    ))

    put = common("put", "put each line of stdin as one message (amqsput)")
    put.add_argument("queue", metavar="QUEUE", help="the queue to put to")
    put.add_argument("--non-persistent", action="store_true",
                     help="non-persistent messages (default persistent: on a stopped queue "
                     "manager non-persistent messages end with the command)")
    put.add_argument("--format", default="MQSTR", help="MQMD Format (default MQSTR)")
    put.set_defaults(func=_run(_put), exit_codes=((0, "put"), MQ_CALL_FAILED, UNREACHABLE))

    get = common("get", "get (destructively) and print messages (amqsget)")
    get.add_argument("queue", metavar="QUEUE", help="the queue to get from")
    get.add_argument("--wait", type=float, default=0.0,
                     help="seconds to wait for a further message (default 0)")
    get.add_argument("--max", type=int, default=0, help="at most N messages (default all)")
    get.set_defaults(func=_run(_get), exit_codes=(
        (0, "got (none waiting is no error)"), MQ_CALL_FAILED, UNREACHABLE,
    ))

    browse = common("browse", "print messages with their MQMD and every header decoded "
                    "(amqsbcg); the queue is not changed")
    browse.add_argument("queue", metavar="QUEUE", help="the queue to browse")
    browse.add_argument("--max", type=int, default=0, help="at most N messages (default all)")
    browse.set_defaults(func=_run(_browse), exit_codes=(
        (0, "browsed"), MQ_CALL_FAILED, UNREACHABLE,
    ))

    dlq = common("dlq", "run the dead-letter handler with a rules table (runmqdlq)")
    dlq.add_argument("--rules", type=Path, required=True, help="the rules table file")
    dlq.add_argument("--once", action="store_true",
                     help="handle what the queue holds now, then stop")
    dlq.add_argument("--dry-run", action="store_true",
                     help="say what each rule would do, change nothing")
    dlq.add_argument("--progress", action="store_true",
                     help="show messages handled as they go on stderr even when it is not "
                     "a terminal (a final count is always written)")
    dlq.set_defaults(func=_run(_dlq), exit_codes=(
        (0, "done"), (1, "an MQ call failed, or a rule's action failed for some messages"),
        (2, "usage, an unreadable or invalid rules table, or the queue manager cannot be "
            "reached"),
    ))


# ---------------------------------------------------------------- locating --------


def _locate(args: argparse.Namespace) -> tuple[Path, dict[str, Provider]] | str:
    """(data directory, DISPLAY providers) or an error message."""
    if args.data_dir is not None:
        return args.data_dir, {}
    from gateway.runtime.config import EmbeddedQueueManagerConfig, load_config
    from gateway.runtime.errors import ConfigErrors
    from gateway.runtime.qm_status import broker_status_reports
    from gateway.runtime.registry import PluginRegistry

    config = args.config if args.config is not None else Path("gateway.yaml")
    try:
        loaded = load_config(config, PluginRegistry.from_entry_points())
    except ConfigErrors as exc:
        return f"invalid configuration {config}: " + "; ".join(map(str, exc.errors))
    qmc = loaded.gateway.queue_manager
    if not isinstance(qmc, EmbeddedQueueManagerConfig):
        return (f"{config}: the queue manager is IBM MQ ({qmc.name}); use IBM MQ's own "
                "runmqsc and samples")
    store = loaded.path(loaded.gateway.broker.store)
    return loaded.path(qmc.data_dir), broker_status_reports(store)


Command = Callable[["AdminSession", argparse.Namespace], Awaitable[int]]


def _run(command: Command) -> Callable[[argparse.Namespace], int]:
    def func(args: argparse.Namespace) -> int:
        from gateway.mq.embedded.admin import AdminError, open_admin
        from gateway.mq.port import MQError

        where = _locate(args)
        if isinstance(where, str):
            print(f"mqgw qm {args.qm_command}: {where}", file=sys.stderr)
            return 2
        data_dir, providers = where
        # read the script before connecting: stdin may be slow, the QM is held meanwhile
        if args.qm_command == "mqsc":
            args.script = (sys.stdin.read() if args.file == "-"
                           else Path(args.file).read_text(encoding="utf-8"))

        async def main() -> int:
            try:
                session = await open_admin(data_dir, status_reports=providers,
                                           appl_name=f"mqgw qm {args.qm_command}")
            except (AdminError, MQError) as exc:
                print(f"mqgw qm {args.qm_command}: {exc}", file=sys.stderr)
                return 2
            if args.qm_verbose or getattr(args, "verbose", 0):
                print(f"mqgw qm: {session.how}", file=sys.stderr)
            try:
                return await command(session, args)
            except MQError as exc:
                print(f"mqgw qm {args.qm_command}: {exc}", file=sys.stderr)
                return 1
            finally:
                await session.close()

        return asyncio.run(main())

    return func


# ---------------------------------------------------------------- commands --------


async def _mqsc(session: AdminSession, args: argparse.Namespace) -> int:
    output, ok = await session.mqsc(args.script)
    sys.stdout.write(output)
    return 0 if ok else 10


async def _put(session: AdminSession, args: argparse.Namespace) -> int:
    from gateway.mq.port import OpenOption
    from gateway.wire.mqmd import MQMD

    q = await session.conn.open(args.queue, OpenOption.OUTPUT)
    count = 0
    try:
        print(f"target queue is {args.queue}")
        for line in sys.stdin:
            text = line.rstrip("\n")
            if not text:
                break  # amqsput ends at an empty line
            md = MQMD(format=args.format[:8], coded_char_set_id=1208,
                      persistence=0 if args.non_persistent else 1)
            await q.put(md, text.encode("utf-8"))
            count += 1
    finally:
        await q.close()
    print(f"{count} message(s) put")
    return 0


async def _get(session: AdminSession, args: argparse.Namespace) -> int:
    from gateway.mq.port import GetOptions, MQError, OpenOption
    from gateway.wire.reasons import Reason

    q = await session.conn.open(args.queue, OpenOption.INPUT_SHARED)
    count = 0
    try:
        print(f"source queue is {args.queue}")
        while not args.max or count < args.max:
            try:
                msg = await q.get(GetOptions(wait_ms=int(args.wait * 1000)))
            except MQError as exc:
                if exc.reason == Reason.NO_MSG_AVAILABLE:
                    print("no more messages")
                    break
                raise
            count += 1
            print(f"message <{_text(msg.body)}>")
    finally:
        await q.close()
    return 0


def _text(body: bytes) -> str:
    return body.decode("utf-8", errors="replace")


async def _browse(session: AdminSession, args: argparse.Namespace) -> int:
    from gateway.mq.port import Browse, GetOptions, MQError, OpenOption
    from gateway.runtime.message_dump import dump_message
    from gateway.wire.reasons import Reason

    q = await session.conn.open(args.queue, OpenOption.BROWSE)
    count = 0
    try:
        print(f"AMQSBCG0 - starts here\nQMgrName - {session.q_mgr_name}\nQName - {args.queue}\n")
        while not args.max or count < args.max:
            try:
                msg = await q.get(GetOptions(browse=Browse.NEXT if count else Browse.FIRST))
            except MQError as exc:
                if exc.reason == Reason.NO_MSG_AVAILABLE:
                    break
                raise
            count += 1
            print(dump_message(count, msg.md, msg.body))
    finally:
        await q.close()
    print(f"No more messages ({count} browsed)")
    return 0


async def _dlq(session: AdminSession, args: argparse.Namespace) -> int:
    from gateway.mq.dlq_handler import DlqHandlerError, run_dlq_handler
    from gateway.mq.dlq_rules import DlqRulesError, parse_rules

    try:
        rules = parse_rules(args.rules.read_text(encoding="utf-8"))
    except OSError as exc:
        print(f"mqgw qm dlq: cannot read {args.rules}: {exc.strerror}", file=sys.stderr)
        return 2
    except DlqRulesError as exc:
        print(f"mqgw qm dlq: {args.rules}: {exc}", file=sys.stderr)
        return 2
    from gateway.runtime.progress import Progress

    progress = Progress("mqgw qm dlq", "messages handled", force=args.progress)
    try:
        report = await run_dlq_handler(
            session.conn, rules, once=args.once, dry_run=args.dry_run, out=sys.stdout,
            on_message=lambda r: progress.update(len(r.lines), f"failed {r.failed}"),
        )
    except DlqHandlerError as exc:
        print(f"mqgw qm dlq: {exc}", file=sys.stderr)
        return 2
    progress.finish(f"removed {report.removed}, failed {report.failed}")
    return 1 if report.failed else 0
