"""Log flood (issue 12 item 6): during a Kafka outage aiokafka logs thousands of lines a
second. The gateway's log handler lets the first line of each kind through (target
down), summarises the repeats periodically, and says when the library is quiet again
(target back): a 10 s outage at 5,000 lines a second stays under 50 lines."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest

from gateway.runtime.logs import configure_logging

#: What aiokafka logs during an outage, from its real loggers.
OUTAGE_LINES = [
    ("aiokafka.conn", logging.ERROR, "Unable connect to node with id %s: %s"),
    ("aiokafka.client", logging.ERROR, "Unable to update metadata from %s: %s"),
    ("aiokafka.producer.sender", logging.WARNING, "Got error produce response: %s %s"),
    (
        "aiokafka.consumer.group_coordinator",
        logging.ERROR,
        "Group Coordinator Request failed: %s %s",
    ),
]


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def restore_root() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    levels = {n: logging.getLogger(n).level for n in ("aiokafka", "kafka", "paho")}
    try:
        yield
    finally:
        for h in list(root.handlers):
            root.removeHandler(h)
        for h in handlers:
            root.addHandler(h)
        root.setLevel(level)
        for n, lv in levels.items():
            logging.getLogger(n).setLevel(lv)


def _limiter_of_root() -> object | None:
    for f in logging.getLogger().handlers[0].filters:
        if hasattr(f, "check") and hasattr(f, "clock"):
            return f
    return None


def test_a_ten_second_kafka_outage_logs_few_lines_with_down_and_up(
    restore_root: None, capfd: pytest.CaptureFixture[str]
) -> None:
    configure_logging("text", "info")
    limiter = _limiter_of_root()
    clock = FakeClock()
    if limiter is not None:  # the test drives its clock and ticks check() itself
        limiter.clock = clock  # type: ignore[attr-defined]
        limiter._background = False  # type: ignore[attr-defined]
    capfd.readouterr()
    for _second in range(10):  # 10 s at 5,000 lines a second
        for i in range(5000):
            name, level, msg = OUTAGE_LINES[i % len(OUTAGE_LINES)]
            logging.getLogger(name).log(level, msg, i % 3, f"[Error {i % 7}] refused")
        clock.now += 1
        if limiter is not None:
            limiter.check()  # type: ignore[attr-defined]
    logging.getLogger("gateway.plugins").warning("kafka sink: target unreachable")  # ours
    clock.now += 11  # the library is quiet again: the target is back
    if limiter is not None:
        limiter.check()  # type: ignore[attr-defined]
    lines = capfd.readouterr().err.splitlines()
    assert len(lines) < 50, f"{len(lines)} lines, e.g. {lines[:5]}"
    first = [ln for ln in lines if "Unable connect to node with id 0" in ln]
    assert len(first) == 1  # the "down" line, as the library wrote it
    summaries = [ln for ln in lines if "repeated lines suppressed" in ln]
    assert summaries, lines
    back = [ln for ln in lines if "target back" in ln]
    assert len(back) == 1, lines
    assert "49996 repeated line(s) were suppressed" in back[0]
    assert any("kafka sink: target unreachable" in ln for ln in lines)  # own lines untouched


def test_a_second_outage_is_reported_again(
    restore_root: None, capfd: pytest.CaptureFixture[str]
) -> None:
    configure_logging("json", "info")
    limiter = _limiter_of_root()
    assert limiter is not None
    clock = FakeClock()
    limiter.clock = clock  # type: ignore[attr-defined]
    limiter._background = False  # type: ignore[attr-defined]
    capfd.readouterr()
    log = logging.getLogger("aiokafka.conn")
    for _ in range(2):
        for i in range(100):
            log.error("Unable connect to node with id %s: %s", 1, i)
        clock.now += 20
        limiter.check()  # type: ignore[attr-defined]
    lines = capfd.readouterr().err.splitlines()
    assert sum("Unable connect to node" in ln and "suppressed" not in ln for ln in lines) == 2
    assert sum("target back" in ln for ln in lines) == 2
