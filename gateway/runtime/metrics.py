"""Prometheus metrics and ``/metrics`` + ``/healthz`` over HTTP.

Why a collector rather than counters bumped per message: the broker service, the plugin
host and the publishers already keep plain integer counters; reading them at scrape
time costs nothing on the message path. Only the end-to-end latency histogram is
observed per delivery (one bucket increment). The HTTP endpoint is a small asyncio
server (no thread), bound to 127.0.0.1 by default.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Callable, Iterator, Sequence

from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from gateway.plugin_api import Envelope, ReportsStats
from gateway.pubsub.authorisation import Authoriser, Refusal
from gateway.runtime.neighbours.links import NeighbourLinks
from gateway.runtime.neighbours.status import neighbour_status
from gateway.runtime.plugin_host import PluginHost
from gateway.runtime.pubsub_service import BrokerService
from gateway.runtime.request_reply.service import RequestReplyService
from gateway.runtime.streams.check import StreamReport
from gateway.runtime.streams.health import stream_metric_families
from gateway.wire.put_time import put_time_ms

log = logging.getLogger(__name__)

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


def put_timestamp(put_date: str, put_time: str) -> float | None:
    """Seconds since the epoch of an MQMD PutDate + PutTime (see gateway.wire.put_time)."""
    ms = put_time_ms(put_date, put_time)
    return None if ms is None else ms / 1000


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
        for name, sc in self.host.sink_counters.items():
            for stream, n in sc.per_stream.items():
                out.add_metric([stream, name], n)
            errors.add_metric([name, "send_failure"], sc.failures)
            errors.add_metric([name, "retained_skipped"], sc.retained_skipped)
        for name, ctx in self.host.contexts.items():
            pc = ctx.publisher.counters
            for stream, n in pc.per_stream.items():
                inbound.add_metric([stream, name], n)
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
            for code, n in fc.dead_lettered.items():
                sink_dead.add_metric([name, str(code)], n)
            sink_down.add_metric([name], fc.down)
            errors.add_metric([name, "sink_retry"], fc.retries)
            errors.add_metric([name, "sink_backout"], fc.backouts)
        depth = GaugeMetricFamily("mqgw_queue_depth", "Current depth of a queue", labels=["queue"])
        try:
            for q, n in self.queue_depths().items():
                depth.add_metric([q], n)
        except Exception:  # a scrape must not fail because one queue cannot be asked
            log.debug("queue depth unavailable", exc_info=True)
        yield from (
            out, inbound, refused, handled, errors, dead, sink_dead, sink_down, suspended, depth,
            up, stats,
        )


class _StreamCollector(Collector):
    """The stream union's facts (gateway.runtime.streams.health) as gauges."""

    def __init__(self, report: Callable[[], StreamReport | None]) -> None:
        self.report = report

    def collect(self) -> Iterator[GaugeMetricFamily]:
        yield from stream_metric_families(self.report())


class NeighbourCollector(Collector):
    """Per neighbour: active, seconds since last heard, proxy subscriptions registered
    there, commands sent and answered (docs/neighbours.md)."""

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
        try:
            for item in neighbour_status(self.links.state, self.clock()):
                q = item["q_mgr"]
                active.add_metric([q], 1.0 if item["state"] == "active" else 0.0)
                if item["last_heard_age"] is not None:
                    heard.add_metric([q], item["last_heard_age"])
                proxies.add_metric([q], item["proxy_subscriptions"])
        except Exception:  # a scrape must not fail because the database is busy
            log.debug("neighbour status unavailable", exc_info=True)
        for (q, result), n in sorted(self.links.counters.commands.items()):
            commands.add_metric([q, result], n)
        yield from (active, heard, proxies, commands)


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
        for (route, event), n in sorted(svc.events.items()):
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


class HealthServer:
    """``GET /metrics`` (Prometheus text) and ``GET /healthz`` (JSON; 503 when unhealthy)."""

    def __init__(
        self,
        metrics: GatewayMetrics,
        health: Callable[[], tuple[bool, dict[str, object]]],
        host: str = "127.0.0.1",
        port: int = 9464,
    ) -> None:
        self.metrics = metrics
        self.health = health
        self.host = host
        self.port = port
        self._server: asyncio.Server | None = None

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._handle, self.host, self.port)
        sock = self._server.sockets[0]
        self.port = int(sock.getsockname()[1])

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 2.0)
            self._server = None

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            request = await asyncio.wait_for(reader.readline(), 5.0)
            while (await asyncio.wait_for(reader.readline(), 5.0)) not in (b"\r\n", b"\n", b""):
                pass
            parts = request.decode("latin-1").split()
            path = parts[1].split("?")[0] if len(parts) >= 2 else ""
            if len(parts) < 2 or parts[0] not in ("GET", "HEAD"):
                status, ctype, body = "405 Method Not Allowed", "text/plain", b"GET only\n"
            elif path == "/metrics":
                status, ctype = "200 OK", "text/plain; version=0.0.4; charset=utf-8"
                body = self.metrics.exposition()
            elif path == "/healthz":
                ok, detail = self.health()
                status = "200 OK" if ok else "503 Service Unavailable"
                ctype, body = "application/json", json.dumps(detail).encode() + b"\n"
            else:
                status, ctype, body = "404 Not Found", "text/plain", b"try /metrics or /healthz\n"
            head = (
                f"HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\n"
                f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
            ).encode()
            writer.write(head + (body if parts[:1] != ["HEAD"] else b""))
            await writer.drain()
        except (TimeoutError, ConnectionError, IndexError):
            pass
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()


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
            counts.update(self.authoriser.refusals)
        for name, inst in self.host.instances.items():
            if not isinstance(inst, ReportsStats):
                continue
            try:
                stats = inst.stats()
            except Exception:  # a scrape must not fail because one plugin cannot answer
                continue
            n = sum(v for k, v in stats.items() if k.endswith(PLUGIN_AUTHORISATION_STAT))
            if n:
                key = (f"plugin:{name}", Refusal.STREAM_NOT_IN_ROUTE.value)
                counts[key] = counts.get(key, 0) + n
        for (entrance, reason), n in sorted(counts.items()):
            family.add_metric([entrance, reason], n)
        yield family
