"""The engine's working set: what the broker remembers, in memory, for one unit of work.

Why its own module: the command handlers change subscriptions, publishers and retained
publications at once (a later message of the same batch must see the change), yet the
store may only learn of them when the MQ unit of work commits. So every change is made
here, queued as a store :class:`~gateway.pubsub.store.Mutation` and logged with its undo;
:meth:`WorkingSet.commit` writes the mutations, :meth:`WorkingSet.rollback` undoes them.
See docs/pubsub.md ("Units of work").

A neighbour's retained copy is stored *unsettled* and settled (:meth:`WorkingSet.settle`)
once the MQ unit of work that carried it committed; the settle rides the next batch
written, no write of its own (docs/neighbours.md, "Retained copies").
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from gateway.pubsub.records import PubKey, Publisher, RetainedPublication, SubKey, Subscription
from gateway.pubsub.store import (
    DeletePublisher,
    DeleteRetained,
    DeleteSubscription,
    Mutation,
    PubSubStore,
    PutRetained,
    SettleRetained,
    UpsertPublisher,
    UpsertSubscription,
)
from gateway.pubsub.topics import TopicIndex

__all__ = ["WorkingSet"]


class WorkingSet:
    """Subscriptions (with a topic index per stream), publishers and retained
    publications, plus the pending store mutations and their undo log.

    The mapping attributes are read directly by the matching code (hot path); change
    them only through the methods, which record the mutation and its undo.
    """

    __slots__ = (
        "_last_token",
        "_settles",
        "_undo",
        "_unsettled",
        "index",
        "pending",
        "publishers",
        "retained",
        "revision",
        "subs",
    )

    def __init__(self) -> None:
        self.subs: dict[SubKey, Subscription] = {}
        self.index: dict[str, TopicIndex[SubKey]] = {}
        self.publishers: dict[PubKey, Publisher] = {}
        #: stream -> topic -> retained publication
        self.retained: dict[str, dict[str, RetainedPublication]] = {}
        #: Store mutations made since the last commit/rollback, in order.
        self.pending: list[Mutation] = []
        self._undo: list[Callable[[], None]] = []
        #: counts changes of ``subs`` (a reader that saw it unchanged need not look again)
        self.revision = 0
        #: the last token given to an unsettled retained copy (tokens only grow)
        self._last_token = 0
        #: retained copies stored unsettled since the last commit/rollback
        self._unsettled: list[RetainedPublication] = []
        #: settles not written yet: they ride the next batch written
        self._settles: list[SettleRetained] = []

    @classmethod
    def load(cls, store: PubSubStore) -> WorkingSet:
        """The working set as the store last committed it."""
        ws = cls()
        snap = store.load()
        for sub in snap.subscriptions:
            ws._put_sub(sub)
        for pub in snap.publishers:
            ws.publishers[pub.key] = pub
        for ret in snap.retained:
            ws.retained.setdefault(ret.stream, {})[ret.topic] = ret
            ws._last_token = max(ws._last_token, ret.unsettled)
        return ws

    # ---------------------------------------------------------------- unit of work --

    def commit(self, store: PubSubStore) -> list[RetainedPublication]:
        """Write the pending mutations to ``store`` (one atomic batch). Returns the
        retained copies it stored unsettled: :meth:`settle` them once the MQ unit of
        work committed."""
        unsettled, self._unsettled = self._unsettled, []
        if self.pending:
            self._take_settles()
            store.apply(self.pending)
        self.pending.clear()
        self._undo.clear()
        return unsettled

    async def commit_async(self, store: PubSubStore) -> list[RetainedPublication]:
        """:meth:`commit`, awaiting the store's ``apply_async`` when it has one (its
        commit then runs off the event loop). Only what was pending when called is
        settled; the in-memory changes stay undoable until the batch is on disk.

        A cancellation while the store writes settles them too: ``apply_async`` raises
        ``CancelledError`` only once the submitted batch is on disk (a write that failed
        raises its own error), so a rollback afterwards cannot undo in memory what the
        store holds. Returns what :meth:`commit` does."""
        unsettled, self._unsettled = self._unsettled, []
        if self.pending:
            self._take_settles()
        pending, undo = len(self.pending), len(self._undo)
        if pending:
            apply_async = getattr(store, "apply_async", None)
            if apply_async is None:
                store.apply(self.pending)
            else:
                try:
                    await apply_async(self.pending[:pending])
                except asyncio.CancelledError:
                    del self.pending[:pending]
                    del self._undo[:undo]
                    raise
        del self.pending[:pending]
        del self._undo[:undo]
        return unsettled

    def rollback(self) -> None:
        """Forget the pending mutations and undo them in memory."""
        self.undo_since(0)
        self.pending.clear()
        self._unsettled.clear()

    def unsettled_token(self) -> int:
        """A token for the retained copies one neighbour's forward stores, unique in
        this store (tokens only grow, from the highest loaded)."""
        self._last_token += 1
        return self._last_token

    def settle(self, copies: list[RetainedPublication]) -> None:
        """The MQ unit of work that carried ``copies`` committed: they are settled now
        (a later replay of one is taken for one), in the store with the next batch
        written. Lost in a crash before that, a settle costs one duplicate delivery at
        a later replay, never a loss. Not undoable: a later batch's rollback restores a
        copy settled."""
        for ret in copies:
            if ret.unsettled:
                self._settles.append(SettleRetained(ret.stream, ret.topic, ret.unsettled))
                ret.unsettled = 0

    def write_settles(self, store: PubSubStore) -> None:
        """Write the settles waiting, on their own (a stop: no batch comes to carry
        them). Only between units of work: nothing may be pending."""
        if self._settles and not self.pending:
            store.apply(self._settles)
            self._settles = []

    def _take_settles(self) -> None:
        """Put the settles waiting into the batch about to be written (first: they
        concern copies stored by earlier batches)."""
        if self._settles:
            self.pending[:0] = self._settles
            self._settles = []

    def mark(self) -> int:
        """A point in the undo log to return to with :meth:`undo_since`."""
        return len(self._undo)

    def undo_since(self, mark: int) -> None:
        """Undo, newest first, every change made after ``mark`` (a failed command)."""
        for undo in reversed(self._undo[mark:]):
            undo()
        del self._undo[mark:]

    # ---------------------------------------------------------------- changes -------
    # Each applies the change, logs its undo and appends the store mutation to ``out``
    # (the command's own list: a failed command's mutations are dropped with it).

    def upsert_sub(self, sub: Subscription, out: list[Mutation]) -> None:
        previous = self.subs.get(sub.key)
        self._put_sub(sub)
        self._undo.append(
            (lambda: self._drop_sub(sub.key))
            if previous is None
            else (lambda: self._put_sub(previous))
        )
        out.append(UpsertSubscription(sub))

    def delete_sub(self, key: SubKey, out: list[Mutation]) -> None:
        previous = self.subs.get(key)
        if previous is None:
            return
        self._drop_sub(key)
        self._undo.append(lambda: self._put_sub(previous))
        out.append(DeleteSubscription(key))

    def upsert_publisher(self, pub: Publisher, out: list[Mutation]) -> None:
        previous = self.publishers.get(pub.key)
        self.publishers[pub.key] = pub

        def undo() -> None:
            if previous is None:
                self.publishers.pop(pub.key, None)
            else:
                self.publishers[pub.key] = previous

        self._undo.append(undo)
        out.append(UpsertPublisher(pub))

    def delete_publisher(self, key: PubKey, out: list[Mutation]) -> None:
        previous = self.publishers.pop(key, None)
        if previous is None:
            return
        self._undo.append(lambda: self.publishers.__setitem__(key, previous))
        out.append(DeletePublisher(key))

    def put_retained(self, ret: RetainedPublication, out: list[Mutation]) -> None:
        bucket = self.retained.setdefault(ret.stream, {})
        previous = bucket.get(ret.topic)
        bucket[ret.topic] = ret
        if ret.unsettled:
            self._unsettled.append(ret)

        def undo() -> None:
            if previous is None:
                bucket.pop(ret.topic, None)
            else:
                bucket[ret.topic] = previous

        self._undo.append(undo)
        out.append(PutRetained(ret))

    def delete_retained(self, stream: str, topic: str, out: list[Mutation]) -> None:
        bucket = self.retained.get(stream, {})
        previous = bucket.pop(topic, None)
        if previous is None:
            return
        self._undo.append(lambda: bucket.__setitem__(topic, previous))
        out.append(DeleteRetained(stream, topic))

    def _put_sub(self, sub: Subscription) -> None:
        self.revision += 1
        self.subs[sub.key] = sub
        index = self.index.get(sub.stream)
        if index is None:
            index = self.index[sub.stream] = TopicIndex()
        index.add(sub.key, sub.scheme, sub.topic)

    def _drop_sub(self, key: SubKey) -> None:
        self.revision += 1
        sub = self.subs.pop(key, None)
        if sub is not None:
            self.index[sub.stream].remove(key)
