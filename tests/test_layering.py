"""Imports run one way: wire -> pubsub -> mq/routing -> runtime; plugins use the plugin API.

Walks every module's imports with ``ast`` — top-level and lazy (inside functions), plain
and relative (``from . import x``, resolved against the module's package), and imports
by string (``importlib.import_module("...")``, ``"module:attr"`` entry-point strings and
tables of module names such as the CLI's ``COMMAND_MODULES``) — and checks them against
one table of exact allowed sets. It also checks the entry points in pyproject.toml and
that no two modules of ``gateway/`` import each other in a circle.

Every rule has a negative self-test below (a synthetic bad module fed to the checker),
so a rule that can no longer fail is noticed.

Why one file of ~600 lines: the checker and its self-tests stay side by side, so each
rule is read next to the test proving it can fail; the file is test code, not a layer.

Tightening: ``TRANSITIONAL`` lists edges allowed today that are meant to go (none
today: the last, ``plugins -> gateway.wire``, went with the MQ-neutral plugin contract);
``test_transitional_allowances_are_still_needed`` fails as soon as one is unused, so
delete its line then.
"""

from __future__ import annotations

import ast
import re
import tomllib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

#: Top-level folders whose code is walked.
WALKED = ("gateway", "plugins", "analytics", "examples")
#: Every first-party top-level name: an import of one of these is checked.
FIRST_PARTY = (*WALKED, "tests", "benchmarks", "tools")

#: Layer (a package prefix; ``plugins.*`` means each plugin package on its own) -> the
#: other layers it may import. Its own layer is always allowed; anything not listed
#: (tests, benchmarks, tools, another plugin) is refused. Keep these sets exact.
LAYERS: dict[str, frozenset[str]] = {
    # The byte codecs: pure, imports nothing else of the gateway.
    "gateway.wire": frozenset(),
    "gateway.pubsub": frozenset({"gateway.wire"}),
    "gateway.mq": frozenset({"gateway.wire", "gateway.secrets"}),
    # Request/reply's pure core (routes, correlation, reply addressing): MQ names and
    # descriptors from below, and the plugin contract's Envelope it turns replies into.
    "gateway.routing": frozenset(
        {"gateway.wire", "gateway.pubsub", "gateway.mq", "gateway.plugin_api"}
    ),
    # The contract plugins import. MQ-neutral (no gateway.wire); it still takes the
    # stream rule ($SYS/STREAM/, the default stream) and the usr property-name rule from
    # gateway.pubsub so there is one home for each.
    "gateway.plugin_api": frozenset({"gateway.pubsub"}),
    # Secrets named in configuration (env/file/literal), never shown: imports nothing,
    # used by every layer that holds a credential.
    "gateway.secrets": frozenset(),
    # One log line per kind per interval for what outsiders repeat: imports nothing,
    # used by the runtime and the plugins alike.
    "gateway.log_summary": frozenset(),
    # Tooling (real Kafka/Mosquitto on loopback): stands alone.
    "gateway.devstack": frozenset(),
    "gateway.runtime": frozenset(
        {
            "gateway.wire",
            "gateway.pubsub",
            "gateway.mq",
            "gateway.routing",
            "gateway.plugin_api",
            "gateway.devstack",  # `mqgw devstack` and the health of local services
            "gateway.secrets",
            "gateway.log_summary",
            "analytics",  # only the `mqgw analytics` sub-command, imported by string
        }
    ),
    # The package root holds only __version__ and the layer docstring; every layer may
    # import it (``from gateway import __version__``).
    "gateway": frozenset(),
    "plugins": frozenset(),
    "plugins.*": frozenset({"gateway.plugin_api", "gateway.secrets", "gateway.log_summary"}),
    # Runs under spark-submit without the gateway installed; only the local runner asks
    # the devstack where the connector jars are (lazily).
    "analytics": frozenset({"gateway.devstack"}),
    # Demos and examples are applications: any public layer, never tests.
    "examples": frozenset(
        {
            "gateway.wire",
            "gateway.pubsub",
            "gateway.mq",
            "gateway.routing",
            "gateway.plugin_api",
            "gateway.devstack",
            "gateway.runtime",
            "plugins",
            "plugins.*",
        }
    ),
}

#: Edges allowed today that are meant to go (layer -> layers). Delete a line as soon as
#: its test says it is unused.
TRANSITIONAL: dict[str, frozenset[str]] = {}

#: Import circles among gateway modules that are known and being removed, as the set of
#: modules in each circle. test_known_circles_are_still_there fails once one is gone:
#: delete its line then.
KNOWN_CIRCLES: list[frozenset[str]] = []

#: Layers that are a single module: ``gateway.x`` is not in layer ``gateway``.
_EXACT_LAYERS = frozenset({"gateway", "plugins"})

#: Entry-point groups and the layer each target must live in.
ENTRY_POINT_LAYERS = {"project.scripts": "gateway.runtime", "mqgw.plugins": "plugins.*"}

_FIRST_PARTY_RE = "|".join(FIRST_PARTY)
_MODULE_STRING = re.compile(
    rf"(?P<module>(?:{_FIRST_PARTY_RE})(?:\.[A-Za-z_]\w*)*)(?::(?P<attr>[A-Za-z_][\w.]*))?"
)


# ---------------------------------------------------------------- the walk ---------


@dataclass(frozen=True, slots=True)
class Import:
    """One import a module makes: ``target`` module (absolute), where, and how."""

    target: str
    line: int
    how: str  # "import", "relative", "string"
    #: inside ``if TYPE_CHECKING:``: never executed, so it cannot make an import circle
    #: (it still has to respect the layers)
    typing_only: bool = False


def _is_first_party(name: str) -> bool:
    return name.split(".")[0] in FIRST_PARTY


def module_exists(name: str) -> bool:
    """``name`` is a module or package of this tree."""
    path = ROOT.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def _typing_only_nodes(tree: ast.AST) -> set[int]:
    """ids of the nodes under an ``if TYPE_CHECKING:`` (or ``typing.TYPE_CHECKING``)."""
    ids: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If):
            test = node.test
            name = test.attr if isinstance(test, ast.Attribute) else getattr(test, "id", "")
            if name == "TYPE_CHECKING":
                for stmt in node.body:
                    ids.update(id(n) for n in ast.walk(stmt))
    return ids


def _docstring_nodes(tree: ast.AST) -> set[int]:
    ids: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                ids.add(id(body[0].value))
    return ids


def _string_prefix(node: ast.expr) -> str | None:
    """The text of a constant string, or the constant head of an f-string (a package)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr) and node.values:
        head = node.values[0]
        if isinstance(head, ast.Constant) and isinstance(head.value, str):
            return head.value.rstrip(".")
    return None


def _resolve_relative(module: str, is_package: bool, level: int, name: str | None) -> str:
    parts = module.split(".") if is_package else module.split(".")[:-1]
    if level - 1 > len(parts) - 1:
        raise ValueError(f"relative import beyond the top-level package in {module}")
    base = parts[: len(parts) - (level - 1)]
    return ".".join(base + ([name] if name else []))


def imports_of(
    module: str,
    source: str,
    *,
    is_package: bool = False,
    exists: Callable[[str], bool] = module_exists,
) -> list[Import]:
    """Every first-party import ``module`` makes, resolved to absolute names.

    ``from p import a`` is an import of ``p``, and of ``p.a`` when that ``exists`` (a
    module rather than a name defined in ``p``).
    """
    tree = ast.parse(source, filename=module)
    docstrings = _docstring_nodes(tree)
    typing_only = _typing_only_nodes(tree)
    found: list[Import] = []
    for node in ast.walk(tree):
        typed = id(node) in typing_only
        if isinstance(node, ast.Import):
            found.extend(Import(a.name, node.lineno, "import", typed) for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = _resolve_relative(module, is_package, node.level, node.module)
                how = "relative"
            else:
                base, how = node.module or "", "import"
            found.append(Import(base, node.lineno, how, typed))
            found.extend(
                Import(f"{base}.{a.name}", node.lineno, how, typed)
                for a in node.names
                if exists(f"{base}.{a.name}")
            )
        elif isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if name in ("import_module", "__import__") and node.args:
                text = _string_prefix(node.args[0])
                if text:
                    found.append(Import(text, node.lineno, "string"))
        elif (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and id(node) not in docstrings
        ):
            # A module named in a string: an entry-point "module:attr" or a table of
            # module names imported later (COMMAND_MODULES, {"kafka": "plugins.kafka:..."}).
            match = _MODULE_STRING.fullmatch(node.value)
            if match and ("." in match["module"] or match["attr"]) and exists(match["module"]):
                found.append(Import(match["module"], node.lineno, "string"))
    return [i for i in found if _is_first_party(i.target)]


def layer_of(module: str) -> str | None:
    """The layer ``module`` belongs to (longest matching prefix; ``plugins.<name>``)."""
    parts = module.split(".")
    if parts[0] == "plugins" and len(parts) > 1:
        return "plugins.*"
    keys = [
        k
        for k in (*LAYERS, *TRANSITIONAL)
        if module == k or (module.startswith(k + ".") and k not in _EXACT_LAYERS)
    ]
    return max(keys, key=len, default=None)


def _plugin_package(module: str) -> str:
    return ".".join(module.split(".")[:2])


def violations(
    module: str,
    source: str,
    shown: str,
    *,
    is_package: bool = False,
    transitional: Mapping[str, frozenset[str]] | None = None,
) -> Iterator[tuple[str, str, str]]:
    """(message, own layer, target layer) for each import ``module`` may not make.
    ``transitional`` defaults to :data:`TRANSITIONAL` (the self-tests pass their own)."""
    if transitional is None:
        transitional = TRANSITIONAL
    own = layer_of(module)
    if own is None:
        yield f"{shown}: {module} belongs to no layer (add it to LAYERS)", "", ""
        return
    allowed = LAYERS.get(own, frozenset()) | transitional.get(own, frozenset())
    try:
        found = imports_of(module, source, is_package=is_package)
    except ValueError as exc:
        yield f"{shown}: {exc}", own, ""
        return
    for imp in found:
        target = layer_of(imp.target)
        if target is None:
            yield f"{shown}:{imp.line} ({own}) imports {imp.target} ({imp.how})", own, ""
            continue
        if target == "plugins.*" and own == "plugins.*":
            if _plugin_package(imp.target) != _plugin_package(module):
                yield f"{shown}:{imp.line} imports another plugin: {imp.target}", own, target
            continue
        if target in (own, "gateway") or target in allowed:
            if target != own and target in transitional.get(own, frozenset()):
                yield "", own, target  # allowed for now: recorded as used
            continue
        yield f"{shown}:{imp.line} ({own}) imports {imp.target} ({imp.how})", own, target


def _module_name(path: Path) -> tuple[str, bool]:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    is_package = parts[-1] == "__init__"
    if is_package:
        parts.pop()
    return ".".join(parts), is_package


def _source_files() -> list[Path]:
    return [
        p for top in WALKED if (ROOT / top).is_dir() for p in sorted((ROOT / top).rglob("*.py"))
    ]


def _walk_tree() -> tuple[list[str], set[tuple[str, str]]]:
    problems: list[str] = []
    used: set[tuple[str, str]] = set()
    for path in _source_files():
        module, is_package = _module_name(path)
        shown = str(path.relative_to(ROOT))
        for message, own, target in violations(
            module, path.read_text(encoding="utf-8"), shown, is_package=is_package
        ):
            if message:
                problems.append(message)
            else:
                used.add((own, target))
    return problems, used


# ---------------------------------------------------------------- circles ----------


def import_graph(sources: Mapping[str, tuple[str, bool]]) -> dict[str, set[str]]:
    """Module -> modules of ``sources`` it imports when it runs (by any means; type-only
    imports under ``if TYPE_CHECKING:`` never run and are left out), from name -> (source,
    is_package). ``from p import m`` counts as an import of module ``p.m`` when it is one."""
    graph: dict[str, set[str]] = {}
    for module, (source, is_package) in sources.items():
        found = imports_of(module, source, is_package=is_package, exists=sources.__contains__)
        edges = {imp.target for imp in found if imp.target in sources and not imp.typing_only}
        edges.discard(module)
        graph[module] = edges
    return graph


def import_circles(graph: Mapping[str, set[str]]) -> list[list[str]]:
    """Each strongly connected group of two or more modules, as one circular path."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []

    def connect(v: str) -> None:  # Tarjan; the graphs here are a few hundred nodes
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            connect(v)
    return [_circular_path(g, graph) for g in groups]


def _circular_path(group: list[str], graph: Mapping[str, set[str]]) -> list[str]:
    """A path start -> ... -> start inside ``group`` (breadth-first, shortest)."""
    members = set(group)
    start = group[0]
    came_from: dict[str, str] = {}
    frontier = [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(graph[v] & members):
                if w == start:
                    path = [v]
                    while path[-1] != start:
                        path.append(came_from[path[-1]])
                    return [start, *reversed(path[:-1]), start] if v != start else [start, start]
                if w not in came_from:
                    came_from[w] = v
                    nxt.append(w)
        frontier = nxt
    return [*group, group[0]]


def _gateway_sources() -> dict[str, tuple[str, bool]]:
    out: dict[str, tuple[str, bool]] = {}
    for path in sorted((ROOT / "gateway").rglob("*.py")):
        module, is_package = _module_name(path)
        out[module] = (path.read_text(encoding="utf-8"), is_package)
    return out


# ---------------------------------------------------------------- entry points -----


def entry_point_problems(pyproject: str, exists: Mapping[str, str]) -> list[str]:
    """Entry points of ``pyproject`` whose module is missing, does not define the
    attribute, or lies outside the layer its group allows. ``exists`` maps module names
    to their source."""
    project = tomllib.loads(pyproject).get("project", {})
    groups = {"project.scripts": project.get("scripts", {})}
    groups.update(project.get("entry-points", {}))
    problems: list[str] = []
    for group, entries in groups.items():
        for name, value in entries.items():
            module, _, attr = value.partition(":")
            where = f"pyproject.toml [{group}] {name} = {value!r}"
            if module not in exists:
                problems.append(f"{where}: no module {module}")
                continue
            wanted = ENTRY_POINT_LAYERS.get(group)
            if wanted is not None and layer_of(module) != wanted:
                problems.append(f"{where}: {module} is not in {wanted}")
            top = attr.split(".")[0]
            if top and top not in _top_level_names(exists[module]):
                problems.append(f"{where}: {module} defines no {top}")
    return problems


def _top_level_names(source: str) -> set[str]:
    names: set[str] = set()
    for node in ast.parse(source).body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        elif isinstance(node, ast.Import | ast.ImportFrom):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
    return names


def _all_modules() -> dict[str, str]:
    return {_module_name(p)[0]: p.read_text(encoding="utf-8") for p in _source_files()}


# ---------------------------------------------------------------- the rules --------


def test_imports_run_one_way() -> None:
    assert _source_files(), "no source files found: the walk itself is broken"
    problems, _ = _walk_tree()
    assert problems == [], "layering violations:\n" + "\n".join(problems)


def test_transitional_allowances_are_still_needed() -> None:
    _, used = _walk_tree()
    present = {layer_of(_module_name(p)[0]) for p in _source_files()}
    stale = [
        f"{own} -> {target}"
        for own, targets in TRANSITIONAL.items()
        for target in sorted(targets)
        if own in present and (own, target) not in used
    ]
    # A layer that no longer exists (gateway.demo moved away) is stale as a whole.
    stale += [f"{own} (no such module any more)" for own in TRANSITIONAL if own not in present]
    assert stale == [], "tighten TRANSITIONAL, these edges are unused now:\n" + "\n".join(stale)


def test_entry_points_resolve_into_their_layers() -> None:
    pyproject = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    assert entry_point_problems(pyproject, _all_modules()) == []


def test_no_import_circles_in_gateway() -> None:
    circles = import_circles(import_graph(_gateway_sources()))
    unknown = [c for c in circles if frozenset(c) not in KNOWN_CIRCLES]
    assert unknown == [], "import circles:\n" + "\n".join(" -> ".join(c) for c in unknown)


def test_known_circles_are_still_there() -> None:
    found = {frozenset(c) for c in import_circles(import_graph(_gateway_sources()))}
    gone = [sorted(c) for c in KNOWN_CIRCLES if c not in found]
    assert gone == [], f"these circles are gone, delete them from KNOWN_CIRCLES: {gone}"


# ---------------------------------------------------------------- self-tests -------


@pytest.mark.parametrize(
    ("module", "target", "ok"),
    [
        ("gateway.wire.rfh2", "gateway.pubsub.engine", False),
        ("gateway.wire.rfh2", "gateway.wire.folder", True),
        ("gateway.pubsub.engine", "gateway.wire.rfh2", True),
        ("gateway.pubsub.engine", "gateway.mq.port", False),
        ("gateway.mq.port", "gateway.runtime.app", False),
        ("gateway.mq.port", "gateway.plugin_api", False),
        ("gateway.runtime.cli", "gateway.mq.port", True),
        ("gateway.runtime.cli", "tests.support.service_client", False),
        ("gateway.devstack.kafka", "gateway.runtime.app", False),
        ("gateway.plugin_api", "gateway.runtime.app", False),
        ("plugins.kafka.sink", "gateway.plugin_api", True),
        ("plugins.kafka.sink", "gateway.pubsub.engine", False),
        ("plugins.kafka.sink", "gateway.runtime.pubsub_service", False),
        ("plugins.kafka.sink", "plugins.mqtt.sink", False),
        ("plugins.kafka.sink", "plugins.kafka.mapping", True),
        ("analytics.jobs.ohlc", "gateway.runtime.app", False),
        ("analytics.jobs.ohlc", "gateway.wire.mqmd", False),
        ("examples.demo.app", "gateway.runtime.app", True),
        ("examples.demo.app", "tests.support.service_client", False),
    ],
)
def test_rule_layers(module: str, target: str, ok: bool) -> None:
    """The checker itself: a synthetic module importing upward is reported."""
    for source in (f"import {target}\n", f"def f():\n    from {target} import x\n"):
        found = [m for m, _, _ in violations(module, source, module) if m]
        assert (found == []) is ok, (source, found)


def test_rule_unassigned_module_is_reported() -> None:
    found = [m for m, _, _ in violations("gateway.newlayer.x", "import os\n", "x") if m]
    assert found and "belongs to no layer" in found[0]


@pytest.mark.parametrize(
    ("module", "is_package", "source", "ok"),
    [
        ("gateway.wire.rfh2", False, "from . import folder\n", True),
        ("gateway.wire.rfh2", False, "from .folder import Element\n", True),
        ("gateway.wire.rfh2", False, "from ..pubsub import engine\n", False),
        ("gateway.wire.rfh2", False, "from ..runtime.app import App\n", False),
        ("gateway.wire", True, "from .rfh2 import MQRFH2\n", True),
        ("gateway.wire", True, "from ..pubsub.engine import PubSubEngine\n", False),
        ("plugins.kafka.sink", False, "from ..mqtt import sink\n", False),
        ("gateway.wire.rfh2", False, "from .... import x\n", False),  # beyond the top
    ],
)
def test_rule_relative_imports(module: str, is_package: bool, source: str, ok: bool) -> None:
    found = [m for m, _, _ in violations(module, source, module, is_package=is_package) if m]
    assert (found == []) is ok, found


def test_relative_imports_resolve_to_absolute_names() -> None:
    got = {i.target for i in imports_of("gateway.pubsub.engine", "from ..wire import rfh\n")}
    assert got == {"gateway.wire", "gateway.wire.rfh"}
    got = {i.target for i in imports_of("gateway.wire", "from . import rfh\n", is_package=True)}
    assert got == {"gateway.wire", "gateway.wire.rfh"}


@pytest.mark.parametrize(
    ("module", "source", "ok"),
    [
        ("gateway.wire.x", 'importlib.import_module("gateway.runtime.cli")\n', False),
        ("gateway.wire.x", 'import_module("gateway.wire.rfh2")\n', True),
        ("gateway.wire.x", '__import__("gateway.mq.port")\n', False),
        ("gateway.wire.x", 'importlib.import_module(f"gateway.runtime.{name}")\n', False),
        ("gateway.pubsub.x", 'TABLE = {"kafka": "plugins.kafka:plugin"}\n', False),
        ("gateway.pubsub.x", 'MODULES = ("gateway.runtime.run",)\n', False),
        ("gateway.runtime.x", 'MODULES = ("gateway.devstack.cli", "analytics.cli")\n', True),
        ("plugins.kafka.x", 'ENTRY = "gateway.runtime.cli:main"\n', False),
        # prose naming a module is not an import: docstrings and sentences are skipped
        ("gateway.wire.x", '"""See gateway.runtime.app."""\n', True),
        ("gateway.wire.x", 'MSG = "see gateway.runtime.app for more"\n', True),
    ],
)
def test_rule_imports_by_string(module: str, source: str, ok: bool) -> None:
    found = [m for m, _, _ in violations(module, source, module) if m]
    assert (found == []) is ok, found


def test_rule_entry_points() -> None:
    modules = {
        "gateway.runtime.cli": "def main():\n    pass\n",
        "plugins.kafka": "from plugins.kafka.plugin import plugin\n",
    }
    good = (
        '[project.scripts]\nmqgw = "gateway.runtime.cli:main"\n'
        '[project.entry-points."mqgw.plugins"]\nkafka = "plugins.kafka:plugin"\n'
    )
    assert entry_point_problems(good, modules) == []
    bad = (
        '[project.scripts]\nmqgw = "gateway.runtime.cli:nope"\n'
        '[project.entry-points."mqgw.plugins"]\n'
        'kafka = "gateway.runtime.cli:main"\nmqtt = "plugins.mqtt:plugin"\n'
    )
    problems = entry_point_problems(bad, modules)
    assert len(problems) == 3, problems
    assert any("defines no nope" in p for p in problems)
    assert any("is not in plugins.*" in p for p in problems)
    assert any("no module plugins.mqtt" in p for p in problems)


def test_rule_import_circles() -> None:
    sources = {
        "gateway.mq.a": ("from gateway.mq import b\n", False),
        "gateway.mq.b": ("def f():\n    from gateway.mq.c import x\n", False),
        "gateway.mq.c": ("from . import a\n", False),
        "gateway.mq.d": ("import gateway.mq.a\n", False),
        "gateway.mq": ("", True),
    }
    circles = import_circles(import_graph(sources))
    assert circles == [["gateway.mq.a", "gateway.mq.b", "gateway.mq.c", "gateway.mq.a"]]
    del sources["gateway.mq.c"]
    assert import_circles(import_graph(sources)) == []


def test_rule_type_only_imports_make_no_circle_but_keep_the_layers() -> None:
    """``if TYPE_CHECKING:`` imports never run: a type-only back-reference is no circle,
    but it still may not point up a layer."""
    back = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from gateway.mq import a\n"
    sources = {
        "gateway.mq.a": ("from gateway.mq import b\n", False),
        "gateway.mq.b": (back, False),
        "gateway.mq": ("", True),
    }
    assert import_circles(import_graph(sources)) == []
    sources["gateway.mq.b"] = ("from gateway.mq import a\n", False)
    circle = ["gateway.mq.a", "gateway.mq.b", "gateway.mq.a"]
    assert import_circles(import_graph(sources)) == [circle]
    upward = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import gateway.runtime.app\n"
    assert [m for m, _, _ in violations("gateway.mq.b", upward, "") if m]


def test_rule_stale_transitional_edge_is_noticed() -> None:
    """A transitional edge shows up as used only when some module still needs it."""
    table = {"plugins.*": frozenset({"gateway.wire"})}
    bad = "import gateway.wire.rfh2\n"
    used = [
        (o, t)
        for m, o, t in violations("plugins.kafka.x", bad, "", transitional=table)
        if not m
    ]
    assert used == [("plugins.*", "gateway.wire")]
    quiet = violations("plugins.kafka.x", "import os\n", "", transitional=table)
    assert [m for m in quiet if not m[0]] == []
    # Without the transitional edge the same import is a violation.
    assert [m for m, _, _ in violations("plugins.kafka.x", bad, "") if m]
