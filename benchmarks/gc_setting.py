"""The garbage-collector setting of a benchmark's gateway side, and the other process
setting ``mqgw run`` applies with it.

``mqgw run`` applies the ``gc:`` policy (gateway/runtime/gc_policy.py) and the thread
switch interval (gateway/runtime/switch_interval.py) once its start-up is complete. A
benchmark that builds the gateway itself (broker service, plugin host) applies the same
settings through the same functions at the same point (just before the service starts,
:func:`apply_gateway_policy`), so it measures what a user runs; benchmarks that start a
``GatewayApp`` get them from the app. Raw baselines keep Python's settings
(a user of a raw client has them) unless the benchmark says otherwise.
``--python-gc`` keeps Python's collector settings on the gateway side too (the "before"
of docs/performance.md "Garbage-collector policy"); the switch interval is
applied either way.
"""

from __future__ import annotations

import argparse
import gc
from collections.abc import Iterator
from contextlib import contextmanager

from gateway.runtime.gc_policy import GcConfig, GcPolicy, apply_gc_policy
from gateway.runtime.switch_interval import SwitchInterval, apply_switch_interval

#: What the gateway side runs with; ``--python-gc`` sets ``tune=False``.
GATEWAY_GC = GcConfig()


def add_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--python-gc", action="store_true",
        help="gateway side with Python's collector settings (no gc: policy) for a before/after",
    )


def configure(args: argparse.Namespace) -> None:
    global GATEWAY_GC
    GATEWAY_GC = GcConfig(tune=not args.python_gc)


def describe(cfg: GcConfig | None = None) -> str:
    cfg = GATEWAY_GC if cfg is None else cfg
    if not cfg.tune:
        return f"Python's settings {gc.get_threshold()}, no freeze"
    return (f"the app's gc: policy (freeze after start, generation-0 threshold "
            f"{cfg.gen0_threshold:,})")


class GatewayPolicy:
    """The settings ``mqgw run`` applies at start-up, applied; :meth:`release` undoes them."""

    def __init__(self, who: str, cfg: GcConfig | None = None) -> None:
        self.gc: GcPolicy = apply_gc_policy(GATEWAY_GC if cfg is None else cfg, who=who)
        self.switch: SwitchInterval = apply_switch_interval(who)

    def release(self) -> None:
        self.switch.release()
        self.gc.release()


def apply_gateway_policy(who: str, cfg: GcConfig | None = None) -> GatewayPolicy:
    """The gateway side's settings from here on (the gc: policy, ``--python-gc`` aside,
    and the thread switch interval)."""
    return GatewayPolicy(who, cfg)


@contextmanager
def gateway_gc(who: str, cfg: GcConfig | None = None) -> Iterator[None]:
    """The gateway side's settings for the block (released after it, so the baseline that
    follows in the same process has Python's settings again)."""
    policy = apply_gateway_policy(who, cfg)
    try:
        yield
    finally:
        policy.release()


def peak_rss_mib() -> float:
    """This process's peak resident set size so far (``ru_maxrss``, KiB on Linux)."""
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
