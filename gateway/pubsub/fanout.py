"""Fan-out: which subscriptions get a publication, and the delivery each one gets.

Why its own module: matching (the topic index, lapsed subscriptions, one copy per
subscriber identity unless DupsOK, never back to the originating sink) is the hot path
and is the same for a new publication, for retained publications replayed to a new
subscriber and for a DeletePub told to sinks; the command handlers only say which.
Formatting one delivery's MQMD and body is :mod:`gateway.pubsub.deliveries`; a
subscription whose queue manager is a neighbour broker gets a forwarded Publish command
(one dict lookup per delivery: ``neighbours`` is keyed by queue manager).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from gateway.pubsub.deliveries import build_delivery
from gateway.pubsub.neighbours import Neighbour, uses_rfh2
from gateway.pubsub.options import RegOpt
from gateway.pubsub.outcome import Delivery
from gateway.pubsub.records import Destination, Publication, SubFormat, SubKey, Subscription
from gateway.pubsub.store import Mutation
from gateway.pubsub.streams import prefixed_topic
from gateway.pubsub.topics import Scheme, literal_topic, match_pattern
from gateway.pubsub.working_set import WorkingSet
from gateway.wire.put_time import put_date_time

__all__ = ["Fanout"]

_PUB_ON_REQ_ONLY = int(RegOpt.PUBLISH_ON_REQUEST_ONLY)
_DUPS_OK = int(RegOpt.DUPLICATES_OK)
# Enum members as module globals: a member lookup on the enum class is slow per delivery.
_FMT_RFH = SubFormat.RFH
_FMT_SINK = SubFormat.SINK


class Fanout:
    """Builds the deliveries of publications from the subscriptions in ``state``.

    ``broker_q_mgr`` is the broker's queue manager (forwarded publications carry it);
    ``clock`` returns seconds since the epoch; ``neighbours`` maps a neighbour
    broker's queue manager to it (the engine replaces it on join/clear).
    """

    __slots__ = ("broker_q_mgr", "clock", "neighbours", "state")

    def __init__(
        self,
        state: WorkingSet,
        broker_q_mgr: str,
        clock: Callable[[], float],
        neighbours: dict[str, Neighbour] | None = None,
    ) -> None:
        self.state = state
        self.broker_q_mgr = broker_q_mgr
        self.clock = clock
        self.neighbours: dict[str, Neighbour] = neighbours if neighbours is not None else {}

    def publication_deliveries(
        self,
        pub: Publication,
        exclude: tuple[str, str, bytes] | None,
        out: list[Mutation],
        source: str = "",
    ) -> list[Delivery]:
        """A new publication's deliveries; ``exclude`` is the publisher's own
        ``(q_mgr, queue, correl_id)`` for OtherSubscribersOnly; ``source`` the neighbour
        broker it came from (none of whose subscriptions gets it back, OtherSubsOnly or
        not: a broker that is not a gateway forwards plain publications). Lapsed
        subscriptions met on the way are deleted (their mutations go to ``out``)."""
        index = self.state.index.get(pub.stream)
        # first topic (in publication order) each subscription matched
        first_topic: dict[SubKey, str] = {}
        if index is not None and len(index):
            for topic in pub.topics:
                for key in index.match(topic):
                    first_topic.setdefault(key, topic)
        if not first_topic and not self.neighbours:
            return []
        # One copy per subscriber identity unless the subscription says DupsOK. The
        # identity is (destination fields, correl id): a tuple of str/bytes hashes far
        # faster than the frozen Destination; the key is kept (not recomputed per use).
        chosen: dict[object, tuple[SubKey, Subscription]] = {}
        subs = self.state.subs
        now = self.clock()
        for key in sorted(first_topic):
            sub = subs[key]
            opts = sub.reg_opts
            if opts & _PUB_ON_REQ_ONLY or sub.suspended:
                continue
            if sub.expires_at and sub.expires_at <= now:
                self.state.delete_sub(key, out)  # lapsed: removed with this unit of work
                continue
            d = sub.destination
            if exclude is not None and not d.sink and (d.q_mgr, d.queue, sub.correl_id) == exclude:
                continue
            if d.sink and d.sink == pub.origin:
                continue  # never back to the plugin instance it came from
            if source and not d.sink and d.q_mgr == source:
                continue  # never back to the neighbour broker it came from
            if pub.local and not d.sink and d.q_mgr in self.neighbours:
                continue  # published with RegOpt Local: not for other brokers
            ident: object = key if opts & _DUPS_OK else (d.q_mgr, d.queue, d.sink, sub.correl_id)
            if ident not in chosen:
                chosen[ident] = (key, sub)
        cache: dict[tuple[object, ...], bytes] = {}
        if pub.msg_id and pub.put_date and all(s.fmt is _FMT_SINK for _, s in chosen.values()):
            # sinks see the publisher's own stamp (see delivery): none of the broker's
            stamp = (pub.put_date, pub.put_time)
        else:
            stamp = put_date_time(now)
        out_deliveries = [
            self.delivery(sub, pub, first_topic[key], False, now, cache=cache, stamp=stamp,
                          key=key)
            for key, sub in chosen.values()
        ]
        if self.neighbours and pub.topics and not pub.local:
            served = {s.destination.q_mgr for _, s in chosen.values() if not s.destination.sink}
            for n in self.neighbours.values():
                if not n.publish_all or n.q_mgr in served or n.q_mgr == source:
                    continue
                if pub.stream not in n.streams:
                    continue
                if exclude is not None and exclude == (n.q_mgr, pub.stream, b""):
                    continue
                sub = Subscription(
                    stream=pub.stream,
                    topic=pub.topics[0],
                    scheme=Scheme.TOPIC,
                    destination=Destination(n.q_mgr, pub.stream),
                    fmt=SubFormat.RFH2 if uses_rfh2(n.kind) else SubFormat.RFH,
                )
                out_deliveries.append(self.delivery(sub, pub, pub.topics[0], False, now))
        return out_deliveries

    def retained_deliveries(self, sub: Subscription, pattern: str) -> list[Delivery]:
        """The retained publications of ``sub``'s stream that ``pattern`` matches."""
        bucket = self.state.retained.get(sub.stream)
        if not bucket:
            return []
        # A literal pattern is looked up: matching every retained topic made each
        # registration (each proxy a neighbour registers) cost O(retained topics).
        exact = literal_topic(sub.scheme, pattern)
        if exact is not None:
            topics = [exact] if exact in bucket else []
        else:
            topics = sorted(t for t in bucket if match_pattern(sub.scheme, pattern, t))
        now = self.clock()
        out: list[Delivery] = []
        for topic in topics:
            ret = bucket[topic]
            if sub.destination.sink and sub.destination.sink == ret.publication.origin:
                continue
            if ret.publication.local and sub.destination.q_mgr in self.neighbours:
                continue
            held = max(0.0, now - ret.stored_at)
            if ret.publication.expiry > 0 and held * 10 >= ret.publication.expiry:
                continue  # expired while held
            out.append(self.delivery(sub, ret.publication, topic, True, now, held))
        return out

    def deletion_deliveries(self, pub: Publication, topic: str, origin: str) -> list[Delivery]:
        """Tell sink subscribers of ``topic`` that its retained publication is gone.

        MQ subscribers learn nothing of a DeletePub (reference §5.5); the gateway's sinks
        mirror retained state elsewhere (a compacted Kafka topic, MQTT retained
        messages), so they get a delivery flagged ``deleted``.
        """
        index = self.state.index.get(pub.stream)
        if index is None or not len(index):
            return []
        gone = dataclasses.replace(pub, topics=[topic], payload=b"", origin=origin)
        now = self.clock()
        out: list[Delivery] = []
        seen: set[str] = set()
        for key in sorted(index.match(topic)):
            sub = self.state.subs[key]
            sink = sub.destination.sink
            if not sink or sink == origin or sink in seen:
                continue
            if sub.expires_at and sub.expires_at <= now:
                continue
            seen.add(sink)
            d = self.delivery(sub, gone, topic, True, now)
            d.deleted = True
            d.body = b""
            out.append(d)
        return out

    def delivery(
        self,
        sub: Subscription,
        pub: Publication,
        topic: str,
        retained: bool,
        now: float,
        held_for: float = 0.0,
        cache: dict[tuple[object, ...], bytes] | None = None,
        stamp: tuple[str, str] | None = None,
        key: SubKey | None = None,
    ) -> Delivery:
        """``pub`` (matched on ``topic``) formatted for ``sub``: a forwarded Publish
        command when ``sub`` belongs to a neighbour broker. ``key``: ``sub.key``, when
        the caller has it already."""
        forward_as: SubFormat | None = None
        d = sub.destination
        if not d.sink and self.neighbours:
            neighbour = self.neighbours.get(d.q_mgr)
            if neighbour is not None:
                forward_as = SubFormat.RFH2 if uses_rfh2(neighbour.kind) else SubFormat.RFH
        md, body = build_delivery(
            pub,
            sub,
            topic,
            retained=retained,
            broker_q_mgr=self.broker_q_mgr,
            now=now,
            held_for=held_for,
            body_cache=cache,
            stamp=stamp,
            forward_as=forward_as,
        )
        seen_fmt = sub.fmt if forward_as is None else forward_as
        seen_topic = topic if seen_fmt is _FMT_RFH else prefixed_topic(pub.stream, topic)
        if sub.fmt is _FMT_SINK and pub.msg_id:
            # Sinks see the publication as its publisher put it (Kafka contract: mq.msgId,
            # mq.correlId, mq.putTime, mq.userId), not the broker's forwarding identity.
            md.msg_id, md.correl_id = pub.msg_id, pub.correl_id
            md.user_identifier = pub.user_identifier
            if pub.put_date:
                md.put_date, md.put_time = pub.put_date, pub.put_time
        return Delivery(sub.destination, sub.key if key is None else key, md, body, pub,
                        seen_topic, retained)
