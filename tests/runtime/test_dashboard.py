"""The live dashboard (issue 17 item 1) of a real running gateway app on the embedded
queue manager: the snapshot's content (gateway, neighbour, streams with depth, rate and
flows, request/reply route in flight, dead letters, plugin health), the routes and their
headers, the server-sent events, and the same authentication as ``/metrics``."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from gateway.plugin_api import Envelope
from gateway.runtime.app import GatewayApp
from gateway.runtime.config import parse_config
from gateway.runtime.dashboard import RateWindow, Snapshot
from gateway.runtime.registry import PluginRegistry
from plugins.memory import get_bus, reset_buses
from tests.support.pubsub_messages import CONTROL, rfh_message
from tests.support.service_client import put

BULLETIN = "BULLETIN.STREAM"
USER, PASSWORD = "viewer", "s3cret-dashboard"
GOOD = "Basic " + base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()


def _config(tmp_path: Path, *, dashboard: bool = True) -> dict[str, Any]:
    return {
        "id": "gw-dash",
        "queue_manager": {"name": "GWDASH", "data_dir": str(tmp_path / "qm")},
        "broker": {"streams": [{"name": BULLETIN}], "wait_ms": 50},
        "metrics": {"port": 0, "dashboard": dashboard,
                    "auth": {"username": USER, "password": PASSWORD}},
        # BROKERA has no channel: the link stays inactive ("joining") and says why
        "neighbours": [{"q_mgr": "BROKERA", "streams": [BULLETIN]}],
        "plugins": [
            {"name": "mem", "plugin": "memory",
             "config": {"bus": "dash", "subscribe": [f"$SYS/STREAM/{BULLETIN}/#"]}},
            # publishes into MQ (an instance never receives its own publications)
            {"name": "feeder", "plugin": "memory", "config": {"bus": "feed"}},
        ],
        "request_reply": {
            "sweep_interval": 0.1,
            "requests": [{"name": "ask-svc", "plugin": "mem", "source": "ask",
                          "destination": "APP.SERVICE@GWDASH", "timeout": 60}],
        },
    }


@pytest.fixture
async def app(tmp_path: Path) -> AsyncIterator[GatewayApp]:
    reset_buses()
    registry = PluginRegistry.from_entry_points()
    gw = GatewayApp(parse_config(_config(tmp_path), registry, base_dir=tmp_path), registry)
    await gw.start()
    try:
        assert gw.node is not None
        gw.node.qm.run_mqsc("DEFINE QLOCAL(APP.SERVICE) REPLACE", stop_on_error=True)
        async with asyncio.timeout(10):
            while not gw.health()[0]:
                await asyncio.sleep(0.02)
        yield gw
    finally:
        await gw.shutdown()
        reset_buses()


async def _request(
    port: int, path: str, authorization: str | None = GOOD, method: str = "GET"
) -> tuple[int, dict[str, str], bytes]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    auth = f"Authorization: {authorization}\r\n" if authorization else ""
    writer.write(f"{method} {path} HTTP/1.1\r\nHost: x\r\n{auth}\r\n".encode())
    await writer.drain()
    raw = await asyncio.wait_for(reader.read(), 10)
    writer.close()
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {}
    for line in lines[1:]:
        k, _, v = line.partition(":")
        headers[k.strip().lower()] = v.strip()
    return int(lines[0].split()[1]), headers, body


async def _snapshot(port: int) -> Snapshot:
    status, _, body = await _request(port, "/dashboard/api/snapshot")
    assert status == 200, body
    return Snapshot.model_validate_json(body)


def _port(app: GatewayApp) -> int:
    assert app.http is not None
    return app.http.port


async def test_snapshot_shows_the_running_gateway(app: GatewayApp) -> None:
    port = _port(app)
    snap = await _snapshot(port)
    assert snap.gateway.gateway_id == "gw-dash" and snap.gateway.q_mgr == "GWDASH"
    assert snap.gateway.health == "ok" and snap.gateway.broker_serving
    assert snap.gateway.uptime_s >= 0 and snap.gateway.version
    (nb,) = snap.neighbours
    assert (nb.q_mgr, nb.active, nb.state) == ("BROKERA", False, "joining")
    assert BULLETIN in nb.streams
    streams = {s.name: s for s in snap.streams}
    bulletin = streams[BULLETIN]
    assert bulletin.serviced and bulletin.queue_exists and "BROKERA" in bulletin.neighbours
    assert [(f.plugin, f.kind, f.direction, f.target) for f in bulletin.flows] == [
        ("mem", "memory", "out", "bus dash: #")
    ]
    assert [(p.name, p.kind, p.status) for p in snap.plugins] == [
        ("feeder", "memory", "healthy"), ("mem", "memory", "healthy")
    ]
    (route,) = snap.routes
    assert (route.name, route.side, route.in_flight) == ("ask-svc", "requester", 0)

    # traffic: 30 publications in through the plugin and out to its subscription
    bus = get_bus("dash")
    feed = get_bus("feed")
    futures = [feed.inject(Envelope(BULLETIN, "news", b"%d" % i)) for i in range(30)]
    await asyncio.gather(*futures)
    await bus.wait_for(30)
    async with asyncio.timeout(10):
        while True:
            bulletin = next(s for s in (await _snapshot(port)).streams if s.name == BULLETIN)
            if bulletin.total_out == 30 and bulletin.rate_in > 0 and bulletin.rate_out > 0:
                break
            await asyncio.sleep(0.3)
    assert bulletin.total_in == 30

    # a request nobody answers yet is in flight on its route
    await bus.exchanges.append([Envelope("", "ask", b"q", reply_topic="ans",
                                         correlation_data=b"c1")])
    async with asyncio.timeout(10):
        while (await _snapshot(port)).routes[0].in_flight != 1:
            await asyncio.sleep(0.1)

    # a malformed command is dead-lettered by the broker: counted by reason, DLQ depth
    assert app.node is not None
    await put(app.node.qm, rfh_message(CONTROL, [("MQPSCommand", "Bogus")]))
    async with asyncio.timeout(10):
        while True:
            snap = await _snapshot(port)
            dead = {(d.source, d.reason): d.count for d in snap.dead_letters}
            if dead[("broker", "undeliverable")] == 1:
                break
            await asyncio.sleep(0.1)
    assert snap.dead_letter_queue == "SYSTEM.DEAD.LETTER.QUEUE"
    assert snap.dead_letter_depth == 1


async def test_page_static_files_and_headers(app: GatewayApp) -> None:
    port = _port(app)
    for path in ("/dashboard", "/dashboard/", f"/dashboard/stream/{BULLETIN}"):
        status, headers, body = await _request(port, path)
        assert status == 200 and headers["content-type"].startswith("text/html")
        assert b'<script src="/dashboard/static/dashboard.js"' in body
        assert "script-src 'self'" in headers["content-security-policy"]
        assert headers["x-content-type-options"] == "nosniff"
    status, headers, body = await _request(port, "/dashboard/static/dashboard.js")
    assert status == 200 and headers["content-type"].startswith("text/javascript")
    assert b"EventSource" in body
    status, headers, _ = await _request(port, "/dashboard/static/dashboard.css")
    assert status == 200 and headers["content-type"].startswith("text/css")
    # only the listed files: no path reaches the file system
    for path in ("/dashboard/static/../snapshot.py", "/dashboard/static/snapshot.py",
                 "/dashboard/nothing"):
        assert (await _request(port, path))[0] == 404
    status, headers, body = await _request(port, "/dashboard", method="HEAD")
    assert status == 200 and body == b"" and int(headers["content-length"]) > 0


async def test_same_authentication_as_metrics(app: GatewayApp) -> None:
    port = _port(app)
    wrong = "Basic " + base64.b64encode(f"{USER}:nope".encode()).decode()
    for path in ("/metrics", "/dashboard", "/dashboard/static/dashboard.js",
                 "/dashboard/api/snapshot", "/dashboard/api/events"):
        for authorization in (None, wrong, "Bearer " + PASSWORD):
            status, headers, body = await _request(port, path, authorization)
            assert status == 401, (path, authorization)
            assert headers["www-authenticate"].startswith("Basic realm=")
            assert b"GWDASH" not in body
    status, _, body = await _request(port, "/healthz", None)  # probes need no credentials
    assert status == 200 and json.loads(body)["gateway"] == "gw-dash"


async def test_server_sent_events_push_a_snapshot_every_second(app: GatewayApp) -> None:
    port = _port(app)
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"GET /dashboard/api/events HTTP/1.1\r\nAuthorization: {GOOD}\r\n\r\n".encode())
    await writer.drain()
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
    assert head.startswith(b"HTTP/1.1 200") and b"text/event-stream" in head
    stamps: list[float] = []
    started = time.monotonic()
    async with asyncio.timeout(10):
        while len(stamps) < 3:
            line = await reader.readline()
            if line.startswith(b"data: "):
                snap = Snapshot.model_validate_json(line[6:])
                assert snap.gateway.q_mgr == "GWDASH"
                stamps.append(snap.generated_at)
    assert 1.5 <= time.monotonic() - started < 6
    assert stamps == sorted(stamps) and stamps[-1] - stamps[0] >= 1.5
    # the server's stop ends the stream (no connection left behind)
    assert app.http is not None
    await app.http.stop()
    async with asyncio.timeout(5):
        while await reader.read(65536):
            pass
    writer.close()


async def test_dashboard_can_be_turned_off(tmp_path: Path) -> None:
    reset_buses()
    registry = PluginRegistry.from_entry_points()
    gw = GatewayApp(parse_config(_config(tmp_path, dashboard=False), registry,
                                 base_dir=tmp_path), registry)
    await gw.start()
    try:
        port = _port(gw)
        assert (await _request(port, "/dashboard"))[0] == 404
        assert (await _request(port, "/dashboard/api/snapshot"))[0] == 404
        assert (await _request(port, "/metrics"))[0] == 200
    finally:
        await gw.shutdown()
        reset_buses()


def test_rate_window_counts_per_second_over_the_window() -> None:
    rates: RateWindow[str] = RateWindow(window_s=5.0, min_spacing_s=0.5)
    assert rates.rate("a") == 0.0
    rates.observe(0.0, {"a": 0})
    rates.observe(0.2, {"a": 100})  # too soon: ignored
    rates.observe(1.0, {"a": 10})
    assert rates.rate("a") == pytest.approx(10.0)
    for t in range(2, 12):
        rates.observe(float(t), {"a": 10})  # idle: the burst fades out of the window
    assert rates.rate("a") == 0.0
    rates.observe(12.0, {"a": 3})  # a restarted counter counts from zero
    assert rates.rate("a") == pytest.approx(3 / 5)  # 3 over the 7 → 12 s window


def test_rate_after_an_idle_gap_is_not_averaged_over_the_gap() -> None:
    """Samples are taken only while someone watches: a viewer arriving after ten quiet
    minutes must not see (growth over the gap) / (gap) as the rate now."""
    rates: RateWindow[str] = RateWindow(window_s=5.0, min_spacing_s=0.5)
    rates.observe(0.0, {"a": 0})
    rates.observe(1.0, {"a": 1000})
    assert rates.rate("a") == pytest.approx(1000.0)
    rates.observe(601.0, {"a": 1000})  # the next viewer, 10 min later
    assert rates.rate("a") == 0.0
    rates.observe(602.0, {"a": 1010})
    assert rates.rate("a") == pytest.approx(10.0)


def test_plugins_describe_their_routes_from_config_alone() -> None:
    """The names the network picture shows: Kafka topics (``{topic}`` kept as a marker)
    and MQTT topics/filters, per stream and direction, with no connection made."""
    from plugins.kafka import KafkaInstance, KafkaPluginConfig
    from plugins.mqtt.config import MqttConfig
    from plugins.mqtt.instance import MqttInstance

    kafka = KafkaInstance("k", KafkaPluginConfig.model_validate({
        "outbound": {"routes": [{"stream": BULLETIN, "topic": "news/#"},
                                {"stream": "STOCK.STREAM", "kafka_topic": "px.{topic}"}]},
        "inbound": {"topics": [{"kafka_topic": "orders", "stream": BULLETIN}]},
    }))
    assert [(t.direction, t.stream, t.target) for t in kafka.route_targets()] == [
        ("out", BULLETIN, "mqgw.BULLETIN.STREAM"),
        ("out", "STOCK.STREAM", "px.{topic}"),
        ("in", BULLETIN, "orders"),
    ]
    mqtt = MqttInstance("m", MqttConfig.model_validate({
        "outbound": {"topics": ["#", f"$SYS/STREAM/{BULLETIN}/news/+"], "prefix": "mq",
                     "stream_levels": {BULLETIN: "bulletin"}},
        "inbound": {"filters": [{"filter": "sensors/#", "stream": BULLETIN}]},
    }))
    assert [(t.direction, t.stream, t.target) for t in mqtt.route_targets()] == [
        ("out", "SYSTEM.BROKER.DEFAULT.STREAM", "mq/#"),
        ("out", BULLETIN, "mq/bulletin/news/+"),
        ("in", BULLETIN, "sensors/#"),
    ]


async def test_unknown_static_names_are_refused_and_never_remembered(app: GatewayApp) -> None:
    from gateway.runtime.dashboard import assets

    port = _port(app)
    assert (await _request(port, "/dashboard/static/dashboard.js"))[0] == 200
    for i in range(40):
        name = f"x{i}-" + "a" * 2000
        assert (await _request(port, f"/dashboard/static/{name}"))[0] == 404
    # only listed names are ever loaded: the memory does not grow with what clients ask
    assert set(assets._LOADED) <= set(assets.ASSETS)
    assert assets.asset("nothing.js") is None and "nothing.js" not in assets._LOADED


async def test_one_snapshot_a_second_is_shared_by_every_viewer(app: GatewayApp) -> None:
    port = _port(app)
    assert app.http is not None and app.http.dashboard is not None
    source = app.http.dashboard
    await asyncio.sleep(source.cache_s)  # past anything built at start
    before = source.builds
    bodies = [(await _request(port, "/dashboard/api/snapshot"))[2] for _ in range(5)]
    assert len(set(bodies)) == 1 and source.builds == before + 1
    await asyncio.sleep(source.cache_s)
    await _request(port, "/dashboard/api/snapshot")
    assert source.builds == before + 2


async def _open_events(port: int, authorization: str = GOOD, *, rcvbuf: int | None = None
                       ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter, bytes]:
    import socket

    sock = socket.socket()
    if rcvbuf is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", port))
    reader, writer = await asyncio.open_connection(sock=sock)
    writer.write(f"GET /dashboard/api/events HTTP/1.1\r\nAuthorization: {authorization}\r\n\r\n"
                 .encode())
    await writer.drain()
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
    return reader, writer, head


async def test_event_streams_beyond_the_limit_get_503_and_head_answers(
    app: GatewayApp, monkeypatch: pytest.MonkeyPatch
) -> None:
    from gateway.runtime import metrics

    port = _port(app)
    monkeypatch.setattr(metrics, "MAX_EVENT_STREAMS", 1)
    _r1, w1, head = await _open_events(port)
    assert head.startswith(b"HTTP/1.1 200")
    reader, w2, head = await _open_events(port)
    assert head.startswith(b"HTTP/1.1 503") and b"Retry-After: 5" in head
    assert b"poll /dashboard/api/snapshot" in await asyncio.wait_for(reader.read(), 5)
    for w in (w1, w2):
        w.close()
    # HEAD: the stream's headers, no body (as for every dashboard route)
    status, headers, body = await _request(port, "/dashboard/api/events", method="HEAD")
    assert status == 200 and headers["content-type"] == "text/event-stream" and body == b""
    assert "script-src 'self'" in headers["content-security-policy"]
    assert (await _request(port, "/dashboard/api/events", None, method="HEAD"))[0] == 401


async def test_a_rotated_secret_ends_open_event_streams(
    app: GatewayApp, monkeypatch: pytest.MonkeyPatch
) -> None:
    from gateway.runtime import metrics
    from gateway.runtime.config import MetricsAuthConfig

    assert app.http is not None
    monkeypatch.setenv("MQGW_TEST_DASH_PASSWORD", PASSWORD)
    monkeypatch.setattr(app.http, "auth", MetricsAuthConfig.model_validate(
        {"username": USER, "password": {"env": "MQGW_TEST_DASH_PASSWORD"}}))
    monkeypatch.setattr(metrics, "AUTH_RECHECK_EVENTS", 1)
    reader, writer, head = await _open_events(_port(app))
    assert head.startswith(b"HTTP/1.1 200")
    assert (await asyncio.wait_for(reader.readline(), 5)).startswith(b"retry:")
    monkeypatch.setenv("MQGW_TEST_DASH_PASSWORD", "rotated-" + PASSWORD)
    async with asyncio.timeout(6):
        while await reader.read(65536):  # the stream ends (EOF) at the next check
            pass
    writer.close()
    assert (await _request(_port(app), "/dashboard/api/snapshot"))[0] == 401


def _handler_tasks() -> list[asyncio.Task[Any]]:
    return [t for t in asyncio.all_tasks() if not t.done()
            and getattr(t.get_coro(), "__qualname__", "") == "HealthServer._handle"]


async def test_a_client_that_stops_reading_is_cut_off(
    app: GatewayApp, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its slot, its handler task and its socket are released (before: the task waited
    for ever on a close that could not flush)."""
    import socket

    from gateway.runtime import metrics

    assert app.http is not None
    monkeypatch.setattr(metrics, "EVENT_INTERVAL_S", 0.02)
    monkeypatch.setattr(metrics, "EVENT_WRITE_TIMEOUT_S", 0.5)
    _reader, writer, head = await _open_events(_port(app), rcvbuf=4096)
    assert head.startswith(b"HTTP/1.1 200")
    (served,) = app.http._event_streams
    served_sock = served.transport.get_extra_info("socket")
    served_sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    served.transport.set_write_buffer_limits(high=0)
    assert len(_handler_tasks()) == 1
    async with asyncio.timeout(20):  # the client never reads again
        while app.http._event_streams or _handler_tasks():
            await asyncio.sleep(0.1)
    assert served.transport.is_closing()
    writer.transport.abort()


async def test_stream_depth_oldest_age_and_dead_letters(tmp_path: Path) -> None:
    """A stream with a backlog (wanted by the neighbour, not serviced here) shows its
    depth and the age of its oldest message; publications dead-lettered for a stream
    (reason 2085, as a receiving channel does) are counted on that stream."""
    from gateway.mq.port import OpenOption, PutOptions
    from gateway.wire.formats import FMT_RF_HEADER
    from gateway.wire.mqmd import MQMD
    from gateway.wire.reasons import Reason

    news = "NEWS.STREAM"
    reset_buses()
    config = _config(tmp_path)
    config["neighbours"][0]["streams"] = [BULLETIN, news]
    config["expiry_sweep_interval"] = 0.2  # the stream report is sampled with it
    registry = PluginRegistry.from_entry_points()
    gw = GatewayApp(parse_config(config, registry, base_dir=tmp_path), registry)
    await gw.start()
    try:
        assert gw.node is not None
        qm = gw.node.qm
        qm.run_mqsc(f"DEFINE QLOCAL({news}) REPLACE", stop_on_error=True)
        conn = await qm.connect()
        h = await conn.open(news, OpenOption.OUTPUT)
        for i in range(3):
            await h.put(MQMD(persistence=1), b"waiting %d" % i, PutOptions())
        await h.close()
        for i in range(2):
            md = MQMD(format=FMT_RF_HEADER, encoding=546, coded_char_set_id=819)
            await conn.put_dead_letter(md, b"publication %d" % i, Reason.UNKNOWN_OBJECT_NAME,
                                       BULLETIN, syncpoint=True)
        await conn.commit()
        await conn.disconnect()
        port = _port(gw)
        async with asyncio.timeout(15):
            while True:
                streams = {s.name: s for s in (await _snapshot(port)).streams}
                n, b = streams.get(news), streams[BULLETIN]
                if (n is not None and n.oldest_age_s and n.oldest_age_s >= 1.0
                        and b.dead_lettered == 2):
                    break
                await asyncio.sleep(0.3)
        assert n.depth == 3 and not n.serviced and n.queue_exists
        assert n.wanted_by and any("not serviced" in p for p in n.problems)
        assert b.depth == 0 and b.serviced and b.oldest_age_s is None
        assert any("2 publication(s)" in p for p in b.problems)
    finally:
        await gw.shutdown()
        reset_buses()


async def test_connection_cap_and_request_deadline(
    app: GatewayApp, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Beyond MAX_CONNECTIONS a connection gets a 503 before its request is read; a
    client that trickles its headers (one every 0.2 s, each within the per-line limit) is
    cut off at the whole request's deadline."""
    from gateway.runtime import metrics

    port = _port(app)
    monkeypatch.setattr(metrics, "MAX_CONNECTIONS", 1)
    _r1, w1, head = await _open_events(port)  # holds the one connection
    assert head.startswith(b"HTTP/1.1 200")
    # a 503 (or, when the unread request is still in the server's buffer at its close, a
    # reset): either way nothing is served and nothing is held
    try:
        status, headers, _ = await _request(port, "/healthz", None)
        assert status == 503 and headers["retry-after"] == "5"
    except ConnectionResetError:
        pass
    assert app.http is not None and app.http._connections == 1
    w1.close()  # the server notices at its next event; then the slot is free again
    async with asyncio.timeout(5):
        while True:
            with contextlib.suppress(ConnectionResetError):
                if (await _request(port, "/healthz", None))[0] == 200:
                    break
            await asyncio.sleep(0.1)

    monkeypatch.setattr(metrics, "REQUEST_DEADLINE_S", 0.6)
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET /healthz HTTP/1.1\r\n")
    started = time.monotonic()
    with pytest.raises((ConnectionError, OSError)):
        for i in range(50):  # 10 s of headers, if nobody stops it
            writer.write(b"X-Slow-%d: 1\r\n" % i)
            await writer.drain()
            if reader.at_eof() or await _eof_within(reader, 0.2):
                raise ConnectionError("closed by the server")
    assert time.monotonic() - started < 3
    writer.close()


async def _eof_within(reader: asyncio.StreamReader, seconds: float) -> bool:
    try:
        return await asyncio.wait_for(reader.read(1), seconds) == b""
    except TimeoutError:
        return False


async def test_a_sink_refusal_is_one_dead_letter_on_the_dashboard(tmp_path: Path) -> None:
    """The sink refuses one publication for good: the DLQ holds one message and the
    dashboard counts it once, as the plugin's (the broker's own row stays 0)."""
    reset_buses()
    config = _config(tmp_path)
    config["plugins"][0]["config"]["refuse_larger_than"] = 100
    registry = PluginRegistry.from_entry_points()
    gw = GatewayApp(parse_config(config, registry, base_dir=tmp_path), registry)
    await gw.start()
    try:
        await get_bus("feed").inject(Envelope(BULLETIN, "news", b"x" * 200))
        port = _port(gw)
        async with asyncio.timeout(15):
            while True:
                snap = await _snapshot(port)
                dead = {(d.source, d.reason): d.count for d in snap.dead_letters}
                if sum(n for (source, _), n in dead.items() if source == "plugin mem"):
                    break
                await asyncio.sleep(0.1)
        assert snap.dead_letter_depth == 1
        assert sum(dead.values()) == 1, dead
        assert dead[("broker", "undeliverable")] == 0
    finally:
        await gw.shutdown()
        reset_buses()


async def test_labelled_counters_have_their_known_series_from_the_start(
    app: GatewayApp,
) -> None:
    """Before any event: a series at 0 for every configured route's events, every
    neighbour's command results and every refusal reason at the MQ entrance, so a
    Grafana panel or an ``absent()`` alert does not read "No data"."""
    assert app.http is not None
    text = app.http.metrics.exposition().decode()
    for line in (
        'mqgw_request_reply_total{event="requests_sent",route="ask-svc"} 0.0',
        'mqgw_request_reply_total{event="timeouts",route="ask-svc"} 0.0',
        'mqgw_neighbour_commands_total{neighbour="BROKERA",result="failed"} 0.0',
        'mqgw_authorisation_refused_total{entrance="mq",reason="queue_not_listed"} 0.0',
        'mqgw_sink_dead_lettered_total{plugin="mem",reason="2003"} 0.0',
    ):
        assert line in text, line
