"""The gateway process's garbage-collector policy (``gc:`` in ``gateway.yaml``).

Why the application sets it: CPython's cyclic collector runs a generation-0 pass every
700 net allocations of container objects and, every so often, a full pass over every
tracked object in the process. The gateway allocates several container objects per
message (descriptors, queued messages, index entries, deliveries), so on a fan-out or
a bridge the collector ran thousands of times a second and each full pass walked the
start-up objects too (modules, pydantic schemas, plugin clients: hundreds of thousands
of objects that live as long as the process). Measured, it was about a sixth of the CPU
per delivery (docs/performance.md "Garbage-collector policy"). A library must
not change process-wide settings; ``mqgw run`` (and its worker processes) is the
application, so it does, once start-up is complete:

* ``gc.collect(1)`` then ``gc.freeze()`` (the first gateway of the process only): the
  young start-up garbage is collected, then every object alive at that moment moves into the
  permanent generation: later collections no longer walk them. They are still freed by
  reference counting when they go; but a reference cycle that involves a frozen object,
  and everything it refers to, even objects made later, is freed only at shutdown (the
  release unfreezes). The gateway's own long-lived objects do not form such cycles with
  per-message data; a plugin that did would hold memory until the stop.
* the generation-0 threshold is raised (``gen0_threshold``), so a young collection runs
  every N allocations instead of Python's default (700 on CPython 3.11-3.13, where the
  default of 20,000 was measured). Cycles are still found and freed (the collector stays
  enabled, the older generations keep Python's settings); what a higher threshold costs
  is that cyclic garbage can wait up to N allocations longer.

``gc.tune: false`` leaves Python's settings alone. :func:`apply_gc_policy` returns a
:class:`GcPolicy` whose :meth:`~GcPolicy.release` puts the previous settings back (the
app does at shutdown, so a test process that starts several gateways ends as it began).
"""

from __future__ import annotations

import gc
import logging
import threading
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, field_validator

log = logging.getLogger(__name__)

#: Python's own generation-0 threshold (``gc.get_threshold()[0]`` at import: 700 on
#: CPython 3.11-3.13).
PYTHON_GEN0_THRESHOLD = gc.get_threshold()[0]
#: The default ``gc.gen0_threshold`` (chosen by measurement, docs/performance.md).
DEFAULT_GEN0_THRESHOLD = 20_000
#: Bounds of ``gc.gen0_threshold``: below Python's own it would only cost CPU; above a
#: million, cyclic garbage could pile up for long between passes.
MIN_GEN0_THRESHOLD = PYTHON_GEN0_THRESHOLD
MAX_GEN0_THRESHOLD = 1_000_000


class GcConfig(BaseModel):
    """``gc:`` (docs/config-reference.md)."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    tune: bool = True
    """false: leave the collector exactly as Python set it (the other keys are ignored)."""
    freeze_after_start: bool = True
    """``gc.freeze()`` once start-up is complete."""
    gen0_threshold: int = DEFAULT_GEN0_THRESHOLD
    """Allocations between generation-0 collections (Python's default is 700)."""

    @field_validator("gen0_threshold")
    @classmethod
    def _bounded(cls, value: int) -> int:
        if not MIN_GEN0_THRESHOLD <= value <= MAX_GEN0_THRESHOLD:
            raise ValueError(
                f"gen0_threshold {value} is outside {MIN_GEN0_THRESHOLD:,}..."
                f"{MAX_GEN0_THRESHOLD:,} (0 would stop automatic collection; the collector "
                "always stays on); to keep Python's own settings write gc: {tune: false}"
            )
        return value


# Process-wide state: several gateways may run in one process (tests); the first apply
# saves Python's settings, the last release puts them back.
_lock = threading.Lock()
_holders = 0
_saved_thresholds: tuple[int, int, int] | None = None
#: objects frozen before the first apply (someone else's freeze: never undone here)
_saved_freeze_count = 0


@dataclass(slots=True)
class GcPolicy:
    """What :func:`apply_gc_policy` did; :meth:`release` undoes it once."""

    applied: bool
    thresholds: tuple[int, int, int]
    frozen: int
    _released: bool = False

    def release(self) -> None:
        """Put the previous collector settings back (after the last holder lets go)."""
        global _holders, _saved_thresholds
        with _lock:
            if not self.applied or self._released:
                return
            self._released = True
            _holders -= 1
            if _holders:
                return
            if _saved_thresholds is not None:
                gc.set_threshold(*_saved_thresholds)
            if _saved_freeze_count == 0 and gc.get_freeze_count():
                gc.unfreeze()
            _saved_thresholds = None

    def describe(self) -> str:
        if not self.applied:
            return f"Python's defaults kept (gc.tune: false), thresholds {self.thresholds}"
        frozen = (f"{self.frozen:,} start-up objects frozen" if self.frozen
                  else "no freeze")
        return (f"{frozen}, thresholds {self.thresholds} (Python's default generation 0: "
                f"{PYTHON_GEN0_THRESHOLD})")


def apply_gc_policy(cfg: GcConfig, *, who: str = "gateway") -> GcPolicy:
    """Apply ``cfg`` to this process (call once start-up is complete) and log it once at
    INFO; ``who`` names the process in that line. Never disables the collector."""
    global _holders, _saved_thresholds, _saved_freeze_count
    if not cfg.tune:
        policy = GcPolicy(False, gc.get_threshold(), 0)
        log.info("%s: garbage collector: %s", who, policy.describe())
        return policy
    with _lock:
        if _holders == 0:
            _saved_thresholds = gc.get_threshold()
            _saved_freeze_count = gc.get_freeze_count()
        _holders += 1
        _, gen1, gen2 = gc.get_threshold()
        gc.set_threshold(cfg.gen0_threshold, gen1, gen2)
        frozen = 0
        if cfg.freeze_after_start and _holders == 1:
            # the first holder only: a later gateway in the process would freeze the
            # earlier ones' in-flight objects
            gc.collect(1)  # the young start-up garbage (a full pass costs a big heap 100 ms+)
            before = gc.get_freeze_count()
            gc.freeze()
            frozen = gc.get_freeze_count() - before
        policy = GcPolicy(True, gc.get_threshold(), frozen)
    log.info("%s: garbage collector: %s", who, policy.describe())
    return policy
