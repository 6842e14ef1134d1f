"""Reading each node's view for ``mqgw network check``: its ``/healthz`` (the section
``network``), found from a gateway configuration (``metrics.host``/``port``, as ``mqgw
streams check`` finds a running gateway) or given as an address.

Everything a node answers is untrusted: at most ``max_bytes`` are read, each node has
its own timeout, redirects are not followed (a node cannot send the check elsewhere),
and a node that does not answer, answers too much, or answers something that is not a
valid view is reported with the reason, never as a traceback.
"""

from __future__ import annotations

import json
import ssl
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from pydantic import ValidationError

from gateway.runtime.network_check.check import Unreadable
from gateway.runtime.network_check.view import NodeView

__all__ = ["DEFAULT_MAX_BYTES", "NodeAddress", "address_of", "read_nodes"]

#: The largest /healthz answer read from one node (a gateway's is a few KiB to a few MiB
#: with thousands of streams).
DEFAULT_MAX_BYTES = 8 * 2**20
#: Nodes read at once.
PARALLEL_READS = 8


@dataclass(frozen=True, slots=True)
class NodeAddress:
    #: what the operator gave (a configuration file or an address), for the report
    source: str
    url: str


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None  # a 3xx is then an HTTPError: reported, not followed


def address_of(given: str) -> NodeAddress:
    """The /healthz address of a starting point: an ``http(s)://host:port[/path]``
    address (no path: ``/healthz``), else a gateway configuration file. ValueError with
    the reason when it is neither."""
    if "://" in given:
        parts = urlsplit(given)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"{given}: not an http:// or https:// address")
        try:
            parts.port  # noqa: B018 - raises on a bad port
        except ValueError:
            raise ValueError(f"{given}: not a valid port") from None
        path = parts.path if parts.path not in ("", "/") else "/healthz"
        return NodeAddress(given, f"{parts.scheme}://{parts.netloc}{path}")
    from gateway.runtime.streams.cli_support import load

    loaded = load(Path(given))
    if isinstance(loaded, str):
        raise ValueError(loaded)
    mc = loaded.gateway.metrics
    if not mc.enabled:
        raise ValueError(f"{given}: metrics are disabled (metrics.enabled: false): the "
                         "gateway has no /healthz to read; give its address instead")
    host = "127.0.0.1" if mc.host in ("0.0.0.0", "::", "") else mc.host
    host = f"[{host}]" if ":" in host else host
    scheme = "https" if mc.tls is not None else "http"
    return NodeAddress(given, f"{scheme}://{host}:{mc.port}/healthz")


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


def _read_one(
    address: NodeAddress, timeout: float, max_bytes: int, tls: ssl.SSLContext | None
) -> NodeView | Unreadable:
    opener = urllib.request.build_opener(
        _NoRedirects(), urllib.request.HTTPSHandler(context=tls)
    )
    try:
        try:
            resp = opener.open(address.url, timeout=timeout)
        except urllib.error.HTTPError as exc:
            if exc.code != 503:  # a degraded gateway answers 503 with the same JSON
                return Unreadable(address.source, f"{address.url} answers HTTP {exc.code}")
            resp = exc
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
    section = detail.get("network") if isinstance(detail, dict) else None
    if section is None:
        why = ("carries no network view yet (it has just started, or is an older version)"
               if isinstance(detail, dict) else "does not answer a JSON object")
        return Unreadable(address.source, f"{address.url} {why}")
    try:
        return NodeView.model_validate(section)
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
    at once, each bounded by ``timeout`` seconds per socket operation."""
    tls = ssl.create_default_context(cafile=str(cafile) if cafile else None)
    with ThreadPoolExecutor(max_workers=max(1, min(PARALLEL_READS, len(addresses)))) as pool:
        results = list(pool.map(lambda a: _read_one(a, timeout, max_bytes, tls), addresses))
    return list(zip(addresses, results, strict=True))
