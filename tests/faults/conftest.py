"""The fault suite's knob: ``--trials N`` (SIGKILL trials of tests/faults; default 100,
what ``make test`` runs). Long runs: ``pytest -m faults tests/faults --trials 1000``.

The option exists when this conftest is loaded at start-up (``tests/faults`` named on
the command line); ``MQGW_FAULT_TRIALS=N`` works however pytest is called.
"""

from __future__ import annotations

import os

import pytest

DEFAULT_TRIALS = 100


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--trials",
        type=int,
        default=DEFAULT_TRIALS,
        help=f"SIGKILL trials of the fault suite (tests/faults; default {DEFAULT_TRIALS})",
    )


@pytest.fixture
def trials(request: pytest.FixtureRequest) -> int:
    option = request.config.getoption("--trials", default=None)
    env = os.environ.get("MQGW_FAULT_TRIALS")
    value = int(env) if env and option in (None, DEFAULT_TRIALS) else int(option or DEFAULT_TRIALS)
    if value < 1:
        raise pytest.UsageError("--trials must be at least 1")
    return value
