"""The publish/subscribe service's counters (exported as metrics; no per-message logs).

Shared by the stream batches and the sink forwarders: a backout, a move to a backout
queue or a dead-letter counts the same whichever of them made it.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["ServiceCounters"]


@dataclass(slots=True)
class ServiceCounters:
    """Counters exported as metrics (no per-message logging)."""

    batches: int = 0
    messages: int = 0
    backouts: int = 0
    moved_to_backout_queue: int = 0
    dead_lettered: int = 0
    #: Batches backed out because a put to the DLQ or a backout queue failed.
    dead_letter_failures: int = 0
    #: sink deliveries put onto backlog queues
    sink_deliveries: int = 0
    #: sends retried by the sink forwarders (a sink was down)
    sink_retries: int = 0
    #: batches backed out because a sink's backlog queue was full (back-pressure)
    backlog_full: int = 0
