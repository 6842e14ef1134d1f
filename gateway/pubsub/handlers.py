"""One handler per broker command: Publish, RegSub, DeregSub, ReqUpdate, DeletePub,
RegPub, DeregPub (reference §5.2-§5.8).

Why its own module: this is the protocol's meaning, command by command, apart from the
engine's bookkeeping around it (decoding, undo on failure, duplicate detection, the
response; :mod:`gateway.pubsub.engine`), the working set it changes
(:mod:`gateway.pubsub.working_set`) and the matching it asks for
(:mod:`gateway.pubsub.fanout`). A handler changes the working set through ``outcome``'s
mutation list, adds deliveries to ``outcome``, and raises :class:`CommandError` (dead
letter) or :class:`CommandRefusedError` (negative response) when the command fails.

Over 500 lines on purpose: the seven handlers share the identity and stream helpers,
and Publish and DeletePub share the source-neighbour rule (:meth:`CommandHandlers.
source_neighbour`); split by command, each piece would need the others' internals.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Collection

from gateway.pubsub.authorisation import Authoriser, Decision, Principal, Refusal
from gateway.pubsub.commands import STREAM_COMMANDS, Command, CommandName, HeaderKind
from gateway.pubsub.errors import CommandError, CommandRefusedError
from gateway.pubsub.fanout import Fanout
from gateway.pubsub.inbound import ParsedCommand
from gateway.pubsub.neighbours import NeighbourKind, delete_forwards
from gateway.pubsub.options import DelOpt, PubOpt, RegOpt
from gateway.pubsub.origin import split_origin
from gateway.pubsub.outcome import Counters, Delivery, InboundMessage, Outcome
from gateway.pubsub.records import (
    Destination,
    Publication,
    Publisher,
    RetainedPublication,
    SubFormat,
    SubKey,
    Subscription,
)
from gateway.pubsub.responses import ResponseDetail
from gateway.pubsub.store import Mutation
from gateway.pubsub.streams import (
    DEFAULT_STREAM,
    INTER_BROKER_QUEUE,
    StreamTopic,
    prefixed_topic,
    resolve_stream,
    split_subscription_topic,
    split_topic,
)
from gateway.pubsub.topics import (
    Scheme,
    check_topic_pattern,
    compile_char_pattern,
    decode_char_publication_topic,
    match_pattern,
    uses_topic_wildcards,
)
from gateway.pubsub.working_set import WorkingSet
from gateway.wire.constants import CI_NONE, MI_NONE, Q_MGR_NAME_LENGTH, Q_NAME_LENGTH, CompCode
from gateway.wire.mqmd import MQMD
from gateway.wire.names import name_problem
from gateway.wire.reasons import Reason

__all__ = ["CommandHandlers"]

log = logging.getLogger(__name__)

#: option bits as plain ints for the per-publication path (enum flag operations build a
#: new member each, ~2 us apiece)
_IS_RETAINED_PUBLICATION = int(PubOpt.IS_RETAINED_PUBLICATION)
_RETAIN_PUBLICATION = int(PubOpt.RETAIN_PUBLICATION)
_OTHER_SUBSCRIBERS_ONLY = int(PubOpt.OTHER_SUBSCRIBERS_ONLY)
_NO_REGISTRATION = int(PubOpt.NO_REGISTRATION)
_PUB_CORREL_ID_AS_IDENTITY = int(PubOpt.CORREL_ID_AS_IDENTITY)
_REG_CORREL_ID_AS_IDENTITY = int(RegOpt.CORREL_ID_AS_IDENTITY)
_DIRECT_REQUESTS = int(RegOpt.DIRECT_REQUESTS)
_LOCAL = int(RegOpt.LOCAL)

Handler = Callable[[InboundMessage, ParsedCommand, Outcome], None]


#: A publication's topics resolved (stream, header generation, topics as sent ->
#: (the StreamTopics, their topics)): a stream's publishers repeat a few topics, and
#: unescaping, prefixing and splitting them again cost microseconds a message. Only
#: topics that resolved are kept (a bad one raises each time); bounded, oldest first out.
_PUB_TOPICS: dict[
    tuple[str, bool, tuple[str, ...]], tuple[tuple[StreamTopic, ...], tuple[str, ...]]
] = {}
_PUB_TOPICS_MAX = 1024
_PUB_TOPICS_MAX_CHARS = 1024


def _publication_topics(
    stream: str, rfh: bool, raws: list[str], parm: str
) -> tuple[tuple[StreamTopic, ...], tuple[str, ...]]:
    """The StreamTopics of a publication's ``raws`` sent on ``stream`` (all in one
    stream, else MQRCCF_STREAM_ERROR) and their topics within it."""
    key = (stream, rfh, tuple(raws))
    known = _PUB_TOPICS.get(key)
    if known is not None:
        return known
    topics: list[StreamTopic] = []
    for raw in raws:
        literal = (
            decode_char_publication_topic(raw, parm) if rfh else check_topic_pattern(raw, parm)
        )
        topics.append(split_topic(prefixed_topic(stream, literal)))
    if len({t.stream for t in topics}) != 1:
        raise CommandError(
            Reason.STREAM_ERROR, "one publication cannot span streams", parm_id=parm
        )
    resolved = (tuple(topics), tuple(t.topic for t in topics))
    if sum(map(len, raws)) <= _PUB_TOPICS_MAX_CHARS:
        if len(_PUB_TOPICS) >= _PUB_TOPICS_MAX:
            del _PUB_TOPICS[next(iter(_PUB_TOPICS))]
        _PUB_TOPICS[key] = resolved
    return resolved


def _topic_parm(cmd: Command) -> str:
    """The name of the topic parameter in this command's header generation."""
    return "MQPSTopic" if cmd.header is HeaderKind.RFH else "Topic"


class CommandHandlers:
    """The command handlers over one working set (see the module docstring).

    ``broker_q_mgr`` resolves blank identity queue managers; ``clock`` returns seconds
    since the epoch; ``counters`` are the engine's (Publish counts publications);
    ``why_broker_queue(q_mgr, queue)`` says why no subscriber may name a queue (it is, or
    resolves to, one the gateway keeps: "" when it may);
    ``authoriser`` (None: no authorisation) decides who may publish and subscribe where
    and which subscriber queues they may name (docs/security.md).
    ``sink_of(q_mgr, queue)`` names the registered sink whose backlog queue that is (""
    for any other queue): a RegSub/DeregSub naming it makes or removes that sink's
    subscription (``mqgw streams move``) when ``why_not_sink_command(md, body,
    streams)`` says "" (sealed with the gateway's key, recent, ``sinks: owner`` streams).
    """

    __slots__ = (
        "_table",
        "authoriser",
        "broker_q_mgr",
        "clock",
        "counters",
        "fanout",
        "sink_of",
        "state",
        "why_broker_queue",
        "why_not_sink_command",
    )

    def __init__(
        self,
        state: WorkingSet,
        fanout: Fanout,
        broker_q_mgr: str,
        clock: Callable[[], float],
        counters: Counters,
        why_broker_queue: Callable[[str, str], str] = lambda q_mgr, queue: "",
        authoriser: Authoriser | None = None,
        sink_of: Callable[[str, str], str] = lambda q_mgr, queue: "",
        why_not_sink_command: Callable[[MQMD, bytes, Collection[str]], str] = (
            lambda md, body, streams: "no sink command is taken"),
    ) -> None:
        self.state = state
        self.sink_of = sink_of
        self.why_not_sink_command = why_not_sink_command
        self.authoriser = authoriser
        self.why_broker_queue = why_broker_queue
        self.fanout = fanout
        self.broker_q_mgr = broker_q_mgr
        self.clock = clock
        self.counters = counters
        self._table: dict[CommandName, Handler] = {
            CommandName.PUBLISH: self.publish,
            CommandName.REG_SUB: self.reg_sub,
            CommandName.DEREG_SUB: self.dereg_sub,
            CommandName.REQ_UPDATE: self.req_update,
            CommandName.DELETE_PUB: self.delete_pub,
            CommandName.REG_PUB: self.reg_pub,
            CommandName.DEREG_PUB: self.dereg_pub,
        }

    def run(self, msg: InboundMessage, parsed: ParsedCommand, outcome: Outcome) -> None:
        """Run the handler of ``parsed``'s command."""
        self._table[parsed.command.name](msg, parsed, outcome)

    # ---------------------------------------------------------------- addressing ----

    def _identity(self, md: MQMD, cmd: Command, correl_as_id: bool) -> tuple[str, str, bytes]:
        """(q_mgr, queue, correl_id) of the subscriber or publisher a command names."""
        queue = cmd.q_name if cmd.q_name is not None else md.reply_to_q
        q_mgr = cmd.q_mgr_name if cmd.q_mgr_name is not None else md.reply_to_q_mgr
        rfh = cmd.header is HeaderKind.RFH
        if not queue:
            raise CommandError(
                Reason.Q_NAME_ERROR, "no subscriber queue (QName nor ReplyToQ)",
                parm_id="MQPSQName" if rfh else "QName",
            )
        # A name MQ cannot hold would be cut or refused where it is opened: the name
        # checked against the gateway's own queues must be the name put to.
        why = name_problem(queue, "subscriber queue name")
        if why:
            raise CommandError(Reason.Q_NAME_ERROR, why, parm_id="MQPSQName" if rfh else "QName",
                               value=queue[:Q_NAME_LENGTH])
        why = q_mgr and name_problem(q_mgr, "subscriber queue manager name", Q_MGR_NAME_LENGTH)
        if why:
            raise CommandError(Reason.CF_Q_MGR_NAME_ERROR, why,
                               parm_id="MQPSQMgrName" if rfh else "QMgrName",
                               value=q_mgr[:Q_MGR_NAME_LENGTH])
        queue, q_mgr = queue.rstrip(" "), q_mgr.rstrip(" ")
        correl = b""
        if correl_as_id:
            correl = cmd.correl_id if cmd.correl_id is not None else md.correl_id
            if correl == CI_NONE:
                raise CommandError(Reason.CORREL_ID_ERROR, "CorrelAsId with an all-zero CorrelId")
        return q_mgr or self.broker_q_mgr, queue, correl

    def _registration_identity(self, msg: InboundMessage, cmd: Command) -> tuple[str, str, bytes]:
        correl_as_id = bool(cmd.reg_opts & RegOpt.CORREL_ID_AS_IDENTITY)
        return self._identity(msg.md, cmd, correl_as_id)

    @staticmethod
    def _command_stream(msg: InboundMessage, cmd: Command) -> str:
        if cmd.header is HeaderKind.RFH2:
            return DEFAULT_STREAM
        return resolve_stream(
            cmd.stream,
            msg.queue,
            msg.implicit_stream_naming,
            is_stream_command=cmd.name in STREAM_COMMANDS,
        )

    def command_streams(self, msg: InboundMessage, cmd: Command) -> set[str]:
        """The streams a command names: MQRFH's stream (MQPSStreamName, the queue, or
        the default stream), MQRFH2's ``$SYS/STREAM/<stream>/`` topic prefixes."""
        if cmd.header is HeaderKind.RFH:
            return {self._command_stream(msg, cmd)}
        return {split_topic(t).stream for t in cmd.topics} or {DEFAULT_STREAM}

    def _command_patterns(
        self, msg: InboundMessage, cmd: Command
    ) -> tuple[Scheme, list[tuple[str, StreamTopic]]]:
        """(scheme, [(topic as sent, stream topic)]) of a subscription-type command."""
        parm = _topic_parm(cmd)
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
            full = prefixed_topic(stream, raw)
            out.append((raw, split_subscription_topic(full, scheme, parm)))
        return scheme, out

    # ---------------------------------------------------------------- authorisation -

    def _principal(self, msg: InboundMessage, parsed: ParsedCommand, source: str) -> Principal:
        assert self.authoriser is not None
        origin, _ = split_origin(parsed.extra_folders)
        return self.authoriser.principal_of(
            msg.md.user_identifier, origin=origin, neighbour=source
        )

    def _require(self, decision: Decision, cmd: Command, parm: str, value: str) -> None:
        """Refuse the command when ``decision`` says no: MQRCCF_NOT_AUTHORIZED in the
        response and the MQDLH (the command is dead-lettered), counted and logged."""
        if decision.allowed:
            return
        assert self.authoriser is not None
        self.authoriser.count("mq", decision)  # counted and reported (logged, summarised)
        raise CommandError(Reason.CF_NOT_AUTHORIZED, decision.detail, parm_id=parm, value=value)

    def _authorise_subscriber(
        self,
        msg: InboundMessage,
        parsed: ParsedCommand,
        ident: tuple[str, str, bytes],
        scheme: Scheme,
        patterns: list[tuple[str, StreamTopic]],
        *,
        check_queue: bool,
    ) -> None:
        """RegSub/DeregSub/ReqUpdate: the subscriber queue and every pattern."""
        authoriser = self.authoriser
        if authoriser is None:
            return
        cmd = parsed.command
        source = self.source_neighbour(cmd.q_mgr_name, msg.md)
        who = self._principal(msg, parsed, source)
        rfh = cmd.header is HeaderKind.RFH
        if check_queue:
            q_mgr, queue, _ = ident
            self._require(
                authoriser.may_use_subscriber_queue(who, q_mgr, queue),
                cmd,
                "MQPSQName" if rfh else "QName",
                queue.strip(),
            )
        for raw, st in patterns:
            self._require(
                authoriser.may_subscribe(who, st.stream, st.topic, scheme),
                cmd,
                _topic_parm(cmd),
                raw,
            )

    # ---------------------------------------------------------------- publications --

    def publish(self, msg: InboundMessage, parsed: ParsedCommand, outcome: Outcome) -> None:
        cmd = parsed.command
        parm = _topic_parm(cmd)
        md = msg.md
        source = self.source_neighbour(cmd.q_mgr_name, md)
        pub_opts = int(cmd.pub_opts)  # int masks: enum flag arithmetic is slow per message
        reg_opts = int(cmd.reg_opts)
        flagged_retained = bool(pub_opts & _IS_RETAINED_PUBLICATION)
        if flagged_retained:
            if not source:
                raise CommandError(
                    Reason.PUB_OPTIONS_ERROR, "IsRetainedPub is set by brokers only", parm_id=parm
                )
            # A neighbour broker tells its subscriber (our proxy, InformIfRet) that the
            # publication is a retained one: keep it retained here too.
            pub_opts = (pub_opts & ~_IS_RETAINED_PUBLICATION) | _RETAIN_PUBLICATION
        topics, pub_topics = _publication_topics(
            self._command_stream(msg, cmd), cmd.header is HeaderKind.RFH, cmd.topics, parm
        )
        stream = topics[0].stream
        if self.authoriser is not None:
            who = self._principal(msg, parsed, source)
            for raw, target in zip(cmd.topics, topics, strict=True):
                decision = self.authoriser.may_publish(who, stream, target.topic)
                if not decision.allowed and cmd.header is HeaderKind.RFH and cmd.stream:
                    self._require(decision, cmd, "MQPSStreamName", stream)
                self._require(decision, cmd, parm, raw)
        correl_as_id = bool(
            pub_opts & _PUB_CORREL_ID_AS_IDENTITY or reg_opts & _REG_CORREL_ID_AS_IDENTITY
        )
        queue = cmd.q_name if cmd.q_name is not None else md.reply_to_q
        q_mgr = (
            cmd.q_mgr_name if cmd.q_mgr_name is not None else md.reply_to_q_mgr
        ) or self.broker_q_mgr
        correl = b""
        if queue and correl_as_id:
            correl = md.correl_id
            if correl == CI_NONE:
                raise CommandError(Reason.CORREL_ID_ERROR, "CorrelAsId with an all-zero CorrelId")
        pub = Publication(
            stream=stream,
            topics=list(pub_topics),
            payload=parsed.payload,
            payload_format=parsed.payload_format,
            payload_encoding=parsed.payload_encoding,
            payload_ccsid=parsed.payload_ccsid,
            persistence=md.persistence,
            priority=md.priority,
            expiry=md.expiry,
            pub_opts=pub_opts,
            pub_time=cmd.pub_time,
            seq_num=cmd.seq_num,
            int_data=list(cmd.int_data),
            string_data=list(cmd.string_data),
            user_pairs=list(cmd.user_pairs),
            extra_folders=parsed.extra_folders,  # made for this message alone
            publisher_q_mgr=q_mgr if queue else "",
            publisher_queue=queue,
            direct_requests=bool(reg_opts & _DIRECT_REQUESTS),
            local=bool(reg_opts & _LOCAL),
            put_date=md.put_date,
            put_time=md.put_time,
            msg_id=md.msg_id,
            correl_id=md.correl_id,
            user_identifier=md.user_identifier,
            header="MQRFH" if cmd.header is HeaderKind.RFH else "MQRFH2",
        )
        pub.origin, pub.extra_folders = split_origin(pub.extra_folders)
        self.counters.publications += 1
        state = self.state
        # A neighbour broker is no publisher: its forwarded publications carry NoReg in
        # MQRFH, and MQRFH2 (no NoReg in psc) is recognised by the neighbour's QMgrName.
        if (
            queue
            and not pub_opts & _NO_REGISTRATION
            and q_mgr.strip() not in self.fanout.neighbours
        ):
            for t in pub.topics:
                reg = Publisher(stream, t, q_mgr, queue, correl, reg_opts)
                known = state.publishers.get(reg.key)
                if known is None or known.reg_opts != reg.reg_opts:
                    state.upsert_publisher(reg, outcome.mutations)
        now = self.clock()
        if pub_opts & _RETAIN_PUBLICATION and self._is_retained_replay(
            pub, source, flagged_retained
        ):
            return
        if pub_opts & _RETAIN_PUBLICATION:
            # a neighbour's copy is unsettled until its MQ unit of work commits
            token = state.unsettled_token() if source else 0
            for t in pub.topics:
                one = dataclasses.replace(
                    pub, topics=[t], pub_opts=pub_opts & ~_RETAIN_PUBLICATION
                )
                state.put_retained(
                    RetainedPublication(stream, t, one, now, token), outcome.mutations
                )
        exclude: tuple[str, str, bytes] | None = None
        if pub_opts & _OTHER_SUBSCRIBERS_ONLY and queue:
            exclude = (q_mgr, queue, correl)
        outcome.deliveries.extend(
            self.fanout.publication_deliveries(pub, exclude, outcome.mutations, source)
        )

    def source_neighbour(self, q_mgr_name: str | None, md: MQMD) -> str:
        """The neighbour broker a publication or DeletePub came from, or "": its
        MQPSQMgrName/QMgrName when that names a neighbour, else its MQMD ReplyToQMgr
        when that does (a broker forwarding a plain publication puts its own queue
        manager there). It never gets the publication back, whatever the options.

        Except from a gateway neighbour with a ReplyToQ other than the inter-broker
        queue: a gateway names itself in QMgrName in its forwards and commands, and its
        anonymous loop probes carry no ReplyToQ, so such a message is an application's
        on that gateway's queue manager (MQ filled ReplyToQMgr), routed here because
        this broker owns the stream (docs/scaling.md); that gateway's subscribers get
        it through their proxies like any other publication."""
        neighbours = self.fanout.neighbours
        if not neighbours:
            return ""
        if q_mgr_name and q_mgr_name.strip() in neighbours:
            return q_mgr_name.strip()
        name = md.reply_to_q_mgr.strip()
        neighbour = neighbours.get(name) if name else None
        if neighbour is None:
            return ""
        reply_to_q = md.reply_to_q.strip()
        if (neighbour.kind is NeighbourKind.GATEWAY and reply_to_q
                and reply_to_q != INTER_BROKER_QUEUE):
            return ""
        return neighbour.q_mgr

    def _is_retained_replay(self, pub: Publication, source: str, flagged: bool) -> bool:
        """A neighbour's retained publication this broker already holds: same MsgId
        (forwarded publications keep their first one) and same data.

        A neighbour sends its retained publications to every new proxy subscription
        (with RetainPub), including ones this broker forwarded to it or already got:
        every local subscriber matching the topic has that copy already (when it came,
        or from this broker's own retained copy at registration), so fanning it out
        again would deliver it twice (docs/neighbours.md). A publisher repeating a
        publication puts a new MsgId, so a repeat is never taken for a replay. A broker
        that is not a gateway sends its retained publications with a new MsgId but
        flagged IsRetainedPub (``flagged``): then the same data is enough.

        Never a copy still *unsettled*: this broker stored it in a unit of work whose
        MQ commit has not been seen, so this may be the same forward coming again after
        a crash or a failed MQ commit between the store's commit and MQ's, whose
        deliveries were backed out; delivered again, it reaches them (at least once).
        """
        if not source:
            return False
        if not flagged and (not pub.msg_id or pub.msg_id == MI_NONE):
            return False
        bucket = self.state.retained.get(pub.stream)
        if not bucket:
            return False
        for topic in pub.topics:
            held = bucket.get(topic)
            if (
                held is None
                or held.unsettled
                or (not flagged and held.publication.msg_id != pub.msg_id)
                or not _same_content(held.publication, pub)
            ):
                return False
        return True

    def delete_pub(self, msg: InboundMessage, parsed: ParsedCommand, outcome: Outcome) -> None:
        cmd = parsed.command
        scheme, patterns = self._command_patterns(msg, cmd)
        origin, _ = split_origin(parsed.extra_folders)
        if self.authoriser is not None:
            source = self.source_neighbour(cmd.q_mgr_name, msg.md)
            who = self._principal(msg, parsed, source)
            for raw, st in patterns:
                self._require(
                    self.authoriser.may_publish(who, st.stream, st.topic, scheme),
                    cmd,
                    _topic_parm(cmd),
                    raw,
                )
        for _raw, st in patterns:
            bucket = self.state.retained.get(st.stream, {})
            deleted_topics = [t for t in bucket if match_pattern(scheme, st.topic, t)]
            for topic in deleted_topics:
                deleted = bucket[topic].publication
                self.state.delete_retained(st.stream, topic, outcome.mutations)
                outcome.deliveries.extend(self.fanout.deletion_deliveries(deleted, topic, origin))
            if self.fanout.neighbours and not cmd.del_opts & DelOpt.LOCAL:
                came_from = self.source_neighbour(cmd.q_mgr_name, msg.md)
                outcome.forwards.extend(
                    delete_forwards(
                        self.fanout.neighbours.values(),
                        came_from=came_from,
                        stream=st.stream,
                        scheme=scheme,
                        pattern=st.topic,
                        deleted_topics=deleted_topics,
                        self_q_mgr=self.broker_q_mgr,
                        persistence=msg.md.persistence,
                    )
                )

    # ---------------------------------------------------------------- subscriptions -

    # ---------------------------------------------------------------- sinks ---------

    def _sink_identity(
        self, msg: InboundMessage, parsed: ParsedCommand, q_mgr: str, queue: str, correl: bytes
    ) -> str:
        """The sink whose backlog queue a RegSub/DeregSub names ("" for any other
        queue). Refused as not authorised (MQRCCF_NOT_AUTHORIZED in the response, the
        command dead-lettered with MQRC_NOT_AUTHORIZED, counted, logged summarised)
        unless sealed with the gateway's key and recent, for ``sinks: owner`` streams
        only; a DeregAll always (a move removes each subscription by its topic). The
        command's identity counts for nothing: anyone can write it."""
        sink = self.sink_of(q_mgr, queue)
        if not sink:
            return ""
        cmd = parsed.command
        parm = "MQPSQName" if cmd.header is HeaderKind.RFH else "QName"
        if cmd.reg_opts & RegOpt.DEREGISTER_ALL:
            why = "DeregAll is never taken for a sink"
        else:
            _, patterns = self._command_patterns(msg, cmd)
            why = self.why_not_sink_command(msg.md, msg.body, {st.stream for _, st in patterns})
        if why:
            decision = Decision(False, f"sink {sink!r}: a {cmd.name} naming its backlog queue "
                                f"is refused: {why}", Refusal.SINK_SUBSCRIPTION)
            if self.authoriser is not None:
                self.authoriser.count("mq", decision)  # counted and logged, summarised
            raise CommandError(Reason.CF_NOT_AUTHORIZED, decision.detail, parm_id=parm,
                               value=queue, dead_letter_reason=Reason.NOT_AUTHORIZED)
        if correl:
            raise CommandRefusedError(Reason.CORREL_ID_ERROR, f"sink {sink!r}: a sink's "
                                      "subscription has no CorrelId identity")
        return sink

    def _reg_sink_sub(
        self, msg: InboundMessage, parsed: ParsedCommand, outcome: Outcome, sink: str
    ) -> None:
        """RegSub for a sink: its subscription as the sink itself makes it
        (:meth:`subscribe_sink`), with the command's options."""
        cmd = parsed.command
        scheme, patterns = self._command_patterns(msg, cmd)
        for _raw, st in patterns:
            _, deliveries = self.subscribe_sink(sink, st, scheme, RegOpt(int(cmd.reg_opts)),
                                                "", outcome.mutations)
            outcome.deliveries.extend(deliveries)
            # rare (an operator's move) and sealed: each one is worth a line
            log.info("sink %s subscribed to %r on %s by a sealed RegSub (mqgw streams move)",
                     sink, st.topic, st.stream)

    def subscribe_sink(
        self, sink: str, st: StreamTopic, scheme: Scheme, reg_opts: RegOpt, sub_name: str,
        mutations: list[Mutation],
    ) -> tuple[Subscription, list[Delivery]]:
        """Make (or replace: its creation time kept) the in-process sink ``sink``'s
        subscription to ``st``; the retained deliveries due to it unless NewPubsOnly or
        PubOnReqOnly. The engine's own :meth:`PubSubEngine.subscribe_sink` and a RegSub
        naming the sink's backlog queue both make it here."""
        sub = Subscription(
            stream=st.stream, topic=st.topic, scheme=scheme,
            destination=Destination(sink=sink), fmt=SubFormat.SINK,
            reg_opts=int(reg_opts), sub_name=sub_name, created=self.clock(),
        )
        existing = self.state.subs.get(sub.key)
        if existing is not None:
            sub.created = existing.created
        self.state.upsert_sub(sub, mutations)
        if reg_opts & (RegOpt.NEW_PUBLICATIONS_ONLY | RegOpt.PUBLISH_ON_REQUEST_ONLY):
            return sub, []
        return sub, self.fanout.retained_deliveries(sub, sub.topic)

    def _dereg_sink_sub(
        self, msg: InboundMessage, parsed: ParsedCommand, outcome: Outcome, sink: str
    ) -> None:
        """DeregSub for a sink (never DeregAll: :meth:`_sink_identity`): as for any
        subscriber, MQRCCF_NOT_REGISTERED when it had none of the topics (the caller
        decides whether that is fine)."""
        cmd = parsed.command
        scheme, patterns = self._command_patterns(msg, cmd)

        def removed(sub: Subscription) -> None:
            log.info("sink %s unsubscribed from %r on %s by a sealed DeregSub (mqgw "
                     "streams move)", sink, sub.topic, sub.stream)

        self._deregister(cmd, outcome, patterns,
                         lambda st: (st.stream, int(scheme), st.topic, "", "", sink, b""),
                         removed)

    # ---------------------------------------------------------------- subscriptions -

    def reg_sub(self, msg: InboundMessage, parsed: ParsedCommand, outcome: Outcome) -> None:
        cmd = parsed.command
        md = msg.md
        q_mgr, queue, correl = self._registration_identity(msg, cmd)
        if sink := self._sink_identity(msg, parsed, q_mgr, queue, correl):
            self._reg_sink_sub(msg, parsed, outcome, sink)
            return
        if self.authoriser is not None:
            scheme, patterns = self._command_patterns(msg, cmd)
            self._authorise_subscriber(
                msg, parsed, (q_mgr, queue, correl), scheme, patterns, check_queue=True
            )
        why = self.why_broker_queue(q_mgr, queue)
        if why:
            # MQ answers a subscriber queue it cannot use with MQRCCF_Q_NAME_ERROR.
            raise CommandRefusedError(
                Reason.Q_NAME_ERROR,
                f"subscriber queue {why}",
                parm_id="MQPSQName" if cmd.header is HeaderKind.RFH else "QName",
                value=queue.strip(),
            )
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
            existing = self.state.subs.get(sub.key)
            if existing is not None:
                _check_owner(existing, md.user_identifier, cmd)
                if cmd.reg_opts & RegOpt.NO_ALTERATION:
                    sub = existing
                    if existing.suspended:  # registering again resumes it
                        sub = dataclasses.replace(existing, suspended=False)
                        self.state.upsert_sub(sub, outcome.mutations)
                else:
                    sub.created = existing.created
                    self.state.upsert_sub(sub, outcome.mutations)
            else:
                self.state.upsert_sub(sub, outcome.mutations)
            if not sub.reg_opts & (RegOpt.NEW_PUBLICATIONS_ONLY | RegOpt.PUBLISH_ON_REQUEST_ONLY):
                outcome.deliveries.extend(self.fanout.retained_deliveries(sub, sub.topic))
            # rare (an operator's move) and sealed: each one is worth a line
            log.info("sink %s subscribed to %r on %s by a sealed RegSub (mqgw streams move)",
                     sink, st.topic, st.stream)

    def dereg_sub(self, msg: InboundMessage, parsed: ParsedCommand, outcome: Outcome) -> None:
        cmd = parsed.command
        q_mgr, queue, correl = self._registration_identity(msg, cmd)
        if sink := self._sink_identity(msg, parsed, q_mgr, queue, correl):
            self._dereg_sink_sub(msg, parsed, outcome, sink)
            return
        dest = Destination(q_mgr, queue)
        if cmd.reg_opts & RegOpt.DEREGISTER_ALL:
            stream = self._command_stream(msg, cmd) if cmd.header is HeaderKind.RFH else None
            if stream is not None:
                self._authorise_subscriber(
                    msg,
                    parsed,
                    (q_mgr, queue, correl),
                    Scheme.TOPIC,
                    [("#", StreamTopic(stream, "#"))],
                    check_queue=False,
                )
            keys = [
                k
                for k, s in self.state.subs.items()
                if s.destination == dest
                and s.correl_id == correl
                and (stream is None or s.stream == stream)
                and (not cmd.sub_name or s.sub_name == cmd.sub_name)
            ]
            if not keys:
                raise CommandRefusedError(Reason.NOT_REGISTERED, "no subscriptions to deregister")
            for k in keys:
                self.state.delete_sub(k, outcome.mutations)
            return
        scheme, patterns = self._command_patterns(msg, cmd)
        self._authorise_subscriber(
            msg, parsed, (q_mgr, queue, correl), scheme, patterns, check_queue=False
        )
        self._deregister(
            cmd, outcome, patterns,
            lambda st: (st.stream, int(scheme), st.topic, q_mgr, queue, "", correl),
            lambda existing: _check_owner(existing, msg.md.user_identifier, cmd),
        )

    def _deregister(
        self,
        cmd: Command,
        outcome: Outcome,
        patterns: list[tuple[str, StreamTopic]],
        key_of: Callable[[StreamTopic], SubKey],
        before_delete: Callable[[Subscription], None],
    ) -> None:
        """Delete the subscription of each pattern (``before_delete`` sees each first,
        and may refuse it by raising); MQRCCF_NOT_REGISTERED when none existed, a
        warning naming the first missing one when some did not."""
        parm = _topic_parm(cmd)
        missing: list[str] = []
        for raw, st in patterns:
            key = key_of(st)
            existing = self.state.subs.get(key)
            if existing is not None:
                before_delete(existing)
                self.state.delete_sub(key, outcome.mutations)
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

    def req_update(self, msg: InboundMessage, parsed: ParsedCommand, outcome: Outcome) -> None:
        cmd = parsed.command
        q_mgr, queue, correl = self._registration_identity(msg, cmd)
        scheme, patterns = self._command_patterns(msg, cmd)
        self._authorise_subscriber(
            msg, parsed, (q_mgr, queue, correl), scheme, patterns[:1], check_queue=True
        )
        parm = _topic_parm(cmd)
        raw, st = patterns[0]
        key: SubKey = (st.stream, int(scheme), st.topic, q_mgr, queue, "", correl)
        sub = self.state.subs.get(key)
        if sub is None:
            raise CommandRefusedError(
                Reason.NOT_REGISTERED, f"no subscription for {raw!r}", parm_id=parm, value=raw
            )
        deliveries = self.fanout.retained_deliveries(sub, sub.topic)
        if not deliveries:
            raise CommandRefusedError(
                Reason.NO_RETAINED_MSG, f"nothing retained for {raw!r}", parm_id=parm, value=raw
            )
        outcome.deliveries.extend(deliveries)

    # ---------------------------------------------------------------- publishers ----

    def reg_pub(self, msg: InboundMessage, parsed: ParsedCommand, outcome: Outcome) -> None:
        cmd = parsed.command
        q_mgr, queue, correl = self._registration_identity(msg, cmd)
        stream = self._command_stream(msg, cmd)
        regs: list[Publisher] = []
        for raw in cmd.topics:
            literal = decode_char_publication_topic(raw, "MQPSTopic")
            st = split_topic(prefixed_topic(stream, literal))
            regs.append(Publisher(st.stream, st.topic, q_mgr, queue, correl, int(cmd.reg_opts)))
        for reg in regs:
            self.state.upsert_publisher(reg, outcome.mutations)

    def dereg_pub(self, msg: InboundMessage, parsed: ParsedCommand, outcome: Outcome) -> None:
        cmd = parsed.command
        ident = self._registration_identity(msg, cmd)
        stream = self._command_stream(msg, cmd)
        publishers = self.state.publishers
        if cmd.reg_opts & RegOpt.DEREGISTER_ALL:
            keys = [
                k
                for k, p in publishers.items()
                if (p.q_mgr, p.queue, p.correl_id) == ident and p.stream == stream
            ]
        else:
            keys = []
            for raw in cmd.topics:
                compiled = compile_char_pattern(prefixed_topic(stream, raw), "MQPSTopic")
                for k, p in publishers.items():
                    if (p.q_mgr, p.queue, p.correl_id) == ident and compiled.matches(
                        prefixed_topic(p.stream, p.topic)
                    ):
                        keys.append(k)
        if not keys:
            raise CommandRefusedError(Reason.NOT_REGISTERED, "publisher not registered")
        for k in keys:
            self.state.delete_publisher(k, outcome.mutations)


def _same_content(held: Publication, new: Publication) -> bool:
    """Same publication data (payload, its format, the publisher's PubTime/SeqNum and
    data), whichever broker forwarded it or header generation carried it."""
    same = (
        held.payload == new.payload
        and held.payload_format == new.payload_format
        and held.payload_encoding == new.payload_encoding
        and held.payload_ccsid == new.payload_ccsid
        and held.pub_time == new.pub_time
        and held.seq_num == new.seq_num
    )
    if same and held.header == new.header:
        same = (
            held.user_pairs == new.user_pairs
            and held.extra_folders == new.extra_folders
            and held.int_data == new.int_data
            and held.string_data == new.string_data
        )
    return same


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
