"""Where MQ takes a put, followed across the nodes' views (pure).

Why a model of its own rather than the embedded queue manager's resolver: that one
resolves inside one queue manager against its live catalogue and cluster directory
(and may ask a full repository); the check has only the definitions each node
announced, and follows a message from one node's view to the next. The rules are the
same subset (protocol reference §7): a local queue ends the path, an alias queue names
its target, a QREMOTE sends RNAME to RQMNAME, a queue-manager alias renames the target
queue manager, and a queue manager is reached through a transmission queue named after
it, a cluster, or the default transmission queue.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from gateway.runtime.network_check.view import NodeView

__all__ = ["MAX_HOPS", "Ended", "next_hop", "q_mgr_route", "resolve_put"]

#: Definitions one resolution may follow across the network (a loop guard).
MAX_HOPS = 16


@dataclass(frozen=True, slots=True)
class Ended:
    """Where a put ended: on a local queue of ``q_mgr`` (``q_name``), or not (``why``).

    ``unknown`` when the path went into a node that was not read (or has no MQ view):
    nothing can be said beyond it."""

    q_mgr: str = ""
    q_name: str = ""
    why: str = ""
    unknown: bool = False
    #: the definitions followed, for the report
    path: tuple[str, ...] = ()
    #: a cluster queue with several hosts: MQ balances puts between them
    balanced: tuple[str, ...] = ()

    @property
    def arrived(self) -> bool:
        return not self.why and not self.unknown


def next_hop(
    view: NodeView, target: str, _seen: tuple[str, ...] = (), *, aliases: bool = True
) -> tuple[str, str] | None:
    """(the queue manager a message for ``target`` goes to next from ``view``'s, how) or
    None when there is no route: a queue-manager alias (not for a QREMOTE's RQMNAME,
    ``aliases=False``: MQ consults no alias for a remote definition), a transmission
    queue named after it, the cluster, or the default transmission queue. A
    transmission queue is taken to lead to the queue manager it is named after, as the
    channels of this project's networks are defined."""
    mq = view.mq
    if target == view.q_mgr:
        return view.q_mgr, "local"
    if mq is None:
        return None
    alias = mq.remote_queues.get(target)
    if aliases and alias is not None and not alias.rname and target not in _seen:
        if alias.xmitq:
            if alias.xmitq not in mq.xmitq_set:
                return None
            return alias.xmitq, f"qmalias {target} via xmitq {alias.xmitq}"
        if alias.rqmname and alias.rqmname != target:
            inner = next_hop(view, alias.rqmname, (*_seen, target))
            if inner is None:
                return None
            return inner[0], f"qmalias {target} -> {alias.rqmname}, {inner[1]}"
    if target in mq.xmitq_set:
        return target, f"xmitq {target}"
    if target in mq.cluster_q_mgr_set:
        return target, "cluster"
    if mq.default_xmit_q and mq.default_xmit_q in mq.xmitq_set:
        return mq.default_xmit_q, f"defxmitq {mq.default_xmit_q}"
    return None


def q_mgr_route(view: NodeView, target: str, *, aliases: bool = True) -> str:
    """How ``view``'s queue manager reaches queue manager ``target`` ("" when it
    cannot; :func:`next_hop`)."""
    hop = next_hop(view, target, aliases=aliases)
    return "" if hop is None else hop[1]


def resolve_put(views: Mapping[str, NodeView], start: str, q_name: str) -> Ended:
    """Where a put of ``q_name`` on queue manager ``start`` ends (``views`` by queue
    manager)."""
    node, q, target = start, q_name, ""
    path: list[str] = []
    hop: tuple[str, str] | None
    for _ in range(MAX_HOPS):
        view = views.get(node)
        if view is None or view.mq is None:
            return Ended(q_mgr=node, q_name=q, unknown=True, path=tuple(path),
                         why=f"{node} was not read" if view is None
                         else f"{node} does not describe its MQ definitions")
        mq = view.mq
        if target and target != node:
            # a message for queue manager ``target``: alias, then a route to it
            alias = mq.remote_queues.get(target)
            if alias is not None and not alias.rname and alias.rqmname:
                path.append(f"{node}: qmalias {target} -> {alias.rqmname}")
                target = alias.rqmname
                if alias.xmitq and target != node:
                    if alias.xmitq not in mq.xmitq_set:
                        return Ended(why=f"transmission queue {alias.xmitq} is not defined "
                                     f"on {node} (2085)", path=tuple(path))
                    node = alias.xmitq
                continue
            hop = next_hop(view, target, aliases=False)
            if hop is None:
                return Ended(why=f"{node} has no route to queue manager {target} (2087)",
                             path=tuple(path))
            path.append(f"{node}: {hop[1]}")
            node = hop[0]
            continue
        if q in mq.local_set:
            return Ended(q_mgr=node, q_name=q, path=(*path, f"{node}: local {q}"))
        if q in mq.xmitq_set:
            return Ended(why=f"{q} on {node} is a transmission queue", path=tuple(path))
        if q in mq.alias_queues:
            base = mq.alias_queues[q]
            path.append(f"{node}: alias {q} -> {base}")
            if not base:
                return Ended(why=f"alias {q} on {node} has no target (2082)", path=tuple(path))
            q = base
            continue
        remote = mq.remote_queues.get(q)
        if remote is not None:
            if not remote.rname or not remote.rqmname:
                return Ended(why=f"{q} on {node} is a queue-manager alias or has no RQMNAME",
                             path=tuple(path))
            path.append(f"{node}: qremote {q} -> {remote.rname}@{remote.rqmname}")
            if remote.xmitq:
                if remote.xmitq not in mq.xmitq_set:
                    return Ended(why=f"transmission queue {remote.xmitq} of {q} is not "
                                 f"defined on {node} (2085)", path=tuple(path))
                hop = (remote.xmitq, f"xmitq {remote.xmitq}")
            else:
                hop = next_hop(view, remote.rqmname, aliases=False)
            if hop is None:
                return Ended(why=f"{node} has no route to queue manager {remote.rqmname} "
                             f"for {q} (2087)", path=tuple(path))
            node, q, target = hop[0], remote.rname, remote.rqmname
            continue
        hosts = [h for h in mq.cluster_queues.get(q, []) if h != node]
        if hosts:
            if len(hosts) > 1:
                return Ended(why=f"cluster queue {q} has {len(hosts)} hosts ("
                             f"{', '.join(sorted(hosts))}): puts are balanced between them",
                             path=tuple(path), balanced=tuple(sorted(hosts)))
            path.append(f"{node}: cluster queue {q} on {hosts[0]}")
            node = hosts[0]
            continue
        return Ended(why=f"{q} is not defined on {node} (2085)", path=tuple(path))
    return Ended(why=f"more than {MAX_HOPS} definitions followed: a routing loop",
                 path=tuple(path))
