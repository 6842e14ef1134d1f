"""Reading the inter-broker queue: responses (MQRFH and MQRFH2) settle proxy commands;
a failed one names its reason in the log and in `list`; garbage is ignored."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from gateway.mq.embedded.qmgr import EmbeddedQueueManager
from gateway.mq.port import Message
from gateway.pubsub.admin_messages import admin_topic
from gateway.pubsub.neighbours import ProxyKey
from gateway.pubsub.streams import ADMIN_STREAM
from gateway.runtime.neighbours.config import NeighbourConfig
from gateway.runtime.neighbours.links import NeighbourLinks
from gateway.runtime.neighbours.responses import read_received
from gateway.runtime.neighbours.state import NeighbourState
from gateway.runtime.neighbours.stream_support import read_stream_support, stream_support_command
from gateway.wire.constants import MsgType
from gateway.wire.folder import Element
from gateway.wire.formats import FMT_RF_HEADER, FMT_RF_HEADER_2
from gateway.wire.mqmd import MQMD
from gateway.wire.rfh import MQRFH, encode_rfh
from gateway.wire.rfh2 import MQRFH2, encode_rfh2
from tests.support.pubsub_messages import decode

KEY = ProxyKey("SPORTS.STREAM", "football", 2)


def rfh_response(correl: bytes, comp: int, reason: int, text: str) -> Message:
    pairs = [("MQPSCompCode", str(comp)), ("MQPSReason", str(reason)), ("MQPSReasonText", text)]
    md = MQMD(
        format=FMT_RF_HEADER,
        msg_type=MsgType.REPLY,
        correl_id=correl,
        reply_to_q_mgr="BROKERA",
        coded_char_set_id=1208,
    )
    return Message(md, encode_rfh(MQRFH(name_values=pairs), ccsid=1208))


def rfh2_response(correl: bytes, completion: str, reason: int = 0) -> Message:
    pscr = Element("pscr")
    pscr.add("Completion", completion)
    if reason:
        resp = Element("Response")
        resp.add("Reason", str(reason))
        pscr.children.append(resp)
    md = MQMD(
        format=FMT_RF_HEADER_2,
        msg_type=MsgType.REPLY,
        correl_id=correl,
        reply_to_q_mgr="BROKERA",
        coded_char_set_id=1208,
    )
    return Message(md, encode_rfh2(MQRFH2(folders=[pscr], coded_char_set_id=1208), ccsid=1208))


@pytest.fixture
def links(tmp_path: Path) -> NeighbourLinks:
    state = NeighbourState(tmp_path / "neighbours.db")
    state.request_join(NeighbourConfig(q_mgr="BROKERA"), 0.0)
    return NeighbourLinks(
        EmbeddedQueueManager("GW", tmp_path / "qm"), state, subscriptions=list, clock=lambda: 500.0
    )


def test_failed_regsub_is_named_in_the_log_and_in_list(
    links: NeighbourLinks, caplog: pytest.LogCaptureFixture
) -> None:
    links.state.intend("BROKERA", KEY, b"R" * 24, register=True)
    with caplog.at_level(logging.WARNING):
        links.received(rfh_response(b"R" * 24, 2, 3071, "MQRCCF_STREAM_ERROR"))
    links.flush_heard()
    row = links.state.neighbour("BROKERA")
    assert row is not None
    assert "reason 3071 MQRCCF_STREAM_ERROR" in row.last_error
    assert "SPORTS.STREAM 'football'" in row.last_error
    assert "3071" in caplog.text and "BROKERA" in caplog.text
    (p,) = links.state.proxies()  # nothing registered there, the refusal kept
    assert not p.acknowledged and p.refused == "reason 3071 MQRCCF_STREAM_ERROR"
    assert p.retry_at == 560.0
    assert links.counters.commands[("BROKERA", "failed")] == 1
    assert row.last_heard == 500.0


def test_the_same_refusal_is_logged_once(
    links: NeighbourLinks, caplog: pytest.LogCaptureFixture
) -> None:
    links.state.intend("BROKERA", KEY, b"R" * 24, register=True)
    with caplog.at_level(logging.WARNING):
        for _ in range(3):
            links.received(rfh_response(b"R" * 24, 2, 3071, "MQRCCF_STREAM_ERROR"))
        links.received(rfh_response(b"R" * 24, 2, 2035, "MQRC_NOT_AUTHORIZED"))
    refusals = [r for r in caplog.records if "command refused" in r.getMessage()]
    assert len(refusals) == 2
    assert "2035" in refusals[1].getMessage()
    (p,) = links.state.proxies()
    assert p.backoff == 480.0  # 60, 120, 240, 480


def test_ok_responses_settle_register_and_withdraw(links: NeighbourLinks) -> None:
    links.state.intend("BROKERA", KEY, b"R" * 24, register=True)
    links.received(rfh2_response(b"R" * 24, "ok"))
    (p,) = links.state.proxies()
    assert p.acknowledged
    links.state.intend("BROKERA", KEY, b"D" * 24, register=False)
    links.received(rfh_response(b"D" * 24, 0, 0, "MQRC_NONE"))
    assert links.state.proxies() == []
    assert links.counters.commands[("BROKERA", "ok")] == 2


def test_read_received_kinds() -> None:
    r = read_received(*_parts(rfh2_response(b"x" * 24, "error", 3071)))
    assert r is not None and r.is_response and not r.ok and r.reason == 3071
    pub = MQRFH(
        name_values=[
            ("MQPSCommand", "Publish"),
            ("MQPSTopic", "MQGW/Probe/GW/1"),
            ("MQPSQMgrName", "BROKERB"),
        ]
    )
    md = MQMD(format=FMT_RF_HEADER, reply_to_q_mgr="BROKERA", coded_char_set_id=1208)
    r = read_received(md, encode_rfh(pub, ccsid=1208))
    assert r is not None and not r.is_response
    assert (r.topic, r.q_mgr) == ("MQGW/Probe/GW/1", "BROKERB")
    assert read_received(MQMD(format="MQSTR"), b"hello") is None
    assert read_received(MQMD(format=FMT_RF_HEADER), b"RFH garbage") is None


def _parts(m: Message) -> tuple[MQMD, bytes]:
    return m.md, m.body


def test_our_stream_support_is_a_retained_publish_of_the_pcf() -> None:
    msg = stream_support_command("GW", ["S2", "S1", "S2"], now=0.0)
    assert (msg.q_mgr, msg.queue) == ("", ADMIN_STREAM)
    r = decode(msg.md, msg.body)
    assert r.get("MQPSCommand") == "Publish"
    assert r.get("MQPSTopic") == admin_topic("StreamSupport", "GW")
    assert "RetainPub" in r.get_all("MQPSPubOpts")
    assert r.get("MQPSStreamName") == ADMIN_STREAM
    assert read_stream_support(msg.md, msg.body) == ("GW", ("S1", "S2"))
    assert read_stream_support(MQMD(format="MQSTR"), b"not PCF") is None
