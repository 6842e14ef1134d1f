"""``mqgw neighbours join|list|clear|mqsc``: the legacy broker's join/list/clear
commands for the gateway (docs/neighbours.md, "Joining neighbours").

Why through the database: ``join`` and ``clear`` write a request into ``neighbours.db``
(next to the pub/sub store); a running gateway's links pick it up within a second, and
a stopped one at its next start. ``list`` reads it, running or not. Exit status: 0 ok,
2 usage (bad arguments, no data directory, a neighbour that is our own queue manager),
1 no such neighbour.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gateway.runtime.neighbours.state import NeighbourState

__all__ = ["mqsc_for", "register"]

KINDS = ("mqpubsub", "mqv7", "gateway")
ROLES = ("parent", "child")


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser(
        "neighbours",
        help="join, list and clear neighbour brokers (proxy subscriptions, streams)",
        description="Manage the gateway's neighbour brokers: join one (negotiates the "
        "common streams and checks for loops), list them (active/inactive, last heard, "
        "common streams), clear one (withdraws every proxy subscription), print the MQSC "
        "an MQ V7+ neighbour needs.",
    )
    sub = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    join = sub.add_parser("join", help="join neighbour QM (picked up by the running gateway)")
    join.add_argument("q_mgr", metavar="QM", help="the neighbour's queue manager")
    join.add_argument("--kind", choices=KINDS, default="mqpubsub",
                      help="mqpubsub: a legacy MQ Publish/Subscribe broker; mqv7: an MQ V7+ "
                      "queue manager's queued pub/sub; gateway: another gateway "
                      "(default mqpubsub)")
    join.add_argument("--role", choices=ROLES, default="child",
                      help="the neighbour's role: at most one parent (default child)")
    join.add_argument("--streams", help="comma-separated streams to share (default: its own)")
    join.add_argument("--probe-timeout", type=float, default=5.0, help="loop probe window (s)")
    lst = sub.add_parser("list", help="list the neighbours")
    lst.add_argument("--json", action="store_true", help="one JSON object per line")
    clear = sub.add_parser(
        "clear",
        help="leave neighbour QM (withdraws its proxies)",
        description="Leave neighbour QM: every proxy subscription there is withdrawn and QM "
        "is forgotten. A neighbour listed in the configuration (YAML neighbours:, "
        "mqgw broker --neighbour) is cleared only until the next start, which joins it "
        "again: remove it from the configuration too to leave it for good.",
    )
    clear.add_argument("q_mgr", metavar="QM", help="the neighbour's queue manager")
    mqsc = sub.add_parser("mqsc", help="print the MQSC for an MQ V7+ neighbour QM")
    mqsc.add_argument("q_mgr", metavar="QM", help="the neighbour's queue manager")
    mqsc.add_argument("--self-qmgr", help="our queue manager (default: from --config)")
    mqsc.add_argument(
        "--conname", default="127.0.0.1(1414)", type=_conname,
        help="our listener as the neighbour sees it: host(port), or a connection list "
        "host1(port),host2(port) for a multi-instance node (one address per instance)"
    )
    mqsc.add_argument(
        "--neighbour-conname", default="", type=_conname,
        help="the neighbour's listener as we see it (host(port) or a connection list)"
    )
    for q in (join, lst, clear, mqsc):
        where = q.add_mutually_exclusive_group(required=True)
        where.add_argument("--config", type=Path, help="the gateway's YAML (broker.store dir)")
        where.add_argument("--data-dir", type=Path, help="the directory of neighbours.db")
    failed = (2, "no usable configuration or data directory, or an invalid option")
    join.set_defaults(exit_codes=((0, "join requested"), failed))
    lst.set_defaults(exit_codes=((0, "listed"), failed))
    clear.set_defaults(exit_codes=((0, "clear requested"), (1, "no such neighbour"), failed))
    mqsc.set_defaults(exit_codes=(
        (0, "printed"), (1, "no such neighbour"),
        (2, "no usable configuration or data directory, or no --self-qmgr"),
    ))
    p.set_defaults(func=run_command)


def _locate(args: argparse.Namespace) -> tuple[Path, str] | str:
    """(neighbours.db, our queue manager or "") or an error message."""
    from gateway.runtime.neighbours.state import DB_NAME, neighbours_db_of

    if args.data_dir is not None:
        if not args.data_dir.is_dir():
            return f"no data directory {args.data_dir}"
        return args.data_dir / DB_NAME, ""
    from gateway.runtime.config import load_config
    from gateway.runtime.errors import ConfigErrors
    from gateway.runtime.registry import PluginRegistry

    try:
        loaded = load_config(args.config, PluginRegistry.from_entry_points())
    except ConfigErrors as exc:
        return f"invalid configuration {args.config}: " + "; ".join(map(str, exc.errors))
    db = neighbours_db_of(loaded.path(loaded.gateway.broker.store))
    if not db.parent.is_dir():
        return f"no data directory {db.parent} (has the gateway ever run with this config?)"
    return db, loaded.gateway.queue_manager.name


def run_command(args: argparse.Namespace) -> int:
    from pydantic import ValidationError

    from gateway.runtime.neighbours.config import NeighbourConfig
    from gateway.runtime.neighbours.state import NeighbourState, NeighbourStateError

    where = _locate(args)
    if isinstance(where, str):
        print(f"mqgw neighbours: {where}", file=sys.stderr)
        return 2
    db, self_q_mgr = where
    try:
        state = NeighbourState(db)
    except NeighbourStateError as exc:
        print(f"mqgw neighbours: {exc}", file=sys.stderr)
        return 2
    try:
        if args.action == "join":
            try:
                cfg = NeighbourConfig(
                    q_mgr=args.q_mgr,
                    kind=args.kind,
                    role=args.role,
                    streams=None if args.streams is None else args.streams.split(","),
                    probe_timeout=args.probe_timeout,
                )
            except ValidationError as exc:
                first = exc.errors()[0]
                print(
                    f"mqgw neighbours join: invalid {'.'.join(map(str, first['loc']))}: "
                    f"{first['msg']}",
                    file=sys.stderr,
                )
                return 2
            if cfg.q_mgr == self_q_mgr:
                print(
                    f"mqgw neighbours join: {cfg.q_mgr} is the gateway's own queue manager: "
                    "a neighbour is another broker",
                    file=sys.stderr,
                )
                return 2
            state.request_join(cfg, time.time())
            print(f"join of {cfg.q_mgr} requested: the running gateway negotiates it")
            return 0
        if args.action == "clear":
            if not state.request_clear(args.q_mgr):
                print(f"mqgw neighbours clear: no neighbour {args.q_mgr}", file=sys.stderr)
                return 1
            print(f"clear of {args.q_mgr} requested: its proxy subscriptions are withdrawn")
            return 0
        if args.action == "list":
            _list(state, as_json=args.json)
            return 0
        row = state.neighbour(args.q_mgr)
        if row is None:
            print(f"mqgw neighbours mqsc: no neighbour {args.q_mgr}", file=sys.stderr)
            return 1
        own = args.self_qmgr or self_q_mgr
        if not own:
            print("mqgw neighbours mqsc: give --self-qmgr (or --config)", file=sys.stderr)
            return 2
        print(
            mqsc_for(
                row.q_mgr,
                own,
                sorted(row.common_streams),
                conname=args.conname,
                neighbour_conname=args.neighbour_conname,
            ),
            end="",
        )
        return 0
    finally:
        state.close()


def _list(state: NeighbourState, *, as_json: bool) -> None:
    from gateway.runtime.neighbours.status import neighbour_status

    items = neighbour_status(state, time.time())
    for item in items:
        if as_json:
            print(json.dumps(item))
            continue
        age = item["last_heard_age"]
        heard = "never" if age is None else f"{age:.0f}s ago"
        print(
            f"{item['q_mgr']:16} {item['state']:8} {item['kind']:8} {item['role']:6} "
            f"heard {heard:10} proxies {item['proxy_subscriptions']:<4} "
            f"streams {', '.join(item['common_streams'])}"
        )
        for note in (item["refusal"], item["last_error"]):
            if note:
                print(f"{'':16} {note}")
        for p in item["refused_proxies"]:
            print(
                f"{'':16} proxy {p['stream']} {p['topic']!r} refused ({p['reason']}), "
                f"sent again in {p['retry_in']:.0f}s"
            )
    if not as_json:
        print(f"{len(items)} neighbour(s)")


def _conname(text: str) -> str:
    """A CONNAME for the MQSC printed: ``host(port)`` or a connection list, checked here
    (an argparse error saying what is wrong) rather than by runmqsc on the other side."""
    if not text:
        return text
    from gateway.mq.conname import ConnameError, format_conname, parse_conname_list

    try:
        return format_conname(parse_conname_list(text))
    except ConnameError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def mqsc_for(
    neighbour: str,
    own: str,
    streams: list[str],
    *,
    conname: str,
    neighbour_conname: str = "",
) -> str:
    """MQSC for an MQ V7+ queue manager ``neighbour`` with queued pub/sub: a stream
    queue, a topic object whose topic string is the stream name and the namelist entry
    for each shared stream; our reply queue's route (transmission queue named after us,
    channel pair); and, commented, the same for our side."""
    extra = [s for s in streams if not s.startswith("SYSTEM.BROKER.")]
    names = ["SYSTEM.BROKER.DEFAULT.STREAM", "SYSTEM.BROKER.ADMIN.STREAM", *extra]
    lines = [
        f"* MQSC for {neighbour} (run with runmqsc {neighbour}): queued pub/sub and the",
        f"* streams it shares with {own}. The gateway talks queued pub/sub commands only:",
        "* no PARENT is set (that is the MQ V7 hierarchy protocol, not used here).",
        "ALTER QMGR PSMODE(ENABLED)",
    ]
    for s in extra:
        lines += [
            f"DEFINE QLOCAL('{s}') DEFPSIST(YES) REPLACE",
            f"DEFINE TOPIC('{s}') TOPICSTR('{s}') REPLACE",
        ]
    lines += [
        "ALTER NAMELIST(SYSTEM.QPUBSUB.QUEUE.NAMELIST) +",
        "  NAMES(" + ", ".join(names) + ")",
        f"DEFINE QLOCAL('{own}') USAGE(XMITQ) REPLACE",
        f"DEFINE CHANNEL('{neighbour}.TO.{own}') CHLTYPE(SDR) TRPTYPE(TCP) +",
        f"  CONNAME('{conname}') XMITQ('{own}') REPLACE",
        f"DEFINE CHANNEL('{own}.TO.{neighbour}') CHLTYPE(RCVR) TRPTYPE(TCP) REPLACE",
        f"START CHANNEL('{neighbour}.TO.{own}')",
        f"* On {own} (the gateway's mqsc_file):",
        f"*   DEFINE QLOCAL('{neighbour}') USAGE(XMITQ)",
        f"*   DEFINE CHANNEL('{own}.TO.{neighbour}') CHLTYPE(SDR) "
        f"CONNAME('{neighbour_conname or 'host(port)'}') XMITQ('{neighbour}')",
        f"*   DEFINE CHANNEL('{neighbour}.TO.{own}') CHLTYPE(RCVR)",
    ]
    return "\n".join(lines) + "\n"
