"""Destinations named from outside: resolved as MQ resolves them, then checked against
the names the gateway keeps for itself (sans-I/O, synchronous, pure).

Why one module: a subscriber queue in a RegSub, the ReplyToQ of a command or of a
service request, a requester route's destination -- each is a name an outside party (or
an operator's alias) chooses, and the gateway then writes there with its own authority.
Checked by name alone, a queue alias (``DEFINE QALIAS(APP.Q) TARGET(STOCK.STREAM)``) or a
queue-manager alias of this queue manager (``DEFINE QREMOTE(SELF) RQMNAME(QM1)``) turns
the broker's deliveries back into commands on its own stream queue, or puts
publications on the dead-letter queue without an MQDLH. So every such name is first
*resolved* the way MQ resolves it (queue aliases, chains of queue-manager aliases,
clusters: the runtime supplies the resolver -- the embedded queue manager's own name
resolution, or MQOPEN's resolved names on IBM MQ) and the result is checked. The same
:class:`OwnQueues` answers for the pub/sub engine, the authoriser and request/reply
(docs/security.md, "Destinations named from outside").

The gateway's own queues: every ``SYSTEM.`` queue of this queue manager (the stream,
control, admin, dead-letter, inter-broker, cluster and command queues, the sink backlogs
``SYSTEM.MQGW.*``), the queues it services or keeps whatever their names (stream queues,
its dead-letter queue, request/reply queues), and its transmission queues.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Collection
from dataclasses import dataclass

from gateway.pubsub.streams import INTER_BROKER_QUEUE

__all__ = [
    "KEPT_QUEUE",
    "SYSTEM_QUEUE",
    "TRANSMISSION_QUEUE",
    "OwnQueue",
    "OwnQueues",
    "QueueResolver",
    "QueueUse",
    "ResolvedQueue",
    "identity_resolver",
]


class QueueUse(enum.StrEnum):
    """What the gateway will put on a queue an outsider named."""

    #: a RegSub's subscriber queue: no SYSTEM. queue anywhere (another broker's
    #: inter-broker queue aside: its proxy subscriptions)
    SUBSCRIBER = "subscriber queue"
    #: the ReplyToQ of a pub/sub command, for the broker's response: checked on this
    #: queue manager only (brokers answer each other on their SYSTEM. queues)
    RESPONSE = "response queue"
    #: the ReplyToQ of a request a service route forwards, for the responder's reply: no
    #: SYSTEM. queue anywhere
    REPLY = "reply-to queue"
    #: a requester route's destination (the operator's, requests from outside): no
    #: SYSTEM. queue anywhere (a queue manager's command queue takes PCF commands)
    DESTINATION = "request destination"


@dataclass(frozen=True, slots=True)
class ResolvedQueue:
    """Where a message put to a named queue lands: ``queue`` at ``q_mgr``. ``path``
    lists the definitions followed (for the refusal's text)."""

    q_mgr: str
    queue: str
    path: tuple[str, ...] = ()


#: (queue manager, queue) as named -> where MQ's name resolution puts a message for it,
#: or None when it does not resolve (the put itself would then fail: not a loop).
QueueResolver = Callable[[str, str], ResolvedQueue | None]


def identity_resolver(q_mgr: str, queue: str) -> ResolvedQueue | None:
    """Resolution by name only (no definitions known: e.g. IBM MQ at registration)."""
    return ResolvedQueue(q_mgr, queue)


class OwnQueues:
    """The queues of this queue manager the gateway keeps for itself, and the check of a
    named queue against them (module docstring).

    ``q_mgr_name`` is this queue manager (a blank queue manager means it);
    ``kept`` are the queues it services or keeps under any name; ``is_kept`` asks about
    the ones that can change at run time (the queue manager's DEADQ);
    ``is_transmission_queue`` asks the queue manager's definitions; ``resolve`` is MQ's
    name resolution.
    """

    __slots__ = ("is_kept", "is_transmission_queue", "kept", "q_mgr_name", "resolve")

    def __init__(
        self,
        q_mgr_name: str,
        kept: Collection[str] = (),
        *,
        is_transmission_queue: Callable[[str], bool] = lambda queue: False,
        resolve: QueueResolver = identity_resolver,
        is_kept: Callable[[str], bool] = lambda queue: False,
    ) -> None:
        self.q_mgr_name = q_mgr_name.strip()
        self.kept = frozenset(q.strip() for q in kept if q.strip())
        self.is_transmission_queue = is_transmission_queue
        self.resolve = resolve
        self.is_kept = is_kept

    def with_kept(self, more: Collection[str]) -> OwnQueues:
        """The same rule with more queues kept (the request/reply queues)."""
        return OwnQueues(
            self.q_mgr_name,
            self.kept | {q.strip() for q in more},
            is_transmission_queue=self.is_transmission_queue,
            resolve=self.resolve,
            is_kept=self.is_kept,
        )

    @property
    def resolves_names(self) -> bool:
        """Whether :attr:`resolve` knows the queue manager's definitions (the embedded
        queue manager's own resolution), not only names."""
        return self.resolve is not identity_resolver

    def is_local(self, q_mgr: str) -> bool:
        q_mgr = q_mgr.strip()
        return not q_mgr or q_mgr == self.q_mgr_name

    def why_own(
        self, q_mgr: str, queue: str, use: QueueUse, resolved: ResolvedQueue | None = None
    ) -> OwnQueue | None:
        """Why the gateway may not put there for ``use``, or None.

        On this queue manager: its ``SYSTEM.`` queues, the queues it keeps and its
        transmission queues. On others: ``SYSTEM.`` queues, except for a broker's
        response (and another broker's inter-broker queue for a subscriber:
        :class:`QueueUse`). The name as
        given is checked, then where it resolves to: ``resolved`` when the caller has it
        (MQOPEN's resolved names), else :attr:`resolve`."""
        name, qm = queue.strip(), q_mgr.strip()
        named = name if self.is_local(qm) else f"{name} at {qm}"
        kind = self._kind(qm, name, use)
        if kind is not None:
            return OwnQueue(kind, named, _WHY[kind])
        if resolved is None:
            resolved = self.resolve(qm, name)
        if resolved is None:
            return None
        r_qm, r_q = resolved.q_mgr.strip(), resolved.queue.strip()
        if (r_qm or self.q_mgr_name, r_q) == (qm or self.q_mgr_name, name):
            return None
        kind = self._kind(r_qm, r_q, use)
        if kind is None:
            return None
        via = " -> ".join(resolved.path) if resolved.path else f"{named} -> {r_q}"
        where = r_q if self.is_local(r_qm) else f"{r_q} at {r_qm}"
        return OwnQueue(kind, named, f"resolves to {where} ({via}), which {_WHY[kind]}")

    def _kind(self, q_mgr: str, name: str, use: QueueUse) -> str | None:
        local = self.is_local(q_mgr)
        if name.startswith("SYSTEM."):
            if not local and (
                use in _LOCAL_ONLY or (use is QueueUse.SUBSCRIBER and name == INTER_BROKER_QUEUE)
            ):
                return None
            return SYSTEM_QUEUE
        if local and (name in self.kept or self.is_kept(name)):
            return KEPT_QUEUE
        if local and self.is_transmission_queue(name):
            return TRANSMISSION_QUEUE
        return None


_LOCAL_ONLY = frozenset({QueueUse.RESPONSE})

#: The kinds of :class:`OwnQueue` (the ``reason`` label of the refusal counter).
SYSTEM_QUEUE = "system_queue"
KEPT_QUEUE = "broker_queue"
TRANSMISSION_QUEUE = "transmission_queue"
_WHY = {
    SYSTEM_QUEUE: "is a SYSTEM. queue",
    KEPT_QUEUE: "is a queue the gateway services or keeps (a stream, dead-letter or "
    "request/reply queue)",
    TRANSMISSION_QUEUE: "is a transmission queue",
}


@dataclass(frozen=True, slots=True)
class OwnQueue:
    """A named queue that is (or resolves to) one of the gateway's own: ``kind`` is one of
    :data:`SYSTEM_QUEUE`, :data:`KEPT_QUEUE`, :data:`TRANSMISSION_QUEUE`; ``named`` the
    queue as named, ``why`` the rest of the sentence ("is a SYSTEM. queue", "resolves to
    ... which is ...")."""

    kind: str
    named: str
    why: str

    @property
    def detail(self) -> str:
        return f"{self.named} {self.why}"
