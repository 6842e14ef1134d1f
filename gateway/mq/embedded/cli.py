"""``mqgw mqsc QM`` and ``mqgw network``: MQSC and networks of embedded queue managers.

``mqgw mqsc`` is ``runmqsc QM < script.mqsc`` for the embedded queue manager; ``mqgw
network`` runs the queue managers of a topology file (docs/networks.md). The help texts
are :data:`MQSC_DESCRIPTION` and the ``network`` parser's description.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from pathlib import Path

MQSC_DESCRIPTION = """\
Run MQSC commands from stdin against an embedded queue manager.

--data-dir holds queue managers (DIR/QM) or is one queue manager's own directory
(the queue_manager.data_dir of mqgw run). A queue manager a running process owns is
reached through its local socket (docs/embedded-qm.md); mqgw qm mqsc does the same
from the gateway's configuration.

Like runmqsc QM < script.mqsc: echoes each command with its number, prints the AMQ
messages and ends with the summary. A queue manager that does not exist is only
created with --create, so a typo in its name does not make a new one.
"""

DEFAULT_DATA_DIR_ENV = "MQGW_DATA_DIR"
DEFAULT_DATA_DIR = "data/qmgrs"


def default_data_dir() -> Path:
    return Path(os.environ.get(DEFAULT_DATA_DIR_ENV, DEFAULT_DATA_DIR))


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "mqsc",
        help="run MQSC commands (stdin) against an embedded queue manager",
        description=MQSC_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("qmgr", metavar="QM", help="queue manager name")
    parser.add_argument(
        "--data-dir",
        type=Path,
        default=None,
        help=f"directory holding queue managers (default ${DEFAULT_DATA_DIR_ENV} or "
        f"./{DEFAULT_DATA_DIR}); the queue manager lives in DIR/QM",
    )
    parser.add_argument(
        "--create", action="store_true", help="create the queue manager if it does not exist"
    )
    parser.set_defaults(func=run, exit_codes=(
        (0, "every command processed"),
        (10, "some commands failed"),
        (20, "the queue manager could not be used (or does not exist and no --create)"),
    ))

    net = subparsers.add_parser(
        "network",
        help="run a network of embedded queue managers from a topology file",
        description="Run the queue managers of a topology file (docs/networks.md) with "
        "their listeners, channels and repository managers until interrupted. With --qm, "
        "only those queue managers run here (the others in other processes; fixed ports).",
    )
    net.add_argument("topology", type=Path, help="topology YAML file")
    net.add_argument("--qm", action="append", default=[], help="run only this queue manager")
    net.add_argument("--data-dir", type=Path, default=None,
                     help="default: the topology's data_dir")
    net.set_defaults(func=run_network, exit_codes=(
        (0, "stopped when interrupted"),
        (2, "the topology file is invalid or a data directory cannot be used"),
    ))


def run(args: argparse.Namespace) -> int:
    from gateway.mq.embedded.qm_protocol import SOCKET_NAME
    from gateway.mq.embedded.store import DB_FILE

    base: Path = args.data_dir if args.data_dir is not None else default_data_dir()
    path = base / args.qmgr
    exists = [(p / DB_FILE).exists() or (p / SOCKET_NAME).exists() for p in (path, base)]
    if not exists[0] and exists[1]:
        path = base  # `mqgw run`'s layout: data_dir is the queue manager's own directory
    script = sys.stdin.read()
    if any(exists):
        return asyncio.run(_run_existing(args.qmgr, path, script))
    if not args.create:
        print(
            f"AMQ8118E: IBM MQ queue manager {args.qmgr} does not exist (no {path / DB_FILE}); "
            "use --create to create it.",
            file=sys.stderr,
        )
        return 20
    return _run_new(args.qmgr, path, script)


async def _run_existing(name: str, path: Path, script: str) -> int:
    """Through the running process's socket, or opening the directory (admin.open_admin)."""
    from gateway.mq.embedded.admin import AdminError, open_admin
    from gateway.mq.port import MQError

    try:
        session = await open_admin(path, appl_name="mqgw mqsc")
    except (AdminError, MQError) as exc:
        print(f"AMQ8146E: IBM MQ queue manager not available: {exc}", file=sys.stderr)
        return 20
    try:
        if session.q_mgr_name != name:
            print(f"AMQ8118E: IBM MQ queue manager {name} does not exist ({path} holds "
                  f"{session.q_mgr_name}).", file=sys.stderr)
            return 20
        output, ok = await session.mqsc(script)
    finally:
        await session.close()
    sys.stdout.write(output)
    return 0 if ok else 10


def _run_new(name: str, path: Path, script: str) -> int:
    from gateway.mq.embedded.mqsc_run import format_results
    from gateway.mq.embedded.qmgr import EmbeddedQueueManager
    from gateway.mq.port import MQError

    try:
        qm = EmbeddedQueueManager(name, path)
    except MQError as exc:
        print(f"AMQ8146E: IBM MQ queue manager not available: {exc.detail}", file=sys.stderr)
        return 20
    try:
        results = qm.run_mqsc(script)
    finally:
        asyncio.run(qm.close())
    sys.stdout.write(format_results(name, results))
    for r in results:  # as `mqgw network` reports a bad start script: QM and line
        if not r.ok:
            print(f"<stdin>: queue manager {name}: line {r.line}: {r.lines[-1]}",
                  file=sys.stderr)
    return 0 if all(r.ok for r in results) else 10


def run_network(args: argparse.Namespace) -> int:
    from gateway.mq.embedded.network import serve
    from gateway.mq.embedded.topology import TopologyError, load_topology
    from gateway.mq.port import MQError

    try:
        topo = load_topology(args.topology)
        asyncio.run(serve(topo, args.qm or None, args.data_dir))
    except TopologyError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except MQError as exc:  # e.g. a data directory another process holds
        print(f"error: {args.topology}: {exc}", file=sys.stderr)
        return 2
    return 0
