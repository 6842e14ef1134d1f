"""The summary table of ``make bench`` (issue 16, item 5): one row per measured path.

Each benchmark calls :func:`record` for the paths it measured; when ``make bench``
(benchmarks/run.py) runs it, the environment variable :data:`RESULTS_ENV` names a JSON
lines file the rows are appended to, and the runner prints :func:`format_table` of them
at the end. Run alone, a benchmark records nothing (it prints its own figures).

A row is either a *ratio* row (gateway and baseline rates measured in the same run;
met when gateway/baseline >= goal), a *latency* row (p50/p99 in ms; met when
p99 < goal), an *info* row (a ratio with no goal in the issue) or a *figure* (one
measured value in its unit, met when below the goal, if any: the 20-node network's
settle time, latency, memory), listed in a table of its own after the others and not
counted among their goals. Pure: no brokers, no event loop; tests/test_bench_summary.py
covers it.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal

RESULTS_ENV = "MQGW_BENCH_RESULTS"

Kind = Literal["ratio", "latency", "info", "figure"]


@dataclass(frozen=True, slots=True)
class Row:
    """One measured path.

    ratio/info: ``gateway`` and ``baseline`` are rates (``unit``, msg/s by default) and
    ``goal`` is the least gateway/baseline ratio (None: no goal). latency: ``gateway``
    is the p99 and ``baseline`` the p50 (ms), ``goal`` the p99 bound in ms. figure:
    ``gateway`` is the value in ``unit``, ``goal`` its upper bound (``baseline`` unused).
    """

    path: str
    gateway: float
    baseline: float
    goal: float | None
    kind: Kind = "ratio"
    unit: str = "msg/s"
    note: str = ""

    @property
    def ratio(self) -> float | None:
        if self.kind in ("latency", "figure") or self.baseline <= 0:
            return None
        return self.gateway / self.baseline

    @property
    def met(self) -> bool | None:
        """True/False against the goal; None when the row has none."""
        if self.goal is None:
            return None
        if self.kind in ("latency", "figure"):
            return self.gateway < self.goal
        ratio = self.ratio
        return ratio is not None and ratio >= self.goal


def record(row: Row) -> None:
    """Append ``row`` to the results file named by :data:`RESULTS_ENV` (if any)."""
    target = os.environ.get(RESULTS_ENV)
    if not target:
        return
    with open(target, "a", encoding="utf-8") as out:
        out.write(json.dumps(asdict(row)) + "\n")


def load(path: Path) -> list[Row]:
    """The rows of a results file (missing file: none)."""
    if not path.exists():
        return []
    rows = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip():
            rows.append(Row(**json.loads(line)))
    return rows


def _rate(value: float, unit: str) -> str:
    return f"{value:,.0f} {unit}" if value >= 100 else f"{value:,.1f} {unit}"


def cells(row: Row) -> tuple[str, str, str, str, str, str]:
    """(path, gateway, baseline, ratio, goal, verdict) as printed."""
    if row.kind == "figure":
        path, value, goal, verdict = figure_cells(row)
        return path, value, "-", "-", goal, verdict
    if row.kind == "latency":
        gateway = f"p99 {row.gateway:.1f} ms"
        baseline = f"(p50 {row.baseline:.1f} ms)"
        ratio = "-"
        goal = f"p99 < {row.goal:g} ms" if row.goal is not None else "-"
    else:
        gateway = _rate(row.gateway, row.unit)
        baseline = _rate(row.baseline, row.unit)
        r = row.ratio
        ratio = f"{r:.2f}" if r is not None else "-"
        goal = f">= {row.goal:g}x" if row.goal is not None else "-"
    met = row.met
    verdict = "info" if met is None else ("met" if met else "NOT MET")
    path = row.path + (f" [{row.note}]" if row.note else "")
    return path, gateway, baseline, ratio, goal, verdict


HEADERS = ("path", "gateway", "baseline", "ratio", "goal", "met")
FIGURE_HEADERS = ("figure", "value", "goal", "met")


def figure_cells(row: Row) -> tuple[str, str, str, str]:
    """(figure, value, goal, verdict) of a figure row as printed."""
    goal = f"< {row.goal:g} {row.unit}" if row.goal is not None else "-"
    met = row.met
    verdict = "info" if met is None else ("met" if met else "NOT MET")
    path = row.path + (f" [{row.note}]" if row.note else "")
    return path, f"{row.gateway:,.2f} {row.unit}", goal, verdict


def _aligned(table: list[tuple[str, ...]], right: set[int]) -> list[str]:
    widths = [max(len(line[i]) for line in table) for i in range(len(table[0]))]

    def fmt(line: tuple[str, ...]) -> str:
        return "  ".join(
            cell.rjust(widths[i]) if i in right else cell.ljust(widths[i])
            for i, cell in enumerate(line)
        ).rstrip()

    return [fmt(table[0]), "  ".join("-" * w for w in widths), *map(fmt, table[1:])]


def format_table(rows: list[Row], failed: list[str] | None = None) -> str:
    """The summary table, then one line per benchmark that failed (its rows missing),
    then the figures' table (when any was recorded)."""
    figures = [r for r in rows if r.kind == "figure"]
    rows = [r for r in rows if r.kind != "figure"]
    table: list[tuple[str, ...]] = [HEADERS, *(cells(r) for r in rows)]
    out = ["summary (issue 16): goals are ratios measured in this run"]
    out.extend(_aligned(table, {1, 2, 3}))  # figures right-aligned
    if not rows:
        out.append("(no rows recorded)")
    goals = [r for r in rows if r.met is not None]
    out.append(f"{sum(1 for r in goals if r.met)} of {len(goals)} goals met")
    for name in failed or ():
        out.append(f"{name}: failed, its rows are missing")
    if figures:
        out += ["", "measured figures (info, not counted above)"]
        out.extend(_aligned([FIGURE_HEADERS, *(figure_cells(r) for r in figures)], {1}))
    return "\n".join(out)
