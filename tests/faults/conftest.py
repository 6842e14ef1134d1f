"""The fault suite's knob and shared fixture. ``--trials N`` (SIGKILL trials of
tests/faults; default 100, what ``make test`` runs). Long runs:
``pytest -m faults tests/faults --trials 1000``.

The option exists when this conftest is loaded at start-up (``tests/faults`` named on
the command line); ``MQGW_FAULT_TRIALS=N`` works however pytest is called.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

DEFAULT_TRIALS = 100
#: Size of the small disk of the disk-full tests (``small_disk``).
DISK_MB = 64
#: pytest-timeout's limit of a trials test: a base plus this much per trial (a trial
#: takes 2.5–5 s on two busy cores), so ``--trials 1000`` is not cut at the global 600 s.
TIMEOUT_BASE_S, TIMEOUT_PER_TRIAL_S = 180, 10


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--trials",
        type=int,
        default=DEFAULT_TRIALS,
        help=f"SIGKILL trials of the fault suite (tests/faults; default {DEFAULT_TRIALS})",
    )


def trial_count(config: pytest.Config) -> int:
    option = config.getoption("--trials", default=None)
    env = os.environ.get("MQGW_FAULT_TRIALS")
    value = int(env) if env and option in (None, DEFAULT_TRIALS) else int(option or DEFAULT_TRIALS)
    if value < 1:
        raise pytest.UsageError("--trials must be at least 1")
    return value


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # Called with every collected item (not only this folder's): only trials tests.
    limit = TIMEOUT_BASE_S + TIMEOUT_PER_TRIAL_S * trial_count(config)
    for item in items:
        if "trials" in getattr(item, "fixturenames", ()) and not item.get_closest_marker(
            "timeout"
        ):
            item.add_marker(pytest.mark.timeout(limit))


@pytest.fixture
def trials(request: pytest.FixtureRequest) -> int:
    return trial_count(request.config)


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A ``DISK_MB`` MB tmpfs at ``tmp_path/disk``: root only, and a test that needs it
    fails (never skips) where it cannot be mounted."""
    mount = tmp_path / "disk"
    mount.mkdir()
    if os.geteuid() != 0:
        pytest.fail("the disk-full tests mount a tmpfs: run them as root")
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={DISK_MB}m", "tmpfs", str(mount)],
        capture_output=True, text=True, check=False,
    )
    if done.returncode != 0:
        pytest.fail(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)
