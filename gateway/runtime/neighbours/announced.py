"""What a neighbour may announce: the screening of a StreamSupport stream list (pure).

Why: the stream list of a neighbour's StreamSupport publication becomes common streams,
the stream union (queues `streams check --fix` defines, names `--write-config` writes),
our own StreamSupport, ``neighbours.db``, ``/healthz`` and ``/metrics``. Anything that
can put on the inter-broker queue can send one (MQ does not say who put a message), so
the list is screened before anything of it is kept: every name must be an MQ object
name, the list at most ``max_streams`` long (else it is refused whole), and only the
names the neighbour's ``accept_streams`` globs allow are kept (docs/security.md).
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Collection, Iterable
from dataclasses import dataclass

from gateway.pubsub.streams import ADMIN_STREAM, DEFAULT_STREAM

__all__ = [
    "ACCEPT_ALL",
    "DEFAULT_MAX_STREAMS",
    "Screened",
    "accepts_stream",
    "screen_streams",
    "stored_streams",
    "valid_stream_name",
]

#: An MQ object name: 1-48 characters of A-Z a-z 0-9 . / _ %.
_MQ_OBJECT_NAME = re.compile(r"[A-Za-z0-9./_%]{1,48}")
#: The default ``accept_streams``: every stream except MQ's own ``SYSTEM.`` names.
ACCEPT_ALL = ("*",)
#: The default ``max_streams`` of a neighbour.
DEFAULT_MAX_STREAMS = 100
#: The broker streams every broker supports (accepted whatever the globs say).
_BROKER_STREAMS = frozenset({DEFAULT_STREAM, ADMIN_STREAM})


def valid_stream_name(name: str) -> bool:
    """True for a name MQ accepts as a queue name (a stream is its queue)."""
    return _MQ_OBJECT_NAME.fullmatch(name) is not None


def accepts_stream(globs: Iterable[str], name: str) -> bool:
    """Does one of ``globs`` (``*``, ``?``, ``[...]``, case-sensitive) allow ``name``?
    A ``SYSTEM.`` name is allowed only by a glob that itself starts with ``SYSTEM.``
    (``*`` does not hand MQ's own queues to a neighbour), except the default and admin
    streams, which every broker supports."""
    if name in _BROKER_STREAMS:
        return True
    system = name.startswith("SYSTEM.")
    return any(
        fnmatch.fnmatchcase(name, g) and (not system or g.startswith("SYSTEM."))
        for g in globs
    )


@dataclass(frozen=True, slots=True)
class Screened:
    """The verdict on one announced list: ``refusal`` is "" when ``streams`` (the names
    kept) may be installed, else why the whole list is refused ("invalid",
    "too_many"); ``not_allowed`` counts the valid names the globs do not allow."""

    streams: tuple[str, ...]
    refusal: str = ""
    detail: str = ""
    not_allowed: int = 0


def screen_streams(
    names: Collection[str],
    *,
    accept: Iterable[str] = ACCEPT_ALL,
    max_streams: int = DEFAULT_MAX_STREAMS,
) -> Screened:
    """Screen the stream names of a StreamSupport (module docstring). The names are
    announced blank-padded by some brokers: trailing blanks are not part of a name."""
    if len(names) > max_streams:
        return Screened(
            (), "too_many", f"{len(names)} streams, more than its max_streams ({max_streams})"
        )
    kept: list[str] = []
    not_allowed = 0
    globs = tuple(accept)
    for raw in names:
        name = raw.rstrip(" ")
        if not valid_stream_name(name):
            shown = name[:60].encode("unicode_escape").decode("ascii")
            return Screened((), "invalid", f"stream name {shown!r} is not an MQ object name")
        if accepts_stream(globs, name):
            kept.append(name)
        else:
            not_allowed += 1
    return Screened(tuple(dict.fromkeys(kept)), not_allowed=not_allowed)


def stored_streams(
    names: Collection[str],
    *,
    accept: Iterable[str] = ACCEPT_ALL,
    max_streams: int = DEFAULT_MAX_STREAMS,
) -> tuple[str, ...]:
    """What may be kept of a stream list remembered in ``neighbours.db`` (a gateway
    before issue 29 kept any list it was sent): the valid names the globs allow; none
    when there are more than ``max_streams`` of them."""
    globs = tuple(accept)
    kept = tuple(
        dict.fromkeys(
            n.rstrip(" ") for n in names
            if valid_stream_name(n.rstrip(" ")) and accepts_stream(globs, n.rstrip(" "))
        )
    )
    return kept if len(kept) <= max_streams else ()
