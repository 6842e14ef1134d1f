"""Connection lists: MQ's ``CONNAME('host1(port),host2(port)')``.

Why: a multi-instance node (or an IBM MQ multi-instance queue manager) is reached at
whichever of its addresses accepts: a standby does not listen, so a client or a sender
channel tries the addresses in order and takes the first that answers, as MQ clients
and channels do with a connection list. One parser for every place that takes one
(channels' CONNAME, the IBM MQ client's ``conname``), pure and bounded: an outsider's
MQSC or configuration cannot make the gateway hold or try more than
:data:`MAX_ADDRESSES` addresses of at most :data:`MAX_CONNAME_LENGTH` characters.
"""

from __future__ import annotations

import re

__all__ = [
    "MAX_ADDRESSES",
    "MAX_CONNAME_LENGTH",
    "ConnameError",
    "format_conname",
    "is_conname_list",
    "parse_conname_list",
]

#: MQ_CONN_NAME_LENGTH: the longest CONNAME IBM MQ accepts.
MAX_CONNAME_LENGTH = 264
#: Addresses in one list (MQ bounds a list by its length only; a multi-instance node has
#: two instances, native HA three: eight leaves room without letting a list grow).
MAX_ADDRESSES = 8

_ENTRY = re.compile(r"^([A-Za-z0-9_.:\-\[\]%]+)\((\d{1,5})\)$")
_HOST = re.compile(r"^[A-Za-z0-9_.:\-\[\]%]+$")


class ConnameError(ValueError):
    """A CONNAME (list) that is not ``host(port)[,host(port)...]``; says what is wrong."""


def is_conname_list(conname: str) -> bool:
    """Whether ``conname`` is meant as addresses (``host(port)``, one or more) rather
    than a name to look up (an address book's listener name)."""
    return "(" in conname or "," in conname


def parse_conname_list(conname: str, *, default_port: int | None = None) -> list[tuple[str,
                                                                                    int]]:
    """``'host1(port),host2(port)'`` -> ``[(host1, port), (host2, port)]`` in order.

    Blanks around entries are ignored, as MQ does. ``default_port``: an entry without
    ``(port)`` gets it (MQ's 1414 for clients); None: every entry needs its port.
    ConnameError for an empty list or entry, a malformed entry, a port outside 1-65535,
    more than :data:`MAX_ADDRESSES` entries or more than :data:`MAX_CONNAME_LENGTH`
    characters."""
    if len(conname) > MAX_CONNAME_LENGTH:
        raise ConnameError(f"CONNAME has {len(conname)} characters; at most "
                           f"{MAX_CONNAME_LENGTH} (MQ_CONN_NAME_LENGTH)")
    if not conname.strip():
        raise ConnameError("CONNAME is empty: give host(port) or a list "
                           "host1(port),host2(port)")
    entries = conname.split(",")
    if len(entries) > MAX_ADDRESSES:
        raise ConnameError(f"CONNAME lists {len(entries)} addresses; at most {MAX_ADDRESSES}")
    out: list[tuple[str, int]] = []
    for number, raw in enumerate(entries, 1):
        entry = re.sub(r"\s+", "", raw)
        if not entry:
            raise ConnameError(f"CONNAME({conname}): address {number} is empty "
                               "(a stray comma?)")
        m = _ENTRY.match(entry)
        if m:
            host, port = m.group(1), int(m.group(2))
        elif default_port is not None and _HOST.match(entry):
            host, port = entry, default_port
        else:
            raise ConnameError(f"CONNAME({conname}): address {number} {raw.strip()!r} is "
                               "not host(port)")
        if not 1 <= port <= 65535:
            raise ConnameError(f"CONNAME({conname}): address {number} has port {port}, "
                               "not 1-65535")
        out.append((host, port))
    return out


def format_conname(addresses: list[tuple[str, int]]) -> str:
    """The inverse of :func:`parse_conname_list`: ``host1(port),host2(port)``."""
    return ",".join(f"{host}({port})" for host, port in addresses)
