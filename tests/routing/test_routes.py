"""Config models of request/reply routes: defaults, validation, split_destination."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from pydantic import ValidationError

from gateway.routing.routes import (
    RequestReplyConfig,
    RequestRoute,
    ServiceRoute,
    split_destination,
)


def _request(**changes: object) -> dict[str, object]:
    base: dict[str, object] = {
        "name": "quote",
        "plugin": "kafka1",
        "source": "quote.requests",
        "destination": "SVC.QUOTE",
    }
    base.update(changes)
    return base


def _service(**changes: object) -> dict[str, object]:
    base: dict[str, object] = {
        "name": "pricing",
        "queue": "GW.PRICING",
        "plugin": "kafka1",
        "target": "pricing.requests",
        "replies": "pricing.replies",
    }
    base.update(changes)
    return base


def test_split_destination() -> None:
    assert split_destination("SVC.QUOTE") == ("SVC.QUOTE", "")
    assert split_destination("Q3@QMC") == ("Q3", "QMC")
    for bad in ("", "@QM", "Q@", "Q@A@B", "Q" * 49, "Q@" + "M" * 49, "BAD NAME", "Q*"):
        with pytest.raises(ValueError):
            split_destination(bad)
    assert split_destination("Q" * 48 + "@" + "M" * 48) == ("Q" * 48, "M" * 48)


def test_request_route_defaults() -> None:
    r = RequestRoute.model_validate(_request())
    assert r.timeout == 30.0
    assert r.expiry is None
    assert r.report == ["exception", "expiration"]
    assert r.correlation == "msg_id"
    assert r.reply_topic is None
    assert r.persistent is True
    # MQTT: one level below the request; Kafka: a valid Kafka name (no "/")
    assert r.default_reply_topic("a/b") == "a/b/reply"
    assert r.default_reply_topic("quotes.get") == "quotes.get.reply"
    assert re.fullmatch(r"[A-Za-z0-9._-]{1,249}", r.default_reply_topic("quotes.get"))
    t = RequestRoute.model_validate(_request(reply_topic="answers/{topic}"))
    assert t.default_reply_topic("quotes.get") == "answers/quotes.get"


def test_request_route_report_default_is_not_shared() -> None:
    a = RequestRoute.model_validate(_request())
    b = RequestRoute.model_validate(_request(name="other"))
    a.report.append("coa")
    assert b.report == ["exception", "expiration"]


@pytest.mark.parametrize(
    "changes",
    [
        {"name": "bad name"},
        {"name": "x" * 65},
        {"name": ""},
        {"destination": "A@B@C"},
        {"destination": ""},
        {"timeout": 0},
        {"timeout": -1},
        {"expiry": 0},
        {"report": ["coa", "bogus"]},
        {"report": ["coa", "coa"]},
        {"correlation": "group_id"},
        {"unknown_key": 1},
        {"plugin": ""},
    ],
)
def test_request_route_refuses(changes: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        RequestRoute.model_validate(_request(**changes))


def test_service_route() -> None:
    s = ServiceRoute.model_validate(_service())
    assert s.timeout == 30.0
    for changes in ({"queue": "Q@QM"}, {"queue": ""}, {"timeout": 0}, {"extra": 1}):
        with pytest.raises(ValidationError):
            ServiceRoute.model_validate(_service(**changes))


def test_request_reply_config_defaults() -> None:
    c = RequestReplyConfig()
    assert c.reply_queue == "MQGW.REPLY"
    assert c.effective_reply_to_q == "MQGW.REPLY"
    assert c.reply_to_q_mgr == ""
    assert c.store == Path("data/request_reply.db")
    assert c.retention == 600.0
    assert c.sweep_interval == 0.5
    assert c.requests == [] and c.services == []
    alias = RequestReplyConfig(reply_to_q="MQGW.REPLY.ALIAS")
    assert alias.effective_reply_to_q == "MQGW.REPLY.ALIAS"


def test_route_names_are_unique_over_requests_and_services() -> None:
    with pytest.raises(ValidationError, match="used twice"):
        RequestReplyConfig.model_validate(
            {"requests": [_request(name="x")], "services": [_service(name="x")]}
        )
    ok = RequestReplyConfig.model_validate(
        {"requests": [_request(name="x")], "services": [_service(name="y")]}
    )
    assert [r.name for r in ok.requests] == ["x"]


@pytest.mark.parametrize(
    "changes",
    [
        {"reply_queue": ""},
        {"reply_to_q": "A B"},
        {"reply_to_q_mgr": "M" * 49},
        {"sweep_interval": 0},
        {"retention": -1},
        {"other": 1},
    ],
)
def test_request_reply_config_refuses(changes: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        RequestReplyConfig.model_validate(changes)
