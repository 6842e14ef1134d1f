"""Whether this node's sinks subscribe to a stream configured ``sinks: owner``
(docs/scaling.md, "Moving a stream"). Pure: the caller reads the route.

Why from the route: ownership is what MQ routing says, the stream's publishing route
(``QALIAS(<route>)``) naming the local stream queue, the same reading ``mqgw streams
move`` makes (:func:`gateway.runtime.streams.route_state.route_state`). The owner's sinks
subscribe; a node whose route names another owner does not, and drops the sink
subscriptions its store kept (the move took them to the new owner); while a move holds
the route (or the route cannot be read) nothing is decided: the store is kept as it is,
so a restart in the middle of a move changes nothing the move has done or will do.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from gateway.runtime.streams.route_state import RouteState, route_state

__all__ = [
    "QueueLookup",
    "SinkDecision",
    "SinkGate",
    "SinkRule",
    "read_catalogue_route",
    "sink_rule",
]


class SinkDecision(enum.StrEnum):
    #: this node owns the stream (or ``sinks: always``): subscribe as configured
    SUBSCRIBE = "subscribe"
    #: another node owns it: no sink subscription here, drop the ones kept
    WITHHOLD = "withhold"
    #: a move holds the route, or it cannot be read: keep what the store has
    KEEP = "keep"


@dataclass(frozen=True, slots=True)
class SinkRule:
    decision: SinkDecision
    #: one sentence for the log
    why: str


def sink_rule(state: RouteState, stream: str, route: str) -> SinkRule:
    """What a ``sinks: owner`` stream's sinks do on ``state.q_mgr``, from its route."""
    here = state.q_mgr
    if state.problem:
        return SinkRule(SinkDecision.KEEP, f"ownership of {stream} unknown ({state.problem}): "
                        "sink subscriptions kept as stored, none made")
    if state.held:
        return SinkRule(SinkDecision.KEEP, f"{route} on {here} is held by a move of {stream}: "
                        "sink subscriptions kept as stored, none made")
    if state.owner == here:
        return SinkRule(SinkDecision.SUBSCRIBE, f"{here} owns {stream} ({route} names it "
                        "here): its sinks subscribe")
    return SinkRule(SinkDecision.WITHHOLD, f"{state.owner} owns {stream} ({route} on {here} "
                    f"names it there): no sink subscribes to {stream} here")


#: name -> (type, TARGET, RNAME, RQMNAME) of a queue definition, None when undefined;
#: type is "QALIAS", "QREMOTE", "QLOCAL" or anything else.
QueueLookup = Callable[[str], tuple[str, str, str, str] | None]


def read_catalogue_route(lookup: QueueLookup, q_mgr: str, stream: str, route: str
                         ) -> RouteState:
    """Whom ``q_mgr``'s route of ``stream`` names, from its definitions."""
    alias = lookup(route)
    target = alias[1] if alias is not None and alias[0] == "QALIAS" else None
    remote = None
    if target is not None:
        t = lookup(target)
        if t is not None and t[0] == "QREMOTE":
            remote = (t[2], t[3])
    return route_state(q_mgr, stream, route, target, remote)


class SinkGate:
    """Behind the service's ``sink_gate`` (a sink subscribes while this says
    SUBSCRIBE): per stream, whether a sink subscribes to it here
    now, read from the route at each ask (a plugin that subscribes again after a failed
    start gets today's answer, not the one of the gateway's start). ``routes``: each
    ``sinks: owner`` stream's route; other streams always subscribe. ``report`` is told
    each decision once, and again only when it changes (the operator's log)."""

    def __init__(self, q_mgr: str, routes: Mapping[str, str], lookup: QueueLookup,
                 report: Callable[[str], None]) -> None:
        self.q_mgr = q_mgr
        self.routes = dict(routes)
        self.lookup = lookup
        self.report = report
        self._told: dict[str, SinkDecision] = {}

    def __call__(self, stream: str) -> SinkDecision:
        route = self.routes.get(stream)
        if route is None:
            return SinkDecision.SUBSCRIBE
        rule = sink_rule(read_catalogue_route(self.lookup, self.q_mgr, stream, route),
                         stream, route)
        if self._told.get(stream) is not rule.decision:
            self._told[stream] = rule.decision
            self.report(rule.why)
        return rule.decision
