"""What each path of the fault suite sent and received, by unique message id, and the
per-path table (trials, sent, received, lost, duplicated) the suite prints and writes."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

#: The path held to 0 duplicates (the kafka plugin's ``delivery: exactly_once``).
EXACTLY_ONCE_PATH = "MQ->Kafka (exactly-once)"
PATHS = ("MQ->Kafka", "MQ->MQTT", "Kafka->MQ", "MQTT->MQ")


@dataclass
class PathLedger:
    """What one path sent (unique ids) and received (id -> times seen)."""

    sent: set[str] = field(default_factory=set)
    received: Counter[str] = field(default_factory=Counter)

    def receive(self, ids: Iterable[str]) -> None:
        self.received.update(i for i in ids if i)

    @property
    def lost(self) -> list[str]:
        return sorted(self.sent - set(self.received))

    @property
    def duplicated(self) -> int:
        return sum(n - 1 for i, n in self.received.items() if i in self.sent and n > 1)

    @property
    def complete(self) -> bool:
        return not self.lost


@dataclass
class Ledger:
    paths: dict[str, PathLedger] = field(
        default_factory=lambda: {p: PathLedger() for p in PATHS}
    )

    @classmethod
    def with_exactly_once(cls) -> Ledger:
        """The four paths plus :data:`EXACTLY_ONCE_PATH`."""
        return cls({p: PathLedger() for p in (*PATHS, EXACTLY_ONCE_PATH)})

    def table(self, trials: int) -> list[dict[str, Any]]:
        return [
            {
                "path": name,
                "trials": trials,
                "sent": len(p.sent),
                "received": sum(n for i, n in p.received.items() if i in p.sent),
                "lost": len(p.lost),
                "duplicated": p.duplicated,
                "unexpected": sum(n for i, n in p.received.items() if i not in p.sent),
            }
            for name, p in self.paths.items()
        ]

    @staticmethod
    def render(rows: list[dict[str, Any]]) -> str:
        cols = ("path", "trials", "sent", "received", "lost", "duplicated", "unexpected")
        lines = ["  ".join(f"{c:>24}" if c == "path" else f"{c:>10}" for c in cols)]
        lines += [
            "  ".join(f"{row[c]!s:>24}" if c == "path" else f"{row[c]!s:>10}" for c in cols)
            for row in rows
        ]
        return "\n".join(lines)


def report(path: Path, title: str, ledger: Ledger, trials: int, **extra: Any) -> str:
    """The per-path table, printed (visible with ``-s``) and written as JSON to ``path``;
    returns the table for assertion messages."""
    rows = ledger.table(trials)
    path.write_text(json.dumps({"paths": rows, **extra}, indent=2), encoding="utf-8")
    table = Ledger.render(rows)
    details = ", ".join(f"{k} {v}" for k, v in extra.items())
    print(f"\n{title} ({details}); report {path}\n{table}")
    return table


def assert_nothing_lost(ledger: Ledger, table: str) -> None:
    lost = {name: p.lost[:10] for name, p in ledger.paths.items() if p.lost}
    assert not lost, f"lost (first ten ids per path): {lost}\n{table}"


def assert_nothing_duplicated(path: PathLedger, table: str) -> None:
    """The exactly-once guarantee: every sent id received exactly once."""
    twice = sorted((i, n) for i, n in path.received.items() if i in path.sent and n > 1)
    assert not twice, f"duplicated (first ten id, times): {twice[:10]}\n{table}"
