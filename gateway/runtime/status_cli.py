"""``mqgw status``: the node's instances, read from its data directory.

Which instance holds the node directory's lock (host, pid, since when), whether it permits
a standby, and the standbys waiting for it (docs/operations.md, "High availability").
It reads files only, so it works from any host that mounts the directory, with the
gateway running or not.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

__all__ = ["register"]


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser(
        "status",
        help="show the node's instances: the active one and its standbys",
        description="Show which instance of this node is active (holds the data directory's "
        "lock: host, pid, since when) and the standbys waiting for it (mqgw run "
        "--multi-instance). Reads the data directory only: works with the gateway running or "
        "stopped, from any host that mounts it.",
    )
    p.add_argument("-c", "--config", type=Path, default=Path("gateway.yaml"),
                   help="the configuration file (default: ./gateway.yaml)")
    p.add_argument("--json", action="store_true", help="one JSON object instead of text")
    p.set_defaults(func=status_command, exit_codes=(
        (0, "an instance is active"),
        (1, "no instance is active (the node is stopped)"),
        (2, "the configuration is invalid"),
    ))


def status_command(args: argparse.Namespace) -> int:
    from gateway.runtime.app import node_directory
    from gateway.runtime.config import load_config
    from gateway.runtime.errors import ConfigErrors
    from gateway.runtime.instance_lock import (
        NodeStatusJson,
        is_locked,
        live_standbys,
        read_holder,
    )
    from gateway.runtime.registry import PluginRegistry

    try:
        loaded = load_config(args.config, PluginRegistry.from_entry_points())
    except ConfigErrors as exc:
        print(f"mqgw status: invalid configuration ({len(exc.errors)} problem(s)):",
              file=sys.stderr)
        for err in exc.errors:
            print(f"  {err}", file=sys.stderr)
        return 2
    directory = node_directory(loaded)
    active = is_locked(directory)
    holder = read_holder(directory)
    standbys = live_standbys(directory)
    if args.json:
        print(json.dumps(NodeStatusJson(
            gateway=loaded.gateway.gateway_id,
            data_directory=str(directory),
            active=holder.to_json() if active and holder is not None else None,
            last_active=holder.to_json() if not active and holder is not None else None,
            standbys=[s.to_json() for s in standbys],
        )))
        return 0 if active else 1
    print(f"node {loaded.gateway.gateway_id}: data directory {directory}")
    if active and holder is not None:
        permits = "permits a standby" if holder.multi_instance else "permits no standby"
        print(f"  active instance: {holder.describe()} ({permits})")
    elif active:
        print("  active instance: one holds the lock, not yet recorded (starting)")
    else:
        print("  active instance: none" + (
            f" (the last one, {holder.describe()}, ended without a clean stop)"
            if holder is not None else ""))
    for s in standbys:
        print(f"  standby instance: {s.describe().replace(' since ', ' waiting since ')}")
    if not standbys:
        print("  standby instances: none")
    return 0 if active else 1
