"""What the ``mqgw streams`` and ``mqgw migrate`` commands share: exit statuses, the
error line, loading the configuration."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

__all__ = ["OK", "PROBLEM", "USAGE", "err", "load"]

OK, PROBLEM, USAGE = 0, 1, 2


def err(command: str, text: str) -> int:
    print(f"mqgw {command}: {text}", file=sys.stderr)
    return USAGE


def load(path: Path) -> Any:
    """The loaded configuration, or an error text."""
    from gateway.runtime.config import load_config
    from gateway.runtime.errors import ConfigErrors
    from gateway.runtime.registry import PluginRegistry

    try:
        return load_config(path, PluginRegistry.from_entry_points())
    except ConfigErrors as exc:
        return f"invalid configuration {path}: " + "; ".join(map(str, exc.errors))
