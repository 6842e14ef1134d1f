"""Correlation identities: deterministic tokens and the source_id rule."""

from __future__ import annotations

import hashlib

from hypothesis import given
from hypothesis import strategies as st

from gateway.plugin_api import Envelope
from gateway.routing.correlation import (
    PendingRequest,
    PendingService,
    Side,
    State,
    request_token,
    source_id,
)


def test_request_token_is_sha256_prefix() -> None:
    assert request_token("r|id|00") == hashlib.sha256(b"r|id|00").digest()[:24]
    assert len(request_token("")) == 24


@given(st.text(), st.text())
def test_request_token_deterministic_and_distinct(a: str, b: str) -> None:
    assert request_token(a) == request_token(a)
    if a != b:
        assert request_token(a) != request_token(b)


def test_source_id_prefers_plugin_msg_id() -> None:
    env = Envelope(
        stream="",
        topic="t",
        payload=b"p",
        msg_id=b"\x01" * 24,
        reply_topic="r",
        correlation_data=b"c",
    )
    assert source_id("route", env) == "route|id|" + "01" * 24


def test_source_id_from_reply_topic_and_correlation_data() -> None:
    env = Envelope(stream="", topic="t", payload=b"p", reply_topic="r/x", correlation_data=b"\xab")
    assert source_id("route", env) == "route|r/x|ab"


def test_source_id_from_topic_payload_put_time() -> None:
    digest = hashlib.sha256(b"p").hexdigest()
    env = Envelope(stream="", topic="t", payload=b"p", put_time_ms=1234)
    assert source_id("route", env) == f"route|t|{digest}|1234"
    no_time = Envelope(stream="", topic="t", payload=b"p")
    assert source_id("route", no_time) == f"route|t|{digest}|"


def test_source_id_depends_on_route() -> None:
    env = Envelope(stream="", topic="t", payload=b"p", correlation_data=b"c")
    assert source_id("a", env) != source_id("b", env)


def test_entry_defaults() -> None:
    p = PendingRequest(
        key=b"k" * 24,
        route="r",
        source_id="s",
        reply_topic="t",
        correlation_data=b"",
        msg_id=b"k" * 24,
        deadline=1.0,
    )
    assert (p.state, p.outcome, p.sent) == (State.OPEN, "", False)
    s = PendingService(
        token=b"t" * 24,
        route="r",
        msg_id=b"t" * 24,
        correl_id=bytes(24),
        reply_to_q="Q",
        reply_to_q_mgr="QM",
        report=0,
        persistence=1,
        priority=0,
        expiry_at=None,
        deadline=1.0,
    )
    assert (s.state, s.outcome) == (State.OPEN, "")
    assert Side.REQUESTER == "requester" and Side.SERVICE == "service"
    assert State.OPEN == "open" and State.DONE == "done"
