"""The thread switch interval the gateway sets while it runs
(``gateway.runtime.switch_interval``): set by the first holder, kept while any holds it,
and Python's own put back after the last lets go (a test process starts many gateways)."""

from __future__ import annotations

import sys

from gateway.runtime.switch_interval import SWITCH_INTERVAL_S, apply_switch_interval


def test_the_interval_is_held_while_any_gateway_runs_and_restored_after() -> None:
    python_s = sys.getswitchinterval()
    sys.setswitchinterval(0.0042)  # a value of its own, whatever ran before
    try:
        first = apply_switch_interval("gateway a")
        second = apply_switch_interval("gateway b")
        assert sys.getswitchinterval() == SWITCH_INTERVAL_S
        first.release()
        first.release()  # once only
        assert sys.getswitchinterval() == SWITCH_INTERVAL_S
        second.release()
        assert sys.getswitchinterval() == 0.0042
    finally:
        sys.setswitchinterval(python_s)
