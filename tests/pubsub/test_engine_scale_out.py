"""Streams owned by one gateway each (docs/scaling.md): a publication an application put
at a non-owner reaches the owner through MQ routing, not through a broker, and must
still come back to the non-owner's own subscribers through their proxy subscription.

MQ fills ReplyToQMgr with the application's queue manager when the publication names a
ReplyToQ (an MQRFH publisher's queue for error responses), so the owner sees a
ReplyToQMgr that names its neighbour. Only a legacy broker forwards plain publications
with its own queue manager there; a gateway neighbour's forwarded publications always
name it in QMgrName, so from a gateway neighbour ReplyToQMgr is not a forward.
"""

from __future__ import annotations

import pytest

from gateway.pubsub.neighbours import NeighbourKind, probe_publication
from tests.pubsub.test_engine_neighbours import BULLETIN, Net, payloads, subscribe
from tests.support.pubsub_messages import rfh2_message, rfh_message


def owner_and_non_owner(kind: NeighbourKind) -> Net:
    """OWNER and OTHER linked as neighbours of ``kind`` both ways; OTHER's application
    subscribed to BULLETIN ``T``, so OTHER holds a proxy at OWNER."""
    net = Net()
    net.add("OWNER")
    net.add("OTHER")
    net.link("OWNER", "OTHER", kind_of_b=kind, kind_of_a=kind)
    subscribe(net, "OTHER", "APP.SUB", "T")
    return net


@pytest.mark.parametrize("header", ["MQRFH", "MQRFH2"])
def test_publication_routed_from_a_gateway_neighbours_queue_manager_reaches_its_subscriber(
    header: str,
) -> None:
    net = owner_and_non_owner(NeighbourKind.GATEWAY)
    # put at OTHER to OWNER's stream queue (a QREMOTE there): MQ moves it unchanged,
    # with ReplyToQMgr = OTHER since the application named a ReplyToQ
    if header == "MQRFH":
        msg = rfh_message(BULLETIN, [("MQPSCommand", "Publish"), ("MQPSStreamName", BULLETIN),
                                     ("MQPSTopic", "T")], b"routed",
                          reply_to_q="APP.ERRORS", reply_to_q_mgr="OTHER")
    else:
        msg = rfh2_message(BULLETIN, [("Command", "Publish"),
                                      ("Topic", f"$SYS/STREAM/{BULLETIN}/T")], b"routed",
                           reply_to_q="APP.ERRORS", reply_to_q_mgr="OTHER")
    net.handle("OWNER", msg)
    assert payloads(net, "OTHER", "APP.SUB") == [b"routed"]


def test_a_legacy_brokers_plain_forward_still_never_goes_back() -> None:
    """Unchanged for the other kinds: a plain publication whose ReplyToQMgr names a
    legacy broker neighbour is that broker's forward and is not sent back to it."""
    net = owner_and_non_owner(NeighbourKind.MQPUBSUB)
    msg = rfh_message(BULLETIN, [("MQPSCommand", "Publish"), ("MQPSStreamName", BULLETIN),
                                 ("MQPSTopic", "T")], b"forwarded",
                      reply_to_q="APP.ERRORS", reply_to_q_mgr="OTHER")
    net.handle("OWNER", msg)
    assert payloads(net, "OTHER", "APP.SUB") == []


def test_a_gateway_neighbours_forwarded_publication_never_goes_back() -> None:
    """The gateway's forwards name it in QMgrName: still never sent back."""
    net = owner_and_non_owner(NeighbourKind.GATEWAY)
    subscribe(net, "OWNER", "OWN.SUB", "T")
    msg = rfh2_message(BULLETIN, [("Command", "Publish"),
                                  ("Topic", f"$SYS/STREAM/{BULLETIN}/T")], b"at other",
                       reply_to_q_mgr="OTHER")
    net.handle("OTHER", msg)  # published at OTHER: forwarded to OWNER's proxy only
    assert payloads(net, "OWNER", "OWN.SUB") == [b"at other"]
    assert payloads(net, "OTHER", "APP.SUB") == [b"at other"]  # once, not echoed back


def test_a_gateway_neighbours_anonymous_probe_still_counts_as_from_it() -> None:
    """The loop probe a gateway publishes at its neighbours is anonymous (no QMgrName)
    with ReplyToQMgr its queue manager and no ReplyToQ: still that neighbour's, never
    sent back to it (else the probe would come straight back and every join would see
    a loop). Here in the probe's shape on a shared stream."""
    net = owner_and_non_owner(NeighbourKind.GATEWAY)
    probe = probe_publication("OWNER", "T", self_q_mgr="OTHER")
    assert (probe.md.reply_to_q, probe.md.reply_to_q_mgr) == ("", "OTHER")
    msg = rfh_message(BULLETIN, [("MQPSCommand", "Publish"), ("MQPSRegOpts", "Anon"),
                                 ("MQPSPubOpts", "NoReg"), ("MQPSStreamName", BULLETIN),
                                 ("MQPSTopic", "T")], b"probe",
                      reply_to_q="", reply_to_q_mgr="OTHER")
    net.handle("OWNER", msg)
    assert payloads(net, "OTHER", "APP.SUB") == []
