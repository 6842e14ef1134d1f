"""``mqgw subscriptions``: the broker's subscriptions as its pub/sub store holds them.

Why a command: a subscription whose queue kept failing is suspended (issue 12 item 5) and
an operator must be able to see which ones, with or without the gateway running. It only
reads the store (SQLite in WAL mode lets it read beside a running gateway).
:class:`SubscriptionJson` is the shape of one line of ``--json``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Literal

from pydantic import ConfigDict, with_config
from typing_extensions import TypedDict

__all__ = ["SubscriptionJson", "register"]


@with_config(ConfigDict(use_attribute_docstrings=True))
class SubscriptionJson(TypedDict):
    """One subscription as ``mqgw subscriptions --json`` prints it."""

    stream: str
    """The stream it subscribes on."""
    topic: str
    """Its topic pattern."""
    scheme: Literal["CHAR", "TOPIC"]
    """Its wildcard scheme: ``CHAR`` (MQSO_WILDCARD_CHAR: ``*`` and ``?`` anywhere, the
    legacy broker's) or ``TOPIC`` (MQSO_WILDCARD_TOPIC: ``#`` and ``+`` as whole topic
    levels)."""
    destination: str
    """Where its publications go: ``QUEUE@QMGR`` for an MQ subscriber queue (``QUEUE@?``
    when the subscriber named no queue manager) or ``sink:<instance>`` for a plugin
    instance (its backlog queue ``SYSTEM.MQGW.SINK.<instance>``)."""
    suspended: bool
    """Deliveries are suspended because puts to its queue kept failing, until the
    subscriber registers again (docs/pubsub.md)."""


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser(
        "subscriptions",
        help="list the broker's subscriptions (which are suspended, where they deliver)",
        description=(
            "List the subscriptions in a gateway's pub/sub store: stream, topic, scheme, "
            "destination and whether it is suspended. Reads only; works while the gateway "
            "runs and when it is stopped."
        ),
    )
    where = p.add_mutually_exclusive_group()
    where.add_argument(
        "--config", type=Path, default=Path("gateway.yaml"),
        help="the gateway's YAML, for its broker.store (default: ./gateway.yaml)",
    )
    where.add_argument("--store", type=Path, help="the pub/sub store file itself")
    p.add_argument("--suspended", action="store_true", help="only the suspended ones")
    p.add_argument("--json", action="store_true", help="one JSON object per line")
    p.set_defaults(func=run_command, exit_codes=(
        (0, "listed (with --suspended: none is suspended)"),
        (1, "with --suspended: some are suspended (they are listed)"),
        (2, "no usable configuration or no store"),
    ))


def _store_path(args: argparse.Namespace) -> Path | str:
    """The store file, or an error message."""
    if args.store is not None:
        path: Path = args.store
    else:
        from gateway.runtime.config import load_config
        from gateway.runtime.errors import ConfigErrors
        from gateway.runtime.registry import PluginRegistry

        try:
            loaded = load_config(args.config, PluginRegistry.from_entry_points())
        except ConfigErrors as exc:
            return f"invalid configuration {args.config}: " + "; ".join(map(str, exc.errors))
        path = loaded.path(loaded.gateway.broker.store)
    if not path.is_file():
        return f"no pub/sub store at {path} (has the gateway ever run with this data?)"
    return path


def run_command(args: argparse.Namespace) -> int:
    from gateway.pubsub.sqlite_store import SqliteStore
    from gateway.pubsub.topics import Scheme

    path = _store_path(args)
    if isinstance(path, str):
        print(f"mqgw subscriptions: {path}", file=sys.stderr)
        return 2
    store = SqliteStore(path)
    try:
        subs = store.load().subscriptions
    finally:
        store.close()
    shown = [s for s in subs if s.suspended or not args.suspended]
    for s in sorted(shown, key=lambda s: (s.stream, s.topic, str(s.destination))):
        row: SubscriptionJson = {
            "stream": s.stream,
            "topic": s.topic,
            "scheme": "CHAR" if s.scheme is Scheme.CHAR else "TOPIC",
            "destination": str(s.destination),
            "suspended": s.suspended,
        }
        if args.json:
            print(json.dumps(row))
        else:
            state = "SUSPENDED" if s.suspended else "active"
            print(f"{state:9} {s.stream:32} {s.topic:30} {s.scheme.name:9} {s.destination}")
    if not args.json:
        suspended = sum(1 for s in subs if s.suspended)
        print(f"{len(subs)} subscription(s), {suspended} suspended")
    return 1 if args.suspended and shown else 0
