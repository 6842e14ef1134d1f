"""Prometheus metrics and ``/metrics`` + ``/healthz`` (+ ``/network``) over HTTP.

Why a collector rather than counters bumped per message: the broker service, the plugin
host and the publishers already keep plain integer counters; reading them at scrape
time costs nothing on the message path. Only the end-to-end latency histogram is
observed per delivery (one bucket increment). The HTTP endpoint is a small asyncio
server (no thread), bound to 127.0.0.1 by default, with optional TLS and a bearer token
or basic auth for ``/metrics``, ``/network`` and the dashboard (docs/security.md "The
metrics and admin endpoint").
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import hmac
import ipaddress
import json
import logging
import ssl
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from gateway.plugin_api import Envelope, ReportsStats
from gateway.pubsub.authorisation import Authoriser, Refusal
from gateway.runtime.dashboard.assets import PAGE, asset
from gateway.runtime.dashboard.snapshot import DashboardSource, stream_flow_counts
from gateway.runtime.instance_lock import InstanceRecord
from gateway.runtime.neighbours.links import NeighbourLinks
from gateway.runtime.neighbours.status import neighbour_status
from gateway.runtime.network_check.check import OWN_VIEW_CODES, NetworkReport
from gateway.runtime.network_check.view import NETWORK_PATH, NodeView
from gateway.runtime.plugin_host import PluginHost
from gateway.runtime.pubsub_service import BrokerService
from gateway.runtime.pubsub_service.sink_forwarder import OWN_DEAD_LETTER_REASONS
from gateway.runtime.request_reply.service import RequestReplyService
from gateway.runtime.streams.check import StreamReport
from gateway.runtime.streams.health import stream_metric_families
from gateway.secrets import SecretError
from gateway.wire.put_time import put_time_ms

if TYPE_CHECKING:
    from gateway.runtime.config import MetricsAuthConfig, MetricsTLSConfig

log = logging.getLogger(__name__)

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


def put_timestamp(put_date: str, put_time: str) -> float | None:
    """Seconds since the epoch of an MQMD PutDate + PutTime (see gateway.wire.put_time)."""
    ms = put_time_ms(put_date, put_time)
    return None if ms is None else ms / 1000


class Exposition(Protocol):
    """What ``/metrics`` serves: the active gateway's metrics, or a standby's."""

    def exposition(self) -> bytes: ...


class GatewayMetrics:
    """Metrics of one running gateway (its own registry: tests run several at once)."""

    def __init__(
        self,
        service: BrokerService,
        host: PluginHost,
        queue_depths: Callable[[], dict[str, int]],
        start_errors: Callable[[], int] = lambda: 0,
        stream_report: Callable[[], StreamReport | None] = lambda: None,
        neighbours: NeighbourLinks | None = None,
        request_reply: Callable[[], RequestReplyService | None] = lambda: None,
        authoriser: Authoriser | None = None,
        network_report: Callable[[], NetworkReport | None] = lambda: None,
        instance: InstanceRecord | None = None,
    ) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.latency = Histogram(
            "mqgw_end_to_end_latency_seconds",
            "From the MQ put of a publication to its acknowledgement by a plugin's target",
            ["plugin"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.registry.register(_Collector(service, host, queue_depths, start_errors))
        self.registry.register(_StreamCollector(stream_report))
        if neighbours is not None:
            self.registry.register(NeighbourCollector(neighbours))
        self.registry.register(RequestReplyCollector(request_reply))
        self.registry.register(AuthorisationCollector(authoriser, host))
        self.registry.register(NetworkCollector(network_report))
        self.registry.register(
            InstanceCollector(instance or InstanceRecord.of_this_process(False), active=True)
        )

    def observe(self, plugin: str, envelopes: Sequence[Envelope]) -> None:
        """Record end-to-end latency of acknowledged envelopes (sink observer)."""
        now = time.time()
        child = self.latency.labels(plugin)
        for e in envelopes:
            if e.from_retained_store:
                continue  # a retained re-send is not a new publication's latency
            if e.put_time_ms is not None:
                child.observe(max(0.0, now - e.put_time_ms / 1000))

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


class _Collector(Collector):
    def __init__(
        self,
        service: BrokerService,
        host: PluginHost,
        queue_depths: Callable[[], dict[str, int]],
        start_errors: Callable[[], int],
    ) -> None:
        self.service = service
        self.host = host
        self.queue_depths = queue_depths
        self.start_errors = start_errors

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        c = self.service.counters
        out = CounterMetricFamily(
            "mqgw_messages_out",
            "Publications handed to a plugin and acknowledged by its target",
            labels=["stream", "plugin"],
        )
        inbound = CounterMetricFamily(
            "mqgw_messages_in",
            "Publications a plugin brought into MQ (committed)",
            labels=["stream", "plugin"],
        )
        errors = CounterMetricFamily(
            "mqgw_errors", "Failures by component and kind", labels=["component", "kind"]
        )
        errors.add_metric(["broker", "batch_backout"], c.backouts)
        errors.add_metric(["broker", "sink_retry"], c.sink_retries)
        errors.add_metric(["broker", "dead_letter_failure"], c.dead_letter_failures)
        errors.add_metric(["plugins", "start_error"], self.start_errors())
        refused = CounterMetricFamily(
            "mqgw_inbound_refused",
            "Inbound publications MQ refused for good, by MQ reason (the plugin "
            "dead-letters them and moves on)",
            labels=["plugin", "reason"],
        )
        up = GaugeMetricFamily(
            "mqgw_plugin_up", "1 while a plugin instance is healthy", labels=["plugin"]
        )
        for name, healthy in self.host.healthy().items():
            up.add_metric([name], 1.0 if healthy else 0.0)
        for (stream, name, direction), n in stream_flow_counts(self.host).items():
            (out if direction == "out" else inbound).add_metric([stream, name], n)
        for name, sc in self.host.sink_counters.items():
            errors.add_metric([name, "send_failure"], sc.failures)
            errors.add_metric([name, "retained_skipped"], sc.retained_skipped)
        for name, ctx in self.host.contexts.items():
            pc = ctx.publisher.counters
            errors.add_metric([name, "publish_failure"], pc.failures)
            for reason, n in pc.refused.items():
                refused.add_metric([name, reason], n)
        stats = GaugeMetricFamily(
            "mqgw_plugin_stat",
            "A plugin instance's own counters and states (its stats(), e.g. the Kafka "
            "source's inbound_commit_failures)",
            labels=["plugin", "stat"],
        )
        for name, inst in self.host.instances.items():
            if not isinstance(inst, ReportsStats):
                continue
            try:
                for stat, n in inst.stats().items():
                    stats.add_metric([name, stat], float(n))
            except Exception:  # a scrape must not fail because one plugin cannot answer
                log.debug("stats of %s unavailable", name, exc_info=True)
        handled = CounterMetricFamily(
            "mqgw_broker_messages", "Messages got from serviced queues and committed"
        )
        handled.add_metric([], c.messages)
        dead = CounterMetricFamily(
            "mqgw_dead_lettered",
            "Messages put to the dead-letter or a backout queue",
            labels=["why"],
        )
        dead.add_metric(["undeliverable"], c.dead_lettered)
        dead.add_metric(["backout_threshold"], c.moved_to_backout_queue)
        engine = self.service.engine
        suspended = GaugeMetricFamily(
            "mqgw_suspended_subscriptions",
            "Subscriptions suspended because puts to their queue kept failing",
        )
        suspended.add_metric([], engine.suspended_subscriptions)
        errors.add_metric(["broker", "subscription_suspended"], engine.suspensions)
        errors.add_metric(
            ["broker", "broker_queue_subscription_removed"],
            engine.removed_broker_queue_subscriptions,
        )
        sink_dead = CounterMetricFamily(
            "mqgw_sink_dead_lettered",
            "Backlog messages a sink's forwarder moved to the dead-letter queue, by MQ reason "
            "(a refusal by the target for good, an undecodable or poison backlog message)",
            labels=["plugin", "reason"],
        )
        sink_down = GaugeMetricFamily(
            "mqgw_sink_down", "1 while a sink's target refuses retriably (down)", labels=["plugin"]
        )
        for name, fc in self.service.forwarder_counters().items():
            # the forwarder's own reasons from the start; a target's refusals once seen
            by_reason = dict.fromkeys(map(int, OWN_DEAD_LETTER_REASONS), 0)
            by_reason.update(fc.dead_lettered)
            for code, n in sorted(by_reason.items()):
                sink_dead.add_metric([name, str(code)], n)
            sink_down.add_metric([name], fc.down)
            errors.add_metric([name, "sink_retry"], fc.retries)
            errors.add_metric([name, "sink_backout"], fc.backouts)
        connect_failed = CounterMetricFamily(
            "mqgw_mq_connect_failures",
            "Failed connection attempts to an IBM MQ queue manager, by MQ reason (2035 not "
            "authorized, 2393 TLS set-up, 2059 not available, ...; docs/security.md)",
            labels=["reason"],
        )
        for reason, n in sorted(getattr(self.service.qm, "connect_failures", {}).items()):
            connect_failed.add_metric([str(reason)], n)
        depth = GaugeMetricFamily("mqgw_queue_depth", "Current depth of a queue", labels=["queue"])
        try:
            for q, n in self.queue_depths().items():
                depth.add_metric([q], n)
        except Exception:  # a scrape must not fail because one queue cannot be asked
            log.debug("queue depth unavailable", exc_info=True)
        yield from (
            out, inbound, refused, handled, errors, dead, sink_dead, sink_down, suspended, depth,
            up, stats, connect_failed,
        )


class _StreamCollector(Collector):
    """The stream union's facts (gateway.runtime.streams.health) as gauges."""

    def __init__(self, report: Callable[[], StreamReport | None]) -> None:
        self.report = report

    def collect(self) -> Iterator[GaugeMetricFamily]:
        yield from stream_metric_families(self.report())


#: The ``result`` label of ``mqgw_neighbour_commands_total`` (LinkCounters.commands).
COMMAND_RESULTS = ("sent", "put_failed", "ok", "failed")


class NeighbourCollector(Collector):
    """Per neighbour: active, seconds since last heard, proxy subscriptions registered
    there, commands sent and answered, messages refused (docs/neighbours.md)."""

    def __init__(self, links: NeighbourLinks, clock: Callable[[], float] = time.time) -> None:
        self.links = links
        self.clock = clock

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        active = GaugeMetricFamily(
            "mqgw_neighbour_active",
            "1 while the neighbour is active (answered, no loop), 0 otherwise",
            labels=["neighbour"],
        )
        heard = GaugeMetricFamily(
            "mqgw_neighbour_last_heard_seconds",
            "Seconds since the last message from the neighbour (absent: never heard)",
            labels=["neighbour"],
        )
        proxies = GaugeMetricFamily(
            "mqgw_neighbour_proxy_subscriptions",
            "Proxy subscriptions registered at the neighbour",
            labels=["neighbour"],
        )
        commands = CounterMetricFamily(
            "mqgw_neighbour_commands",
            "Commands put to the neighbour (sent, put_failed) and its answers (ok, failed)",
            labels=["neighbour", "result"],
        )
        names: list[str] = []
        try:
            for item in neighbour_status(self.links.state, self.clock()):
                q = item["q_mgr"]
                names.append(q)
                active.add_metric([q], 1.0 if item["state"] == "active" else 0.0)
                if item["last_heard_age"] is not None:
                    heard.add_metric([q], item["last_heard_age"])
                proxies.add_metric([q], item["proxy_subscriptions"])
        except Exception:  # a scrape must not fail because the database is busy
            log.debug("neighbour status unavailable", exc_info=True)
        known = Counter({(q, result): 0 for q in names for result in COMMAND_RESULTS})
        known.update(self.links.counters.commands)
        for (q, result), n in sorted(known.items()):
            commands.add_metric([q, result], n)
        refused = CounterMetricFamily(
            "mqgw_neighbour_refused_messages",
            "Messages refused from the inter-broker queue (dead-lettered; backed_out, "
            "discarded: set aside at its BOTHRESH) and announced streams not taken, per "
            "kind; neighbour \"\" when they name none (docs/neighbours.md)",
            labels=["neighbour", "kind"],
        )
        for (q, kind), n in sorted(self.links.counters.refused.items()):
            refused.add_metric([q, kind], n)
        yield from (active, heard, proxies, commands, refused)


class RequestReplyCollector(Collector):
    """Request/reply events per route (requests_sent, replies_delivered,
    error_replies.<kind>, duplicates_filtered, ...) and open correlation entries per side
    (docs/request-reply.md "Metrics")."""

    def __init__(self, service: Callable[[], RequestReplyService | None]) -> None:
        self.service = service

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        svc = self.service()
        if svc is None:
            return
        events = CounterMetricFamily(
            "mqgw_request_reply",
            "Request/reply events per route (docs/request-reply.md)",
            labels=["route", "event"],
        )
        totals = Counter({key: 0 for key in _known_request_reply_events(svc)})
        totals.update(svc.events)
        for (route, event), n in sorted(totals.items()):
            events.add_metric([route, event], n)
        open_entries = GaugeMetricFamily(
            "mqgw_request_reply_open",
            "Correlation entries waiting for a reply, per side (requester, service)",
            labels=["side"],
        )
        try:
            counts = svc.store.counts()
        except Exception:  # a scrape must not fail because the database is busy
            log.debug("correlation store counts unavailable", exc_info=True)
            counts = {}
        for name, n in sorted(counts.items()):
            if name.endswith("_open"):
                open_entries.add_metric([name.removesuffix("_open")], n)
        yield from (events, open_entries)


#: Events every requester route / service route counts, shown as 0 from the start so a
#: dashboard panel or an ``absent()`` alert has a series before the first event.
REQUESTER_EVENTS = (
    "requests_sent", "replies_delivered", "timeouts", "error_replies_undeliverable",
    "replies_unmatched", "replies_late", "duplicates_filtered", "destinations_refused",
)
SERVICE_EVENTS = (
    "service_requests", "service_requests_refused", "service_replies",
    "replies_dead_lettered", "destinations_refused",
)


def _known_request_reply_events(svc: RequestReplyService) -> Iterator[tuple[str, str]]:
    for name in svc.requests:
        yield from ((name, event) for event in REQUESTER_EVENTS)
    for name in svc.services:
        yield from ((name, event) for event in SERVICE_EVENTS)


class NetworkCollector(Collector):
    """``mqgw_network_problems{code}``: the problems the node's check of its own view
    finds (docs/scaling.md "Checking the network"), zero for the other codes that check
    can find; nothing before the first view."""

    def __init__(self, report: Callable[[], NetworkReport | None]) -> None:
        self.report = report

    def collect(self) -> Iterator[GaugeMetricFamily]:
        report = self.report()
        family = GaugeMetricFamily(
            "mqgw_network_problems",
            "Problems of the network check this gateway finds from its own view (its "
            "definitions and links), by code (docs/scaling.md)",
            labels=["code"],
        )
        if report is not None:
            counts = dict.fromkeys(OWN_VIEW_CODES, 0)
            for p in report.problems:
                counts[p.code] = counts.get(p.code, 0) + 1
            for code, n in counts.items():
                family.add_metric([code], n)
        yield family


class InstanceCollector(Collector):
    """``mqgw_instance_active`` (1 active, 0 standby) and since when (docs/operations.md,
    "High availability"): a takeover shows as the series of another host or pid going
    to 1."""

    def __init__(self, record: InstanceRecord, *, active: bool) -> None:
        self.record = record
        self.active = active

    def collect(self) -> Iterator[GaugeMetricFamily]:
        labels = ["host", "pid"]
        values = [self.record.host, str(self.record.pid)]
        active = GaugeMetricFamily(
            "mqgw_instance_active",
            "1 when this instance is the node's active instance (holds the data "
            "directory's lock), 0 while it waits as a standby",
            labels=labels,
        )
        active.add_metric(values, 1 if self.active else 0)
        yield active
        if self.active:
            name, doc = ("mqgw_instance_active_since_seconds",
                         "Unix time this instance became the node's active instance")
        else:
            name, doc = ("mqgw_instance_standby_since_seconds",
                         "Unix time this standby began waiting for the data directory's lock")
        since = GaugeMetricFamily(name, doc, labels=labels)
        since.add_metric(values, self.record.since)
        yield since


class HealthServer:
    """``GET /metrics`` (Prometheus text), ``GET /healthz`` (JSON; 503 when unhealthy),
    with a ``network`` source ``GET /network`` (the node's view for ``mqgw network
    check``: JSON; 503 before the first one) and, with a ``dashboard`` source, the live
    dashboard under ``/dashboard`` (page, static files, JSON snapshot, server-sent
    events; docs/dashboard.md).

    All are read-only: the endpoint changes no state (the admin operations are
    ``mqgw qm`` over a local socket). ``ssl_context`` makes it HTTPS; ``auth`` requires a
    bearer token or basic-auth credentials for ``/metrics``, ``/network`` (it names the
    queue manager's routing definitions) and the dashboard (``protect_metrics``), never
    for ``/healthz``, which liveness probes must reach without credentials.
    """

    def __init__(
        self,
        metrics: Exposition,
        health: Callable[[], tuple[bool, dict[str, object]]],
        host: str = "127.0.0.1",
        port: int = 9464,
        *,
        ssl_context: ssl.SSLContext | None = None,
        auth: MetricsAuthConfig | None = None,
        dashboard: DashboardSource | None = None,
        network: Callable[[], NodeView | None] | None = None,
    ) -> None:
        self.metrics = metrics
        #: the node's network view (None: no /network route)
        self.network = network
        #: the live dashboard's source (None: no /dashboard routes)
        self.dashboard = dashboard
        self._event_streams: set[asyncio.StreamWriter] = set()
        #: connections being served (at most MAX_CONNECTIONS)
        self._connections = 0
        self._closing = asyncio.Event()
        self.health = health
        self.host = host
        self.port = port
        self.ssl_context = ssl_context
        self.auth = auth
        self._server: asyncio.Server | None = None

    @property
    def url(self) -> str:
        scheme = "https" if self.ssl_context is not None else "http"
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{scheme}://{host}:{self.port}"

    async def start(self) -> None:
        self._closing = asyncio.Event()
        self._server = await asyncio.start_server(
            self._handle,
            self.host,
            self.port,
            ssl=self.ssl_context,
            ssl_handshake_timeout=HANDSHAKE_TIMEOUT_S if self.ssl_context is not None else None,
        )
        sock = self._server.sockets[0]
        self.port = int(sock.getsockname()[1])
        missing = [
            what
            for what, given in (("TLS", self.ssl_context), ("authentication", self.auth))
            if given is None
        ]
        if missing and not is_loopback(self.host):
            log.warning(
                "metrics endpoint %s is reachable from other hosts without %s: "
                "set metrics.tls and metrics.auth, or bind metrics.host to 127.0.0.1 "
                "(docs/security.md)",
                self.url,
                " or ".join(missing),
            )

    async def stop(self) -> None:
        self._closing.set()  # event streams end after their current write
        # ... and one whose client stopped reading is cut off rather than left behind
        deadline = asyncio.get_running_loop().time() + EVENT_INTERVAL_S + 1.0
        while self._event_streams and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.05)
        for writer in list(self._event_streams):
            writer.transport.abort()
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 2.0)
            self._server = None

    async def _read_request(self, reader: asyncio.StreamReader) -> tuple[list[str], str | None]:
        """The request line's words and the Authorization header (if any)."""
        request = await _read_line(reader)
        authorization = None
        for _ in range(MAX_HEADER_LINES):
            line = await _read_line(reader)
            if line in (b"\r\n", b"\n", b""):
                break
            name, _, value = line.decode("latin-1").partition(":")
            if name.strip().lower() == "authorization":
                authorization = value.strip()
        else:
            raise ConnectionError("too many header lines")
        return request.decode("latin-1").split(), authorization

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._connections >= MAX_CONNECTIONS:  # before reading anything of the request
            writer.write(b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\n"
                         b"Retry-After: 5\r\nConnection: close\r\n\r\n")
            writer.close()  # a few bytes: the kernel takes them, nothing waits on the peer
            return
        self._connections += 1
        try:
            await self._serve(reader, writer)
        finally:
            self._connections -= 1

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            parts, authorization = await asyncio.wait_for(
                self._read_request(reader), REQUEST_DEADLINE_S
            )
            path = parts[1].split("?")[0] if len(parts) >= 2 else ""
            extra: list[str] = []
            if len(parts) < 2 or parts[0] not in ("GET", "HEAD"):
                status, ctype, body = "405 Method Not Allowed", "text/plain", b"GET only\n"
                extra.append("Allow: GET, HEAD")
            elif path == "/healthz":
                ok, detail = self.health()
                status = "200 OK" if ok else "503 Service Unavailable"
                ctype, body = "application/json", json.dumps(detail).encode() + b"\n"
            elif path == "/metrics" or self._is_network(path) or self._is_dashboard(path):
                refusal = self._refusal(authorization)
                if refusal is None and path == "/metrics":
                    status, ctype = "200 OK", "text/plain; version=0.0.4; charset=utf-8"
                    body = self.metrics.exposition()
                elif refusal is None and path == NETWORK_PATH:
                    status, ctype, body = self._network_view()
                elif refusal is None and path == EVENTS_PATH and parts[0] == "GET":
                    await self._send_events(writer, authorization)
                    return
                elif refusal is None:
                    status, ctype, body, extra = self._dashboard(path)
                else:
                    assert self.auth is not None
                    peer = writer.get_extra_info("peername")
                    log.info("metrics endpoint: refused %s %s from %s: %s",
                             parts[0], path, peer[0] if peer else "?", refusal)
                    if refusal.startswith("credentials unavailable"):
                        status, ctype, body = ("503 Service Unavailable", "text/plain",
                                               b"credentials unavailable\n")
                    else:
                        status, ctype, body = "401 Unauthorized", "text/plain", b"unauthorized\n"
                        extra.append(f"WWW-Authenticate: {challenge(self.auth)}")
            else:
                status, ctype, body = "404 Not Found", "text/plain", self._not_found()
            head = "".join(
                [f"HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\n",
                 f"Content-Length: {len(body)}\r\n"]
                + [f"{h}\r\n" for h in extra]
                + ["Connection: close\r\n\r\n"]
            ).encode()
            writer.write(head + (body if parts[:1] != ["HEAD"] else b""))
            await writer.drain()
        except (TimeoutError, ConnectionError, IndexError, ssl.SSLError):
            pass
        finally:
            # a peer that stopped reading never lets a graceful close flush: cut it off
            # rather than keep this task and its socket for good
            writer.close()
            try:
                await asyncio.wait_for(writer.wait_closed(), CLOSE_TIMEOUT_S)
            except Exception:
                writer.transport.abort()

    def _not_found(self) -> bytes:
        paths = ["/metrics", "/healthz"]
        paths += [NETWORK_PATH] if self.network is not None else []
        paths += [DASHBOARD_PATH] if self.dashboard is not None else []
        return f"try {', '.join(paths[:-1])} or {paths[-1]}\n".encode()

    def _is_network(self, path: str) -> bool:
        return self.network is not None and path == NETWORK_PATH

    def _network_view(self) -> tuple[str, str, bytes]:
        """(status, content type, body) of ``GET /network``."""
        assert self.network is not None
        view = self.network()
        if view is None:  # until the first housekeeping sample (or without a queue manager)
            return "503 Service Unavailable", "text/plain", b"no network view yet\n"
        return "200 OK", "application/json", view.model_dump_json().encode() + b"\n"

    def _is_dashboard(self, path: str) -> bool:
        return self.dashboard is not None and (
            path == DASHBOARD_PATH or path.startswith(DASHBOARD_PATH + "/")
        )

    def _dashboard(self, path: str) -> tuple[str, str, bytes, list[str]]:
        """(status, content type, body, extra headers) of a dashboard GET other than
        the event stream: the page (also for its client-side routes), a listed static
        file, or the snapshot."""
        assert self.dashboard is not None
        rest = path.removeprefix(DASHBOARD_PATH).strip("/")
        headers = [*DASHBOARD_HEADERS]
        if rest == "api/events":  # HEAD (a GET is the stream itself): its headers only
            return "200 OK", "text/event-stream", b"", [*headers, "Cache-Control: no-store"]
        if rest == "api/snapshot":
            try:
                body = self.dashboard.snapshot_json()
            except Exception:  # never a traceback to the client; the log has it
                log.exception("dashboard snapshot failed")
                return "503 Service Unavailable", "text/plain", b"snapshot unavailable\n", []
            return "200 OK", "application/json", body, [*headers, "Cache-Control: no-store"]
        if rest.startswith("static/"):
            found = asset(rest.removeprefix("static/"))
            if found is None:
                return "404 Not Found", "text/plain", b"no such file\n", []
            return "200 OK", found[0], found[1], [*headers, "Cache-Control: no-cache"]
        if rest == "" or rest.startswith("stream/"):
            ctype, body = asset(PAGE) or ("text/plain", b"")
            return "200 OK", ctype, body, [*headers, "Cache-Control: no-cache"]
        return "404 Not Found", "text/plain", b"no such dashboard page\n", []

    async def _send_events(self, writer: asyncio.StreamWriter, authorization: str | None) -> None:
        """Server-sent events: a snapshot now and every ``EVENT_INTERVAL_S`` until the
        client goes away or the server stops (at most ``MAX_EVENT_STREAMS`` at once; the
        page falls back to polling the snapshot).

        The credentials are checked again every ``AUTH_RECHECK_EVENTS`` events (a rotated
        secret ends the streams opened with the old one), a stream lasts at most
        ``MAX_EVENT_STREAM_S`` (the browser reconnects by itself), and a client that does
        not take a snapshot within ``EVENT_WRITE_TIMEOUT_S`` is cut off (transport
        aborted), so a stalled tab holds neither a slot nor a socket."""
        assert self.dashboard is not None
        if len(self._event_streams) >= MAX_EVENT_STREAMS:
            body = b"too many event streams: poll /dashboard/api/snapshot\n"
            writer.write(
                b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain\r\n"
                + f"Content-Length: {len(body)}\r\nRetry-After: 5\r\n".encode()
                + b"Connection: close\r\n\r\n" + body
            )
            await writer.drain()
            return
        self._event_streams.add(writer)
        try:
            head = "".join(
                ["HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"]
                + [f"{h}\r\n" for h in DASHBOARD_HEADERS]
                + ["Cache-Control: no-store\r\nConnection: close\r\n\r\n", "retry: 2000\n\n"]
            )
            writer.write(head.encode())
            ends = asyncio.get_running_loop().time() + MAX_EVENT_STREAM_S
            sent = 0
            while not self._closing.is_set() and not writer.is_closing():
                if asyncio.get_running_loop().time() >= ends:
                    return
                if sent and sent % AUTH_RECHECK_EVENTS == 0:
                    refused = self._refusal(authorization)
                    if refused is not None:
                        log.info("dashboard event stream ended: %s", refused)
                        return
                try:
                    data = self.dashboard.snapshot_json()
                except Exception:
                    log.exception("dashboard snapshot failed")
                    return
                writer.write(b"event: snapshot\ndata: " + data + b"\n\n")
                sent += 1
                try:
                    await asyncio.wait_for(writer.drain(), EVENT_WRITE_TIMEOUT_S)
                except TimeoutError:
                    writer.transport.abort()
                    return
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._closing.wait(), EVENT_INTERVAL_S)
        finally:
            self._event_streams.discard(writer)

    def _refusal(self, authorization: str | None) -> str | None:
        """Why a request for /metrics is refused (never naming the credentials), or None."""
        auth = self.auth
        if auth is None or not auth.protect_metrics:
            return None
        try:
            return refusal(auth, authorization)
        except SecretError as exc:
            return f"credentials unavailable ({exc})"


async def _read_line(reader: asyncio.StreamReader) -> bytes:
    """One request or header line; an over-long line (more than the reader's 64 KiB
    limit) ends the connection like a malformed request."""
    try:
        return await asyncio.wait_for(reader.readline(), 5.0)
    except ValueError as exc:  # LimitOverrunError surfaces as ValueError from readline
        raise ConnectionError("request line too long") from exc


#: The dashboard's page; its routes are below it (docs/dashboard.md).
DASHBOARD_PATH = "/dashboard"
EVENTS_PATH = "/dashboard/api/events"
#: Seconds between two snapshots on an event stream.
EVENT_INTERVAL_S = 1.0
#: Event streams served at once (each holds a connection and snapshots every second).
MAX_EVENT_STREAMS = 16
#: Seconds a client may take to accept one snapshot before its stream is cut off.
EVENT_WRITE_TIMEOUT_S = 5.0
#: Every this many events the stream's credentials are checked again.
AUTH_RECHECK_EVENTS = 5
#: Seconds one event stream lasts; then it ends and the browser reconnects (checked again).
MAX_EVENT_STREAM_S = 300.0
#: Seconds a closing connection may take to flush before it is aborted.
CLOSE_TIMEOUT_S = 2.0
#: Seconds a client may take to send its whole request (line and headers).
REQUEST_DEADLINE_S = 10.0
#: Connections served at once; beyond, a 503 before the request is read.
MAX_CONNECTIONS = 128
#: Sent with every dashboard answer: the page runs only its own script and style sheet
#: and cannot be framed.
DASHBOARD_HEADERS = (
    "Content-Security-Policy: default-src 'none'; script-src 'self'; style-src 'self'; "
    "img-src 'self' data:; connect-src 'self'; base-uri 'none'; form-action 'none'; "
    "frame-ancestors 'none'",
    "X-Content-Type-Options: nosniff",
    "Referrer-Policy: no-referrer",
)
#: Seconds a client may take for the TLS handshake.
HANDSHAKE_TIMEOUT_S = 5.0
#: Header lines read per request at most (the endpoint needs only Authorization).
MAX_HEADER_LINES = 100


def is_loopback(host: str) -> bool:
    """Whether binding ``host`` keeps the endpoint on this machine."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def challenge(auth: MetricsAuthConfig) -> str:
    """The WWW-Authenticate value of a 401."""
    if auth.token is not None:
        return 'Bearer realm="mqgw-metrics"'
    return 'Basic realm="mqgw-metrics", charset="UTF-8"'


def _same(given: str, expected: str) -> bool:
    return hmac.compare_digest(given.encode("utf-8"), expected.encode("utf-8"))


#: Authorization schemes a refusal may name (anything else could be a bare credential).
_KNOWN_SCHEMES = frozenset({"basic", "bearer", "digest", "negotiate", "ntlm"})


def _scheme_name(scheme: str) -> str:
    """How a refusal names the scheme sent: a known scheme by name, anything else (a
    token sent without ``Bearer``, say) never echoed — it may be the credential."""
    if scheme.lower() in _KNOWN_SCHEMES:
        return f"{scheme.capitalize()} credentials"
    return "a malformed Authorization header"


def refusal(auth: MetricsAuthConfig, authorization: str | None) -> str | None:
    """None when the Authorization header carries the configured credentials, else why
    not. Reads the secrets now (a rotated file takes effect on the next request); raises
    :class:`SecretError` when they cannot be read."""
    if not authorization:
        return "no credentials"
    scheme, _, value = authorization.partition(" ")
    value = value.strip()
    if auth.token is not None:
        if scheme.lower() != "bearer":
            return f"{_scheme_name(scheme)} where a bearer token is required"
        return None if _same(value, auth.token.reveal()) else "wrong token"
    assert auth.username is not None and auth.password is not None
    if scheme.lower() != "basic":
        return f"{_scheme_name(scheme)} where basic authentication is required"
    try:
        decoded = base64.b64decode(value, validate=True).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError):
        return "malformed basic credentials"
    user, sep, password = decoded.partition(":")
    if not sep:
        return "malformed basic credentials"
    ok_user = _same(user, auth.username)
    ok_password = _same(password, auth.password.reveal())
    return None if ok_user and ok_password else "wrong user name or password"


def server_ssl_context(tls: MetricsTLSConfig, resolve: Callable[[Path], Path]) -> ssl.SSLContext:
    """The endpoint's TLS context (TLS 1.2 or later); ``resolve`` makes paths absolute
    against the config file. Raises ValueError naming the key and the problem."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    cert, key = resolve(tls.cert_file), resolve(tls.key_file)
    for name, path in (("metrics.tls.cert_file", cert), ("metrics.tls.key_file", key)):
        if not path.is_file():
            raise ValueError(f"{name}: {path} does not exist or is not a file")
    password = tls.key_password
    try:
        ctx.load_cert_chain(cert, key, password=(password.reveal if password else None))
    except SecretError as exc:
        raise ValueError(f"metrics.tls.key_password: {exc}") from None
    except ssl.SSLError as exc:
        raise ValueError(
            f"metrics.tls: cannot load {cert} with {key}: {exc.reason or exc} "
            "(a PEM certificate and its private key; key_password if the key is encrypted)"
        ) from None
    if tls.client_ca_file is not None:
        ca = resolve(tls.client_ca_file)
        try:
            ctx.load_verify_locations(cafile=ca)
        except (OSError, ssl.SSLError) as exc:
            raise ValueError(f"metrics.tls.client_ca_file: cannot load {ca}: {exc}") from None
        ctx.verify_mode = ssl.CERT_REQUIRED
    return ctx


#: The refusals the MQ entrance can count (every one but a plugin route's own).
MQ_ENTRANCE_REFUSALS = tuple(r for r in Refusal if r is not Refusal.STREAM_NOT_IN_ROUTE)

#: A plugin's own ``stats()`` entry counting records refused by its route's stream
#: allow-list (the Kafka plugin's ``inbound_authorisation_refused``).
PLUGIN_AUTHORISATION_STAT = "authorisation_refused"


class AuthorisationCollector(Collector):
    """``mqgw_authorisation_refused_total{entrance,reason}``: refusals by the policy at
    each entrance (``mq`` for MQ commands, ``plugin:<instance>`` for a plugin's inbound
    publications, including those its route's ``allowed_streams`` refused)."""

    def __init__(self, authoriser: Authoriser | None, host: PluginHost) -> None:
        self.authoriser = authoriser
        self.host = host

    def collect(self) -> Iterator[CounterMetricFamily]:
        family = CounterMetricFamily(
            "mqgw_authorisation_refused",
            "Commands and publications refused by stream/topic/subscriber-queue "
            "authorisation (docs/security.md)",
            labels=["entrance", "reason"],
        )
        counts: dict[tuple[str, str], int] = {}
        if self.authoriser is not None:
            # every reason at the MQ entrance from the start (a series before the first)
            counts.update({("mq", r.value): 0 for r in MQ_ENTRANCE_REFUSALS})
            counts.update(self.authoriser.refusals)
        for name, inst in self.host.instances.items():
            if not isinstance(inst, ReportsStats):
                continue
            try:
                stats = inst.stats()
            except Exception:  # a scrape must not fail because one plugin cannot answer
                continue
            mine = [v for k, v in stats.items() if k.endswith(PLUGIN_AUTHORISATION_STAT)]
            if mine:  # a plugin that counts refusals has its series from the start
                key = (f"plugin:{name}", Refusal.STREAM_NOT_IN_ROUTE.value)
                counts[key] = counts.get(key, 0) + sum(mine)
        for (entrance, reason), n in sorted(counts.items()):
            family.add_metric([entrance, reason], n)
        yield family
