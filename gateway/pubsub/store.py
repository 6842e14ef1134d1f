"""The storage port of the broker: where subscriptions, publishers and retained
publications survive restarts.

The engine keeps the working set in memory (the match index needs it there anyway)
and writes through this small protocol in *batches of mutations*: the I/O loop applies
one batch per MQ unit of work, just before committing that unit of work. Every mutation
is an idempotent upsert or delete, and command results are journalled by MsgId, so
processing the same command again after a crash between the store commit and the MQ
commit changes nothing (see docs/pubsub.md, "Ordering of commits").

Two implementations: :class:`MemoryStore` (tests, throw-away brokers) and
``gateway.pubsub.sqlite_store.SqliteStore`` (durable; SQLite in WAL mode).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from gateway.pubsub.records import (
    PubKey,
    Publisher,
    RetainedPublication,
    SubKey,
    Subscription,
)


@dataclass(frozen=True, slots=True)
class UpsertSubscription:
    subscription: Subscription


@dataclass(frozen=True, slots=True)
class DeleteSubscription:
    key: SubKey


@dataclass(frozen=True, slots=True)
class UpsertPublisher:
    publisher: Publisher


@dataclass(frozen=True, slots=True)
class DeletePublisher:
    key: PubKey


@dataclass(frozen=True, slots=True)
class PutRetained:
    retained: RetainedPublication


@dataclass(frozen=True, slots=True)
class DeleteRetained:
    stream: str
    topic: str


@dataclass(frozen=True, slots=True)
class SettleRetained:
    """The retained copy of ``stream``/``topic`` stored unsettled with ``token`` is
    settled (its MQ unit of work committed); a newer copy there is left as it is."""

    stream: str
    topic: str
    token: int


@dataclass(frozen=True, slots=True)
class RecordCommand:
    """Journal entry: the result of a command message, keyed by queue and MsgId."""

    queue: str
    msg_id: bytes
    comp_code: int
    reason: int


Mutation = (
    UpsertSubscription
    | DeleteSubscription
    | UpsertPublisher
    | DeletePublisher
    | PutRetained
    | DeleteRetained
    | SettleRetained
    | RecordCommand
)


@dataclass(slots=True)
class StoreSnapshot:
    """Everything a store holds, as loaded at start-up."""

    subscriptions: list[Subscription] = field(default_factory=list)
    publishers: list[Publisher] = field(default_factory=list)
    retained: list[RetainedPublication] = field(default_factory=list)


class PubSubStore(Protocol):
    """Durable state of the broker. Synchronous on purpose: the engine is sans-I/O and
    the service calls it once per unit of work (SQLite commits take well under a ms)."""

    def load(self) -> StoreSnapshot:
        """Every subscription, publisher and retained publication."""
        ...

    def apply(self, mutations: Sequence[Mutation]) -> None:
        """Apply all mutations atomically (all or none), durably once it returns."""
        ...

    def recorded_result(self, queue: str, msg_id: bytes) -> tuple[int, int] | None:
        """(comp_code, reason) journalled for a command message, if it was processed."""
        ...

    def close(self) -> None: ...


class MemoryStore:
    """A store that lives as long as the process: same semantics, no durability."""

    def __init__(self) -> None:
        self._subs: dict[SubKey, Subscription] = {}
        self._pubs: dict[PubKey, Publisher] = {}
        self._retained: dict[tuple[str, str], RetainedPublication] = {}
        self._journal: dict[tuple[str, bytes], tuple[int, int]] = {}
        self.applied_batches = 0

    def load(self) -> StoreSnapshot:
        return StoreSnapshot(
            list(self._subs.values()), list(self._pubs.values()), list(self._retained.values())
        )

    def apply(self, mutations: Sequence[Mutation]) -> None:
        for m in mutations:
            if isinstance(m, UpsertSubscription):
                self._subs[m.subscription.key] = m.subscription
            elif isinstance(m, DeleteSubscription):
                self._subs.pop(m.key, None)
            elif isinstance(m, UpsertPublisher):
                self._pubs[m.publisher.key] = m.publisher
            elif isinstance(m, DeletePublisher):
                self._pubs.pop(m.key, None)
            elif isinstance(m, PutRetained):
                self._retained[m.retained.key] = m.retained
            elif isinstance(m, DeleteRetained):
                self._retained.pop((m.stream, m.topic), None)
            elif isinstance(m, SettleRetained):
                held = self._retained.get((m.stream, m.topic))
                if held is not None and held.unsettled == m.token:
                    self._retained[held.key] = dataclasses.replace(held, unsettled=0)
            else:
                self._journal[(m.queue, m.msg_id)] = (m.comp_code, m.reason)
        self.applied_batches += 1

    def recorded_result(self, queue: str, msg_id: bytes) -> tuple[int, int] | None:
        return self._journal.get((queue, msg_id))

    def close(self) -> None:
        return None
