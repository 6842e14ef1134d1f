"""A running gateway's :class:`~gateway.runtime.network_check.view.NodeView`: built from
the live objects ``/healthz`` and ``/metrics`` already read (the broker's serviced queues and sink
subscriptions, the neighbour links' state) and, on the embedded queue manager, its
definitions and cluster repository as held in memory — no scan, no MQ traffic, so the
housekeeping task can build it every sample.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from gateway.mq.embedded.objects import QType
from gateway.mq.embedded.repository import QMGR, QUEUE
from gateway.pubsub.streams import ADMIN_STREAM
from gateway.runtime.neighbours.state import NeighbourState
from gateway.runtime.network_check.view import MAX_ITEMS, MQView, NodeView, RemoteQueue

__all__ = ["mq_view", "node_view", "sink_streams"]

_SYSTEM = "SYSTEM."


class _Bounded:
    """Counts what is cut off at MAX_ITEMS (the view then says ``truncated``)."""

    def __init__(self) -> None:
        self.truncated = False

    def take(self, items: Iterable[Any]) -> list[Any]:
        out: list[Any] = []
        for item in items:
            if len(out) >= MAX_ITEMS:
                self.truncated = True
                break
            out.append(item)
        return out


def mq_view(qm: Any, cut: _Bounded | None = None) -> MQView | None:
    """The routing definitions of an embedded queue manager ``qm`` (None for anything
    else: IBM MQ is asked nothing here)."""
    catalogue = getattr(qm, "catalogue", None)
    if catalogue is None:
        return None
    cut = cut or _Bounded()
    defs = sorted(catalogue.queues.values(), key=lambda d: d.name)
    local = [d.name for d in defs
             if d.qtype is QType.LOCAL and not d.is_xmitq and not d.name.startswith(_SYSTEM)]
    xmitqs = [d.name for d in defs if d.is_xmitq and not d.name.startswith(_SYSTEM)]
    remote = [(d.name, RemoteQueue(rname=d.remote_name, rqmname=d.remote_q_mgr_name,
                                   xmitq=d.xmit_q_name))
              for d in defs if d.qtype is QType.REMOTE]
    alias = [(d.name, d.target) for d in defs
             if d.qtype is QType.ALIAS and not d.name.startswith(_SYSTEM)]
    hosts: dict[str, list[str]] = {}
    members: set[str] = set()
    directory = getattr(qm, "remote_directory", None)
    repository = getattr(directory, "repository", None)
    if repository is not None:
        for r in repository.live(getattr(directory, "clusters", None)):
            member = r.kind == QMGR and r.name != qm.name
            if member or (r.kind == QUEUE and r.q_mgr_alias and r.q_mgr != qm.name):
                members.add(r.name)
            elif r.kind == QUEUE and r.q_mgr != qm.name:
                hosts.setdefault(r.name, [])
                if r.q_mgr not in hosts[r.name]:
                    hosts[r.name].append(r.q_mgr)
    return MQView(
        local_queues=cut.take(local),
        transmission_queues=cut.take(xmitqs),
        remote_queues=dict(cut.take(remote)),
        alias_queues=dict(cut.take(alias)),
        default_xmit_q=catalogue.qmgr.default_xmit_q_name,
        cluster_queues={k: sorted(v)[:64] for k, v in cut.take(sorted(hosts.items()))},
        cluster_q_mgrs=cut.take(sorted(members)),
    )


def sink_streams(subscriptions: Iterable[Any]) -> dict[str, list[str]]:
    """stream -> the sink instances subscribed to it, from the engine's subscriptions
    (one pass; the caller redoes it only when their revision changed)."""
    sinks: dict[str, set[str]] = {}
    for sub in subscriptions:
        if sub.destination.sink:
            sinks.setdefault(sub.stream, set()).add(sub.destination.sink)
    return {s: sorted(v) for s, v in sinks.items()}


def node_view(
    *,
    q_mgr: str,
    gateway_id: str,
    serviced: Iterable[str],
    sinks: Mapping[str, Sequence[str]],
    neighbours: NeighbourState | None,
    qm: Any,
) -> NodeView:
    """This gateway as the network check sees it (``sinks``: :func:`sink_streams`)."""
    cut = _Bounded()
    rows = neighbours.neighbours() if neighbours is not None else []
    return NodeView(
        q_mgr=q_mgr,
        gateway=gateway_id,
        serviced=cut.take(sorted(s for s in serviced if s != ADMIN_STREAM)),
        sinks={s: list(v)[:256] for s, v in cut.take(sorted(sinks.items()))},
        neighbours=cut.take(
            {"q_mgr": r.q_mgr, "kind": str(r.kind), "role": str(r.role), "state": str(r.state),
             "streams": sorted(r.common_streams)}
            for r in rows
        ),
        mq=mq_view(qm, cut),
        truncated=cut.truncated,
    )
