"""Which streams the gateway must support: its own serviced streams, its neighbours'
streams and a migrated legacy broker's streams (pure; reads a loaded configuration and
what is remembered of the neighbours, given by the caller)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from gateway.pubsub.streams import DEFAULT_STREAM

__all__ = ["neighbour_streams", "serviced_streams", "stream_union"]


def neighbour_streams(
    loaded: Any, remembered: Mapping[str, Iterable[str]] | None = None
) -> dict[str, set[str]]:
    """Stream set per neighbour queue manager: as the configuration names them, plus
    ``remembered`` (the common streams of the neighbours in ``neighbours.db``: joined
    with ``mqgw neighbours join``, or whose streams were learnt from their
    StreamSupport publication; see :func:`gateway.runtime.streams.health.remembered_neighbours`).

    The one place that merges neighbours: ``gateway.neighbours`` (a list of objects with
    ``q_mgr`` and optional ``streams``) when the configuration has it. A configured
    neighbour without a stream list contributes the default stream until its streams
    are learnt.
    """
    out: dict[str, set[str]] = {}
    for n in getattr(loaded.gateway, "neighbours", None) or ():
        q_mgr = str(getattr(n, "q_mgr", "")).strip()
        if not q_mgr:
            continue
        streams = getattr(n, "streams", None) or ()
        out.setdefault(q_mgr, {DEFAULT_STREAM}).update(str(s) for s in streams)
    for q_mgr, streams in (remembered or {}).items():
        out.setdefault(q_mgr, {DEFAULT_STREAM}).update(streams)
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
