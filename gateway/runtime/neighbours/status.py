"""Each neighbour's status as ``mqgw neighbours list --json``, ``/healthz`` and
``/metrics`` show it: one home, so the three always agree."""

from __future__ import annotations

from typing import Any

from gateway.runtime.neighbours.state import NeighbourState

__all__ = ["neighbour_status"]


def neighbour_status(state: NeighbourState, now: float) -> list[dict[str, Any]]:
    """One dict per neighbour: state, kind, role, when last heard (epoch seconds or
    None) and how long ago, common streams, proxy subscriptions, refusal, last error,
    the proxy RegSubs it refused (reason, seconds until sent again)."""
    proxies: dict[str, int] = {}
    refused: dict[str, list[dict[str, Any]]] = {}
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
            "kind": str(row.kind),
            "role": str(row.role),
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
