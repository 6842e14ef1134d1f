"""A stopping ``mqgw`` exits within its budget even when a library thread never returns
(librdkafka's close after a broker restart): Python would otherwise join that thread at
exit for ever. Real processes: the watchdog ends them with ``os._exit``."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

SCRIPT = """
import logging, sys, threading
from gateway.runtime.stop_watchdog import StopWatchdog
logging.basicConfig(level=logging.INFO)
threading.Thread(target=threading.Event().wait, name="stuck-close").start()
watchdog = StopWatchdog(0.5)
if sys.argv[1] == "finished":
    watchdog.finished(0)  # the stop itself was clean: its status is kept
else:
    watchdog.arm()  # still stopping when the budget ran out
"""


@pytest.mark.parametrize(("state", "code"), [("finished", 0), ("stopping", 1)])
def test_a_thread_that_never_returns_does_not_keep_the_process_alive(
    state: str, code: int
) -> None:
    began = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, state], capture_output=True, text=True, timeout=60
    )
    took = time.monotonic() - began
    assert done.returncode == code, done.stderr
    assert "threads still busy: stuck-close" in done.stderr, done.stderr
    assert "most recent call first" in done.stderr, done.stderr  # the stacks, for the record
    assert took < 30, f"exited only after {took:.1f} s"
