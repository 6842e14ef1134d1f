"""Engines as neighbours: forwarded Publish commands, retained copies held at every
broker, DeletePub propagation, the neighbours' life cycle.

Several engines are wired into one network by :class:`Net`, which plays the queue
managers and the neighbour links: it registers proxies with :func:`wanted_proxies` and
:func:`proxy_command`, and puts every delivery, forward and command to the engine whose
control or stream queue it names (anything else lands in an inbox). Only the documented
command messages pass between engines.
"""

from __future__ import annotations

from collections import Counter, defaultdict

import pytest

from gateway.pubsub.commands import CommandName
from gateway.pubsub.engine import PubSubEngine
from gateway.pubsub.inbound import decode_command_message
from gateway.pubsub.neighbours import (
    Neighbour,
    NeighbourKind,
    NeighbourRole,
    ProxyKey,
    proxy_command,
    wanted_proxies,
)
from gateway.pubsub.options import PubOpt
from gateway.pubsub.outcome import InboundMessage, Outcome
from gateway.pubsub.records import Destination
from gateway.pubsub.store import MemoryStore
from gateway.pubsub.streams import CONTROL_QUEUE, DEFAULT_STREAM, INTER_BROKER_QUEUE
from gateway.wire.constants import CompCode, MsgType
from gateway.wire.formats import FMT_RF_HEADER, FMT_RF_HEADER_2
from gateway.wire.mqmd import MQMD
from tests.support.pubsub_messages import decode, rfh2_message, rfh_message

BULLETIN = "BULLETIN.STREAM"
STOCK = "STOCK.STREAM"
STREAMS = frozenset({DEFAULT_STREAM, BULLETIN, STOCK})


def nb(q_mgr: str, kind: NeighbourKind, streams: frozenset[str] = STREAMS) -> Neighbour:
    return Neighbour(q_mgr, kind, NeighbourRole.CHILD, streams | {DEFAULT_STREAM})


class Net:
    """Engines by queue manager, linked as neighbours, with a message router."""

    def __init__(self) -> None:
        self.engines: dict[str, PubSubEngine] = {}
        self.registered: dict[tuple[str, str], set[ProxyKey]] = defaultdict(set)
        #: (q_mgr, queue) -> messages put there that no engine services
        self.inbox: dict[tuple[str, str], list[tuple[MQMD, bytes]]] = defaultdict(list)
        #: (q_mgr, queue) -> how many messages were put to that engine queue
        self.put_to: Counter[tuple[str, str]] = Counter()
        self._ids = 0

    def add(self, q_mgr: str) -> PubSubEngine:
        engine = PubSubEngine(q_mgr, MemoryStore())
        self.engines[q_mgr] = engine
        return engine

    def link(
        self,
        a: str,
        b: str,
        kind_of_b: NeighbourKind = NeighbourKind.MQPUBSUB,
        kind_of_a: NeighbourKind = NeighbourKind.MQPUBSUB,
        streams: frozenset[str] = STREAMS,
    ) -> None:
        ea, eb = self.engines[a], self.engines[b]
        ea.set_neighbours({**ea.neighbours, b: nb(b, kind_of_b, streams)})
        eb.set_neighbours({**eb.neighbours, a: nb(a, kind_of_a, streams)})

    def put(self, q_mgr: str, queue: str, md: MQMD, body: bytes) -> Outcome | None:
        engine = self.engines.get(q_mgr)
        if engine is None or not (queue == CONTROL_QUEUE or queue in STREAMS):
            self.inbox[(q_mgr, queue)].append((md, body))
            return None
        self.put_to[(q_mgr, queue)] += 1
        return self.handle(q_mgr, InboundMessage(queue, md, body))

    def handle(self, q_mgr: str, msg: InboundMessage) -> Outcome:
        """One unit of work at ``q_mgr``: handle, commit (the store's, then MQ's: the
        retained copies it stored are settled), put everything it produced."""
        engine = self.engines[q_mgr]
        out = engine.handle(msg)
        assert out.dead_letter is None, out.dead_letter
        engine.settle_retained(engine.commit())
        for d in out.deliveries:
            if d.destination.sink:
                self.inbox[(q_mgr, "sink:" + d.destination.sink)].append((d.md, d.body))
            else:
                self.put(d.destination.q_mgr or q_mgr, d.destination.queue, d.md, d.body)
        for f in out.forwards:
            self.put(f.q_mgr or q_mgr, f.queue, f.md, f.body)
        if out.response is not None:
            r = out.response
            self.inbox[(r.q_mgr, r.queue)].append((r.md, r.body))
        self.sync()
        return out

    def sync(self) -> None:
        """The neighbour links: register / withdraw proxies until nothing changes."""
        changed = True
        while changed:
            changed = False
            for name, engine in self.engines.items():
                for neighbour in engine.neighbours.values():
                    wanted = set(wanted_proxies(engine.subscriptions, neighbour, engine.neighbours))
                    have = self.registered[(name, neighbour.q_mgr)]
                    for key in sorted(wanted ^ have):
                        register = key in wanted
                        (have.add if register else have.discard)(key)
                        self._ids += 1
                        cmd = proxy_command(
                            neighbour,
                            key,
                            register=register,
                            self_q_mgr=name,
                            msg_id=b"PROXY%d" % self._ids,
                        )
                        out = self.put(cmd.q_mgr, cmd.queue, cmd.md, cmd.body)
                        assert out is not None and out.comp_code == CompCode.OK, out
                        changed = True

    def local(self, q_mgr: str, q_name: str) -> list[tuple[MQMD, bytes]]:
        return self.inbox[(q_mgr, q_name)]


def subscribe(net: Net, q_mgr: str, queue: str, topic: str, stream: str = BULLETIN) -> None:
    out = net.handle(
        q_mgr,
        rfh_message(
            CONTROL_QUEUE,
            [
                ("MQPSCommand", "RegSub"),
                ("MQPSStreamName", stream),
                ("MQPSTopic", topic),
                ("MQPSQName", queue),
            ],
            reply_to_q_mgr=q_mgr,
        ),
    )
    assert (out.comp_code, out.reason) == (0, 0)


def unsubscribe(net: Net, q_mgr: str, queue: str, topic: str, stream: str = BULLETIN) -> None:
    out = net.handle(
        q_mgr,
        rfh_message(
            CONTROL_QUEUE,
            [
                ("MQPSCommand", "DeregSub"),
                ("MQPSStreamName", stream),
                ("MQPSTopic", topic),
                ("MQPSQName", queue),
            ],
            reply_to_q_mgr=q_mgr,
        ),
    )
    assert (out.comp_code, out.reason) == (0, 0)


def publish_message(
    q_mgr: str, topic: str, payload: bytes, *, retain: bool = False, stream: str = BULLETIN
) -> InboundMessage:
    pairs = [("MQPSCommand", "Publish"), ("MQPSStreamName", stream), ("MQPSTopic", topic)]
    if retain:
        pairs.append(("MQPSPubOpts", "RetainPub"))
    return rfh_message(stream, pairs, payload, reply_to_q="PUB.Q", reply_to_q_mgr=q_mgr)


def publish(
    net: Net,
    q_mgr: str,
    topic: str,
    payload: bytes,
    *,
    retain: bool = False,
    stream: str = BULLETIN,
) -> Outcome:
    return net.handle(q_mgr, publish_message(q_mgr, topic, payload, retain=retain, stream=stream))


def payloads(net: Net, q_mgr: str, queue: str) -> list[bytes]:
    return [decode(md, body).payload for md, body in net.local(q_mgr, queue)]


KINDS = [NeighbourKind.MQPUBSUB, NeighbourKind.MQV7, NeighbourKind.GATEWAY]


# ------------------------------------------------------------------ forwarding -------


@pytest.mark.parametrize("kind", KINDS)
def test_delivery_to_a_neighbours_proxy_is_a_forwarded_publish_command(kind: NeighbourKind) -> None:
    net = Net()
    net.add("QMA")
    net.add("QMB")
    net.link("QMA", "QMB", kind_of_b=kind, kind_of_a=kind)
    subscribe(net, "QMB", "LOCAL.B", "news")
    # B's interest reached A as a proxy subscription with B's identity
    [proxy] = net.engines["QMA"].subscriptions
    assert proxy.destination == Destination("QMB", BULLETIN)
    assert proxy.correl_id == b""

    msg = publish_message("QMA", "news", b"first", retain=True)
    out = net.handle("QMA", msg)

    [forward] = out.deliveries
    assert forward.md.msg_id == msg.md.msg_id  # the publication keeps its first MsgId
    assert forward.destination == Destination("QMB", BULLETIN)
    rfh2 = kind is NeighbourKind.GATEWAY
    assert forward.md.format == (FMT_RF_HEADER_2 if rfh2 else FMT_RF_HEADER)
    assert forward.md.msg_type == MsgType.DATAGRAM
    assert forward.md.persistence == 1  # as the publication (PersAsPub)
    cmd = decode_command_message(forward.md, forward.body).command
    assert cmd.name is CommandName.PUBLISH
    assert (cmd.q_mgr_name, cmd.q_name) == ("QMA", BULLETIN)
    # NoReg (MQRFH only; psc has no such option): the receiver registers no publisher
    no_reg = PubOpt.NONE if rfh2 else PubOpt.NO_REGISTRATION
    assert cmd.pub_opts == PubOpt.OTHER_SUBSCRIBERS_ONLY | PubOpt.RETAIN_PUBLICATION | no_reg
    if rfh2:
        assert cmd.topics == ["$SYS/STREAM/BULLETIN.STREAM/news"]
    else:
        assert (cmd.stream, cmd.topics) == (BULLETIN, ["news"])
    # B delivered it to its local subscriber, once, and kept a retained copy
    assert payloads(net, "QMB", "LOCAL.B") == [b"first"]
    [held] = net.engines["QMB"].retained(BULLETIN)
    assert (held.topic, held.publication.payload) == ("news", b"first")


def test_forwarded_publication_never_goes_back_to_the_sender() -> None:
    """Both brokers have subscribers, so each holds the other's proxy: the publication
    from A reaches B's subscriber and is not sent back to A (OtherSubsOnly identity)."""
    net = Net()
    net.add("QMA")
    net.add("QMB")
    net.link("QMA", "QMB")
    subscribe(net, "QMA", "LOCAL.A", "news")
    subscribe(net, "QMB", "LOCAL.B", "news")
    assert Destination("QMA", BULLETIN) in {s.destination for s in net.engines["QMB"].subscriptions}

    publish(net, "QMA", "news", b"one")

    assert payloads(net, "QMA", "LOCAL.A") == [b"one"]
    assert payloads(net, "QMB", "LOCAL.B") == [b"one"]
    assert net.put_to[("QMB", BULLETIN)] == 1
    assert net.put_to[("QMA", BULLETIN)] == 0  # nothing came back to A's stream queue
    # and the other way round
    publish(net, "QMB", "news", b"two")
    assert payloads(net, "QMA", "LOCAL.A") == [b"one", b"two"]
    assert payloads(net, "QMB", "LOCAL.B") == [b"one", b"two"]


def test_non_retained_publication_is_not_retained_at_the_neighbour() -> None:
    net = Net()
    net.add("QMA")
    net.add("QMB")
    net.link("QMA", "QMB")
    subscribe(net, "QMB", "LOCAL.B", "news")
    out = publish(net, "QMA", "news", b"x")
    cmd = decode_command_message(out.deliveries[0].md, out.deliveries[0].body).command
    assert cmd.pub_opts == PubOpt.OTHER_SUBSCRIBERS_ONLY | PubOpt.NO_REGISTRATION
    assert net.engines["QMB"].retained(BULLETIN) == []


def test_a_new_proxy_receives_the_retained_publication_as_retained() -> None:
    """A held a retained publication before B's first subscriber: B's proxy gets it
    (RetainPub), B keeps it, and a later subscriber at B gets it from B."""
    net = Net()
    net.add("QMA")
    net.add("QMB")
    net.link("QMA", "QMB", kind_of_b=NeighbourKind.GATEWAY, kind_of_a=NeighbourKind.GATEWAY)
    publish(net, "QMA", "news", b"held", retain=True)
    assert net.put_to[("QMB", BULLETIN)] == 0

    subscribe(net, "QMB", "LOCAL.B", "news")

    assert payloads(net, "QMB", "LOCAL.B") == [b"held"]
    assert [r.publication.payload for r in net.engines["QMB"].retained(BULLETIN)] == [b"held"]
    subscribe(net, "QMB", "LATE.B", "n*")
    # the wider subscriber widened B's proxy at A, and A replayed "news" to it: B already
    # held that very publication, so nobody at B gets it twice
    assert payloads(net, "QMB", "LATE.B") == [b"held"]
    assert payloads(net, "QMB", "LOCAL.B") == [b"held"]
    assert net.put_to[("QMB", BULLETIN)] == 2


def test_retained_publication_replayed_back_to_its_origin_is_not_delivered_again() -> None:
    net = Net()
    net.add("QMA")
    net.add("QMB")
    net.link("QMA", "QMB")
    subscribe(net, "QMA", "LOCAL.A", "news")
    subscribe(net, "QMB", "LOCAL.B", "news")
    publish(net, "QMB", "news", b"from-b", retain=True)
    assert payloads(net, "QMA", "LOCAL.A") == [b"from-b"]
    # a new subscriber at B needs a new proxy at A; A replays what it holds (B's own)
    subscribe(net, "QMB", "WIDE.B", "*")
    assert payloads(net, "QMB", "LOCAL.B") == [b"from-b"]
    assert payloads(net, "QMB", "WIDE.B") == [b"from-b"]
    # a changed retained publication from the neighbour is a new one
    publish(net, "QMA", "news", b"newer", retain=True)
    assert payloads(net, "QMB", "LOCAL.B") == [b"from-b", b"newer"]
    assert [r.publication.payload for r in net.engines["QMB"].retained(BULLETIN)] == [b"newer"]
    # and a local publisher repeating a retained publication is always delivered
    publish(net, "QMB", "news", b"newer", retain=True)
    assert payloads(net, "QMB", "LOCAL.B") == [b"from-b", b"newer", b"newer"]
    assert payloads(net, "QMA", "LOCAL.A") == [b"from-b", b"newer", b"newer"]


def test_mqrfh2_publisher_reaches_an_mqrfh_subscriber_through_a_gateway_neighbour() -> None:
    net = Net()
    net.add("QMA")
    net.add("GW")
    net.link("QMA", "GW", kind_of_b=NeighbourKind.GATEWAY, kind_of_a=NeighbourKind.MQPUBSUB)
    subscribe(net, "QMA", "LOCAL.A", "news/*")
    out = net.handle(
        "GW",
        rfh2_message(
            CONTROL_QUEUE,
            [("Command", "Publish"), ("Topic", "$SYS/STREAM/BULLETIN.STREAM/news/today")],
            b"rfh2",
        ),
    )
    assert out.comp_code == CompCode.OK
    [(md, body)] = net.local("QMA", "LOCAL.A")
    got = decode(md, body)
    assert (got.topic, got.get("MQPSStreamName"), got.payload) == ("news/today", BULLETIN, b"rfh2")


def test_proxies_follow_the_last_local_subscriber() -> None:
    net = Net()
    net.add("QMA")
    net.add("QMB")
    net.link("QMA", "QMB")
    subscribe(net, "QMB", "ONE.B", "news")
    subscribe(net, "QMB", "TWO.B", "news")
    assert len(net.engines["QMA"].subscriptions) == 1
    unsubscribe(net, "QMB", "ONE.B", "news")
    assert len(net.engines["QMA"].subscriptions) == 1
    unsubscribe(net, "QMB", "TWO.B", "news")
    assert net.engines["QMA"].subscriptions == []
    assert all(
        decode(md, body).get("MQPSCompCode") == "0"
        for md, body in net.local("QMB", INTER_BROKER_QUEUE)
    )


# ------------------------------------------------------------------ life cycle -------


def test_cleared_neighbours_subscriptions_stay_and_are_delivered_as_plain_publications() -> None:
    net = Net()
    net.add("QMA")
    net.add("QMB")
    net.link("QMA", "QMB")
    subscribe(net, "QMB", "LOCAL.B", "news")
    a = net.engines["QMA"]
    assert set(a.neighbours) == {"QMB"}

    a.set_neighbours({})

    assert dict(a.neighbours) == {}
    [kept] = a.subscriptions
    assert kept.destination == Destination("QMB", BULLETIN)
    out = a.handle(
        rfh_message(
            BULLETIN,
            [("MQPSCommand", "Publish"), ("MQPSStreamName", BULLETIN), ("MQPSTopic", "news")],
            b"plain",
            reply_to_q="PUB.Q",
            reply_to_q_mgr="QMA",
        )
    )
    [d] = out.deliveries
    got = decode(d.md, d.body)
    assert got.payload == b"plain"
    assert got.get("MQPSQMgrName") is None
    assert got.get_all("MQPSPubOpts") == []
    # joining again makes it a forwarded command once more
    a.set_neighbours({"QMB": nb("QMB", NeighbourKind.MQPUBSUB)})
    out = publish(net, "QMA", "news", b"again")
    cmd = decode_command_message(out.deliveries[0].md, out.deliveries[0].body).command
    assert cmd.pub_opts & PubOpt.OTHER_SUBSCRIBERS_ONLY
    assert cmd.q_mgr_name == "QMA"


def test_engine_takes_neighbours_at_construction() -> None:
    n = nb("QMB", NeighbourKind.GATEWAY)
    engine = PubSubEngine("QMA", MemoryStore(), neighbours={"QMB": n})
    assert dict(engine.neighbours) == {"QMB": n}


# ------------------------------------------------------------------ DeletePub --------


def line_with_retained(kind: NeighbourKind = NeighbourKind.MQPUBSUB) -> Net:
    """A - G - B; B's subscriber pulls A's retained publication to G and B."""
    net = Net()
    for q_mgr in ("QMA", "QMG", "QMB"):
        net.add(q_mgr)
    net.link("QMA", "QMG", kind_of_b=kind, kind_of_a=kind)
    net.link("QMG", "QMB", kind_of_b=kind, kind_of_a=kind)
    subscribe(net, "QMB", "LOCAL.B", "news/*")
    publish(net, "QMA", "news/today", b"held", retain=True)
    publish(net, "QMA", "news/older", b"old", retain=True)
    for q_mgr in ("QMA", "QMG", "QMB"):
        assert {r.topic for r in net.engines[q_mgr].retained(BULLETIN)} == {
            "news/today",
            "news/older",
        }, q_mgr
    assert payloads(net, "QMB", "LOCAL.B") == [b"held", b"old"]
    return net


def delete_at(net: Net, q_mgr: str, topic: str, *, local: bool = False) -> Outcome:
    pairs = [("MQPSCommand", "DeletePub"), ("MQPSStreamName", BULLETIN), ("MQPSTopic", topic)]
    if local:
        pairs.append(("MQPSDelOpts", "Local"))
    return net.handle(q_mgr, rfh_message(BULLETIN, pairs, reply_to_q_mgr=q_mgr))


@pytest.mark.parametrize("kind", KINDS)
def test_delete_publication_reaches_every_broker_holding_it_and_never_goes_back(
    kind: NeighbourKind,
) -> None:
    net = line_with_retained(kind)
    before = net.put_to.copy()

    out = delete_at(net, "QMA", "news/today")

    [forward] = out.forwards
    assert (forward.q_mgr, forward.queue) == ("QMG", BULLETIN)
    cmd = decode_command_message(forward.md, forward.body).command
    assert cmd.name is CommandName.DELETE_PUB
    assert (cmd.stream, cmd.topics, cmd.q_mgr_name, cmd.q_name) == (
        BULLETIN,
        ["news/today"],
        "QMA",
        BULLETIN,
    )
    for q_mgr in ("QMA", "QMG", "QMB"):
        assert [r.topic for r in net.engines[q_mgr].retained(BULLETIN)] == ["news/older"], q_mgr
    sent = net.put_to - before
    assert sent == Counter({("QMG", BULLETIN): 1, ("QMB", BULLETIN): 1})  # none back to A


def test_delete_publication_from_the_far_end_travels_the_other_way() -> None:
    net = line_with_retained()
    before = net.put_to.copy()
    delete_at(net, "QMB", "news/*")
    for q_mgr in ("QMA", "QMG", "QMB"):
        assert net.engines[q_mgr].retained(BULLETIN) == [], q_mgr
    assert net.put_to - before == Counter({("QMG", BULLETIN): 1, ("QMA", BULLETIN): 1})


def test_delete_publication_skips_neighbours_without_the_stream_and_local_deletes() -> None:
    net = line_with_retained()
    net.add("QMC")
    net.link("QMG", "QMC", streams=frozenset({DEFAULT_STREAM}))
    out = delete_at(net, "QMG", "news/today")
    assert sorted(f.q_mgr for f in out.forwards) == ["QMA", "QMB"]

    out = delete_at(net, "QMA", "news/older", local=True)
    assert out.forwards == []
    assert net.engines["QMA"].retained(BULLETIN) == []
    assert [r.topic for r in net.engines["QMB"].retained(BULLETIN)] == ["news/older"]


def test_mqrfh2_wildcard_delete_is_passed_on_as_the_topics_it_deleted() -> None:
    net = line_with_retained(NeighbourKind.GATEWAY)
    out = net.handle(
        "QMA",
        rfh2_message(
            CONTROL_QUEUE,
            [("Command", "DeletePub"), ("Topic", "$SYS/STREAM/BULLETIN.STREAM/news/#")],
            reply_to_q_mgr="QMA",
        ),
    )
    assert out.comp_code == CompCode.OK
    [forward] = out.forwards
    cmd = decode_command_message(forward.md, forward.body).command
    assert sorted(cmd.topics) == ["news/older", "news/today"]
    for q_mgr in ("QMA", "QMG", "QMB"):
        assert net.engines[q_mgr].retained(BULLETIN) == [], q_mgr


# ------------------------------------------------------------------ Local ------------


def test_local_subscriptions_and_local_publications_stay_at_their_broker() -> None:
    net = Net()
    net.add("QMA")
    net.add("QMB")
    net.link("QMA", "QMB")
    out = net.handle(
        "QMB",
        rfh_message(
            CONTROL_QUEUE,
            [
                ("MQPSCommand", "RegSub"),
                ("MQPSRegOpts", "Local"),
                ("MQPSStreamName", BULLETIN),
                ("MQPSTopic", "news"),
                ("MQPSQName", "LOCAL.B"),
            ],
            reply_to_q_mgr="QMB",
        ),
    )
    assert out.reason == 0
    assert net.engines["QMA"].subscriptions == []  # no proxy for a Local subscription

    subscribe(net, "QMB", "GLOBAL.B", "news")
    out = net.handle(
        "QMA",
        rfh_message(
            BULLETIN,
            [
                ("MQPSCommand", "Publish"),
                ("MQPSRegOpts", "Local"),
                ("MQPSStreamName", BULLETIN),
                ("MQPSTopic", "news"),
            ],
            b"stays",
            reply_to_q="PUB.Q",
            reply_to_q_mgr="QMA",
        ),
    )
    assert out.deliveries == []
    publish(net, "QMA", "news", b"travels")
    assert payloads(net, "QMB", "GLOBAL.B") == [b"travels"]
    assert payloads(net, "QMB", "LOCAL.B") == [b"travels"]


def test_a_local_retained_publication_is_not_replayed_to_a_new_proxy() -> None:
    net = Net()
    net.add("QMA")
    net.add("QMB")
    net.link("QMA", "QMB")
    for topic, opts in (("local", [("MQPSRegOpts", "Local")]), ("global", [])):
        net.handle(
            "QMA",
            rfh_message(
                BULLETIN,
                [
                    ("MQPSCommand", "Publish"),
                    *opts,
                    ("MQPSPubOpts", "RetainPub"),
                    ("MQPSStreamName", BULLETIN),
                    ("MQPSTopic", topic),
                ],
                topic.encode(),
                reply_to_q="PUB.Q",
                reply_to_q_mgr="QMA",
            ),
        )
    subscribe(net, "QMB", "ALL.B", "*")
    assert payloads(net, "QMB", "ALL.B") == [b"global"]
    assert [r.topic for r in net.engines["QMB"].retained(BULLETIN)] == ["global"]
