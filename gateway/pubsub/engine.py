"""The publish/subscribe engine: command message in, typed outcome out (sans-I/O).

Modelled on h11: :meth:`PubSubEngine.handle` takes one inbound message (MQMD, body, the
queue it arrived on and that queue's Implicit Stream Naming flag) and returns an
:class:`Outcome` — deliveries (destination + MQMD + body), an optional response, an
optional dead-letter action with the MQDLH reason, and the store mutations it made. It
never touches a queue; the runtime's broker service does the I/O.

This module is the bookkeeping around one command: decode it, check where it arrived,
answer a redelivered command as the first time, undo a failed command's changes, build
the response. The rest lives beside it, one concept each:

* :mod:`gateway.pubsub.working_set` — subscriptions, publishers and retained
  publications in memory, the pending store mutations, commit and rollback;
* :mod:`gateway.pubsub.handlers` — what each command (Publish, RegSub, ...) means;
* :mod:`gateway.pubsub.fanout` — matching a publication and building its deliveries.

State changes are applied to the in-memory working set at once (so a later message of
the same batch sees them) and queued as *pending mutations*. The service calls
:meth:`PubSubEngine.commit` once the MQ puts of the unit of work succeeded and just
before the MQ commit, or :meth:`PubSubEngine.rollback` when it backs out, which undoes
the in-memory changes too. See docs/pubsub.md for why this order loses nothing.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Collection, Mapping
from types import MappingProxyType

from gateway.pubsub.authorisation import Authoriser, Decision, own_queue_refusal
from gateway.pubsub.commands import STREAM_COMMANDS, CommandName, HeaderKind
from gateway.pubsub.destinations import OwnQueues, QueueUse
from gateway.pubsub.errors import CommandError, CommandRefusedError
from gateway.pubsub.fanout import Fanout
from gateway.pubsub.handlers import CommandHandlers
from gateway.pubsub.inbound import ParsedCommand, decode_command_message
from gateway.pubsub.neighbours import Neighbour
from gateway.pubsub.options import RegOpt
from gateway.pubsub.outcome import (
    Counters,
    DeadLetter,
    Delivery,
    InboundMessage,
    OutboundMessage,
    Outcome,
)
from gateway.pubsub.records import (
    Destination,
    Publisher,
    RetainedPublication,
    SubKey,
    Subscription,
)
from gateway.pubsub.responses import ResponseDetail, build_response
from gateway.pubsub.store import Mutation, PubSubStore, RecordCommand
from gateway.pubsub.streams import (
    ADMIN_STREAM,
    CONTROL_QUEUE,
    DEFAULT_STREAM,
    INTER_BROKER_QUEUE,
    split_subscription_topic,
)
from gateway.pubsub.topics import Scheme
from gateway.pubsub.working_set import WorkingSet
from gateway.wire.constants import CompCode, MsgType
from gateway.wire.errors import WireError
from gateway.wire.folder import Element
from gateway.wire.formats import FMT_RF_HEADER_2
from gateway.wire.mqmd import MQMD
from gateway.wire.reasons import Reason
from gateway.wire.rfh import MQRFH

__all__ = ["Counters", "PubSubEngine"]

log = logging.getLogger(__name__)


class PubSubEngine:
    """Queued publish/subscribe broker logic over a :class:`PubSubStore`.

    ``q_mgr_name`` is the broker's queue manager (blank identity queue managers resolve
    to it; forwarded publications carry it in ReplyToQMgr/PutApplName). ``clock``
    returns seconds since the epoch (injectable for tests).

    ``own_queues`` (:mod:`gateway.pubsub.destinations`) are the queues the gateway keeps
    for itself -- every ``SYSTEM.`` queue of its queue manager, the queues it services
    (stream queues, the dead-letter queue), its transmission queues -- with MQ's name
    resolution; without it, ``broker_queues`` and names alone. No subscriber may name one
    of them, directly or through an alias (a publication delivered to a stream queue
    would be published again, for ever), and no response goes to one. Subscriptions to
    them found in the store are removed at construction and by
    :meth:`drop_subscriptions_to_own_queues` (the queue manager's definitions changed).
    ``suspend_after`` consecutive failed puts to a subscriber queue suspend its
    subscriptions (docs/pubsub.md).

    ``neighbours`` (queue manager -> :class:`Neighbour`, replaced at run time with
    :meth:`set_neighbours`) are the brokers this one exchanges publications with:
    deliveries to their subscriptions are forwarded Publish commands and DeletePubs
    propagate to them (docs/neighbours.md). ``supported_streams`` set is the legacy
    profile: commands on any other stream (the admin and default streams are always
    supported) are refused with MQRCCF_STREAM_ERROR, as the V6 broker did.

    ``authoriser`` (:mod:`gateway.pubsub.authorisation`) refuses what the policy does
    not allow with MQRCCF_NOT_AUTHORIZED: the response, and the command dead-lettered.
    """

    def __init__(
        self,
        q_mgr_name: str,
        store: PubSubStore,
        *,
        clock: Callable[[], float] = time.time,
        broker_queues: Collection[str] = (),
        suspend_after: int = 10,
        neighbours: Mapping[str, Neighbour] | None = None,
        supported_streams: frozenset[str] | None = None,
        authoriser: Authoriser | None = None,
        own_queues: OwnQueues | None = None,
    ) -> None:
        if suspend_after < 1:
            raise ValueError(f"suspend_after must be at least 1, not {suspend_after}")
        self.q_mgr_name = q_mgr_name
        self.store = store
        self.clock = clock
        self.counters = Counters()
        self.broker_queues = frozenset(q.strip() for q in broker_queues)
        self.own_queues = own_queues or (
            authoriser.own_queues if authoriser is not None
            else OwnQueues(q_mgr_name, self.broker_queues)
        )
        #: Responses not sent because their ReplyToQ is (or resolves to) a queue of
        #: the gateway's own.
        self.responses_refused = 0
        self.suspend_after = suspend_after
        self.supported_streams = (
            None
            if supported_streams is None
            else frozenset(supported_streams) | {DEFAULT_STREAM, ADMIN_STREAM}
        )
        #: Subscriptions to broker queues removed from the store at construction.
        self.removed_broker_queue_subscriptions = 0
        #: Times a subscriber queue's subscriptions were suspended.
        self.suspensions = 0
        #: Failed puts to neighbours' queues (never suspended; the DLQ has them).
        self.neighbour_delivery_failures = 0
        #: Consecutive failed puts per subscriber queue (q_mgr, queue), in memory.
        self._failures: dict[tuple[str, str], int] = {}
        self._state = WorkingSet.load(store)
        self._fanout = Fanout(self._state, q_mgr_name, clock, dict(neighbours or {}))
        #: Stream/topic/subscriber-queue authorisation (None: everything allowed).
        self.authoriser = authoriser
        #: backlog queue -> its registered sink (the service keeps it): a RegSub or
        #: DeregSub naming one changes that sink's subscriptions (``mqgw streams move``)
        self.sink_queues: dict[str, str] = {}
        #: the service's check of such a command's seal, ``(md, body) -> ""`` or why not
        #: (gateway/runtime/sink_command_seal.py); None: every one is refused (no key
        #: here: IBM MQ). The seal is the authority, not the command's identity
        self.sink_command_check: Callable[[MQMD, bytes], str] | None = None
        #: the streams configured ``sinks: owner`` here: a sink command is taken for
        #: these only (the service sets them)
        self.sink_owner_streams: frozenset[str] = frozenset()
        self._handlers = CommandHandlers(
            self._state,
            self._fanout,
            q_mgr_name,
            clock,
            self.counters,
            self.why_broker_queue,
            authoriser,
            self.sink_of,
            self.why_not_sink_command,
        )
        self.drop_subscriptions_to_own_queues()

    def sink_of(self, q_mgr: str, queue: str) -> str:
        """The registered sink whose backlog queue ``queue`` at ``q_mgr`` is, or ""."""
        if q_mgr.strip() not in ("", self.q_mgr_name):
            return ""
        return self.sink_queues.get(queue.strip(), "")

    def why_not_sink_command(self, md: MQMD, body: bytes, streams: Collection[str]) -> str:
        """"" when a RegSub/DeregSub of a sink on ``streams`` may be taken (sealed by the
        gateway's key, recent, every stream ``sinks: owner`` here); else why not."""
        check = self.sink_command_check
        if check is None:
            return "this broker takes no sink command (it has no backlog key to check it)"
        if why := check(md, body):
            return why
        others = sorted(set(streams) - self.sink_owner_streams)
        if others:
            return f"stream {others[0]} is not configured `sinks: owner` here"
        return ""

    def is_broker_queue(self, q_mgr: str, queue: str) -> bool:
        """True when ``queue`` at ``q_mgr`` is (or resolves to) a queue of this queue
        manager that the gateway services or keeps for itself."""
        return self.why_broker_queue(q_mgr, queue) != ""

    def why_broker_queue(self, q_mgr: str, queue: str) -> str:
        """Why ``queue`` at ``q_mgr`` is (or resolves to) one of the gateway's own queues
        of this queue manager (one sentence), or ""."""
        own = self.own_queues.why_own(q_mgr, queue, QueueUse.RESPONSE)
        return "" if own is None else own.detail

    def drop_subscriptions_to_own_queues(self) -> int:
        """Remove (and commit) the stored subscriptions whose queue is, or now resolves
        to, one of the gateway's own: each would loop or leak its publications, restart
        after restart. Called at construction and when the queue manager's definitions
        change (an alias defined after the subscription). Returns how many."""
        out: list[Mutation] = []
        for key, sub in list(self._state.subs.items()):
            d = sub.destination
            if d.is_sink:
                continue
            why = self.why_broker_queue(d.q_mgr, d.queue)
            if why:
                log.warning(
                    "removed subscription %r on stream %s: its queue %s is the gateway's "
                    "own (%s)",
                    sub.topic,
                    sub.stream,
                    d,
                    why,
                )
                self._state.delete_sub(key, out)
        if out:
            self.removed_broker_queue_subscriptions += len(out)
            self._state.pending.extend(out)
            self.commit()
        return len(out)

    # ---------------------------------------------------------------- neighbours ----

    @property
    def neighbours(self) -> Mapping[str, Neighbour]:
        """The neighbour brokers by queue manager (read-only view)."""
        return MappingProxyType(self._fanout.neighbours)

    def set_neighbours(self, neighbours: Mapping[str, Neighbour]) -> None:
        """Replace the neighbours (a join or clear). A cleared neighbour's proxy
        subscriptions are dropped by :meth:`drop_neighbour_subscriptions`."""
        self._fanout.neighbours = dict(neighbours)

    def drop_neighbour_subscriptions(self, q_mgr: str) -> int:
        """Remove (and commit) the subscriptions broker ``q_mgr`` registered here as a
        neighbour: its proxies (identity ``q_mgr`` and the stream's own queue) and its
        administrative ones (to the inter-broker queue). Called when it is cleared: left
        in place, each would turn into an ordinary subscription until its DeregSub came,
        and two brokers that cleared each other would send each publication back and
        forth. Its other subscriptions (an application on its queue manager) stay.
        Returns how many."""
        out: list[Mutation] = []
        for key, sub in list(self._state.subs.items()):
            d = sub.destination
            if d.is_sink or d.q_mgr != q_mgr:
                continue
            if d.queue.strip() in (sub.stream, INTER_BROKER_QUEUE):
                self._state.delete_sub(key, out)
        if out:
            self._state.pending.extend(out)
            self.commit()
        return len(out)

    # ---------------------------------------------------------------- delivery fate --

    @property
    def suspended_subscriptions(self) -> int:
        """How many subscriptions are suspended now (/metrics, /healthz)."""
        return sum(1 for s in self._state.subs.values() if s.suspended)

    def delivered(self, q_mgr: str, queue: str) -> None:
        """A put to ``queue`` worked: its run of failures is over."""
        if self._failures:
            self._failures.pop((q_mgr or self.q_mgr_name, queue), None)

    def delivery_failed(self, q_mgr: str, queue: str, reason: int) -> None:
        """A put to ``queue`` failed (it went to the DLQ instead). After
        ``suspend_after`` failures in a row the queue's subscriptions are suspended with
        the current unit of work: their matches stop going to the DLQ.

        A neighbour broker's proxy subscriptions are never suspended: a full
        transmission queue in a channel outage would otherwise cut the neighbour off for
        good (its links never register an acknowledged proxy again). Their failures are
        counted and logged once per ``suspend_after`` in a row."""
        target = (q_mgr or self.q_mgr_name, queue)
        count = self._failures.get(target, 0) + 1
        self._failures[target] = count
        neighbour = target[0] in self._fanout.neighbours
        if neighbour:
            self.neighbour_delivery_failures += 1
        if count < self.suspend_after:
            return
        if neighbour:
            self._failures.pop(target, None)
            log.warning(
                "%d puts in a row to neighbour %s's queue %s failed (last reason %d); its "
                "proxy subscriptions stay, the publications are on the dead-letter queue",
                count,
                target[0],
                queue,
                reason,
            )
            return
        dest = Destination(*target)
        out: list[Mutation] = []
        for sub in list(self._state.subs.values()):
            if sub.destination == dest and not sub.suspended:
                self._state.upsert_sub(dataclasses.replace(sub, suspended=True), out)
        if out:
            self._failures.pop(target, None)
            self.suspensions += 1
            self._state.pending.extend(out)
            log.warning(
                "suspended %d subscription(s) of %s: %d puts in a row failed (last reason "
                "%d); a new RegSub resumes them",
                len(out),
                dest,
                count,
                reason,
            )

    # ---------------------------------------------------------------- state ---------

    @property
    def subscriptions(self) -> list[Subscription]:
        return list(self._state.subs.values())

    @property
    def subscriptions_revision(self) -> int:
        """Changes whenever a subscription is added, changed or removed (the neighbour
        links skip their proxy diff while it stays the same)."""
        return self._state.revision

    @property
    def publishers(self) -> list[Publisher]:
        return list(self._state.publishers.values())

    def retained(self, stream: str = DEFAULT_STREAM) -> list[RetainedPublication]:
        return list(self._state.retained.get(stream, {}).values())

    @property
    def pending_mutations(self) -> list[Mutation]:
        return list(self._state.pending)

    def commit(self) -> list[RetainedPublication]:
        """Write the pending mutations to the store (one atomic batch). Returns the
        neighbours' retained copies it stored unsettled: pass them to
        :meth:`settle_retained` once the MQ unit of work has committed."""
        return self._state.commit(self.store)

    async def commit_async(self) -> list[RetainedPublication]:
        """:meth:`commit` with the store's commit off the event loop (when the store
        has ``apply_async``); durable when the await returns."""
        return await self._state.commit_async(self.store)

    def settle_retained(self, copies: list[RetainedPublication]) -> None:
        """The MQ unit of work that carried ``copies`` (from :meth:`commit`) has
        committed: from now on, a neighbour's publication matching one is a replay.
        Until then, the forward coming again (a crash or a failed MQ commit between the
        two commits) is delivered, not taken for a replay (docs/neighbours.md)."""
        self._state.settle(copies)

    def write_settles(self) -> None:
        """Write the settles that wait for the next batch now (the service stops:
        none comes). Between units of work only."""
        self._state.write_settles(self.store)

    def rollback(self) -> None:
        """Forget the pending mutations and undo them in memory."""
        self._state.rollback()

    # ---------------------------------------------------------------- sinks ---------

    def subscribe_sink(
        self,
        sink: str,
        topic: str,
        *,
        scheme: Scheme = Scheme.TOPIC,
        reg_opts: RegOpt = RegOpt.NONE,
        sub_name: str = "",
    ) -> tuple[Subscription, list[Delivery]]:
        """Subscribe an in-process sink to ``topic`` (unified form, ``$SYS/STREAM/...``
        prefix for named streams). Returns the subscription and the retained deliveries
        due to it; the caller commits like any other unit of work."""
        out: list[Mutation] = []
        st = split_subscription_topic(topic, scheme, "Topic")
        made = self._handlers.subscribe_sink(sink, st, scheme, reg_opts, sub_name, out)
        self._state.pending.extend(out)
        return made

    def unsubscribe_sink(self, sink: str, topic: str, *, scheme: Scheme = Scheme.TOPIC) -> bool:
        """Remove a sink subscription; False when there was none."""
        out: list[Mutation] = []
        st = split_subscription_topic(topic, scheme, "Topic")
        key: SubKey = (st.stream, int(scheme), st.topic, "", "", sink, b"")
        existed = key in self._state.subs
        self._state.delete_sub(key, out)
        self._state.pending.extend(out)
        return existed

    def unsubscribe_sinks(self, stream: str) -> list[Subscription]:
        """Remove every sink subscription to ``stream`` (pending: the caller commits);
        the subscriptions removed."""
        out: list[Mutation] = []
        gone = [s for s in self._state.subs.values()
                if s.stream == stream and s.destination.is_sink]
        for sub in gone:
            self._state.delete_sub(sub.key, out)
        self._state.pending.extend(out)
        return gone

    # ---------------------------------------------------------------- handling ------

    def handle(self, msg: InboundMessage) -> Outcome:
        """Process one command message; never raises for anything the message contains."""
        self.counters.commands += 1
        outcome = Outcome()
        parsed: ParsedCommand | None = None
        psc: Element | None = None
        pairs: list[tuple[str, str]] | None = None
        try:
            parsed = decode_command_message(msg.md, msg.body)
            outcome.command = parsed.command
            self._check_msg_type(msg.md)
            self._dispatch(msg, parsed, outcome)
        except CommandError as exc:
            self._fail(
                msg,
                outcome,
                exc.reason,
                CompCode.FAILED,
                ResponseDetail(exc.parm_id, exc.value, exc.error_pos),
                str(exc),
            )
            outcome.dead_letter = DeadLetter(exc.dead_letter_reason, str(exc))
            psc, pairs = exc.psc, exc.name_values
            self.counters.dead_letters += 1
        except CommandRefusedError as exc:
            comp = CompCode.WARNING if exc.warning else CompCode.FAILED
            self._fail(
                msg,
                outcome,
                exc.reason,
                comp,
                ResponseDetail(exc.parm_id, exc.value),
                str(exc),
            )
            self.counters.refused += 1
        self._state.pending.extend(outcome.mutations)
        if parsed is not None:
            kind, psc = parsed.command.header, parsed.psc
            if isinstance(parsed.header, MQRFH):
                pairs = parsed.header.name_values
        else:
            kind = HeaderKind.RFH2 if msg.md.format == FMT_RF_HEADER_2 else HeaderKind.RFH
        try:
            self._respond(msg, kind, psc, pairs, outcome)
        except WireError as exc:  # cannot happen for parsed input; never lose the message
            log.error("response to a command on %s could not be encoded: %s", msg.queue, exc)
        self.counters.deliveries += len(outcome.deliveries)
        return outcome

    def _fail(
        self,
        msg: InboundMessage,
        outcome: Outcome,
        reason: int,
        comp: int,
        detail: ResponseDetail,
        text: str,
    ) -> None:
        # A failed command changes nothing (its in-memory effects were undone already).
        outcome.mutations.clear()
        outcome.deliveries.clear()
        outcome.forwards.clear()
        outcome.comp_code = comp
        outcome.reason = reason
        outcome.detail = detail
        log.debug("command on %s refused: %s", msg.queue, text)

    @staticmethod
    def _check_msg_type(md: MQMD) -> None:
        if md.msg_type not in (MsgType.REQUEST, MsgType.DATAGRAM):
            raise CommandError(
                Reason.MSG_TYPE_ERROR, f"command MsgType {md.msg_type} is not REQUEST or DATAGRAM"
            )

    def _dispatch(self, msg: InboundMessage, parsed: ParsedCommand, outcome: Outcome) -> None:
        cmd = parsed.command
        on_control = msg.queue == CONTROL_QUEUE
        if cmd.name not in STREAM_COMMANDS and not on_control:
            raise CommandError(
                Reason.INCORRECT_Q, f"{cmd.name} belongs on {CONTROL_QUEUE}, not {msg.queue}"
            )
        if on_control and cmd.name in STREAM_COMMANDS and cmd.header is HeaderKind.RFH:
            # MQ 8: only MQRFH2 applications may publish through the control queue; an
            # MQRFH (v1) Publish/DeletePub belongs on its stream queue.
            raise CommandError(
                Reason.INCORRECT_Q,
                f"MQRFH {cmd.name} belongs on a stream queue, not {CONTROL_QUEUE}",
            )
        if self.supported_streams is not None:
            self._check_supported(msg, parsed)
        recorded = None
        if cmd.name is not CommandName.PUBLISH and msg.md.msg_id != bytes(24):
            recorded = self.store.recorded_result(msg.queue, msg.md.msg_id)
        mark = self._state.mark()
        try:
            self._handlers.run(msg, parsed, outcome)
        except (CommandError, CommandRefusedError, WireError) as exc:
            # Undo this command's in-memory effects (earlier commands of the batch stay).
            self._state.undo_since(mark)
            if recorded is not None and recorded[0] != CompCode.FAILED:
                # Already done before a crash: answer as the first time.
                outcome.comp_code, outcome.reason = recorded
                outcome.mutations.clear()
                return
            if isinstance(exc, WireError):
                # e.g. a publication that cannot be re-encoded for its subscribers
                raise CommandError(exc.reason, exc.message) from exc
            raise exc
        if recorded is not None:
            outcome.comp_code, outcome.reason = recorded
        if cmd.name is not CommandName.PUBLISH and msg.md.msg_id != bytes(24):
            outcome.mutations.append(
                RecordCommand(msg.queue, msg.md.msg_id, int(outcome.comp_code), int(outcome.reason))
            )

    def _check_supported(self, msg: InboundMessage, parsed: ParsedCommand) -> None:
        """Legacy profile: refuse a command on a stream this broker does not support,
        or arriving on such a stream's queue, with MQRCCF_STREAM_ERROR (the V6 broker)."""
        supported = self.supported_streams
        assert supported is not None
        cmd = parsed.command
        rfh = cmd.header is HeaderKind.RFH
        streams = self._handlers.command_streams(msg, cmd)
        if msg.queue != CONTROL_QUEUE:
            streams.add(msg.queue.strip())
        for stream in sorted(streams):
            if stream not in supported:
                raise CommandRefusedError(
                    Reason.STREAM_ERROR,
                    f"stream {stream} is not supported by this broker",
                    parm_id="MQPSStreamName" if rfh else "Topic",
                    value=stream if rfh else next(iter(cmd.topics), stream),
                )

    # ---------------------------------------------------------------- responses -----

    def _respond(
        self,
        msg: InboundMessage,
        kind: HeaderKind,
        psc: Element | None,
        pairs: list[tuple[str, str]] | None,
        outcome: Outcome,
    ) -> None:
        built = build_response(
            msg.md,
            kind,
            psc,
            name_values=pairs,
            comp_code=outcome.comp_code,
            reason=outcome.reason,
            detail=outcome.detail,
            broker_q_mgr=self.q_mgr_name,
        )
        if built is not None:
            q_mgr, queue, md, body = built
            own = self.own_queues.why_own(q_mgr, queue, QueueUse.RESPONSE)
            if own is not None:
                # A requester named the gateway's own queue (or an alias of it) for
                # the response: not sent there, counted and reported.
                self.responses_refused += 1
                decision = Decision(
                    False,
                    f"no response to {own.detail} (ReplyToQ of a command on {msg.queue})",
                    own_queue_refusal(own),
                )
                if self.authoriser is not None:
                    self.authoriser.count("mq", decision, 0)
                else:
                    log.warning("%s", decision.detail)
                return
            outcome.response = OutboundMessage(q_mgr, queue, md, body)
            self.counters.responses += 1
