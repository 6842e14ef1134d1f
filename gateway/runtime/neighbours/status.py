"""Each neighbour's status as ``mqgw neighbours list --json``, ``/healthz`` and
``/metrics`` show it: one home, so the three always agree. :class:`NeighbourStatus` is
the shape of one line of ``list --json`` (docs/reference/json-output.md is generated from
it)."""

from __future__ import annotations

from pydantic import ConfigDict, with_config
from typing_extensions import TypedDict

from gateway.pubsub.neighbours import NeighbourKind, NeighbourRole
from gateway.runtime.neighbours.state import LinkState, NeighbourState

__all__ = ["NeighbourStatus", "RefusedProxy", "neighbour_status"]


@with_config(ConfigDict(use_attribute_docstrings=True))
class RefusedProxy(TypedDict):
    """A proxy subscription the neighbour refused; it is sent again after a backoff."""

    stream: str
    """The stream of the proxy subscription."""
    topic: str
    """Its topic."""
    reason: str
    """Why the neighbour refused it (its reason code and text)."""
    retry_in: float
    """Seconds until it is sent again."""


@with_config(ConfigDict(use_attribute_docstrings=True))
class NeighbourStatus(TypedDict):
    """One neighbour as ``mqgw neighbours list --json`` prints it (and ``/healthz``
    carries it)."""

    q_mgr: str
    """The neighbour's queue manager."""
    state: LinkState
    """``joining`` (join requested, negotiating), ``active`` (answered, no loop),
    ``inactive`` (not heard from, or cleared) or ``refused`` (the join was refused:
    see ``refusal``)."""
    kind: NeighbourKind
    """What the neighbour is: a legacy MQ Publish/Subscribe broker, an MQ V7+ queue
    manager's queued pub/sub, or another gateway."""
    role: NeighbourRole
    """The neighbour's role towards this gateway."""
    last_heard: float | None
    """When the last message from the neighbour arrived (seconds since the epoch);
    null: never."""
    last_heard_age: float | None
    """Seconds since then; null: never heard."""
    common_streams: list[str]
    """The streams both sides support and share, sorted."""
    proxy_subscriptions: int
    """Proxy subscriptions registered at the neighbour (not being withdrawn)."""
    refusal: str
    """Why the link is refused (a loop, no common stream, ...); empty when it is not."""
    last_error: str
    """The last refusal of one of the gateway's commands by the neighbour (reason and
    text); empty when none."""
    refused_proxies: list[RefusedProxy]
    """The proxy subscriptions the neighbour refused."""


def neighbour_status(state: NeighbourState, now: float) -> list[NeighbourStatus]:
    """One dict per neighbour: state, kind, role, when last heard (epoch seconds or
    None) and how long ago, common streams, proxy subscriptions, refusal, last error,
    the proxy RegSubs it refused (reason, seconds until sent again)."""
    proxies: dict[str, int] = {}
    refused: dict[str, list[RefusedProxy]] = {}
    for p in state.proxies():
        if not p.withdrawing:
            proxies[p.q_mgr] = proxies.get(p.q_mgr, 0) + 1
            if p.refused:
                refused.setdefault(p.q_mgr, []).append(
                    {
                        "stream": p.key.stream,
                        "topic": p.key.topic,
                        "reason": p.refused,
                        "retry_in": max(0.0, round(p.retry_at - now, 3)),
                    }
                )
    return [
        {
            "q_mgr": row.q_mgr,
            "state": row.state,
            "kind": row.kind,
            "role": row.role,
            "last_heard": row.last_heard or None,
            "last_heard_age": round(now - row.last_heard, 3) if row.last_heard else None,
            "common_streams": sorted(row.common_streams),
            "proxy_subscriptions": proxies.get(row.q_mgr, 0),
            "refusal": row.refusal,
            "last_error": row.last_error,
            "refused_proxies": refused.get(row.q_mgr, []),
        }
        for row in state.neighbours()
    ]
