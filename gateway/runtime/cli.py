"""The ``mqgw`` command line: one sub-command per concern, each registered by its own module.

Each module named in ``COMMAND_MODULES`` exposes ``register(subparsers)``, adding its
parser and setting ``func`` (``(argparse.Namespace) -> int``). Registration imports only
light modules so ``mqgw --help`` stays fast; heavy work is imported inside ``func``.
"""

from __future__ import annotations

import argparse
import contextlib
import faulthandler
import importlib
import logging
import os
import signal
import sys
from collections.abc import Sequence

from gateway.runtime.exit_codes import add_exit_status

COMMAND_MODULES: tuple[str, ...] = (
    "gateway.devstack.cli",
    "gateway.mq.embedded.cli",
    "analytics.cli",
    "gateway.runtime.pubsub_service.cli",
    "gateway.runtime.neighbours.cli",
    "gateway.runtime.run",
    "gateway.runtime.status_cli",
    "gateway.runtime.subscriptions_cli",
    "gateway.runtime.streams.cli",
    "gateway.runtime.network_check.cli",  # after gateway.mq.embedded.cli: adds `network check`
    "gateway.runtime.qm_cli",
    "gateway.runtime.completion",
)


def _version() -> str:
    """The installed distribution's version, else the source tree's ``__version__``."""
    from importlib.metadata import PackageNotFoundError, version

    from gateway import __version__

    try:
        return version("mq-stream-gateway")
    except PackageNotFoundError:
        return __version__


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="mqgw",
        description=(
            "mq-stream-gateway: joins IBM MQ publish/subscribe networks as a broker node and "
            "bridges their streams to Kafka and MQTT."
        ),
    )
    parser.add_argument(
        "-v", "--verbose", action="count", default=0, help="more log output (-vv for debug)"
    )
    parser.add_argument("--version", action="version", version=f"mqgw {_version()}")
    parser.set_defaults(root_parser=parser)  # `mqgw completion` walks it (no import circle)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ImportError as exc:
            # One broken sub-command (a missing optional dependency, a stale install)
            # must not take the others down: say so and go on.
            print(
                f"mqgw: the commands of {name} are unavailable: {exc} "
                "(a missing extra? `make setup` reinstalls the project)",
                file=sys.stderr,
            )
            continue
        module.register(sub)
    _accept_verbose_everywhere(sub)
    _show_exit_statuses(parser)
    return parser


def _show_exit_statuses(parser: argparse.ArgumentParser) -> None:
    """Every command's ``--help`` ends with the exit statuses it states
    (gateway/runtime/exit_codes.py; the CLI reference lists the same)."""
    add_exit_status(parser)
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for command in action.choices.values():
                _show_exit_statuses(command)


def _accept_verbose_everywhere(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Let ``-v`` follow the command too (``mqgw run -v``), where users put it.

    A command that gives ``-v`` a meaning of its own (``mqgw qm browse -v``) keeps it;
    nested commands (``mqgw streams check -v``) get it as well, also those a command
    parses with a parser of its own (``mqgw network check -v``: its completion children).
    """
    from gateway.runtime.completion import COMPLETION_CHILDREN

    def accept(command: argparse.ArgumentParser) -> None:
        taken = {s for action in command._actions for s in action.option_strings}
        flags = [f for f in ("-v", "--verbose") if f not in taken]
        if flags:
            command.add_argument(
                *flags, dest="verbose", action="count", default=argparse.SUPPRESS,
                help="more log output (-vv for debug), as before the command",
            )
        for child in getattr(command, COMPLETION_CHILDREN, {}).values():
            accept(child)
        for action in command._actions:
            if isinstance(action, argparse._SubParsersAction):
                _accept_verbose_everywhere(action)

    for command in sub.choices.values():
        accept(command)


def _quiet_on_closed_pipe() -> int:
    """``mqgw ... | head``: the reader went away; stop without a traceback.

    Python's advice (the signal module's docs): point stdout at /dev/null so the
    interpreter's last flush does not raise again. 141 is what a shell reports for a
    command killed by SIGPIPE, as most Unix tools end here.
    """
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    return 141


def _dump_stacks_on_sigusr1() -> None:
    """``kill -USR1 <pid>``: every thread's Python stack to stderr, the process going on.

    What an operator (or a test harness) needs when a stop or a wait hangs: where each
    thread is, from outside, without a debugger (the JVM's thread dump on SIGQUIT).
    """
    with contextlib.suppress(AttributeError, ValueError, OSError):  # no SIGUSR1 / no stderr
        faulthandler.register(signal.SIGUSR1, all_threads=True)


def main(argv: Sequence[str] | None = None) -> int:
    _dump_stacks_on_sigusr1()
    parser = build_parser()
    args = parser.parse_args(argv)
    level = logging.WARNING - 10 * min(args.verbose, 2)
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    func = getattr(args, "func", None)
    if func is None:
        parser.print_help()
        return 2
    try:
        result: int = func(args)
        sys.stdout.flush()
    except BrokenPipeError:
        return _quiet_on_closed_pipe()
    return result


if __name__ == "__main__":
    sys.exit(main())
