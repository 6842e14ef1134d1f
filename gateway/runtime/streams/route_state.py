"""Whom a node's publishing route of a stream names: the stream's owner, a move's hold,
or nothing readable. Pure: the caller reads the definitions.

Why its own module: both ``mqgw streams move`` (:mod:`gateway.runtime.streams.move_plan`)
and a gateway's start (``sinks: owner``, :mod:`gateway.runtime.streams.sink_ownership`)
read ownership the same way, from MQ routing; the start needs none of the move's
journal.
"""

from __future__ import annotations

import hashlib

from pydantic import BaseModel

__all__ = ["HOLD", "MAX_NAME", "RouteState", "fit_queue_name", "hold_queue_name",
           "route_state"]

#: Prefix of the holding queue a move defines on every node (one per stream).
HOLD = "MQGW.MOVE.HOLD."
#: An MQ object name's longest length.
MAX_NAME = 48


def fit_queue_name(name: str, prefix: str) -> str:
    """``prefix + name`` when it is a valid MQ name length, else a hashed stand-in."""
    if len(prefix) + len(name) <= MAX_NAME:
        return prefix + name
    digest = hashlib.sha256(name.encode("utf-8")).hexdigest()[:16].upper()
    return prefix + digest


def hold_queue_name(stream: str) -> str:
    """The local queue that holds ``stream``'s new publications during a move."""
    return fit_queue_name(stream, HOLD)


class RouteState(BaseModel):
    """What one node's route says (read from its definitions)."""

    q_mgr: str
    #: the queue manager that owns the stream by this node's route; "" when held or unknown
    owner: str = ""
    held: bool = False
    problem: str = ""


def route_state(
    q_mgr: str,
    stream: str,
    route: str,
    alias_target: str | None,
    remote: tuple[str, str] | None,
) -> RouteState:
    """Decide whom ``q_mgr``'s route names. ``alias_target``: TARGET of ``QALIAS(route)``
    (None: no such alias); ``remote``: (RNAME, RQMNAME) of that target when it is a
    QREMOTE (None otherwise)."""
    if alias_target is None:
        return RouteState(q_mgr=q_mgr, problem=f"no QALIAS({route}) on {q_mgr}")
    if alias_target == stream:
        return RouteState(q_mgr=q_mgr, owner=q_mgr)
    if alias_target == hold_queue_name(stream):
        return RouteState(q_mgr=q_mgr, held=True)
    if remote is not None and remote[0] == stream and remote[1]:
        return RouteState(q_mgr=q_mgr, owner=remote[1])
    return RouteState(
        q_mgr=q_mgr,
        problem=f"QALIAS({route}) on {q_mgr} names {alias_target}, which is neither "
        f"{stream} nor a QREMOTE with RNAME({stream})",
    )
