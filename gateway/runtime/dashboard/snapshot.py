"""One picture of the running gateway for the dashboard (``GET /dashboard/api/snapshot``
and each server-sent event): pydantic models at the API boundary, built from the live
state the ``/metrics`` collectors and ``/healthz`` read (the stream report, the
neighbour status, the plugin host's and broker service's counters, the request/reply
service), never from a second scan of the queue manager.

Why a class holding the live objects rather than a function of the app: the rates need
a memory (a sliding window of counters), and the HTTP server needs one object to ask.
Reading costs no I/O on the embedded queue manager (depths are in memory, the stream
report is the housekeeping task's last sample); on IBM MQ the depths are the last sample.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import Any, Literal

from pydantic import BaseModel, Field

from gateway import __version__
from gateway.plugin_api import DescribesRoutes, ReportsStats
from gateway.runtime.dashboard.rates import RateWindow
from gateway.runtime.neighbours.links import NeighbourLinks
from gateway.runtime.neighbours.status import neighbour_status
from gateway.runtime.network_check.check import NetworkReport
from gateway.runtime.plugin_host import PluginHost
from gateway.runtime.pubsub_service import BrokerService
from gateway.runtime.request_reply.service import RequestReplyService
from gateway.runtime.streams.check import StreamReport
from gateway.wire.reasons import Reason

__all__ = [
    "DashboardSource",
    "DeadLetterCount",
    "Flow",
    "GatewayInfo",
    "NeighbourInfo",
    "NetworkProblemInfo",
    "PluginInfo",
    "RouteInfo",
    "Snapshot",
    "StreamInfo",
    "stream_flow_counts",
]

log = logging.getLogger(__name__)

#: Seconds an encoded snapshot is reused (a little under the event streams' 1 s beat, so
#: each stream's next tick gets a fresh one).
SNAPSHOT_CACHE_S = 0.9

Direction = Literal["in", "out"]


class GatewayInfo(BaseModel):
    gateway_id: str
    q_mgr: str
    version: str
    started_at: float
    uptime_s: float
    #: "ok" or "degraded" (as /healthz says)
    health: str
    broker_serving: bool
    problems: list[str] = Field(default_factory=list)


class NeighbourInfo(BaseModel):
    q_mgr: str
    #: the link's state word (active, joining, refused, ...)
    state: str
    active: bool
    kind: str
    role: str
    last_heard_age_s: float | None
    streams: list[str]
    proxy_subscriptions: int
    last_error: str | None


class Flow(BaseModel):
    """One plugin route touching a stream: ``out`` the stream feeds ``target``, ``in``
    ``target`` feeds the stream."""

    plugin: str
    #: the plugin's type (kafka, mqtt, memory, ...)
    kind: str
    direction: Direction
    target: str


class StreamInfo(BaseModel):
    name: str
    serviced: bool
    queue_exists: bool
    depth: int
    oldest_age_s: float | None
    #: publications for this stream on the dead-letter queue (reason 2085)
    dead_lettered: int
    #: who needs the stream: "gateway", "neighbour <QM>", "migration <QM>"
    wanted_by: list[str]
    #: neighbours that support it
    neighbours: list[str]
    #: publications per second over the last few seconds, brought in by plugins / sent out
    rate_in: float
    rate_out: float
    total_in: int
    total_out: int
    flows: list[Flow]
    problems: list[str]


class RouteInfo(BaseModel):
    name: str
    #: "requester" (plugin → MQ service) or "service" (MQ requester → plugin)
    side: str
    plugin: str
    #: the requests' origin and where they go, as configured
    source: str
    destination: str
    in_flight: int
    events: dict[str, int]


class DeadLetterCount(BaseModel):
    #: who dead-lettered: "broker", "plugin <name>" (its backlog), "inbound <name>"
    source: str
    reason: str
    count: int


class PluginInfo(BaseModel):
    name: str
    kind: str
    healthy: bool
    #: "healthy", "down" (its target refuses retriably) or "unhealthy"
    status: str
    stats: dict[str, int]


class NetworkProblemInfo(BaseModel):
    """A problem of the network check this gateway sees on its own (its definitions and
    links; docs/scaling.md "Checking the network")."""

    code: str
    subject: str
    text: str


class Snapshot(BaseModel):
    generated_at: float
    gateway: GatewayInfo
    neighbours: list[NeighbourInfo]
    streams: list[StreamInfo]
    routes: list[RouteInfo]
    dead_letter_queue: str
    dead_letter_depth: int | None
    dead_letters: list[DeadLetterCount]
    plugins: list[PluginInfo]
    #: the network check of this gateway's neighbourhood (at most MAX_NETWORK_PROBLEMS)
    network_problems: list[NetworkProblemInfo] = Field(default_factory=list)
    #: how many there were in all (more than the list holds: the rest are left out)
    network_problem_count: int = 0


#: Network problems a snapshot carries (the rest are counted: `mqgw network check` lists
#: them all).
MAX_NETWORK_PROBLEMS = 50


def stream_flow_counts(host: PluginHost) -> dict[tuple[str, str, Direction], int]:
    """(stream, plugin instance, direction) → publications: ``in`` committed into MQ by
    the instance, ``out`` acknowledged by its target (``mqgw_messages_in`` /
    ``mqgw_messages_out``)."""
    out: dict[tuple[str, str, Direction], int] = {}
    for name, sc in host.sink_counters.items():
        for stream, n in sc.per_stream.items():
            out[(stream, name, "out")] = n
    for name, ctx in host.contexts.items():
        for stream, n in ctx.publisher.counters.per_stream.items():
            out[(stream, name, "in")] = n
    return out


def _reason_name(code: int) -> str:
    try:
        return f"{code} {Reason(code).name}"
    except ValueError:
        return str(code)


class DashboardSource:
    """Builds :class:`Snapshot` values from a running gateway's live objects."""

    def __init__(
        self,
        *,
        gateway_id: str,
        q_mgr: str,
        plugin_kinds: Mapping[str, str],
        service: BrokerService,
        host: PluginHost,
        health: Callable[[], tuple[bool, dict[str, object]]],
        depths: Callable[[], dict[str, int]],
        stream_report: Callable[[], StreamReport | None],
        neighbours: NeighbourLinks | None = None,
        request_reply: Callable[[], RequestReplyService | None] = lambda: None,
        dead_letter_queue: str = "SYSTEM.DEAD.LETTER.QUEUE",
        network_report: Callable[[], NetworkReport | None] = lambda: None,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
        cache_s: float = SNAPSHOT_CACHE_S,
    ) -> None:
        self.gateway_id = gateway_id
        self.q_mgr = q_mgr
        self.plugin_kinds = dict(plugin_kinds)
        self.service = service
        self.host = host
        self.health = health
        self.depths = depths
        self.stream_report = stream_report
        self.neighbours = neighbours
        self.request_reply = request_reply
        self.dead_letter_queue = dead_letter_queue
        self.network_report = network_report
        self.clock = clock
        self.monotonic = monotonic
        self.started_at = clock()
        self.rates: RateWindow[tuple[str, str, Direction]] = RateWindow()
        self.cache_s = cache_s
        #: (monotonic time built, encoded snapshot): shared by every viewer
        self._cached: tuple[float, bytes] | None = None
        #: snapshots built so far (the tests count them)
        self.builds = 0

    # ------------------------------------------------------------------ parts -------

    def _gateway(self, now: float) -> GatewayInfo:
        ok, detail = self.health()
        report = self.stream_report()
        problems = list(report.problems) if report is not None else []
        plugins = detail.get("plugins") or {}
        if isinstance(plugins, dict):
            problems += [f"plugin {n} is not healthy" for n, h in plugins.items() if not h]
        return GatewayInfo(
            gateway_id=self.gateway_id,
            q_mgr=self.q_mgr,
            version=__version__,
            started_at=self.started_at,
            uptime_s=round(max(0.0, now - self.started_at), 1),
            health="ok" if ok else "degraded",
            broker_serving=bool(detail.get("broker_serving")),
            problems=problems,
        )

    def _neighbours(self, now: float) -> list[NeighbourInfo]:
        if self.neighbours is None:
            return []
        try:
            items = neighbour_status(self.neighbours.state, now)
        except Exception:  # the snapshot must not fail because the database is busy
            log.debug("neighbour status unavailable", exc_info=True)
            return []
        return [
            NeighbourInfo(
                q_mgr=i["q_mgr"],
                state=i["state"],
                active=i["state"] == "active",
                kind=i["kind"],
                role=i["role"],
                last_heard_age_s=i["last_heard_age"],
                streams=list(i["common_streams"]),
                proxy_subscriptions=i["proxy_subscriptions"],
                last_error=i["last_error"],
            )
            for i in items
        ]

    def _flows(self) -> dict[str, list[Flow]]:
        out: dict[str, list[Flow]] = {}
        for name, inst in self.host.instances.items():
            if not isinstance(inst, DescribesRoutes):
                continue
            try:
                targets = inst.route_targets()
            except Exception:  # one plugin's answer must not break the picture
                log.debug("routes of %s unavailable", name, exc_info=True)
                continue
            for t in targets:
                direction: Direction = "in" if t.direction == "in" else "out"
                out.setdefault(t.stream, []).append(
                    Flow(plugin=name, kind=self.plugin_kinds.get(name, "?"),
                         direction=direction, target=t.target)
                )
        return out

    def _streams(self, neighbours: list[NeighbourInfo]) -> list[StreamInfo]:
        counts = stream_flow_counts(self.host)
        self.rates.observe(self.monotonic(), counts)
        flows = self._flows()
        report = self.stream_report()
        facts = {f.stream: f for f in report.streams} if report is not None else {}
        serviced = {q for q, _ in self.service.serviced_queues}
        try:
            depths = self.depths()
        except Exception:  # a snapshot must not fail because one queue cannot be asked
            depths = {}
        names = set(facts) | set(flows) | {s for s, _, _ in counts}
        names |= {q for q in serviced if q.endswith(".STREAM") and "ADMIN" not in q}
        out: list[StreamInfo] = []
        for name in sorted(names):
            f = facts.get(name)
            keys = [k for k in counts if k[0] == name]
            total = {d: sum(counts[k] for k in keys if k[2] == d) for d in ("in", "out")}
            rate = {d: sum(self.rates.rate(k) for k in keys if k[2] == d) for d in ("in", "out")}
            out.append(
                StreamInfo(
                    name=name,
                    serviced=name in serviced,
                    queue_exists=f.queue_exists if f is not None else name in depths,
                    depth=depths.get(name, f.depth if f is not None else 0),
                    oldest_age_s=None if f is None or f.oldest_age_s is None
                    else round(f.oldest_age_s, 1),
                    dead_lettered=f.dead_lettered if f is not None else 0,
                    wanted_by=list(f.wanted_by) if f is not None else [],
                    neighbours=[n.q_mgr for n in neighbours if name in n.streams],
                    rate_in=round(rate["in"], 2),
                    rate_out=round(rate["out"], 2),
                    total_in=total["in"],
                    total_out=total["out"],
                    flows=flows.get(name, []),
                    problems=list(f.problems) if f is not None else [],
                )
            )
        return out

    def _routes(self) -> list[RouteInfo]:
        svc = self.request_reply()
        if svc is None:
            return []
        try:
            open_by_route = svc.store.open_by_route()
        except Exception:  # the snapshot must not fail because the database is busy
            open_by_route = {}
        events: dict[str, dict[str, int]] = {}
        for (route, event), n in svc.events.items():
            events.setdefault(route, {})[event] = n
        out = [
            RouteInfo(name=r.name, side="requester", plugin=r.plugin, source=r.source,
                      destination=r.destination, in_flight=open_by_route.get(r.name, 0),
                      events=events.get(r.name, {}))
            for r in svc.requests.values()
        ]
        out += [
            RouteInfo(name=s.name, side="service", plugin=s.plugin, source=s.queue,
                      destination=s.target, in_flight=open_by_route.get(s.name, 0),
                      events=events.get(s.name, {}))
            for s in svc.services.values()
        ]
        return sorted(out, key=lambda r: r.name)

    def _dead_letters(self) -> list[DeadLetterCount]:
        c = self.service.counters
        forwarders = sorted(self.service.forwarder_counters().items())
        # the service's totals include the sinks' dead letters: each is shown once, by who
        by_sinks = sum(fc.to_dead_letter_queue for _, fc in forwarders)
        by_sinks_aside = sum(fc.to_backout_queue for _, fc in forwarders)
        out = [
            DeadLetterCount(source="broker", reason="undeliverable",
                            count=c.dead_lettered - by_sinks),
            DeadLetterCount(source="broker", reason="backout threshold",
                            count=c.moved_to_backout_queue - by_sinks_aside),
        ]
        for name, fc in forwarders:
            out += [
                DeadLetterCount(source=f"plugin {name}", reason=_reason_name(code), count=n)
                for code, n in sorted(fc.dead_lettered.items())
            ]
        for name, ctx in sorted(self.host.contexts.items()):
            out += [
                DeadLetterCount(source=f"inbound {name}", reason=reason, count=n)
                for reason, n in sorted(ctx.publisher.counters.refused.items())
            ]
        return out

    def _plugins(self) -> list[PluginInfo]:
        healthy = self.host.healthy()
        forwarders = self.service.forwarder_counters()
        out: list[PluginInfo] = []
        for name, inst in sorted(self.host.instances.items()):
            stats: dict[str, int] = {}
            if isinstance(inst, ReportsStats):
                try:
                    stats = {k: int(v) for k, v in inst.stats().items()}
                except Exception:  # a snapshot must not fail because one plugin cannot answer
                    stats = {}
            ok = healthy.get(name, False)
            down = name in forwarders and forwarders[name].down
            out.append(
                PluginInfo(name=name, kind=self.plugin_kinds.get(name, "?"), healthy=ok,
                           status="healthy" if ok and not down else ("down" if down
                                                                     else "unhealthy"),
                           stats=stats)
            )
        return out

    # ------------------------------------------------------------------ whole -------

    def snapshot(self) -> Snapshot:
        now = self.clock()
        neighbours = self._neighbours(now)
        report = self.stream_report()
        dlq = report.dead_letter_queue if report is not None else self.dead_letter_queue
        network = self.network_report()
        depths: dict[str, Any]
        try:
            depths = self.depths()
        except Exception:
            depths = {}
        return Snapshot(
            generated_at=now,
            gateway=self._gateway(now),
            neighbours=neighbours,
            streams=self._streams(neighbours),
            routes=self._routes(),
            dead_letter_queue=dlq,
            dead_letter_depth=depths.get(dlq),
            dead_letters=self._dead_letters(),
            plugins=self._plugins(),
            network_problems=[
                NetworkProblemInfo(code=p.code, subject=p.subject, text=p.text)
                for p in network.problems[:MAX_NETWORK_PROBLEMS]
            ] if network is not None else [],
            network_problem_count=len(network.problems) if network is not None else 0,
        )

    def snapshot_json(self) -> bytes:
        """The encoded snapshot, built at most once per ``cache_s`` and shared by every
        event stream and poll: 16 viewers cost one build a second, not 16, and the rate
        window is sampled at the same pace however many watch."""
        now = self.monotonic()
        cached = self._cached
        if cached is not None and 0 <= now - cached[0] < self.cache_s:
            return cached[1]
        data = self.snapshot().model_dump_json().encode()
        self.builds += 1
        self._cached = (now, data)
        return data
