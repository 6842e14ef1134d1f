"""Queue name resolution inside one queue manager, as a pure function over the catalogue.

MQ resolves (ObjectName, ObjectQMgrName) at every MQOPEN/MQPUT1 and whenever a receiving
channel delivers a message (IBM MQ "Queue name resolution"; protocol reference §7). The
result is either a local queue or (target queue, target queue manager, transmission queue).

Clusters and channels between queue managers plug in through :class:`RemoteDirectory`:
a view of queue managers and cluster queues known beyond this catalogue. Without one,
only explicit definitions (transmission queues, QREMOTE, DEFXMITQ) route off this node.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from gateway.mq.embedded.objects import (
    CLUSTER_TRANSMIT_QUEUE,
    DefBind,
    ObjectCatalogue,
    QType,
    QueueDef,
)
from gateway.wire.reasons import Reason

# MQRC_* codes gateway.wire.reasons does not list (yet); values from cmqc.h.
UNKNOWN_DEF_XMIT_Q = 2197
DEF_XMIT_Q_TYPE_ERROR = 2198
DEF_XMIT_Q_USAGE_ERROR = 2199

#: How many queue-manager alias substitutions one resolution may make (loop guard).
MAX_ALIAS_HOPS = 16


class ResolutionError(Exception):
    """Name resolution failed with an MQRC_* reason (2085, 2087, 2196, 2082, 2001, ...)."""

    def __init__(self, reason: int, message: str) -> None:
        self.reason = int(reason)
        super().__init__(message)


@dataclass(slots=True, frozen=True)
class ClusterQueue:
    """A cluster queue instance chosen by a :class:`RemoteDirectory`."""

    q_mgr_name: str
    xmit_q_name: str = CLUSTER_TRANSMIT_QUEUE
    #: DEFBIND(NOTFIXED) on the advertised definition (used for BIND_AS_Q_DEF).
    bind_not_fixed: bool = False


class RemoteDirectory(Protocol):
    """What a queue manager knows beyond its own definitions (cluster repository, network).

    Issue 8 implements this for clusters of embedded queue managers.
    """

    def xmit_q_for_q_mgr(self, q_mgr_name: str) -> str | None:
        """The transmission queue reaching ``q_mgr_name`` (a cluster member), or None."""
        ...

    def cluster_queue(self, q_name: str, bind_on_open: bool) -> ClusterQueue | None:
        """The instance of cluster queue ``q_name`` to use, or None when not clustered."""
        ...


def _hop_for(directory: RemoteDirectory | None, q_mgr_name: str) -> str:
    """The cluster member a message for ``q_mgr_name`` is sent to (a cluster queue-manager
    alias is hosted by its gateway); directories without ``hop_for_q_mgr`` route directly."""
    hop = getattr(directory, "hop_for_q_mgr", None)
    if hop is None:
        return q_mgr_name
    found = hop(q_mgr_name)
    return str(found) if found else q_mgr_name


@dataclass(slots=True, frozen=True)
class Resolution:
    """Where a message put through an opened name goes.

    ``xmit_q_name`` is blank for a local queue (``q_name`` is then a local QLOCAL);
    otherwise the message goes on that transmission queue wrapped in an MQXQH naming
    ``q_name`` at ``q_mgr_name``. ``path`` lists the definitions followed, for messages.
    """

    q_name: str
    q_mgr_name: str
    xmit_q_name: str = ""
    path: tuple[str, ...] = field(default=())
    #: The cluster member the message travels to on SYSTEM.CLUSTER.TRANSMIT.QUEUE.
    hop: str = ""
    #: Chosen from a cluster repository (workload balancing applies).
    via_cluster: bool = False
    #: The chosen cluster definition says DEFBIND(NOTFIXED).
    bind_not_fixed: bool = False

    @property
    def is_local(self) -> bool:
        return not self.xmit_q_name


def resolve_queue(
    catalogue: ObjectCatalogue,
    q_name: str,
    q_mgr_name: str = "",
    *,
    directory: RemoteDirectory | None = None,
    bind_on_open: bool = False,
    cluster_lookup: bool = True,
) -> Resolution:
    """Resolve ``q_name`` at ``q_mgr_name`` (blank = this queue manager), per §7.2.

    ``cluster_lookup=False`` resolves a name addressed explicitly to this queue manager
    from local definitions only: a receiving channel does that for a message whose
    transmission header names this queue manager (bound on open), so a bridge does not
    forward it into another cluster (seed, Fig. 2-48).
    """
    local = catalogue.q_mgr_name
    if not q_mgr_name or q_mgr_name == local:
        d = directory if cluster_lookup or q_mgr_name != local else None
        return _resolve_local_name(catalogue, q_name, d, bind_on_open, (q_name,), directory)
    return _resolve_q_mgr(catalogue, q_name, q_mgr_name, directory, (f"{q_name}@{q_mgr_name}",), 0)


def resolve_reply_to(
    catalogue: ObjectCatalogue, reply_to_q: str, reply_to_q_mgr: str
) -> tuple[str, str]:
    """The (ReplyToQ, ReplyToQMgr) the queue manager puts into a message at MQPUT.

    A blank ReplyToQMgr with a reply-to queue alias (a QREMOTE named like ReplyToQ) takes
    the alias's RNAME/RQMNAME; otherwise a blank ReplyToQMgr becomes this queue manager.
    """
    if not reply_to_q:
        return reply_to_q, reply_to_q_mgr
    if reply_to_q_mgr:
        return reply_to_q, reply_to_q_mgr
    d = catalogue.get(reply_to_q)
    if d is not None and d.qtype is QType.REMOTE and d.remote_name:
        return d.remote_name, d.remote_q_mgr_name or catalogue.q_mgr_name
    return reply_to_q, catalogue.q_mgr_name


def _resolve_local_name(
    cat: ObjectCatalogue,
    q_name: str,
    directory: RemoteDirectory | None,
    bind_on_open: bool,
    path: tuple[str, ...],
    routing: RemoteDirectory | None = None,
) -> Resolution:
    """``directory`` finds cluster queues; ``routing`` (default: the same) routes to
    other queue managers named by local remote definitions."""
    if routing is None:
        routing = directory
    local = cat.q_mgr_name
    d = cat.get(q_name)
    if d is None:
        if directory is not None:
            found = directory.cluster_queue(q_name, bind_on_open)
            if found is not None:
                if found.q_mgr_name == local:
                    raise ResolutionError(
                        Reason.UNKNOWN_OBJECT_NAME,
                        f"cluster queue {q_name} resolved to this queue manager, "
                        "which does not define it",
                    )
                xq = _check_xmitq(cat, found.xmit_q_name, Reason.UNKNOWN_XMIT_Q)
                return Resolution(q_name, found.q_mgr_name, xq.name, (*path, "cluster"),
                                  found.q_mgr_name, True, found.bind_not_fixed)
        raise ResolutionError(
            Reason.UNKNOWN_OBJECT_NAME, f"queue {q_name} is not defined on {local}"
        )
    if d.qtype is QType.LOCAL:
        return Resolution(d.name, local, "", path)
    if d.qtype is QType.ALIAS:
        base = cat.get(d.target)
        if base is None:
            if directory is not None and d.target:
                found = directory.cluster_queue(d.target, bind_on_open)
                if found is not None and found.q_mgr_name != local:
                    xq = _check_xmitq(cat, found.xmit_q_name, Reason.UNKNOWN_XMIT_Q)
                    return Resolution(d.target, found.q_mgr_name, xq.name, (*path, d.target),
                                      found.q_mgr_name, True,
                                      d.default_bind is DefBind.NOTFIXED)
            raise ResolutionError(
                Reason.UNKNOWN_ALIAS_BASE_Q,
                f"alias {d.name} names base queue {d.target or '(blank)'}, which is not defined",
            )
        if base.qtype is QType.ALIAS:
            raise ResolutionError(
                Reason.ALIAS_BASE_Q_TYPE_ERROR,
                f"alias {d.name} names another alias {base.name} (alias of alias is not allowed)",
            )
        if base.qtype is QType.LOCAL:
            return Resolution(base.name, local, "", (*path, base.name))
        return _resolve_remote_def(cat, base, routing, (*path, base.name))
    return _resolve_remote_def(cat, d, routing, path)


def _resolve_remote_def(
    cat: ObjectCatalogue,
    d: QueueDef,
    directory: RemoteDirectory | None,
    path: tuple[str, ...],
) -> Resolution:
    """Role 1 of a QREMOTE: the local definition of a remote queue."""
    local = cat.q_mgr_name
    if not d.remote_name:
        raise ResolutionError(
            Reason.UNKNOWN_REMOTE_Q_MGR,
            f"{d.name} is a queue-manager alias (blank RNAME) and cannot be opened as a queue",
        )
    if not d.remote_q_mgr_name or d.remote_q_mgr_name == local:
        raise ResolutionError(
            Reason.UNKNOWN_REMOTE_Q_MGR,
            f"remote queue {d.name} has RQMNAME {d.remote_q_mgr_name or '(blank)'}: "
            "it must name another queue manager",
        )
    if d.xmit_q_name:
        xq = _check_xmitq(cat, d.xmit_q_name, Reason.UNKNOWN_XMIT_Q)
        return Resolution(d.remote_name, d.remote_q_mgr_name, xq.name, path)
    # §7.1 role 1: "when a remote definition exists no alias definitions are consulted":
    # a transmission queue named RQMNAME, a cluster route, DEFXMITQ, else 2087 (never a
    # queue-manager alias named RQMNAME, which would re-route the definition's target)
    return _route_without_alias(cat, d.remote_name, d.remote_q_mgr_name, directory, path,
                                d.name)


def _resolve_q_mgr(
    cat: ObjectCatalogue,
    q_name: str,
    q_mgr_name: str,
    directory: RemoteDirectory | None,
    path: tuple[str, ...],
    hops: int,
) -> Resolution:
    """§7.2 step 2: a message for ``q_name`` at another queue manager ``q_mgr_name``."""
    local = cat.q_mgr_name
    if hops > MAX_ALIAS_HOPS:
        raise ResolutionError(
            Reason.UNKNOWN_REMOTE_Q_MGR, f"queue-manager alias loop resolving {q_mgr_name}"
        )
    d = cat.get(q_mgr_name)
    if d is not None and d.qtype is QType.REMOTE:
        if d.remote_name:
            raise ResolutionError(
                Reason.UNKNOWN_REMOTE_Q_MGR,
                f"{q_mgr_name} is a remote queue definition with RNAME({d.remote_name}), "
                "not a queue-manager alias",
            )
        target_qm = d.remote_q_mgr_name
        new_path = (*path, f"qmalias {q_mgr_name}->{target_qm or '(cluster)'}")
        if not target_qm:
            # ANY.CLUSTER: the queue is looked up in the cluster.
            found = directory.cluster_queue(q_name, False) if directory is not None else None
            if found is None:
                raise ResolutionError(
                    Reason.UNKNOWN_REMOTE_Q_MGR,
                    f"queue-manager alias {q_mgr_name} has a blank RQMNAME and {q_name} "
                    "is not a known cluster queue",
                )
            if found.q_mgr_name == local:
                return _resolve_local_name(cat, q_name, directory, False, new_path)
            xq_name = d.xmit_q_name or found.xmit_q_name
            xq = _check_xmitq(cat, xq_name, Reason.UNKNOWN_XMIT_Q)
            return Resolution(q_name, found.q_mgr_name, xq.name, new_path,
                              found.q_mgr_name, True, found.bind_not_fixed)
        if target_qm == local:
            return _resolve_local_name(cat, q_name, directory, False, new_path)
        if d.xmit_q_name:
            xq = _check_xmitq(cat, d.xmit_q_name, Reason.UNKNOWN_XMIT_Q)
            return Resolution(q_name, target_qm, xq.name, new_path)
        if target_qm == q_mgr_name:
            return _route_without_alias(cat, q_name, target_qm, directory, new_path)
        return _resolve_q_mgr(cat, q_name, target_qm, directory, new_path, hops + 1)
    return _route_without_alias(cat, q_name, q_mgr_name, directory, path)


def _route_without_alias(
    cat: ObjectCatalogue,
    q_name: str,
    q_mgr_name: str,
    directory: RemoteDirectory | None,
    path: tuple[str, ...],
    remote_def: str = "",
) -> Resolution:
    """Step 2 (b)-(e): xmitq named after the QM, cluster, DEFXMITQ, else 2087.
    ``remote_def``: the remote queue definition being resolved (role 1), for the error."""
    d = cat.get(q_mgr_name)
    if d is not None and d.qtype is QType.LOCAL:
        xq = _check_xmitq(cat, d.name, Reason.UNKNOWN_XMIT_Q)
        return Resolution(q_name, q_mgr_name, xq.name, (*path, f"xmitq {xq.name}"))
    if d is not None and d.qtype is QType.ALIAS:
        raise ResolutionError(
            Reason.UNKNOWN_REMOTE_Q_MGR,
            f"{q_mgr_name} is an alias queue, not a queue manager or transmission queue",
        )
    if directory is not None:
        xq_name = directory.xmit_q_for_q_mgr(q_mgr_name)
        if xq_name:
            xq = _check_xmitq(cat, xq_name, Reason.UNKNOWN_XMIT_Q)
            return Resolution(q_name, q_mgr_name, xq.name, (*path, f"cluster {xq.name}"),
                              _hop_for(directory, q_mgr_name))
    if cat.qmgr.default_xmit_q_name:
        xq = _check_xmitq(cat, cat.qmgr.default_xmit_q_name, UNKNOWN_DEF_XMIT_Q)
        return Resolution(q_name, q_mgr_name, xq.name, (*path, f"defxmitq {xq.name}"))
    raise ResolutionError(
        Reason.UNKNOWN_REMOTE_Q_MGR,
        f"no route to queue manager {q_mgr_name} for remote queue {remote_def}: no "
        f"transmission queue named {q_mgr_name}, no cluster route and no DEFXMITQ on "
        f"{cat.q_mgr_name} (a remote definition does not use queue-manager aliases)"
        if remote_def else
        f"no route to queue manager {q_mgr_name}: no queue-manager alias, no transmission "
        f"queue named {q_mgr_name}, no cluster route and no DEFXMITQ on {cat.q_mgr_name}",
    )


def _check_xmitq(cat: ObjectCatalogue, name: str, unknown_reason: int) -> QueueDef:
    default = unknown_reason == UNKNOWN_DEF_XMIT_Q
    xq = cat.get(name)
    if xq is None:
        raise ResolutionError(unknown_reason, f"transmission queue {name} is not defined")
    if xq.qtype is not QType.LOCAL:
        raise ResolutionError(
            DEF_XMIT_Q_TYPE_ERROR if default else Reason.XMIT_Q_TYPE_ERROR,
            f"transmission queue {name} is a {xq.qtype.mqsc}, not a QLOCAL",
        )
    if not xq.is_xmitq:
        raise ResolutionError(
            DEF_XMIT_Q_USAGE_ERROR if default else Reason.XMIT_Q_USAGE_ERROR,
            f"queue {name} is not a transmission queue (USAGE(NORMAL))",
        )
    return xq
