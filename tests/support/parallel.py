"""How ``make test`` spreads the suite over pytest-xdist workers (``--dist loadgroup``).

Why: the suite mostly waits (brokers, timeouts, fsyncs), so several workers share the two
cores well; but a worker left with a long test at the end makes everyone wait for it.

- **Work units.** A test is its own unit, except where running its neighbours elsewhere
  would start something twice: every test that uses the Spark session goes to one worker
  (group ``spark``: one Spark JVM), and a module whose tests share a module- or
  class-scoped fixture (a TLS broker, a five-process network) stays on one worker.
- **Order.** Units run longest first (the measured durations in
  ``tests/test-durations.json``; a test not in it is guessed from its module's, then its
  folder's, median), so the long fault-suite tests start at once, the short ones fill in
  at the end; the first unit queued behind each worker's first one is a short one
  (xdist hands a worker its next test before the current one ends).

- **The ``subprocess`` mark** goes on the tests of modules that use what starts processes
  (subprocess, the gateway and network helpers): ``make test-quick`` leaves them out.

The order is a pure function of the collection and the file, so every worker computes
the same one (xdist checks). Refresh the file after adding slow tests:
``python -m tests.support.parallel JUNIT.xml`` (``make test`` writes the JUnit file to
``.cache/test-junit.xml``).
"""

from __future__ import annotations

import json
import statistics
import sys
import xml.etree.ElementTree as ET
from collections.abc import Iterable, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

DURATIONS_FILE = Path(__file__).resolve().parents[1] / "test-durations.json"
#: Tests faster than this are left out of the file (they are guessed well enough).
RECORD_FROM_S = 0.5
#: A test nothing is known about (not even its folder).
DEFAULT_S = 0.3
SPARK_GROUP = "spark"
_SHARED_SCOPES = {"module", "class", "package"}


def _load(path: Path = DURATIONS_FILE) -> dict[str, float]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return {str(k): float(v) for k, v in data.get("durations", {}).items()}


def _module_of(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


def _folder_of(nodeid: str) -> str:
    return _module_of(nodeid).rsplit("/", 1)[0]


class Estimator:
    """Expected duration of a test: measured, else the median of its module, then folder
    (tests faster than RECORD_FROM_S were left out of the file: they count as fast)."""

    def __init__(self, known: dict[str, float]) -> None:
        self.known = known
        by_module: dict[str, list[float]] = {}
        by_folder: dict[str, list[float]] = {}
        for nodeid, seconds in known.items():
            by_module.setdefault(_module_of(nodeid), []).append(seconds)
            by_folder.setdefault(_folder_of(nodeid), []).append(seconds)
        self.module = {k: statistics.median(v) for k, v in by_module.items()}
        self.folder = {k: statistics.median(v) for k, v in by_folder.items()}

    def __call__(self, nodeid: str) -> float:
        if nodeid in self.known:
            return self.known[nodeid]
        module = _module_of(nodeid)
        if module in self.module:
            return min(self.module[module], DEFAULT_S)  # its slow ones are all listed
        return self.folder.get(_folder_of(nodeid), DEFAULT_S)


def _shares_scoped_fixture(item: pytest.Item) -> bool:
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return False
    for defs in info.name2fixturedefs.values():
        if any(str(d.scope) in _SHARED_SCOPES for d in defs):
            return True
    return False


def group_of(item: pytest.Item) -> str | None:
    """The xdist group a test must share with others, or None (a unit of its own)."""
    if item.get_closest_marker("spark") is not None or "spark_session" in getattr(
        item, "fixturenames", ()
    ):
        return SPARK_GROUP
    if _shares_scoped_fixture(item):
        return _module_of(item.nodeid)
    return None


#: Where a test module gets what starts a process of its own (a gateway, a queue manager,
#: a command-line client); the session brokers (kafka_broker, mqtt_broker) do not count.
_PROCESS_MODULES = frozenset({
    "subprocess",
    "multiprocessing",
    "gateway.devstack.process",
    "tests.support.gateway_process",
    "tests.support.legacy_network",
    "tests.support.rr_network",
    "tests.support.neighbour_traffic",
    "tests.faults.scenario",
})


def starts_processes(module: ModuleType) -> bool:
    """True when ``module`` uses something that starts processes (``make test-quick``
    leaves such tests out: the ``subprocess`` mark)."""
    for value in vars(module).values():
        name = value.__name__ if isinstance(value, ModuleType) else getattr(
            value, "__module__", None)
        if name in _PROCESS_MODULES:
            return True
    return False


def mark_process_tests(items: list[pytest.Item]) -> None:
    """Add the ``subprocess`` mark to the tests of modules that start processes."""
    verdicts: dict[str, bool] = {}
    for item in items:
        module = getattr(item, "module", None)
        if module is None:
            continue
        if module.__name__ not in verdicts:
            verdicts[module.__name__] = starts_processes(module)
        if verdicts[module.__name__] and item.get_closest_marker("subprocess") is None:
            item.add_marker(pytest.mark.subprocess)


def plan(items: list[pytest.Item], workers: int, known: dict[str, float] | None = None) -> None:
    """Mark the groups and put ``items`` in the order units should start (in place)."""
    estimate = Estimator(_load() if known is None else known)
    units: dict[str, list[pytest.Item]] = {}
    for item in items:
        group = group_of(item)
        if group is not None and item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group(group))
        units.setdefault(group or item.nodeid, []).append(item)
    if workers <= 1:
        return  # one process: the collection's order (fixtures set up least often)
    cost = {key: sum(estimate(i.nodeid) for i in unit) for key, unit in units.items()}
    # Longest first; ties keep the collection order (sorted() is stable).
    order = sorted(units, key=lambda key: -cost[key])
    if len(order) > 3 * workers:
        # Each worker's second unit is queued behind its first: make those the shortest.
        longest, rest = order[:workers], order[workers:]
        shortest = sorted(rest, key=lambda key: cost[key])[:workers]
        chosen = set(shortest)
        order = longest + shortest + [k for k in rest if k not in chosen]
    items[:] = [item for key in order for item in units[key]]


def worker_count(config: pytest.Config) -> int:
    """How many xdist workers share the run (1 outside a worker: nothing to plan)."""
    workerinput: dict[str, Any] | None = getattr(config, "workerinput", None)
    return 1 if workerinput is None else int(workerinput.get("workercount", 1))


def durations_from_junit(paths: Sequence[Path]) -> dict[str, float]:
    """``nodeid -> seconds`` from JUnit XML files (pytest's ``--junitxml``)."""
    out: dict[str, float] = {}
    for path in paths:
        for case in ET.parse(path).getroot().iter("testcase"):
            classname, name = case.get("classname", ""), case.get("name", "")
            if name.rfind("@") > name.rfind("]"):
                name = name.rsplit("@", 1)[0]  # xdist's group suffix (--dist loadgroup)
            parts = classname.split(".")
            # tests.plugins.kafka.test_x[.Class] -> tests/plugins/kafka/test_x.py[::Class]
            for split in range(len(parts), 0, -1):
                module = "/".join(parts[:split]) + ".py"
                if Path(module).exists():
                    nodeid = "::".join([module, *parts[split:], name])
                    break
            else:
                continue
            out[nodeid] = max(out.get(nodeid, 0.0), float(case.get("time", "0")))
    return out


def write_durations(measured: dict[str, float], path: Path = DURATIONS_FILE) -> int:
    kept = {k: round(v, 1) for k, v in sorted(measured.items()) if v >= RECORD_FROM_S}
    path.write_text(
        json.dumps(
            {
                "about": "per-test seconds of a whole run, the tests of at least "
                f"{RECORD_FROM_S} s: the order make test starts them in "
                "(tests/support/parallel.py)",
                "durations": kept,
            },
            indent=1,
        )
        + "\n",
        encoding="utf-8",
    )
    return len(kept)


def main(argv: Iterable[str]) -> int:
    paths = [Path(a) for a in argv]
    if not paths:
        print("usage: python -m tests.support.parallel JUNIT.xml...", file=sys.stderr)
        return 2
    n = write_durations(durations_from_junit(paths))
    print(f"{DURATIONS_FILE}: {n} tests")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
