"""The network check's edges: reading nodes over HTTP from hostile servers on 127.0.0.1,
the command's limits and exit statuses, the view a running gateway builds (its
``/network``, the dashboard's Network check, ``mqgw_network_problems``) and reading it
behind the metrics credentials."""

from __future__ import annotations

import asyncio
import base64
import json
import socket
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from gateway.devstack.certs import make_dev_certificates
from gateway.runtime.app import GatewayApp
from gateway.runtime.cli import main
from gateway.runtime.config import parse_config
from gateway.runtime.dashboard import Snapshot
from gateway.runtime.network_check.check import Unreadable
from gateway.runtime.network_check.read import NodeAddress, address_of, read_nodes
from gateway.runtime.network_check.view import NodeView
from gateway.runtime.registry import PluginRegistry
from plugins.memory import reset_buses

GOOD_VIEW = {"q_mgr": "QMA", "gateway": "gw-a", "serviced": ["S1"],
             "sinks": {"S1": ["k"]}, "mq": {"local_queues": ["S1"]}}


class Server:
    """A one-thread HTTP server on 127.0.0.1 answering every connection with
    ``respond(conn)`` (the test decides how hostile)."""

    def __init__(self, respond: Callable[[socket.socket], None]) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.respond = respond
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _serve(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            with conn:
                conn.settimeout(5)
                try:
                    conn.recv(65536)
                    self.respond(conn)
                except OSError:
                    pass

    def close(self) -> None:
        self.stop.set()
        self.thread.join(5)
        self.sock.close()


def answer(body: bytes, status: str = "200 OK", extra: str = "") -> Callable[[socket.socket], None]:
    def respond(conn: socket.socket) -> None:
        conn.sendall(f"HTTP/1.1 {status}\r\nContent-Type: application/json\r\n{extra}"
                     f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode() + body)
    return respond


@pytest.fixture
def serve() -> Iterator[Callable[[Callable[[socket.socket], None]], Server]]:
    servers: list[Server] = []

    def start(respond: Callable[[socket.socket], None]) -> Server:
        servers.append(Server(respond))
        return servers[-1]

    yield start
    for s in servers:
        s.close()


def read_one(url: str, **kw: Any) -> NodeView | Unreadable:
    ((_, got),) = read_nodes([address_of(url)], timeout=kw.pop("timeout", 2.0), **kw)
    return got


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_a_good_view_is_read(serve: Callable[..., Server]) -> None:
    srv = serve(answer(json.dumps(GOOD_VIEW).encode()))
    got = read_one(srv.url)
    assert isinstance(got, NodeView) and got.q_mgr == "QMA" and got.sinks == {"S1": ["k"]}


@pytest.mark.parametrize(("body", "why"), [
    (b"no network view yet\n", "carries no network view yet"),
    (b"credentials unavailable\n", "cannot read its own metrics.auth credentials"),
    (b"x" * 100_000, "answers HTTP 503"),
], ids=["no-view-yet", "credentials-unavailable", "anything-else"])
def test_a_503_says_why(serve: Callable[..., Server], body: bytes, why: str) -> None:
    got = read_one(serve(answer(body, "503 Service Unavailable")).url)
    assert isinstance(got, Unreadable) and why in got.why, got


def test_a_refused_connection_is_unreadable() -> None:
    got = read_one(f"http://127.0.0.1:{free_port()}")
    assert isinstance(got, Unreadable) and "does not answer" in got.why


def test_a_node_that_never_answers_is_cut_off(serve: Callable[..., Server]) -> None:
    hang = threading.Event()
    srv = serve(lambda conn: hang.wait(10))
    started = time.monotonic()
    got = read_one(srv.url, timeout=0.5)
    hang.set()
    assert isinstance(got, Unreadable) and "did not answer within 0.5 s" in got.why
    assert time.monotonic() - started < 5


def test_a_node_dripping_its_answer_is_cut_off_at_its_timeout(
    serve: Callable[..., Server],
) -> None:
    stop = threading.Event()

    def drip(conn: socket.socket) -> None:
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n")
        while not stop.is_set():
            conn.sendall(b" ")
            stop.wait(0.05)

    srv = serve(drip)
    started = time.monotonic()
    got = read_one(srv.url, timeout=0.5)
    stop.set()
    assert isinstance(got, Unreadable) and "did not answer within 0.5 s" in got.why
    assert time.monotonic() - started < 3


def test_an_oversized_answer_is_refused(serve: Callable[..., Server]) -> None:
    body = json.dumps({**GOOD_VIEW, "gateway": "x" * 5000}).encode()
    got = read_one(serve(answer(body)).url, max_bytes=4096)
    assert isinstance(got, Unreadable) and "more than 4096 bytes" in got.why


def test_a_redirect_is_not_followed(serve: Callable[..., Server]) -> None:
    target = serve(answer(json.dumps(GOOD_VIEW).encode()))
    srv = serve(answer(b"", "302 Found", f"Location: {target.url}/network\r\n"))
    got = read_one(srv.url)
    assert isinstance(got, Unreadable) and "HTTP 302" in got.why


@pytest.mark.parametrize(("body", "why"), [
    (b"<html>", "does not answer JSON"),
    (b"[1]", "does not answer a JSON object"),
    (b'{"status": "ok"}', "answers a view the check refuses"),
    (json.dumps({**GOOD_VIEW, "q_mgr": "<script>alert(1)</script>"}).encode(),
     "answers a view the check refuses"),
    (json.dumps({**GOOD_VIEW, "serviced": ["S\x1b]0;pwned\x07"]}).encode(),
     "answers a view the check refuses"),
])
def test_what_is_not_a_view_is_unreadable(
    serve: Callable[..., Server], body: bytes, why: str
) -> None:
    got = read_one(serve(answer(body)).url)
    assert isinstance(got, Unreadable) and why in got.why, got


def test_the_command_reports_and_escapes(
    serve: Callable[..., Server], capsys: pytest.CaptureFixture[str]
) -> None:
    """A hostile node's markup and control characters never reach the output raw; an
    unreadable node makes the exit status 1."""
    good = serve(answer(json.dumps(GOOD_VIEW).encode()))
    bad = serve(answer(b"nope", "418 \x1b[31mteapot"))
    assert main(["network", "check", good.url, bad.url]) == 1
    out = capsys.readouterr().out
    assert "\x1b" not in out and "[node-unreadable]" in out and "HTTP 418" in out
    assert main(["network", "check", "--json", good.url]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["ok"] and data["streams"][0]["owners"] == ["QMA"]


def test_the_command_limits_and_usage_errors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    urls = [f"http://127.0.0.1:{p}" for p in range(20001, 20006)]
    assert main(["network", "check", "--max-nodes", "4", *urls]) == 2
    assert "5 nodes given, more than --max-nodes 4" in capsys.readouterr().err
    assert main(["network", "check", "ftp://127.0.0.1:1"]) == 2
    assert "not an http:// or https:// address" in capsys.readouterr().err
    cfg = tmp_path / "gw.yaml"
    cfg.write_text("queue_manager: {name: QMA, data_dir: qm}\nmetrics: {enabled: false}\n")
    assert main(["network", "check", str(cfg)]) == 2
    assert "metrics are disabled" in capsys.readouterr().err


def test_a_configuration_gives_its_metrics_address(tmp_path: Path) -> None:
    cfg = tmp_path / "gw.yaml"
    cfg.write_text("queue_manager: {name: QMA, data_dir: qm}\n"
                   "metrics: {host: 0.0.0.0, port: 19464}\n")
    assert address_of(str(cfg)) == NodeAddress(str(cfg), "http://127.0.0.1:19464/network")
    assert address_of("https://h:1").url == "https://h:1/network"


def test_the_topology_runner_keeps_its_options(capsys: pytest.CaptureFixture[str]) -> None:
    """``mqgw network TOPOLOGY --qm QM`` still parses as before ``check`` was added."""
    with pytest.raises(SystemExit) as exc:
        main(["network", "nosuch-topology.yaml", "--qm", "QM1", "--help"])
    assert exc.value.code == 0 and "--qm QM" in capsys.readouterr().out


# ------------------------------------------------------------ a running gateway -----


def _config(tmp_path: Path) -> dict[str, Any]:
    mqsc = tmp_path / "routes.mqsc"
    mqsc.write_text(
        "DEFINE QLOCAL(QMX) USAGE(XMITQ) REPLACE\n"
        "DEFINE QREMOTE(S3) RNAME(S3) RQMNAME(QMX) REPLACE\n"
        "DEFINE QALIAS(PUB.S1) TARGET(S1) REPLACE\n"
    )
    return {
        "id": "gw-view",
        "queue_manager": {"name": "GWVIEW", "data_dir": str(tmp_path / "qm"),
                          "mqsc_file": str(mqsc)},
        "broker": {"streams": [{"name": "S1"}], "wait_ms": 50},
        "metrics": {"port": 0},
        # no channel, no transmission queue: the link stays joining, with no route
        "neighbours": [{"q_mgr": "BROKERA", "kind": "gateway", "streams": ["S1"]}],
        "plugins": [
            {"name": "own", "plugin": "memory",
             "config": {"bus": "own", "subscribe": ["$SYS/STREAM/S1/#"]}},
        ],
    }


@pytest.fixture
async def app(tmp_path: Path) -> AsyncIterator[GatewayApp]:
    reset_buses()
    registry = PluginRegistry.from_entry_points()
    gw = GatewayApp(parse_config(_config(tmp_path), registry, base_dir=tmp_path), registry)
    await gw.start()
    try:
        yield gw
    finally:
        await gw.shutdown()
        reset_buses()


async def _get(port: int, path: str) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    await writer.drain()
    raw = await asyncio.wait_for(reader.read(), 10)
    writer.close()
    return raw.partition(b"\r\n\r\n")[2]


async def test_a_running_gateway_describes_itself_and_sees_its_neighbourhood(
    app: GatewayApp,
) -> None:
    assert app.http is not None
    port = app.http.port
    # the view is rebuilt with each housekeeping sample (every <= 5 s); the neighbour
    # row appears once the links started
    async with asyncio.timeout(20):
        while True:
            view = json.loads(await _get(port, "/network") or b"null")
            if view and view["neighbours"]:
                break
            await asyncio.sleep(0.1)
    node = NodeView.model_validate(view)
    assert (node.q_mgr, node.gateway) == ("GWVIEW", "gw-view")
    assert "S1" in node.serviced and "SYSTEM.BROKER.ADMIN.STREAM" not in node.serviced
    assert node.sinks == {"S1": ["own"]}
    assert [(n.q_mgr, n.kind, n.role, n.state) for n in node.neighbours] == [
        ("BROKERA", "gateway", "child", "joining")]
    assert node.mq is not None
    assert "S1" in node.mq.local_queues and node.mq.transmission_queues == ["QMX"]
    assert node.mq.remote_queues["S3"].rqmname == "QMX"
    assert node.mq.alias_queues == {"PUB.S1": "S1"}
    snap = Snapshot.model_validate_json(await _get(port, "/dashboard/api/snapshot"))
    seen = {(p.code, p.subject) for p in snap.network_problems}
    assert seen == {
        ("neighbour-not-active", "GWVIEW-BROKERA"),
        ("neighbour-no-route", "GWVIEW-BROKERA"),
    }, snap.network_problems
    assert snap.network_problem_count == 2


# ------------------------------------------------- a gateway behind its credentials -----

TOKEN = "s3cret-token-for-the-check"


@pytest.fixture
async def authed(tmp_path: Path) -> AsyncIterator[GatewayApp]:
    """A running gateway whose metrics listener requires a bearer token (from a file)."""
    async with _running(tmp_path, {}) as gw:
        yield gw


@asynccontextmanager
async def _running(tmp_path: Path, metrics: dict[str, Any]) -> AsyncIterator[GatewayApp]:
    reset_buses()
    (tmp_path / "token").write_text(TOKEN + "\n")
    data = _config(tmp_path)
    data["metrics"] = {"port": 0, "auth": {"token": {"file": str(tmp_path / "token")}},
                       **metrics}
    registry = PluginRegistry.from_entry_points()
    gw = GatewayApp(parse_config(data, registry, base_dir=tmp_path), registry)
    await gw.start()
    try:
        assert gw.http is not None
        # the view is rebuilt with each housekeeping sample (every <= 5 s)
        # and its neighbour row once the links started
        async with asyncio.timeout(20):
            while not (gw.network_view and gw.network_view.neighbours):
                await asyncio.sleep(0.05)
        yield gw
    finally:
        await gw.shutdown()
        reset_buses()


async def _get_full(port: int, path: str, authorization: str | None = None) -> tuple[int, bytes]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    auth = f"Authorization: {authorization}\r\n" if authorization else ""
    writer.write(f"GET {path} HTTP/1.1\r\nHost: x\r\n{auth}\r\n".encode())
    await writer.drain()
    raw = await asyncio.wait_for(reader.read(), 10)
    writer.close()
    head, _, body = raw.partition(b"\r\n\r\n")
    return int(head.split()[1]), body


def _yaml(tmp_path: Path, port: int, auth: str) -> Path:
    cfg = tmp_path / "node.yaml"
    cfg.write_text(f"queue_manager: {{name: GWVIEW, data_dir: qm}}\n"
                   f"metrics: {{port: {port}, auth: {auth}}}\n")
    return cfg


async def test_a_node_with_auth_refuses_an_unauthenticated_read(authed: GatewayApp) -> None:
    """/network carries the routing definitions: behind the metrics credentials, and
    /healthz (open to probes) no longer carries them."""
    assert authed.http is not None
    port = authed.http.port
    status, body = await _get_full(port, "/network")
    assert status == 401 and b"GWVIEW" not in body
    status, body = await _get_full(port, "/network", "Bearer wrong")
    assert status == 401 and b"GWVIEW" not in body
    status, body = await _get_full(port, "/healthz")
    assert "network" not in json.loads(body)
    status, body = await _get_full(port, "/network", f"Bearer {TOKEN}")
    assert status == 200
    view = NodeView.model_validate_json(body)
    assert (view.q_mgr, view.gateway) == ("GWVIEW", "gw-view")


async def test_the_yamls_credentials_work(
    authed: GatewayApp, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert authed.http is not None
    (tmp_path / "tok2").write_text(TOKEN)
    cfg = _yaml(tmp_path, authed.http.port, f"{{token: {{file: {tmp_path / 'tok2'}}}}}")
    status = await asyncio.to_thread(main, ["network", "check", "--json", str(cfg)])
    out = capsys.readouterr().out
    data = json.loads(out)
    assert [n["q_mgr"] for n in data["nodes"]] == ["GWVIEW"], data
    assert not [p for p in data["problems"] if p["code"] == "node-unreadable"], data
    assert status == 1  # its neighbour is not read: a problem, but the node itself is
    assert TOKEN not in out
    # the same node without the credentials in its YAML is not read
    bare = tmp_path / "bare.yaml"
    bare.write_text(f"queue_manager: {{name: GWVIEW, data_dir: qm}}\n"
                    f"metrics: {{port: {authed.http.port}}}\n")
    status = await asyncio.to_thread(main, ["network", "check", str(bare)])
    assert status == 1 and "unauthorised (check the credentials)" in capsys.readouterr().out


async def test_an_address_with_a_token_file_works(
    authed: GatewayApp, tmp_path: Path, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert authed.http is not None
    url = f"http://127.0.0.1:{authed.http.port}"
    token_file = tmp_path / "tok"
    token_file.write_text(TOKEN + "\n")
    await asyncio.to_thread(main, ["network", "check", "--json", "--token-file",
                                   str(token_file), url])
    data = json.loads(capsys.readouterr().out)
    assert [n["q_mgr"] for n in data["nodes"]] == ["GWVIEW"], data
    # ... and from the environment when no option names the credentials
    monkeypatch.setenv("MQGW_NETWORK_TOKEN", TOKEN)
    await asyncio.to_thread(main, ["network", "check", "--json", url])
    data = json.loads(capsys.readouterr().out)
    assert [n["q_mgr"] for n in data["nodes"]] == ["GWVIEW"], data


async def test_a_401_is_reported_cleanly(
    authed: GatewayApp, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert authed.http is not None
    url = f"http://127.0.0.1:{authed.http.port}"
    wrong = "not-the-token-at-all"
    (tmp_path / "wrong").write_text(wrong)
    status = await asyncio.to_thread(main, ["network", "check", "--token-file",
                                            str(tmp_path / "wrong"), url])
    got = capsys.readouterr()
    assert status == 1
    assert "[node-unreadable]" in got.out and "unauthorised (check the credentials)" in got.out
    assert "Traceback" not in got.err and wrong not in got.out + got.err
    # no credentials at all: the same, per node
    status = await asyncio.to_thread(main, ["network", "check", url])
    assert status == 1 and "unauthorised (check the credentials)" in capsys.readouterr().out


def test_a_yaml_node_sends_its_configured_credentials(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Basic credentials from the YAML (the password from the environment, as the
    gateway reads it); never in the address's repr."""
    monkeypatch.setenv("NODE_PW", "pa55word")
    cfg = _yaml(tmp_path, 19465, "{username: probe, password: {env: NODE_PW}}")
    got = address_of(str(cfg))
    assert got.url == "http://127.0.0.1:19465/network"
    assert got.authorization == "Basic " + base64.b64encode(b"probe:pa55word").decode()
    assert "pa55word" not in repr(got) and "cHJvYmU6cGE1NXdvcmQ" not in repr(got)
    monkeypatch.delenv("NODE_PW")
    with pytest.raises(ValueError, match="NODE_PW"):
        address_of(str(cfg))


def test_credential_options_are_checked(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = "http://127.0.0.1:1"
    assert main(["network", "check", "--user", "probe", url]) == 2
    assert "--password-file" in capsys.readouterr().err
    (tmp_path / "t").write_text("a\nb\n")  # a line break would forge a header
    assert main(["network", "check", "--token-file", str(tmp_path / "t"), url]) == 2
    err = capsys.readouterr().err
    assert "control character" in err and "a\nb" not in err
    assert main(["network", "check", "--token-file", str(tmp_path / "none"), url]) == 2
    assert "none" in capsys.readouterr().err
    assert main(["network", "check", "http://probe:pa55@127.0.0.1:1"]) == 2
    err = capsys.readouterr().err
    assert "credentials in an address are refused" in err and "pa55" not in err


async def test_the_node_counts_its_own_network_problems(authed: GatewayApp) -> None:
    """mqgw_network_problems{code}: the problems of its own view, zero for the other
    codes its view can produce."""
    assert authed.http is not None
    status, body = await _get_full(authed.http.port, "/metrics", f"Bearer {TOKEN}")
    text = body.decode()
    assert status == 200
    assert 'mqgw_network_problems{code="neighbour-not-active"} 1.0' in text
    assert 'mqgw_network_problems{code="neighbour-no-route"} 1.0' in text
    assert 'mqgw_network_problems{code="neighbour-loop"} 0.0' in text
    assert 'mqgw_network_problems{code="stream-not-routed"} 0.0' in text
    assert 'code="node-duplicate"' not in text  # needs a second node's view


async def test_an_https_node_is_read_with_its_own_certificate(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A YAML node with metrics.tls: https, its certificate trusted as its configuration
    names it (a privately issued one, no CA given); an address is checked against
    --cafile, and a certificate of another CA is refused."""
    certs = await asyncio.to_thread(make_dev_certificates, tmp_path / "certs")
    tls = {"cert_file": str(certs.server_cert), "key_file": str(certs.server_key)}
    async with _running(tmp_path, {"tls": tls}) as gw:
        assert gw.http is not None
        port = gw.http.port
        cfg = _yaml(tmp_path, port, f"{{token: {{file: {tmp_path / 'token'}}}}}, "
                    f"tls: {{cert_file: {certs.server_cert}, key_file: {certs.server_key}}}")
        assert address_of(str(cfg)).url == f"https://127.0.0.1:{port}/network"
        await asyncio.to_thread(main, ["network", "check", "--json", str(cfg)])
        data = json.loads(capsys.readouterr().out)
        assert [n["q_mgr"] for n in data["nodes"]] == ["GWVIEW"], data
        url = f"https://127.0.0.1:{port}"
        token = ["--token-file", str(tmp_path / "token")]
        await asyncio.to_thread(main, ["network", "check", "--json", "--cafile",
                                       str(certs.ca_cert), *token, url])
        data = json.loads(capsys.readouterr().out)
        assert [n["q_mgr"] for n in data["nodes"]] == ["GWVIEW"], data
        status = await asyncio.to_thread(main, ["network", "check", "--cafile",
                                                str(certs.other_ca_cert), *token, url])
        out = capsys.readouterr().out
        assert status == 1 and "[node-unreadable]" in out and "CERTIFICATE_VERIFY_FAILED" in out
