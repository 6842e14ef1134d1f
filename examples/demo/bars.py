"""The tick feed and the OHLC bars the demo checks the Spark ohlc job against.

Why computed here: the demo proves the analytics loop by recomputing every bar from the
ticks it sent (open/close by put time, then feed order) and comparing value by value.
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from decimal import Decimal, InvalidOperation

from examples.demo.paths import SYMBOLS
from gateway.wire.put_time import put_date_time


@dataclass(frozen=True, slots=True)
class Tick:
    """One tick of the feed; ``put_cs`` is its MQMD put time in 1/100 s since 1970 UTC."""

    seq: int
    symbol: str
    price: Decimal
    volume: int
    put_cs: int

    @property
    def text(self) -> str:
        """The publication data in the ohlc job's text format ``SYMBOL PRICE VOLUME``."""
        return f"{self.symbol} {self.price} {self.volume}"

    @property
    def minute(self) -> int:
        """Start of the tick's one-minute window, seconds since 1970 UTC."""
        return self.put_cs // 6000 * 60


#: (symbol, window start in seconds since 1970 UTC)
BarKey = tuple[str, int]
#: (open, high, low, close, volume, ticks)
Bar = tuple[Decimal, Decimal, Decimal, Decimal, int, int]


def tick_schedule(count: int, now: float, seed: int = 7) -> list[Tick]:
    """``count`` ticks alternating the symbols, put times spread evenly over the two whole
    minutes before ``now`` (so two one-minute windows; each symbol in both from 4 ticks)."""
    start_cs = (int(now) // 60 - 2) * 6000
    rng = random.Random(seed)
    prices = {"IBM": Decimal("131.25"), "HPQ": Decimal("20.10")}
    ticks = []
    for seq in range(count):
        symbol = SYMBOLS[seq % len(SYMBOLS)]
        moved = prices[symbol] + Decimal(rng.randint(-25, 25)) / 100
        prices[symbol] = max(moved, Decimal("0.01"))
        put_cs = start_cs + seq * 12_000 // count
        ticks.append(Tick(seq, symbol, prices[symbol], rng.randint(1, 50) * 100, put_cs))
    return ticks


def expected_bars(ticks: Sequence[Tick]) -> dict[BarKey, Bar]:
    """The bars the ohlc job must compute: per (symbol, minute), open/close the first/last
    tick by put time, then by feed order (= Kafka offset order on the one partition)."""
    grouped: dict[BarKey, list[Tick]] = {}
    for tick in sorted(ticks, key=lambda t: (t.put_cs, t.seq)):
        grouped.setdefault((tick.symbol, tick.minute), []).append(tick)
    return {
        key: (
            group[0].price,
            max(t.price for t in group),
            min(t.price for t in group),
            group[-1].price,
            sum(t.volume for t in group),
            len(group),
        )
        for key, group in grouped.items()
    }


def parse_bar(payload: bytes) -> tuple[BarKey, Bar] | None:
    """A bar as the ohlc job produces it (JSON, prices as decimal strings), or None."""
    try:
        data = json.loads(payload)
        start = datetime.strptime(data["start"], "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
        bar: Bar = (
            Decimal(data["open"]),
            Decimal(data["high"]),
            Decimal(data["low"]),
            Decimal(data["close"]),
            int(data["volume"]),
            int(data["ticks"]),
        )
        return (str(data["symbol"]), int(start.timestamp())), bar
    except (ValueError, TypeError, KeyError, InvalidOperation, UnicodeDecodeError):
        return None


@dataclass
class BarBook:
    """Bars expected from the ticks sent, and the latest version each queue received."""

    expected: dict[BarKey, Bar] = field(default_factory=dict)
    seen: dict[str, dict[BarKey, Bar]] = field(default_factory=dict)

    def receive(self, queue: str, key: BarKey, bar: Bar) -> None:
        # A bar is produced again when a micro-batch changes it: the latest one counts.
        self.seen.setdefault(queue, {})[key] = bar

    def matched(self, queue: str) -> int:
        got = self.seen.get(queue, {})
        return sum(1 for key, bar in self.expected.items() if got.get(key) == bar)

    def mismatches(self, queue: str) -> list[str]:
        got = self.seen.get(queue, {})
        lines = []
        for key, want in sorted(self.expected.items()):
            have = got.get(key)
            if have != want:
                lines.append(f"{bar_name(key)}: expected {bar_text(want)}, got "
                             + (bar_text(have) if have else "nothing"))
        lines += [f"{bar_name(k)}: unexpected bar {bar_text(v)}"
                  for k, v in sorted(got.items()) if k not in self.expected]
        return lines


def bar_name(key: BarKey) -> str:
    """``SYMBOL HH:MMZ``: a bar as the summary names it."""
    return f"{key[0]} {time.strftime('%H:%M', time.gmtime(key[1]))}Z"


def bar_text(bar: Bar) -> str:
    """A bar's values as the summary prints them."""
    o, h, lo, c, v, n = bar
    return f"O {o} H {h} L {lo} C {c} V {v} ({n} ticks)"


def put_stamp(put_cs: int) -> tuple[str, str]:
    """MQMD PutDate ``YYYYMMDD`` and PutTime ``HHMMSSTH`` (GMT) of ``put_cs``."""
    whole, hundredths = divmod(put_cs, 100)
    moment = datetime.fromtimestamp(whole, UTC) + timedelta(milliseconds=hundredths * 10)
    return put_date_time(moment)
