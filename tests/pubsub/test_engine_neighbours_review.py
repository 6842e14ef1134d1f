"""Neighbours that do not behave like the gateway (review of issue 13): a real broker
forwards plain publications, so the source neighbour is never sent its own
publication back; forwarded publications register no publishers; a neighbour's proxies
are never suspended; retained publications flagged IsRetainedPub are kept."""

from __future__ import annotations

from pathlib import Path

from gateway.pubsub import neighbours as neighbours_module
from gateway.pubsub.engine import PubSubEngine
from gateway.pubsub.inbound import decode_command_message
from gateway.pubsub.neighbours import (
    PROBE_PREFIX,
    NeighbourKind,
    ProxyKey,
    proxy_command,
)
from gateway.pubsub.options import PubOpt, RegOpt
from gateway.pubsub.outcome import InboundMessage
from gateway.pubsub.records import Destination, Publication, RetainedPublication
from gateway.pubsub.sqlite_store import SqliteStore
from gateway.pubsub.store import MemoryStore, PutRetained
from gateway.pubsub.streams import CONTROL_QUEUE
from gateway.wire.constants import CompCode, MsgType, PutApplType
from tests.pubsub.test_engine_neighbours import (
    BULLETIN,
    Net,
    nb,
    payloads,
    publish,
    subscribe,
)
from tests.support.pubsub_messages import decode, rfh_message


def gateway_with_proxy_of(neighbour: str = "QMA") -> PubSubEngine:
    """GW with neighbour ``neighbour`` (which registered a proxy on ``news``) and a
    local subscriber on ``news``."""
    gw = PubSubEngine(
        "GW", MemoryStore(), neighbours={neighbour: nb(neighbour, NeighbourKind.MQPUBSUB)}
    )
    for q_mgr, queue in ((neighbour, BULLETIN), ("GW", "LOCAL.GW")):
        out = gw.handle(
            rfh_message(
                CONTROL_QUEUE,
                [
                    ("MQPSCommand", "RegSub"),
                    ("MQPSStreamName", BULLETIN),
                    ("MQPSTopic", "news"),
                    ("MQPSQMgrName", q_mgr),
                    ("MQPSQName", queue),
                ],
                reply_to_q_mgr=q_mgr,
                msg_type=MsgType.REQUEST,
                reply_to_q="R.Q",
            )
        )
        assert out.comp_code == CompCode.OK
    gw.commit()
    return gw


def v6_publication(
    from_q_mgr: str, *extra: tuple[str, str], payload: bytes = b"plain"
) -> InboundMessage:
    """A publication as a V6 broker forwards it to its subscriber (our stream queue):
    new MsgId, ReplyToQMgr = its queue manager, PutApplType BROKER, no RetainPub nor
    OtherSubsOnly, no identity unless DirectReq."""
    msg = rfh_message(
        BULLETIN,
        [
            ("MQPSCommand", "Publish"),
            ("MQPSStreamName", BULLETIN),
            ("MQPSTopic", "news"),
            *extra,
        ],
        payload,
        reply_to_q_mgr=from_q_mgr,
    )
    msg.md.put_appl_type = PutApplType.BROKER
    return msg


# ------------------------------------------------------------------ finding 1 --------


def test_plain_publication_from_a_neighbour_is_not_sent_back_to_it() -> None:
    gw = gateway_with_proxy_of("QMA")
    out = gw.handle(v6_publication("QMA"))
    assert out.comp_code == CompCode.OK
    assert [d.destination for d in out.deliveries] == [Destination("GW", "LOCAL.GW")]


def test_publication_naming_a_neighbour_without_other_subs_only_is_not_sent_back() -> None:
    """DirectReq: the neighbour's publisher identity is QMgrName QMA, no OtherSubsOnly."""
    gw = gateway_with_proxy_of("QMA")
    out = gw.handle(v6_publication("QMA", ("MQPSQMgrName", "QMA"), ("MQPSQName", "APP.PUB.Q")))
    assert [d.destination for d in out.deliveries] == [Destination("GW", "LOCAL.GW")]
    # a publisher on the gateway's own queue manager still reaches the neighbour
    out = gw.handle(
        rfh_message(
            BULLETIN,
            [("MQPSCommand", "Publish"), ("MQPSStreamName", BULLETIN), ("MQPSTopic", "news")],
            b"local",
            reply_to_q="PUB.Q",
            reply_to_q_mgr="GW",
        )
    )
    assert {d.destination for d in out.deliveries} == {
        Destination("GW", "LOCAL.GW"),
        Destination("QMA", BULLETIN),
    }


def test_publication_from_one_neighbour_still_reaches_another() -> None:
    gw = gateway_with_proxy_of("QMA")
    gw.set_neighbours({**gw.neighbours, "QMB": nb("QMB", NeighbourKind.MQPUBSUB)})
    out = gw.handle(
        rfh_message(
            CONTROL_QUEUE,
            [
                ("MQPSCommand", "RegSub"),
                ("MQPSStreamName", BULLETIN),
                ("MQPSTopic", "news"),
                ("MQPSQMgrName", "QMB"),
                ("MQPSQName", BULLETIN),
            ],
            reply_to_q_mgr="QMB",
            msg_type=MsgType.REQUEST,
            reply_to_q="R.Q",
        )
    )
    assert out.comp_code == CompCode.OK
    out = gw.handle(v6_publication("QMA"))
    assert {d.destination for d in out.deliveries} == {
        Destination("GW", "LOCAL.GW"),
        Destination("QMB", BULLETIN),
    }


def test_proxies_at_mqrfh_neighbours_ask_to_be_told_of_retained_publications() -> None:
    key = ProxyKey(BULLETIN, "news", 1)
    for kind in (NeighbourKind.MQPUBSUB, NeighbourKind.MQV7):
        cmd = proxy_command(nb("QMA", kind), key, register=True, self_q_mgr="GW", msg_id=b"X")
        parsed = decode_command_message(cmd.md, cmd.body).command
        assert parsed.reg_opts & RegOpt.INFORM_IF_RETAINED, kind
        assert parsed.reg_opts & RegOpt.PERSISTENT_AS_PUBLISH, kind


def test_retained_publication_flagged_by_a_neighbour_is_kept_as_retained() -> None:
    gw = gateway_with_proxy_of("QMA")
    out = gw.handle(v6_publication("QMA", ("MQPSPubOpts", "IsRetainedPub"), payload=b"held"))
    assert out.comp_code == CompCode.OK, out
    assert out.dead_letter is None
    assert [d.destination for d in out.deliveries] == [Destination("GW", "LOCAL.GW")]
    gw.settle_retained(gw.commit())  # the store's commit, then MQ's (the runtime's order)
    [held] = gw.retained(BULLETIN)
    assert (held.topic, held.publication.payload) == ("news", b"held")
    # Request Update works at this broker
    out = gw.handle(
        rfh_message(
            CONTROL_QUEUE,
            [
                ("MQPSCommand", "ReqUpdate"),
                ("MQPSStreamName", BULLETIN),
                ("MQPSTopic", "news"),
                ("MQPSQMgrName", "GW"),
                ("MQPSQName", "LOCAL.GW"),
            ],
            reply_to_q_mgr="GW",
            msg_type=MsgType.REQUEST,
            reply_to_q="R.Q",
        )
    )
    assert out.comp_code == CompCode.OK
    [d] = out.deliveries
    assert decode(d.md, d.body).payload == b"held"
    # the same retained publication sent again (a new proxy, new MsgId) is not delivered
    # to the local subscriber a second time
    out = gw.handle(v6_publication("QMA", ("MQPSPubOpts", "IsRetainedPub"), payload=b"held"))
    assert out.deliveries == []


def test_is_retained_pub_from_an_application_is_still_refused() -> None:
    gw = gateway_with_proxy_of("QMA")
    out = gw.handle(v6_publication("QMX", ("MQPSPubOpts", "IsRetainedPub")))
    assert out.dead_letter is not None
    assert gw.retained(BULLETIN) == []


# ------------------------------------------------------------------ finding 2 --------


def test_forwarded_publications_register_no_publishers() -> None:
    for kind in (NeighbourKind.MQPUBSUB, NeighbourKind.GATEWAY):
        net = Net()
        for q_mgr in ("QMA", "QMG", "QMB"):
            net.add(q_mgr)
        net.link("QMA", "QMG", kind_of_b=kind, kind_of_a=kind)
        net.link("QMG", "QMB", kind_of_b=kind, kind_of_a=kind)
        subscribe(net, "QMB", "LOCAL.B", "news/*")
        for i in range(50):
            out = publish(net, "QMA", f"news/{i}", b"x")
            if kind is NeighbourKind.MQPUBSUB:
                [fwd] = out.deliveries
                cmd = decode_command_message(fwd.md, fwd.body).command
                assert cmd.pub_opts & PubOpt.NO_REGISTRATION
        assert len(payloads(net, "QMB", "LOCAL.B")) == 50
        assert len(net.engines["QMA"].publishers) == 50  # the local publisher, per topic
        assert net.engines["QMG"].publishers == [], kind
        assert net.engines["QMB"].publishers == [], kind


# ------------------------------------------------------------------ finding 4 --------


def test_a_neighbours_proxies_are_never_suspended() -> None:
    gw = gateway_with_proxy_of("QMA")
    for _ in range(3 * gw.suspend_after):
        gw.delivery_failed("QMA", BULLETIN, 2053)  # MQRC_Q_FULL: xmitq full in an outage
    gw.commit()
    assert gw.suspended_subscriptions == 0
    assert gw.suspensions == 0
    assert gw.neighbour_delivery_failures == 3 * gw.suspend_after
    out = gw.handle(v6_publication("GW"))
    assert Destination("QMA", BULLETIN) in {d.destination for d in out.deliveries}
    # an application queue on the same queue manager is suspended as before
    for _ in range(gw.suspend_after):
        gw.delivery_failed("GW", "LOCAL.GW", 2053)
    gw.commit()
    assert gw.suspended_subscriptions == 1


# ------------------------------------------------------------------ finding 6 --------


def test_sqlite_store_keeps_publication_local(tmp_path: Path) -> None:
    path = tmp_path / "pubsub.db"
    store = SqliteStore(path)
    pub = Publication(stream=BULLETIN, topics=["news"], payload=b"x", local=True)
    store.apply([PutRetained(RetainedPublication(BULLETIN, "news", pub, 1.0))])
    store.close()
    [again] = SqliteStore(path).load().retained
    assert again.publication.local is True


# ------------------------------------------------------------------ finding 11 -------


def test_probe_prefix_has_one_home() -> None:
    assert PROBE_PREFIX == "MQGW/Probe/"
    assert "PROBE_PREFIX" in neighbours_module.__all__
