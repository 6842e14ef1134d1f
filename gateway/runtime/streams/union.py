"""Which streams the gateway must support: its own serviced streams, its neighbours'
streams and a migrated legacy broker's streams (pure; reads a loaded configuration)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from gateway.pubsub.streams import DEFAULT_STREAM

__all__ = ["neighbour_streams", "serviced_streams", "stream_union"]


def neighbour_streams(loaded: Any) -> dict[str, set[str]]:
    """Stream set per neighbour queue manager, as the configuration names them.

    The one place that reads neighbours: ``gateway.neighbours`` (a list of objects with
    ``q_mgr`` and optional ``streams``) when the configuration has it. A neighbour
    without a stream list contributes the default stream only until it has told its
    streams at join (learnt streams are wired in here when neighbour links exist).
    """
    out: dict[str, set[str]] = {}
    for n in getattr(loaded.gateway, "neighbours", None) or ():
        q_mgr = str(getattr(n, "q_mgr", "")).strip()
        if not q_mgr:
            continue
        streams = getattr(n, "streams", None) or ()
        out.setdefault(q_mgr, {DEFAULT_STREAM}).update(str(s) for s in streams)
    return out


def serviced_streams(loaded: Any) -> set[str]:
    """The streams the broker services: ``broker.streams`` plus the default stream."""
    return {DEFAULT_STREAM} | {s.name for s in loaded.gateway.broker.streams}


def stream_union(
    serviced: Iterable[str],
    neighbours: dict[str, set[str]],
    migrated: Iterable[str] = (),
) -> set[str]:
    """Every stream the gateway must have a serviced queue for."""
    out = set(serviced) | set(migrated) | {DEFAULT_STREAM}
    for streams in neighbours.values():
        out |= streams
    return out
