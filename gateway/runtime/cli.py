"""The ``mqgw`` command line: one sub-command per concern, each registered by its own module.

Each module named in ``COMMAND_MODULES`` exposes ``register(subparsers)``, adding its
parser and setting ``func`` (``(argparse.Namespace) -> int``). Registration imports only
light modules so ``mqgw --help`` stays fast; heavy work is imported inside ``func``.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Sequence

COMMAND_MODULES: tuple[str, ...] = (
    "gateway.devstack.cli",
    "gateway.mq.embedded.cli",
    "analytics.cli",
    "gateway.runtime.pubsub_service.cli",
    "gateway.runtime.neighbours.cli",
    "gateway.runtime.run",
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
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    level = logging.WARNING - 10 * min(args.verbose, 2)
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    func = getattr(args, "func", None)
    if func is None:
        parser.print_help()
        return 2
    result: int = func(args)
    return result


if __name__ == "__main__":
    sys.exit(main())
