"""The publish/subscribe engine: command message in, typed outcome out (sans-I/O).

Modelled on h11: :meth:`PubSubEngine.handle` takes one inbound message (MQMD, body, the
queue it arrived on and that queue's Implicit Stream Naming flag) and returns an
:class:`Outcome` — deliveries (destination + MQMD + body), an optional response, an
optional dead-letter action with the MQDLH reason, and the store mutations it made. It
never touches a queue; ``gateway.runtime.broker.BrokerService`` does the I/O.

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
from collections.abc import Callable
from dataclasses import dataclass

from gateway.pubsub.commands import STREAM_COMMANDS, Command, CommandName, HeaderKind
from gateway.pubsub.deliveries import build_delivery
from gateway.pubsub.errors import CommandError, CommandRefusedError
from gateway.pubsub.inbound import ParsedCommand, decode_command_message
from gateway.pubsub.options import PubOpt, RegOpt
from gateway.pubsub.origin import split_origin
from gateway.pubsub.outcome import DeadLetter, Delivery, InboundMessage, OutboundMessage, Outcome
from gateway.pubsub.records import (
    Destination,
    PubKey,
    Publication,
    Publisher,
    RetainedPublication,
    SubFormat,
    SubKey,
    Subscription,
)
from gateway.pubsub.responses import ResponseDetail, build_response
from gateway.pubsub.store import (
    DeletePublisher,
    DeleteRetained,
    DeleteSubscription,
    Mutation,
    PubSubStore,
    PutRetained,
    RecordCommand,
    UpsertPublisher,
    UpsertSubscription,
)
from gateway.pubsub.streams import (
    CONTROL_QUEUE,
    DEFAULT_STREAM,
    StreamTopic,
    prefixed_topic,
    resolve_stream,
    split_topic,
    stream_segment,
)
from gateway.pubsub.topics import (
    Scheme,
    TopicIndex,
    check_topic_pattern,
    compile_char_pattern,
    decode_char_publication_topic,
    match_pattern,
    uses_topic_wildcards,
)
from gateway.wire.constants import CI_NONE, CompCode, MsgType
from gateway.wire.errors import WireError
from gateway.wire.folder import Element
from gateway.wire.formats import FMT_RF_HEADER_2
from gateway.wire.mqmd import MQMD
from gateway.wire.put_time import put_date_time
from gateway.wire.reasons import Reason
from gateway.wire.rfh import MQRFH

log = logging.getLogger(__name__)

_PUB_ON_REQ_ONLY = int(RegOpt.PUBLISH_ON_REQUEST_ONLY)
_DUPS_OK = int(RegOpt.DUPLICATES_OK)


@dataclass(slots=True)
class Counters:
    """Monotonic counters (the service exports them as metrics)."""

    commands: int = 0
    publications: int = 0
    deliveries: int = 0
    responses: int = 0
    dead_letters: int = 0
    refused: int = 0


class PubSubEngine:
    """Queued publish/subscribe broker logic over a :class:`PubSubStore`.

    ``q_mgr_name`` is the broker's queue manager (blank identity queue managers resolve
    to it; forwarded publications carry it in ReplyToQMgr/PutApplName). ``clock``
    returns seconds since the epoch (injectable for tests).
    """

    def __init__(
        self, q_mgr_name: str, store: PubSubStore, *, clock: Callable[[], float] = time.time
    ) -> None:
        self.q_mgr_name = q_mgr_name
        self.store = store
        self.clock = clock
        self.counters = Counters()
        self._subs: dict[SubKey, Subscription] = {}
        self._index: dict[str, TopicIndex[SubKey]] = {}
        self._publishers: dict[PubKey, Publisher] = {}
        self._retained: dict[str, dict[str, RetainedPublication]] = {}
        self._pending: list[Mutation] = []
        self._undo: list[Callable[[], None]] = []
        snap = store.load()
        for sub in snap.subscriptions:
            self._put_sub(sub)
        for pub in snap.publishers:
            self._publishers[pub.key] = pub
        for ret in snap.retained:
            self._retained.setdefault(ret.stream, {})[ret.topic] = ret

    # ---------------------------------------------------------------- state ---------

    @property
    def subscriptions(self) -> list[Subscription]:
        return list(self._subs.values())

    @property
    def publishers(self) -> list[Publisher]:
        return list(self._publishers.values())

    def retained(self, stream: str = DEFAULT_STREAM) -> list[RetainedPublication]:
        return list(self._retained.get(stream, {}).values())

    @property
    def pending_mutations(self) -> list[Mutation]:
        return list(self._pending)

    def commit(self) -> None:
        """Write the pending mutations to the store (one atomic batch)."""
        if self._pending:
            self.store.apply(self._pending)
        self._pending.clear()
        self._undo.clear()

    def rollback(self) -> None:
        """Forget the pending mutations and undo them in memory."""
        for undo in reversed(self._undo):
            undo()
        self._pending.clear()
        self._undo.clear()

    def _put_sub(self, sub: Subscription) -> None:
        self._subs[sub.key] = sub
        index = self._index.get(sub.stream)
        if index is None:
            index = self._index[sub.stream] = TopicIndex()
        index.add(sub.key, sub.scheme, sub.topic)

    def _drop_sub(self, key: SubKey) -> None:
        sub = self._subs.pop(key, None)
        if sub is not None:
            self._index[sub.stream].remove(key)

    def _upsert_sub(self, sub: Subscription, out: list[Mutation]) -> None:
        previous = self._subs.get(sub.key)
        self._put_sub(sub)
        self._undo.append(
            (lambda: self._drop_sub(sub.key))
            if previous is None
            else (lambda: self._put_sub(previous))
        )
        out.append(UpsertSubscription(sub))

    def _delete_sub(self, key: SubKey, out: list[Mutation]) -> None:
        previous = self._subs.get(key)
        if previous is None:
            return
        self._drop_sub(key)
        self._undo.append(lambda: self._put_sub(previous))
        out.append(DeleteSubscription(key))

    def _upsert_publisher(self, pub: Publisher, out: list[Mutation]) -> None:
        previous = self._publishers.get(pub.key)
        self._publishers[pub.key] = pub

        def undo() -> None:
            if previous is None:
                self._publishers.pop(pub.key, None)
            else:
                self._publishers[pub.key] = previous

        self._undo.append(undo)
        out.append(UpsertPublisher(pub))

    def _delete_publisher(self, key: PubKey, out: list[Mutation]) -> None:
        previous = self._publishers.pop(key, None)
        if previous is None:
            return
        self._undo.append(lambda: self._publishers.__setitem__(key, previous))
        out.append(DeletePublisher(key))

    def _put_retained(self, ret: RetainedPublication, out: list[Mutation]) -> None:
        bucket = self._retained.setdefault(ret.stream, {})
        previous = bucket.get(ret.topic)
        bucket[ret.topic] = ret

        def undo() -> None:
            if previous is None:
                bucket.pop(ret.topic, None)
            else:
                bucket[ret.topic] = previous

        self._undo.append(undo)
        out.append(PutRetained(ret))

    def _delete_retained(self, stream: str, topic: str, out: list[Mutation]) -> None:
        bucket = self._retained.get(stream, {})
        previous = bucket.pop(topic, None)
        if previous is None:
            return
        self._undo.append(lambda: bucket.__setitem__(topic, previous))
        out.append(DeleteRetained(stream, topic))

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
        st = self._subscription_topic(topic, scheme, "Topic")
        sub = Subscription(
            stream=st.stream,
            topic=st.topic,
            scheme=scheme,
            destination=Destination(sink=sink),
            fmt=SubFormat.SINK,
            reg_opts=int(reg_opts),
            sub_name=sub_name,
            created=self.clock(),
        )
        self._upsert_sub(sub, out)
        self._pending.extend(out)
        deliveries: list[Delivery] = []
        if not reg_opts & (RegOpt.NEW_PUBLICATIONS_ONLY | RegOpt.PUBLISH_ON_REQUEST_ONLY):
            deliveries = self._retained_deliveries(sub, sub.topic)
        return sub, deliveries

    def unsubscribe_sink(self, sink: str, topic: str, *, scheme: Scheme = Scheme.TOPIC) -> bool:
        """Remove a sink subscription; False when there was none."""
        out: list[Mutation] = []
        st = self._subscription_topic(topic, scheme, "Topic")
        key: SubKey = (st.stream, int(scheme), st.topic, "", "", sink, b"")
        existed = key in self._subs
        self._delete_sub(key, out)
        self._pending.extend(out)
        return existed

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
                parsed,
                outcome,
                exc.reason,
                CompCode.FAILED,
                ResponseDetail(exc.parm_id, exc.value, exc.error_pos),
                str(exc),
            )
            outcome.dead_letter = DeadLetter(exc.reason, str(exc))
            psc, pairs = exc.psc, exc.name_values
            self.counters.dead_letters += 1
        except CommandRefusedError as exc:
            comp = CompCode.WARNING if exc.warning else CompCode.FAILED
            self._fail(
                msg,
                parsed,
                outcome,
                exc.reason,
                comp,
                ResponseDetail(exc.parm_id, exc.value),
                str(exc),
            )
            self.counters.refused += 1
        self._pending.extend(outcome.mutations)
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
        parsed: ParsedCommand | None,
        outcome: Outcome,
        reason: int,
        comp: int,
        detail: ResponseDetail,
        text: str,
    ) -> None:
        # A failed command changes nothing (its in-memory effects were undone already).
        outcome.mutations.clear()
        outcome.deliveries.clear()
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
        recorded = None
        if cmd.name is not CommandName.PUBLISH and msg.md.msg_id != bytes(24):
            recorded = self.store.recorded_result(msg.queue, msg.md.msg_id)
        mark = len(self._undo)
        try:
            if cmd.name is CommandName.PUBLISH:
                self._publish(msg, parsed, outcome)
            elif cmd.name is CommandName.REG_SUB:
                self._reg_sub(msg, parsed, outcome)
            elif cmd.name is CommandName.DEREG_SUB:
                self._dereg_sub(msg, cmd, outcome)
            elif cmd.name is CommandName.REQ_UPDATE:
                self._req_update(msg, cmd, outcome)
            elif cmd.name is CommandName.DELETE_PUB:
                self._delete_pub(msg, parsed, outcome)
            elif cmd.name is CommandName.REG_PUB:
                self._reg_pub(msg, cmd, outcome)
            else:
                self._dereg_pub(msg, cmd, outcome)
        except (CommandError, CommandRefusedError, WireError) as exc:
            # Undo this command's in-memory effects (earlier commands of the batch stay).
            for undo in reversed(self._undo[mark:]):
                undo()
            del self._undo[mark:]
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

    # ---------------------------------------------------------------- identity ------

    def _identity(self, md: MQMD, cmd: Command, correl_as_id: bool) -> tuple[str, str, bytes]:
        queue = cmd.q_name if cmd.q_name is not None else md.reply_to_q
        q_mgr = cmd.q_mgr_name if cmd.q_mgr_name is not None else md.reply_to_q_mgr
        if not queue:
            parm = "MQPSQName" if cmd.header is HeaderKind.RFH else "QName"
            raise CommandError(
                Reason.Q_NAME_ERROR, "no subscriber queue (QName nor ReplyToQ)", parm_id=parm
            )
        correl = b""
        if correl_as_id:
            correl = cmd.correl_id if cmd.correl_id is not None else md.correl_id
            if correl == CI_NONE:
                raise CommandError(Reason.CORREL_ID_ERROR, "CorrelAsId with an all-zero CorrelId")
        return q_mgr or self.q_mgr_name, queue, correl

    def _command_stream(self, msg: InboundMessage, cmd: Command) -> str:
        if cmd.header is HeaderKind.RFH2:
            return DEFAULT_STREAM
        return resolve_stream(
            cmd.stream,
            msg.queue,
            msg.implicit_stream_naming,
            is_stream_command=cmd.name in STREAM_COMMANDS,
        )

    def _subscription_topic(self, full_topic: str, scheme: Scheme, parm: str) -> StreamTopic:
        """Validate a pattern of the unified topic space and split off its stream."""
        if scheme is Scheme.TOPIC:
            check_topic_pattern(full_topic, parm)
        else:
            compile_char_pattern(full_topic, parm)
        segment = stream_segment(full_topic)
        st = split_topic(full_topic)
        if segment is not None and st.stream == DEFAULT_STREAM and "/" in full_topic[12:]:
            wild = (
                segment in ("#", "+")
                if scheme is Scheme.TOPIC
                else any(c in segment for c in "*?%")
            )
            if wild:
                raise CommandError(
                    Reason.STREAM_ERROR,
                    "wildcards cannot match across streams",
                    parm_id=parm,
                    value=full_topic,
                )
        return st

    def _command_patterns(
        self, msg: InboundMessage, cmd: Command
    ) -> tuple[Scheme, list[tuple[str, StreamTopic]]]:
        """(scheme, [(topic as sent, stream topic)]) of a subscription-type command."""
        parm = "MQPSTopic" if cmd.header is HeaderKind.RFH else "Topic"
        scheme = Scheme.CHAR if cmd.header is HeaderKind.RFH else Scheme.TOPIC
        stream = self._command_stream(msg, cmd)
        out: list[tuple[str, StreamTopic]] = []
        for raw in cmd.topics:
            if scheme is Scheme.CHAR and uses_topic_wildcards(raw):
                raise CommandError(
                    Reason.TOPIC_ERROR,
                    "MQRFH subscriptions use '*', '?' and '%'; '#' and '+' are not wildcards here",
                    parm_id=parm,
                    value=raw,
                )
            out.append((raw, self._subscription_topic(prefixed_topic(stream, raw), scheme, parm)))
        return scheme, out

    # ---------------------------------------------------------------- commands ------

    def _publish(self, msg: InboundMessage, parsed: ParsedCommand, outcome: Outcome) -> None:
        cmd = parsed.command
        parm = "MQPSTopic" if cmd.header is HeaderKind.RFH else "Topic"
        if cmd.pub_opts & PubOpt.IS_RETAINED_PUBLICATION:
            raise CommandError(
                Reason.PUB_OPTIONS_ERROR, "IsRetainedPub is set by brokers only", parm_id=parm
            )
        stream = self._command_stream(msg, cmd)
        topics: list[StreamTopic] = []
        for raw in cmd.topics:
            if cmd.header is HeaderKind.RFH:
                literal = decode_char_publication_topic(raw, parm)
            else:
                literal = check_topic_pattern(raw, parm)
            topics.append(split_topic(prefixed_topic(stream, literal)))
        streams = {t.stream for t in topics}
        if len(streams) != 1:
            raise CommandError(
                Reason.STREAM_ERROR, "one publication cannot span streams", parm_id=parm
            )
        stream = topics[0].stream
        md = msg.md
        correl_as_id = bool(
            cmd.pub_opts & PubOpt.CORREL_ID_AS_IDENTITY
            or cmd.reg_opts & RegOpt.CORREL_ID_AS_IDENTITY
        )
        queue = cmd.q_name if cmd.q_name is not None else md.reply_to_q
        q_mgr = (
            cmd.q_mgr_name if cmd.q_mgr_name is not None else md.reply_to_q_mgr
        ) or self.q_mgr_name
        correl = b""
        if queue and correl_as_id:
            correl = md.correl_id
            if correl == CI_NONE:
                raise CommandError(Reason.CORREL_ID_ERROR, "CorrelAsId with an all-zero CorrelId")
        pub = Publication(
            stream=stream,
            topics=[t.topic for t in topics],
            payload=parsed.payload,
            payload_format=parsed.payload_format,
            payload_encoding=parsed.payload_encoding,
            payload_ccsid=parsed.payload_ccsid,
            persistence=md.persistence,
            priority=md.priority,
            expiry=md.expiry,
            pub_opts=int(cmd.pub_opts),
            pub_time=cmd.pub_time,
            seq_num=cmd.seq_num,
            int_data=list(cmd.int_data),
            string_data=list(cmd.string_data),
            user_pairs=list(cmd.user_pairs),
            extra_folders=list(parsed.extra_folders),
            publisher_q_mgr=q_mgr if queue else "",
            publisher_queue=queue,
            direct_requests=bool(cmd.reg_opts & RegOpt.DIRECT_REQUESTS),
            put_date=md.put_date,
            put_time=md.put_time,
            msg_id=md.msg_id,
            correl_id=md.correl_id,
            user_identifier=md.user_identifier,
            header="MQRFH" if cmd.header is HeaderKind.RFH else "MQRFH2",
        )
        pub.origin, pub.extra_folders = split_origin(pub.extra_folders)
        self.counters.publications += 1
        if queue and not cmd.pub_opts & PubOpt.NO_REGISTRATION:
            for t in pub.topics:
                reg = Publisher(stream, t, q_mgr, queue, correl, int(cmd.reg_opts))
                known = self._publishers.get(reg.key)
                if known is None or known.reg_opts != reg.reg_opts:
                    self._upsert_publisher(reg, outcome.mutations)
        now = self.clock()
        if cmd.pub_opts & PubOpt.RETAIN_PUBLICATION:
            for t in pub.topics:
                one = dataclasses.replace(
                    pub, topics=[t], pub_opts=int(cmd.pub_opts & ~PubOpt.RETAIN_PUBLICATION)
                )
                self._put_retained(RetainedPublication(stream, t, one, now), outcome.mutations)
        exclude: tuple[str, str, bytes] | None = None
        if cmd.pub_opts & PubOpt.OTHER_SUBSCRIBERS_ONLY and queue:
            exclude = (q_mgr, queue, correl)
        outcome.deliveries.extend(self._match_and_build(pub, exclude, outcome.mutations))

    def _match_and_build(
        self, pub: Publication, exclude: tuple[str, str, bytes] | None, out: list[Mutation]
    ) -> list[Delivery]:
        index = self._index.get(pub.stream)
        if index is None or not len(index):
            return []
        # first topic (in publication order) each subscription matched
        first_topic: dict[SubKey, str] = {}
        for topic in pub.topics:
            for key in index.match(topic):
                first_topic.setdefault(key, topic)
        if not first_topic:
            return []
        # One copy per subscriber identity unless the subscription says DupsOK.
        chosen: dict[object, Subscription] = {}
        subs = self._subs
        now = self.clock()
        for key in sorted(first_topic):
            sub = subs[key]
            opts = sub.reg_opts
            if opts & _PUB_ON_REQ_ONLY:
                continue
            if sub.expires_at and sub.expires_at <= now:
                self._delete_sub(key, out)  # lapsed: removed with this unit of work
                continue
            d = sub.destination
            if exclude is not None and not d.sink and (d.q_mgr, d.queue, sub.correl_id) == exclude:
                continue
            if d.sink and d.sink == pub.origin:
                continue  # never back to the plugin instance it came from
            ident: object = key if opts & _DUPS_OK else (d, sub.correl_id)
            if ident not in chosen:
                chosen[ident] = sub
        cache: dict[tuple[object, ...], bytes] = {}
        stamp = put_date_time(now)
        return [
            self._delivery(sub, pub, first_topic[sub.key], False, now, cache=cache, stamp=stamp)
            for sub in chosen.values()
        ]

    def _delivery(
        self,
        sub: Subscription,
        pub: Publication,
        topic: str,
        retained: bool,
        now: float,
        held_for: float = 0.0,
        cache: dict[tuple[object, ...], bytes] | None = None,
        stamp: tuple[str, str] | None = None,
    ) -> Delivery:
        md, body = build_delivery(
            pub,
            sub,
            topic,
            retained=retained,
            broker_q_mgr=self.q_mgr_name,
            now=now,
            held_for=held_for,
            body_cache=cache,
            stamp=stamp,
        )
        seen_topic = topic if sub.fmt is SubFormat.RFH else prefixed_topic(pub.stream, topic)
        if sub.fmt is SubFormat.SINK and pub.msg_id:
            # Sinks see the publication as its publisher put it (Kafka contract: mq.msgId,
            # mq.correlId, mq.putTime, mq.userId), not the broker's forwarding identity.
            md.msg_id, md.correl_id = pub.msg_id, pub.correl_id
            md.user_identifier = pub.user_identifier
            if pub.put_date:
                md.put_date, md.put_time = pub.put_date, pub.put_time
        return Delivery(sub.destination, sub.key, md, body, pub, seen_topic, retained)

    def _retained_deliveries(self, sub: Subscription, pattern: str) -> list[Delivery]:
        bucket = self._retained.get(sub.stream)
        if not bucket:
            return []
        now = self.clock()
        out: list[Delivery] = []
        for topic in sorted(bucket):
            if match_pattern(sub.scheme, pattern, topic):
                ret = bucket[topic]
                if sub.destination.sink and sub.destination.sink == ret.publication.origin:
                    continue
                held = max(0.0, now - ret.stored_at)
                if ret.publication.expiry > 0 and held * 10 >= ret.publication.expiry:
                    continue  # expired while held
                out.append(self._delivery(sub, ret.publication, topic, True, now, held))
        return out

    def _reg_sub(self, msg: InboundMessage, parsed: ParsedCommand, outcome: Outcome) -> None:
        cmd = parsed.command
        md = msg.md
        correl_as_id = bool(cmd.reg_opts & RegOpt.CORREL_ID_AS_IDENTITY)
        q_mgr, queue, correl = self._identity(md, cmd, correl_as_id)
        scheme, patterns = self._command_patterns(msg, cmd)
        fmt = SubFormat.RFH if cmd.header is HeaderKind.RFH else SubFormat.RFH2
        now = self.clock()
        for _raw, st in patterns:
            sub = Subscription(
                stream=st.stream,
                topic=st.topic,
                scheme=scheme,
                destination=Destination(q_mgr, queue),
                fmt=fmt,
                correl_id=correl,
                reg_opts=int(cmd.reg_opts),
                sub_name=cmd.sub_name,
                sub_identity=cmd.sub_identity,
                sub_user_data=cmd.sub_user_data,
                user_identifier=md.user_identifier,
                accounting_token=md.accounting_token,
                appl_identity_data=md.appl_identity_data,
                created=now,
                expires_at=now + md.expiry / 10 if md.expiry > 0 else 0.0,
            )
            existing = self._subs.get(sub.key)
            if existing is not None:
                self._check_owner(existing, md.user_identifier, cmd)
                if cmd.reg_opts & RegOpt.NO_ALTERATION:
                    sub = existing
                else:
                    sub.created = existing.created
                    self._upsert_sub(sub, outcome.mutations)
            else:
                self._upsert_sub(sub, outcome.mutations)
            if not sub.reg_opts & (RegOpt.NEW_PUBLICATIONS_ONLY | RegOpt.PUBLISH_ON_REQUEST_ONLY):
                outcome.deliveries.extend(self._retained_deliveries(sub, sub.topic))

    @staticmethod
    def _check_owner(existing: Subscription, user_id: str, cmd: Command) -> None:
        """An identity belongs to the user that registered it unless VariableUserId."""
        if existing.user_identifier == user_id:
            return
        if existing.reg_opts & RegOpt.VARIABLE_USER_ID and cmd.reg_opts & RegOpt.VARIABLE_USER_ID:
            return
        raise CommandRefusedError(
            Reason.DUPLICATE_IDENTITY,
            f"subscriber identity is registered by user {existing.user_identifier!r}",
        )

    def _dereg_sub(self, msg: InboundMessage, cmd: Command, outcome: Outcome) -> None:
        correl_as_id = bool(cmd.reg_opts & RegOpt.CORREL_ID_AS_IDENTITY)
        q_mgr, queue, correl = self._identity(msg.md, cmd, correl_as_id)
        parm = "MQPSTopic" if cmd.header is HeaderKind.RFH else "Topic"
        dest = Destination(q_mgr, queue)
        if cmd.reg_opts & RegOpt.DEREGISTER_ALL:
            stream = self._command_stream(msg, cmd) if cmd.header is HeaderKind.RFH else None
            keys = [
                k
                for k, s in self._subs.items()
                if s.destination == dest
                and s.correl_id == correl
                and (stream is None or s.stream == stream)
                and (not cmd.sub_name or s.sub_name == cmd.sub_name)
            ]
            if not keys:
                raise CommandRefusedError(Reason.NOT_REGISTERED, "no subscriptions to deregister")
            for k in keys:
                self._delete_sub(k, outcome.mutations)
            return
        scheme, patterns = self._command_patterns(msg, cmd)
        missing: list[str] = []
        for raw, st in patterns:
            key: SubKey = (st.stream, int(scheme), st.topic, q_mgr, queue, "", correl)
            existing = self._subs.get(key)
            if existing is not None:
                self._check_owner(existing, msg.md.user_identifier, cmd)
                self._delete_sub(key, outcome.mutations)
            else:
                missing.append(raw)
        if len(missing) == len(patterns):
            raise CommandRefusedError(
                Reason.NOT_REGISTERED,
                f"not registered for {missing[0]!r}",
                parm_id=parm,
                value=missing[0],
            )
        if missing:  # some topics deregistered: a warning names the first missing one
            outcome.comp_code = CompCode.WARNING
            outcome.reason = Reason.NOT_REGISTERED
            outcome.detail = ResponseDetail(parm, missing[0])

    def _req_update(self, msg: InboundMessage, cmd: Command, outcome: Outcome) -> None:
        correl_as_id = bool(cmd.reg_opts & RegOpt.CORREL_ID_AS_IDENTITY)
        q_mgr, queue, correl = self._identity(msg.md, cmd, correl_as_id)
        scheme, patterns = self._command_patterns(msg, cmd)
        parm = "MQPSTopic" if cmd.header is HeaderKind.RFH else "Topic"
        raw, st = patterns[0]
        key: SubKey = (st.stream, int(scheme), st.topic, q_mgr, queue, "", correl)
        sub = self._subs.get(key)
        if sub is None:
            raise CommandRefusedError(
                Reason.NOT_REGISTERED, f"no subscription for {raw!r}", parm_id=parm, value=raw
            )
        deliveries = self._retained_deliveries(sub, sub.topic)
        if not deliveries:
            raise CommandRefusedError(
                Reason.NO_RETAINED_MSG, f"nothing retained for {raw!r}", parm_id=parm, value=raw
            )
        outcome.deliveries.extend(deliveries)

    def _delete_pub(self, msg: InboundMessage, parsed: ParsedCommand, outcome: Outcome) -> None:
        scheme, patterns = self._command_patterns(msg, parsed.command)
        origin, _ = split_origin(parsed.extra_folders)
        for _raw, st in patterns:
            bucket = self._retained.get(st.stream, {})
            for topic in [t for t in bucket if match_pattern(scheme, st.topic, t)]:
                deleted = bucket[topic].publication
                self._delete_retained(st.stream, topic, outcome.mutations)
                outcome.deliveries.extend(self._deletion_deliveries(deleted, topic, origin))

    def _deletion_deliveries(self, pub: Publication, topic: str, origin: str) -> list[Delivery]:
        """Tell sink subscribers of ``topic`` that its retained publication is gone.

        MQ subscribers learn nothing of a DeletePub (reference §5.5); the gateway's sinks
        mirror retained state elsewhere (a compacted Kafka topic, MQTT retained
        messages), so they get a delivery flagged ``deleted``.
        """
        index = self._index.get(pub.stream)
        if index is None or not len(index):
            return []
        gone = dataclasses.replace(pub, topics=[topic], payload=b"", origin=origin)
        now = self.clock()
        out: list[Delivery] = []
        seen: set[str] = set()
        for key in sorted(index.match(topic)):
            sub = self._subs[key]
            sink = sub.destination.sink
            if not sink or sink == origin or sink in seen:
                continue
            if sub.expires_at and sub.expires_at <= now:
                continue
            seen.add(sink)
            d = self._delivery(sub, gone, topic, True, now)
            d.deleted = True
            d.body = b""
            out.append(d)
        return out

    def _reg_pub(self, msg: InboundMessage, cmd: Command, outcome: Outcome) -> None:
        correl_as_id = bool(cmd.reg_opts & RegOpt.CORREL_ID_AS_IDENTITY)
        q_mgr, queue, correl = self._identity(msg.md, cmd, correl_as_id)
        stream = self._command_stream(msg, cmd)
        regs: list[Publisher] = []
        for raw in cmd.topics:
            literal = decode_char_publication_topic(raw, "MQPSTopic")
            st = split_topic(prefixed_topic(stream, literal))
            regs.append(Publisher(st.stream, st.topic, q_mgr, queue, correl, int(cmd.reg_opts)))
        for reg in regs:
            self._upsert_publisher(reg, outcome.mutations)

    def _dereg_pub(self, msg: InboundMessage, cmd: Command, outcome: Outcome) -> None:
        correl_as_id = bool(cmd.reg_opts & RegOpt.CORREL_ID_AS_IDENTITY)
        q_mgr, queue, correl = self._identity(msg.md, cmd, correl_as_id)
        stream = self._command_stream(msg, cmd)
        if cmd.reg_opts & RegOpt.DEREGISTER_ALL:
            keys = [
                k
                for k, p in self._publishers.items()
                if (p.q_mgr, p.queue, p.correl_id) == (q_mgr, queue, correl) and p.stream == stream
            ]
        else:
            keys = []
            for raw in cmd.topics:
                compiled = compile_char_pattern(prefixed_topic(stream, raw), "MQPSTopic")
                for k, p in self._publishers.items():
                    if (p.q_mgr, p.queue, p.correl_id) == (
                        q_mgr,
                        queue,
                        correl,
                    ) and compiled.matches(prefixed_topic(p.stream, p.topic)):
                        keys.append(k)
        if not keys:
            raise CommandRefusedError(Reason.NOT_REGISTERED, "publisher not registered")
        for k in keys:
            self._delete_publisher(k, outcome.mutations)

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
            outcome.response = OutboundMessage(q_mgr, queue, md, body)
            self.counters.responses += 1
