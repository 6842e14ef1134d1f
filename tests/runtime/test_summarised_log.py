"""SummarisedLog: one line per kind per interval, whatever an outsider repeats."""

from __future__ import annotations

import asyncio
import logging

import pytest

from gateway.log_summary import SummarisedLog


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "test.summarised"]


def test_three_thousand_repeats_are_two_lines(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="test.summarised")
    clock = Clock()
    log = SummarisedLog(logging.getLogger("test.summarised"), interval=60, clock=clock)
    for i in range(3000):
        clock.now = i * 0.01
        log.log(logging.WARNING, "junk", "junk message %d on Q", i)
    assert _lines(caplog) == ["junk message 0 on Q"]
    clock.now = 61
    log.log(logging.WARNING, "junk", "junk message %d on Q", 3000)
    lines = _lines(caplog)
    assert lines[1] == "2999 more like this in 61 s (junk); the last: junk message 2999 on Q"
    assert lines[2] == "junk message 3000 on Q"
    assert len(lines) == 3
    assert log.suppressed == 2999


def test_each_kind_gets_its_first_line_and_kinds_are_bounded(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="test.summarised")
    log = SummarisedLog(logging.getLogger("test.summarised"), max_kinds=3, clock=Clock())
    for kind in ("a", "b", "c", "d", "e", "a"):
        log.log(logging.INFO, kind, "line %s", kind)
    # a, b, c whole; d becomes "other" (its first line whole), e counted under it
    assert _lines(caplog) == ["line a", "line b", "line c", "line d"]
    log.flush()
    assert sorted(_lines(caplog)[4:]) == [
        "1 more like this in 0 s (a); the last: line a",
        "1 more like this in 0 s (other); the last: line e",
    ]


async def test_a_flood_that_stops_is_still_summarised(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="test.summarised")
    log = SummarisedLog(logging.getLogger("test.summarised"), interval=0.05)
    for _ in range(10):
        log.log(logging.WARNING, "junk", "junk")
    for _ in range(100):  # the timer on the loop writes the summary; nothing else calls
        if len(_lines(caplog)) == 2:
            break
        await asyncio.sleep(0.01)
    assert _lines(caplog)[1].startswith("9 more like this in ")
