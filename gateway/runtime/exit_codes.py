"""Exit statuses of the ``mqgw`` commands, stated once per command.

A command states its statuses with plain argparse, ``parser.set_defaults(exit_codes=((0,
"done"), (1, "..."), ...))``, so the command modules below the runtime (the devstack, the
embedded queue manager, analytics) import nothing for it. ``gateway.runtime.cli`` adds
them to every command's ``--help`` (:func:`add_exit_status`) and the CLI reference
(docs/reference/cli.md) lists them from the same place, so the two cannot disagree.
"""

from __future__ import annotations

import argparse
import textwrap

__all__ = ["EXIT_CODES", "USAGE_ERROR", "ExitCodes", "add_exit_status", "exit_codes_of"]

#: The ``set_defaults`` key a command's statuses are stated under.
EXIT_CODES = "exit_codes"

#: What argparse itself exits with on a usage error (unknown option, missing argument).
USAGE_ERROR = 2

#: (status, meaning) pairs, in the order to show them.
ExitCodes = tuple[tuple[int, str], ...]


def exit_codes_of(parser: argparse.ArgumentParser) -> ExitCodes:
    """The statuses ``parser``'s command stated (empty when it stated none)."""
    codes = parser.get_default(EXIT_CODES)
    return tuple(codes) if codes else ()


def add_exit_status(parser: argparse.ArgumentParser) -> None:
    """Append the stated statuses to ``parser``'s epilog (its ``--help``), once."""
    codes = exit_codes_of(parser)
    if not codes:
        return
    text = "Exit status: " + "; ".join(f"{code} {meaning}" for code, meaning in codes)
    wrapped = textwrap.fill(text, width=78, break_on_hyphens=False)
    epilog = parser.epilog or ""
    if wrapped in epilog:
        return
    parser.epilog = f"{epilog}\n\n{wrapped}" if epilog else wrapped
