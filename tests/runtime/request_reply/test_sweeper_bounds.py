"""Issue 29: the sweeper makes progress past entries it cannot finish. An outsider can
make many entries whose error reply (an MQTT Response Topic the broker refuses) or
expiration report (a ReplyToQ that refuses puts) cannot be sent; those must not hold
back the timeouts of everybody else, are retried with a backoff, logged summarised, and
given up after ``request_reply.undeliverable_after`` (outcome ``undeliverable``)."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence

import pytest

from gateway.mq.embedded.network import Network
from gateway.plugin_api import Envelope, PluginError
from gateway.wire.constants import MsgType, Report
from gateway.wire.dlh import unwrap_from_dlq
from plugins.memory import get_bus
from tests.network.network_helpers import drain, get_one, wait_for
from tests.runtime.request_reply.conftest import Gateway
from tests.runtime.request_reply.test_service import SERVICE, put_request

#: More stuck entries than the store's ``due()`` returns at once (100).
STUCK = 120
#: MQRC_PUT_INHIBITED: a ReplyToQ that refuses puts (retriable for MQ).
PUT_INHIBITED = 2051
RR_LOGGERS = "gateway.runtime.request_reply"


def _rr_lines(records: Sequence[logging.LogRecord]) -> list[str]:
    return [r.getMessage() for r in records if r.name.startswith(RR_LOGGERS)
            and r.levelno >= logging.INFO]


async def test_error_replies_that_keep_failing_do_not_hold_back_other_timeouts(
    net: Network, gateway: Callable[..., Gateway], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    gw = gateway(
        requests=[{"name": "q", "plugin": "req", "source": "quote/req",
                   "destination": "SVC.QUOTE", "timeout": 0.3}],
        reply_to_q="MQGW.REPLY.ALIAS", undeliverable_after=3.0,
    )
    svc = await gw.start(req="sb1")
    real = svc.produce

    async def broker_refuses(instance: str, envs: Sequence[Envelope]) -> None:
        # as the MQTT plugin reports a PUBACK "not authorised" for a Response Topic
        if any(e.topic.startswith("refused/") for e in envs):
            raise PluginError("the broker refused a publication (0x87)", retriable=True)
        await real(instance, envs)

    svc.produce = broker_refuses  # type: ignore[method-assign]
    bus = get_bus("sb1")
    await bus.exchanges.append([
        Envelope("", "quote/req", b"x", reply_topic=f"refused/{i}", correlation_data=b"%d" % i)
        for i in range(STUCK)
    ])
    await wait_for(lambda: svc.stats().get("requests_sent") == STUCK, timeout=20)
    await bus.exchanges.append(
        [Envelope("", "quote/req", b"y", reply_topic="ok", correlation_data=b"ok")]
    )
    # the honest requester's timeout arrives although 120 older entries cannot finish
    (err,) = await bus.exchanges.wait_on("ok", 1, timeout=10)
    assert json.loads(err.payload)["error"] == "timeout"
    # the stuck ones are given up after the bound, each once
    await wait_for(lambda: svc.stats().get("undeliverable") == STUCK, timeout=20)
    stats = svc.stats()
    assert stats["requester_open"] == 0
    assert stats["timeouts"] == STUCK + 1
    assert stats.get("error_replies.timeout") == 1
    # retried with a backoff and logged summarised: not one line per entry per sweep
    lines = _rr_lines(caplog.records)
    assert len(lines) <= 10, lines


async def test_expiration_reports_a_reply_to_queue_refuses_do_not_hold_back_others(
    net: Network, gateway: Callable[..., Gateway], caplog: pytest.LogCaptureFixture
) -> None:
    """MQ requesters naming a put-inhibited ReplyToQ on the gateway's queue manager:
    their expiration reports cannot be put (2051, retriable); another requester's report
    still arrives, and after the bound theirs go to the dead-letter queue."""
    caplog.set_level(logging.INFO)
    net["GW"].qm.run_mqsc("DEFINE QLOCAL(SHUT.REPLY) PUT(DISABLED)", stop_on_error=True)
    gw = gateway(services=[{**SERVICE, "timeout": 0.3}], undeliverable_after=3.0)
    svc = await gw.start(resp="sb2")
    for _ in range(STUCK):
        await put_request(net, report=int(Report.EXPIRATION), on="GW", reply_q_mgr="GW",
                          reply_to_q="SHUT.REPLY")
    await wait_for(lambda: svc.stats().get("service_requests") == STUCK, timeout=30)
    sent = await put_request(net, report=int(Report.EXPIRATION))
    report = await get_one(net["QMA"].qm, "APP.REPLY", wait_ms=10_000)
    assert report.md.msg_type == MsgType.REPORT and report.md.correl_id == sent.msg_id
    await wait_for(lambda: svc.stats().get("undeliverable") == STUCK, timeout=20)
    assert svc.stats()["service_open"] == 0
    dead = await drain(net["GW"].qm, "SYSTEM.DEAD.LETTER.QUEUE")
    assert len(dead) == STUCK
    dlh, md, _ = unwrap_from_dlq(dead[0].md, dead[0].body)
    assert dlh.reason == PUT_INHIBITED and dlh.dest_q_name.strip() == "SHUT.REPLY"
    assert md.msg_type == MsgType.REPORT
    lines = _rr_lines(caplog.records)
    assert len(lines) <= 10, lines
