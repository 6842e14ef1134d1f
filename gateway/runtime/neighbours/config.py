"""Configuration of neighbour brokers (YAML ``neighbours:``, ``mqgw broker --neighbour``).

A neighbour is another broker on another queue manager reached through MQ channels, a
queue-manager alias or a cluster (docs/neighbours.md). Validated here, at the boundary,
so the links and the state never see a name MQ would refuse.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from gateway.pubsub.neighbours import NeighbourKind, NeighbourRole
from gateway.runtime.neighbours.announced import ACCEPT_ALL, DEFAULT_MAX_STREAMS

__all__ = ["MQ_NAME", "NeighbourConfig", "parse_neighbour_spec", "unique_neighbours"]

#: An MQ queue-manager or queue name: 1-48 characters of A-Z a-z 0-9 . _ / %.
MQ_NAME = r"^[A-Za-z0-9._%/]{1,48}$"
_STREAM = r"^[A-Za-z0-9._%]{1,48}$"
_GLOB = r"^[A-Za-z0-9._%/*?\[\]!]{1,48}$"


class NeighbourConfig(BaseModel):
    """One neighbour: its queue manager, what kind of broker it is, its role and,
    optionally, the streams to share with it (None: whatever it says it supports)."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    q_mgr: str = Field(pattern=MQ_NAME)
    """The neighbour's queue manager; one entry per queue manager."""
    kind: NeighbourKind = NeighbourKind.MQPUBSUB
    """``mqpubsub``: a legacy MQ Publish/Subscribe broker (MQRFH commands); ``mqv7``: an MQ V7+
    queue manager's queued pub/sub (``mqgw neighbours mqsc QM`` prints its MQSC);
    ``gateway``: another gateway (MQRFH2)."""
    role: NeighbourRole = NeighbourRole.CHILD
    """The neighbour's role: ``parent`` or ``child``; at most one neighbour is the parent."""
    streams: list[str] | None = None
    """Streams to share. None: whatever the neighbour says it supports (its StreamSupport
    publication); given: only these, of those it supports. The default stream is always
    shared."""
    publish: Literal["subscribed", "all"] = "subscribed"
    """``subscribed``: forward a publication only for the neighbour's subscriptions
    registered here (a gateway, or a broker that registers its interest with RegSub);
    ``all``: every publication on a shared stream, registered or not — for a real
    legacy broker, which propagates its subscriptions only with its own protocol."""
    probe_timeout: float = Field(default=5.0, gt=0.0, le=300.0)
    """How long a loop probe may take to come back before the join is accepted (s)."""
    accept_streams: list[str] = Field(default_factory=lambda: list(ACCEPT_ALL), min_length=1)
    """Which streams of the neighbour's StreamSupport are taken (globs; ``*`` takes
    every stream except MQ's own ``SYSTEM.`` queues, docs/security.md)."""
    max_streams: int = Field(default=DEFAULT_MAX_STREAMS, ge=1, le=10_000)
    """A StreamSupport naming more streams than this is refused whole."""

    @field_validator("streams")
    @classmethod
    def _stream_names(cls, value: list[str] | None) -> list[str] | None:
        if value is None:
            return None

        for name in value:
            if not re.fullmatch(_STREAM, name):
                raise ValueError(
                    f"stream {name!r} is not a stream queue name (1-48 of A-Z a-z 0-9 . _ %)"
                )
        return sorted(set(value))

    @field_validator("accept_streams")
    @classmethod
    def _stream_globs(cls, value: list[str]) -> list[str]:
        for glob in value:
            if not re.fullmatch(_GLOB, glob):
                raise ValueError(
                    f"accept_streams {glob!r} is not a stream name glob (1-48 of A-Z a-z "
                    "0-9 . / _ % and the wildcards * ? [ ] !)"
                )
        return value


def unique_neighbours(value: list[NeighbourConfig]) -> list[NeighbourConfig]:
    """Validator body shared by the gateway and broker sections: one entry per queue
    manager, at most one parent (a broker has one parent in a hierarchy)."""
    seen: set[str] = set()
    for n in value:
        if n.q_mgr in seen:
            raise ValueError(f"neighbour {n.q_mgr} is listed twice")
        seen.add(n.q_mgr)
    parents = [n.q_mgr for n in value if n.role is NeighbourRole.PARENT]
    if len(parents) > 1:
        raise ValueError(f"at most one neighbour may be the parent, not {', '.join(parents)}")
    return value


def parse_neighbour_spec(spec: str) -> NeighbourConfig:
    """``QM[:kind[:role[:S1,S2]]]`` (``mqgw broker --neighbour``) -> NeighbourConfig;
    raises pydantic's ValidationError (or ValueError) on a bad part."""
    parts = spec.split(":")
    if len(parts) > 4:
        raise ValueError(f"--neighbour {spec!r}: expected QM[:kind[:role[:S1,S2]]]")
    data: dict[str, object] = {"q_mgr": parts[0]}
    if len(parts) > 1 and parts[1]:
        data["kind"] = parts[1]
    if len(parts) > 2 and parts[2]:
        data["role"] = parts[2]
    if len(parts) > 3 and parts[3]:
        data["streams"] = [s for s in parts[3].split(",") if s]
    return NeighbourConfig.model_validate(data)
