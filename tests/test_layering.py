"""Imports run one way: wire -> pubsub -> mq/routing -> runtime; plugins use the public API.

Walks every module's imports with ``ast`` (including imports inside functions), so a lazy
import that reaches upward is caught as well as a top-level one.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# For each package: the gateway packages it may import (its own is always allowed).
ALLOWED: dict[str, set[str]] = {
    "gateway.wire": set(),
    "gateway.pubsub": {"gateway.wire"},
    "gateway.mq": {"gateway.wire", "gateway.pubsub"},
    "gateway.routing": {"gateway.wire", "gateway.pubsub", "gateway.mq"},
    "gateway.devstack": set(),
    "gateway.plugin_api": {"gateway.wire", "gateway.pubsub", "gateway.mq", "gateway.routing"},
    "gateway.runtime": {
        "gateway.wire",
        "gateway.pubsub",
        "gateway.mq",
        "gateway.routing",
        "gateway.devstack",
        "gateway.plugin_api",
        "analytics",  # only the `mqgw analytics` sub-command, imported lazily
    },
    # Plugins see the plugin contract and the wire codecs, nothing deeper.
    "plugins": {"gateway.plugin_api", "gateway.wire"},
    # Analytics runs under spark-submit on clusters without the gateway installed; it may
    # only ask the devstack where the locally resolved connector jars are.
    "analytics": {"gateway.devstack"},
}


def _package_of(module: str) -> str | None:
    owners = [pkg for pkg in ALLOWED if module == pkg or module.startswith(pkg + ".")]
    return max(owners, key=len, default=None)


def _module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(source: str, filename: str) -> list[tuple[int, str]]:
    tree = ast.parse(source, filename=filename)
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.lineno, node.module))
            found.extend((node.lineno, f"{node.module}.{alias.name}") for alias in node.names)
    return found


def _source_files() -> list[Path]:
    files: list[Path] = []
    for top in ("gateway", "plugins", "analytics"):
        base = ROOT / top
        if base.is_dir():
            files.extend(sorted(base.rglob("*.py")))
    return files


def _violations(module: str, source: str, shown: str) -> list[str]:
    own = _package_of(module)
    if own is None:
        return []
    allowed = ALLOWED[own] | {own}
    bad = []
    for lineno, target in _imports(source, shown):
        if not (target == "gateway" or target.startswith(("gateway.", "plugins", "analytics"))):
            continue
        if target in ("gateway", "gateway.__version__"):
            continue
        target_pkg = _package_of(target)
        if target_pkg is None:
            # an import of a plain module such as gateway.something that is no package here
            continue
        if own == "plugins" and target_pkg == "plugins":
            # a plugin may import its own sub-package, not another plugin
            if target.split(".")[:2] != module.split(".")[:2]:
                bad.append(f"{shown}:{lineno} imports another plugin: {target}")
            continue
        if target_pkg not in allowed:
            bad.append(f"{shown}:{lineno} ({own}) imports {target}")
    return bad


def test_imports_run_one_way() -> None:
    files = _source_files()
    assert files, "no source files found: the walk itself is broken"
    problems = [
        v
        for path in files
        for v in _violations(
            _module_name(path), path.read_text(encoding="utf-8"), str(path.relative_to(ROOT))
        )
    ]
    assert problems == [], "layering violations:\n" + "\n".join(problems)


@pytest.mark.parametrize(
    ("module", "target", "ok"),
    [
        ("gateway.wire.rfh2", "gateway.pubsub.engine", False),
        ("gateway.pubsub.engine", "gateway.wire.rfh2", True),
        ("gateway.pubsub.engine", "gateway.mq.port", False),
        ("gateway.runtime.cli", "gateway.mq.port", True),
        ("plugins.kafka.sink", "gateway.plugin_api", True),
        ("plugins.kafka.sink", "gateway.runtime.broker", False),
        ("plugins.kafka.sink", "plugins.mqtt.sink", False),
    ],
)
def test_rules_catch_upward_imports(module: str, target: str, ok: bool) -> None:
    """The checker itself: a synthetic module importing upward is reported."""
    assert (_violations(module, f"import {target}\n", module) == []) is ok
