"""``mqgw network check [NODE ...] [--json]``: read every node given (gateway
configurations and/or ``http(s)://`` addresses of their metrics listener, whose
``/network`` answers the node's view behind the ``/metrics`` credentials) and report what
is wrong with the network as a whole (docs/scaling.md "Checking the network").

``mqgw network TOPOLOGY`` (gateway/mq/embedded/cli.py) runs a topology of embedded queue
managers; this module adds the word ``check`` to the same command, so both live under
``mqgw network``. Exit status as ``mqgw streams check``: 0 all well, 1 a problem (an
unreadable node is one), 2 usage or configuration error.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from gateway.runtime.exit_codes import add_exit_status

__all__ = ["register"]

#: Nodes one check reads at most (a bigger network: raise --max-nodes).
DEFAULT_MAX_NODES = 100

SUMMARY = "check a network of gateways: stream owners, routes, neighbour relations"

DESCRIPTION = (
    "Read each NODE's view of itself (GET /network on its metrics listener; NODE is a "
    "gateway YAML file, whose metrics.host/port, metrics.tls and metrics.auth are used, "
    "or an http(s):// address, read with the credentials of --token-file, "
    "--user/--password-file or the environment variable MQGW_NETWORK_TOKEN) and check "
    "the network as a "
    "whole: each stream owned by one node, sinks only on owners, a route from every node "
    "to every owner, neighbour relations that agree on both sides, no loop. A neighbour "
    "that is a gateway must be given too."
)


def check_parser(prog: str = "mqgw network check") -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, description=DESCRIPTION)
    # its line in the CLI reference (it is no sub-parser, which would carry a help)
    setattr(p, "summary", SUMMARY)  # noqa: B010  (not an attribute argparse declares)
    p.add_argument("nodes", nargs="*", metavar="NODE",
                   help="gateway YAML file or http(s)://host:port address "
                        "(default: gateway.yaml)")
    p.add_argument("--json", action="store_true", help="the report as one JSON object")
    p.add_argument("--timeout", type=float, default=5.0,
                   help="seconds each node has to answer (default 5)")
    p.add_argument("--max-nodes", type=int, default=DEFAULT_MAX_NODES,
                   help=f"refuse to read more nodes than this (default {DEFAULT_MAX_NODES})")
    p.add_argument("--max-bytes", type=int, default=None,
                   help="largest answer read from one node (default 8 MiB)")
    p.add_argument("--cafile", type=Path, default=None,
                   help="CA certificates for https nodes (default: the system's, and for "
                        "a YAML node its own metrics.tls.cert_file)")
    p.add_argument("--token-file", type=Path, default=None, metavar="FILE",
                   help="bearer token for the nodes given as addresses (default: the "
                        "environment variable MQGW_NETWORK_TOKEN); a YAML node uses its "
                        "metrics.auth")
    p.add_argument("--user", default=None, metavar="NAME",
                   help="basic-auth user name for the nodes given as addresses")
    p.add_argument("--password-file", type=Path, default=None, metavar="FILE",
                   help="the password of --user")
    p.set_defaults(exit_codes=(
        (0, "all well"), (1, "a problem (an unreadable node is one)"),
        (2, "usage or configuration error"),
    ))
    add_exit_status(p)
    return p


class _CheckArguments(argparse.Action):
    """What follows the topology: after ``check``, parsed by the check's own parser in the
    same parse as the whole command line, so ``-v`` there sets the log level as after any
    other command (``mqgw network check -v``); otherwise kept for the topology runner."""

    def __init__(self, *args: Any, check: argparse.ArgumentParser, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.check = check

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:
        rest = list(values or ())
        if str(getattr(namespace, "topology", "")) == "check":
            checked = self.check.parse_args(rest)
            namespace.check = checked
            if "verbose" in vars(checked):
                namespace.verbose = checked.verbose
            rest = []
        setattr(namespace, self.dest, rest)


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``check`` to ``mqgw network``: everything after ``check`` is this command's
    (its own parser, so options and nodes may come in any order)."""
    net = subparsers.choices.get("network")
    if net is None:  # the topology runner is unavailable: ``network`` is the check alone
        net = subparsers.add_parser("network", help="check a network of gateways",
                                    description=DESCRIPTION)
        net.add_argument("topology", choices=["check"], metavar="check")
        run_topology = None
    else:
        run_topology = net.get_default("func")
        for action in subparsers._choices_actions:  # the line `mqgw --help` shows
            if action.dest == "network":
                action.help = f"{action.help}; network check: check a network of gateways"
    check = check_parser()
    net.add_argument("rest", nargs=argparse.REMAINDER, help=argparse.SUPPRESS,
                     action=_CheckArguments, check=check)
    net.epilog = ("mqgw network check [NODE ...] [--json]: check a network of gateways "
                  "(mqgw network check --help).")

    def dispatch(args: argparse.Namespace) -> int:
        if str(args.topology) == "check":
            return run_check(args.check)
        if args.rest:  # options after the topology: parse them as the runner's
            again = net.parse_args([*args.rest, str(args.topology)])
            if again.rest:
                net.error(f"unrecognized arguments: {' '.join(again.rest)}")
            args = again
        assert run_topology is not None
        result: int = run_topology(args)
        return result

    net.set_defaults(func=dispatch)
    from gateway.runtime.completion import COMPLETION_CHILDREN

    # The CLI's walk (gateway/runtime/cli.py) reaches ``check`` through this attribute.
    setattr(net, COMPLETION_CHILDREN, {"check": check})


def run_check(args: argparse.Namespace) -> int:
    from gateway.runtime.network_check.check import Unreadable, check_network
    from gateway.runtime.network_check.read import (
        DEFAULT_MAX_BYTES,
        address_credentials,
        address_of,
        read_nodes,
    )
    from gateway.runtime.streams.cli_support import OK, PROBLEM, err

    given: list[str] = list(dict.fromkeys(args.nodes or ["gateway.yaml"]))
    if args.max_nodes < 1 or args.timeout <= 0 or (args.max_bytes is not None
                                                    and args.max_bytes < 1):
        return err("network check", "--max-nodes, --timeout and --max-bytes must be positive")
    if len(given) > args.max_nodes:
        return err("network check", f"{len(given)} nodes given, more than --max-nodes "
                   f"{args.max_nodes}: raise --max-nodes to check a network this large")
    if (args.user is None) != (args.password_file is None):
        return err("network check", "--user and --password-file go together")
    if args.token_file is not None and args.user is not None:
        return err("network check", "give --token-file, or --user and --password-file")
    addresses = []
    try:
        authorization = address_credentials(args.token_file, args.user, args.password_file)
        for g in given:
            addresses.append(address_of(g, authorization))
    except ValueError as exc:
        return err("network check", str(exc))
    results = read_nodes(addresses, timeout=args.timeout,
                         max_bytes=args.max_bytes or DEFAULT_MAX_BYTES, cafile=args.cafile)
    views = []
    unreadable = []
    sources: dict[str, str] = {}
    for address, got in results:
        if isinstance(got, Unreadable):
            unreadable.append(got)
        else:
            views.append(got)
            sources.setdefault(got.q_mgr, address.source)
    report = check_network(views, unreadable, sources=sources)
    print(json.dumps(report.to_json()) if args.json else report.text())
    return OK if report.ok else PROBLEM
