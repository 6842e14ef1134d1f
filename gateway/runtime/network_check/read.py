"""Reading each node's view for ``mqgw network check``: its ``GET /network``, found from
a gateway configuration (``metrics.host``/``port``, ``https`` with ``metrics.tls``, the
credentials of ``metrics.auth``) or given as an address (the credentials from
:func:`address_credentials`).

The view names the node's routing definitions, so it is behind the same credentials as
``/metrics``; they travel only in the ``Authorization`` header, never in a report, an
error or a ``repr``.

Everything a node answers is untrusted: at most ``max_bytes`` are read, each node has
its own timeout, redirects are not followed (a node cannot send the check elsewhere),
and a node that does not answer, answers too much, or answers something that is not a
valid view is reported with the reason, never as a traceback.
"""

from __future__ import annotations

import base64
import json
import os
import ssl
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from pydantic import ValidationError

from gateway.runtime.network_check.check import Unreadable
from gateway.runtime.network_check.view import NETWORK_PATH, NodeView
from gateway.secrets import Secret, SecretError

__all__ = [
    "DEFAULT_MAX_BYTES", "TOKEN_ENV", "UNAUTHORISED", "NodeAddress", "address_credentials",
    "address_of", "read_nodes",
]

#: The bearer token for nodes given as addresses, when no option names credentials.
TOKEN_ENV = "MQGW_NETWORK_TOKEN"
#: What a node's 401 is reported as.
UNAUTHORISED = "unauthorised (check the credentials)"

#: The largest answer read from one node (a gateway's is a few KiB to a few MiB
#: with thousands of streams).
DEFAULT_MAX_BYTES = 8 * 2**20
#: Nodes read at once.
PARALLEL_READS = 8


@dataclass(frozen=True, slots=True)
class NodeAddress:
    #: what the operator gave (a configuration file or an address), for the report
    source: str
    url: str
    #: the ``Authorization`` header's value, if any (kept out of the repr)
    authorization: str | None = field(default=None, repr=False)
    #: a certificate file trusted for this node besides the system's CAs (the gateway's
    #: own ``metrics.tls.cert_file``; ``--cafile`` replaces both)
    cafile: Path | None = None


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None  # a 3xx is then an HTTPError: reported, not followed


def _header(scheme: str, credential: str, what: str) -> str:
    """The Authorization value; a control character (a line break would forge a header)
    is refused naming ``what``, never the value."""
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in credential):
        raise ValueError(f"{what} contains a line break or another control character")
    return f"{scheme} {credential}"


def _basic(username: str, password: str, what: str) -> str:
    raw = f"{username}:{password}"
    _header("Basic", raw, what)  # the plain text is what must hold no control character
    return f"Basic {base64.b64encode(raw.encode('utf-8')).decode('ascii')}"


def address_credentials(
    token_file: Path | None = None,
    user: str | None = None,
    password_file: Path | None = None,
) -> str | None:
    """The Authorization value for nodes given as addresses: a bearer token from
    ``token_file``, basic credentials from ``user`` and ``password_file``, else the token
    in the environment variable TOKEN_ENV, else none. Files are read as the gateway reads
    a ``{file: PATH}`` secret (trailing newline stripped). ValueError with the reason
    (naming the file or the variable, never the value)."""
    try:
        if token_file is not None:
            token = Secret(file=token_file).reveal()
            return _header("Bearer", token, f"--token-file {token_file}")
        if user is not None and password_file is not None:
            password = Secret(file=password_file).reveal()
            return _basic(user, password, f"--user/--password-file {password_file}")
        if os.environ.get(TOKEN_ENV):
            return _header("Bearer", Secret(env=TOKEN_ENV).reveal(), TOKEN_ENV)
    except SecretError as exc:
        raise ValueError(str(exc)) from None
    return None


def address_of(given: str, authorization: str | None = None) -> NodeAddress:
    """Where to read a starting point's view: an ``http(s)://host:port[/path]`` address
    (no path: ``/network``; ``authorization`` sent to it), else a gateway configuration
    file (its metrics listener and its own credentials). ValueError with the reason when
    it is neither or its credentials cannot be read."""
    if "://" in given:
        parts = urlsplit(given)
        if "@" in parts.netloc:  # user:password@ would put a secret in argv and the report
            raise ValueError(f"{parts.scheme}://...@{parts.netloc.rpartition('@')[2]}: "
                             "credentials in an address are refused: give --token-file "
                             f"or --user and --password-file (or {TOKEN_ENV})")
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"{given}: not an http:// or https:// address")
        try:
            parts.port  # noqa: B018 - raises on a bad port
        except ValueError:
            raise ValueError(f"{given}: not a valid port") from None
        path = parts.path if parts.path not in ("", "/") else NETWORK_PATH
        return NodeAddress(given, f"{parts.scheme}://{parts.netloc}{path}", authorization)
    from gateway.runtime.streams.cli_support import load

    loaded = load(Path(given))
    if isinstance(loaded, str):
        raise ValueError(loaded)
    mc = loaded.gateway.metrics
    if not mc.enabled:
        raise ValueError(f"{given}: metrics are disabled (metrics.enabled: false): the "
                         f"gateway has no {NETWORK_PATH} to read; give its address instead")
    host = "127.0.0.1" if mc.host in ("0.0.0.0", "::", "") else mc.host
    host = f"[{host}]" if ":" in host else host
    scheme = "https" if mc.tls is not None else "http"
    header = None
    auth = mc.auth
    if auth is not None:
        try:
            if auth.token is not None:
                header = _header("Bearer", auth.token.reveal(), f"{given}: metrics.auth.token")
            elif auth.username is not None and auth.password is not None:
                header = _basic(auth.username, auth.password.reveal(),
                                f"{given}: metrics.auth.password")
        except SecretError as exc:
            raise ValueError(f"{given}: metrics.auth: {exc}") from None
    cafile = loaded.path(mc.tls.cert_file) if mc.tls is not None else None
    return NodeAddress(given, f"{scheme}://{host}:{mc.port}{NETWORK_PATH}", header, cafile)


def _read_body(resp: Any, max_bytes: int, deadline: float) -> bytes:
    """At most ``max_bytes + 1`` bytes, all by ``deadline`` (a node dripping its answer
    cannot hold the check longer than its timeout and one socket read)."""
    chunks: list[bytes] = []
    size = 0
    read = getattr(resp, "read1", resp.read)  # what has arrived, not "wait for n bytes"
    while size <= max_bytes:
        if time.monotonic() > deadline:
            raise TimeoutError
        chunk = read(min(65536, max_bytes + 1 - size))
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks)


def _refused(address: NodeAddress, exc: urllib.error.HTTPError, timeout: float) -> Unreadable:
    """What an error status says: 401 the credentials, 503 (a few bytes of its body
    read) no view yet or the node's own credentials unreadable."""
    if exc.code == 401:
        return Unreadable(address.source, f"{address.url} answers HTTP 401: {UNAUTHORISED}")
    why = f"{address.url} answers HTTP {exc.code}"
    if exc.code == 503:
        with exc:
            try:
                start = _read_body(exc, 64, time.monotonic() + timeout)
            except (OSError, ValueError):
                start = b""
        if start.startswith(b"credentials unavailable"):
            why += ": it cannot read its own metrics.auth credentials (its log says why)"
        elif start.startswith(b"no network view"):
            why = f"{address.url} carries no network view yet (it has just started)"
    return Unreadable(address.source, why)


def _read_one(
    address: NodeAddress, timeout: float, max_bytes: int, tls: ssl.SSLContext | None
) -> NodeView | Unreadable:
    opener = urllib.request.build_opener(
        _NoRedirects(), urllib.request.HTTPSHandler(context=tls)
    )
    request = urllib.request.Request(address.url)
    if address.authorization is not None:
        request.add_unredirected_header("Authorization", address.authorization)
    try:
        try:
            resp = opener.open(request, timeout=timeout)
        except urllib.error.HTTPError as exc:
            return _refused(address, exc, timeout)
        with resp:
            body = _read_body(resp, max_bytes, time.monotonic() + timeout)
    except TimeoutError:
        return Unreadable(address.source, f"{address.url} did not answer within {timeout:g} s "
                          "(--timeout)")
    except (OSError, ValueError, ssl.SSLError) as exc:
        reason = getattr(exc, "reason", None) or exc
        return Unreadable(address.source, f"{address.url} does not answer ({reason})")
    if len(body) > max_bytes:
        return Unreadable(address.source, f"{address.url} answers more than {max_bytes} "
                          "bytes (--max-bytes)")
    try:
        detail = json.loads(body)
    except ValueError:
        return Unreadable(address.source, f"{address.url} does not answer JSON")
    if not isinstance(detail, dict):
        return Unreadable(address.source, f"{address.url} does not answer a JSON object")
    try:
        return NodeView.model_validate(detail)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])[:80]
        return Unreadable(address.source, f"{address.url} answers a view the check refuses "
                          f"({exc.error_count()} error(s); first at {where}: {first['msg']})")


def read_nodes(
    addresses: Sequence[NodeAddress],
    *,
    timeout: float,
    max_bytes: int = DEFAULT_MAX_BYTES,
    cafile: Path | None = None,
) -> list[tuple[NodeAddress, NodeView | Unreadable]]:
    """Each address's view (or why not), in the order given; at most PARALLEL_READS
    at once, each bounded by ``timeout`` seconds per socket operation. ``cafile``: the
    CA certificates https nodes are checked against (default: the system's, and a
    configuration's own certificate for its node)."""
    contexts: dict[Path | None, ssl.SSLContext | ValueError] = {}

    def tls_for(a: NodeAddress) -> ssl.SSLContext | ValueError:
        key = None if cafile is not None else a.cafile
        if key not in contexts:
            contexts[key] = _client_context(cafile, key)
        return contexts[key]

    def read(a: NodeAddress, tls: ssl.SSLContext | ValueError) -> NodeView | Unreadable:
        if isinstance(tls, ValueError):
            return Unreadable(a.source, str(tls))
        return _read_one(a, timeout, max_bytes, tls)

    pairs = [(a, tls_for(a)) for a in addresses]
    with ThreadPoolExecutor(max_workers=max(1, min(PARALLEL_READS, len(addresses)))) as pool:
        results = list(pool.map(lambda p: read(*p), pairs))
    return list(zip(addresses, results, strict=True))


def _client_context(cafile: Path | None, own_cert: Path | None) -> ssl.SSLContext | ValueError:
    """Checks the server's certificate and host name: against ``cafile``, else the
    system's CAs plus ``own_cert`` (a node's certificate, trusted as it is: a partial
    chain suffices). A ValueError (reported for the nodes it concerns) when a file cannot
    be loaded."""
    try:
        ctx = ssl.create_default_context(cafile=str(cafile) if cafile else None)
    except (OSError, ssl.SSLError) as exc:
        return ValueError(f"--cafile {cafile} cannot be loaded ({exc})")
    if own_cert is not None:
        try:
            ctx.load_verify_locations(cafile=str(own_cert))
        except (OSError, ssl.SSLError) as exc:
            return ValueError(f"metrics.tls.cert_file {own_cert} cannot be loaded ({exc}): "
                              "give the CA with --cafile")
        ctx.verify_flags |= ssl.VERIFY_X509_PARTIAL_CHAIN
    return ctx
