"""Issue 29: the sweeper makes progress past entries it cannot finish. An outsider can
make many entries whose error reply or expiration report (a ReplyToQ that refuses puts)
cannot be sent; those must not hold back the timeouts of everybody else, are retried
with a backoff, logged summarised, and given up once their destination has refused them
for ``request_reply.undeliverable_after`` (outcome ``undeliverable``). An outage of the
gateway's own -- the plugin or the queue manager unreachable -- is no such refusal: its
entries are retried until it ends, however long."""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Callable, Sequence

import pytest

from gateway.mq.embedded.network import Network
from gateway.mq.port import Connection, MQError, QueueManager
from gateway.plugin_api import DeliveryRefusedError, Envelope, PluginError
from gateway.routing.correlation import PendingRequest, PendingService
from gateway.runtime.request_reply import RequestReplyService
from gateway.runtime.request_reply.errors import DestinationBusyError
from gateway.runtime.request_reply.readers import belongs_to_destination, retry_delay
from gateway.wire.constants import MsgType, Report
from gateway.wire.dlh import unwrap_from_dlq
from gateway.wire.reasons import Reason
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
        # a failure the plugin does not call retriable (no outage): it belongs to the
        # entry, as a refused reply topic does
        if any(e.topic.startswith("refused/") for e in envs):
            raise PluginError("the broker refused a publication", retriable=False)
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


# ------------------------------------------------ outages of the gateway's own ------


def _put_failed(reason: int, *, destination: bool) -> PluginError:
    """What put_or_dead_letter raises for a retriable MQ failure of its put: about the
    queue put to (DestinationBusyError), or not (the connection; the dead-letter queue)."""
    exc = (DestinationBusyError("put to the ReplyToQ", reason=reason) if destination
           else PluginError("put", retriable=True))
    exc.__cause__ = MQError(reason, "put")
    return exc


@pytest.mark.parametrize(
    ("exc", "counts"),
    [
        (DeliveryRefusedError("reply topic refused", index=0, reason=2035), True),
        (_put_failed(Reason.Q_FULL, destination=True), True),
        (_put_failed(Reason.PUT_INHIBITED, destination=True), True),
        (PluginError("refused, not retriable", retriable=False), True),
        (PluginError("memory bus is down", retriable=True), False),
        (_put_failed(Reason.CONNECTION_BROKEN, destination=False), False),
        (_put_failed(Reason.Q_FULL, destination=False), False),  # the dead-letter queue
        (MQError(Reason.Q_MGR_NOT_AVAILABLE, "connect"), False),
        (MQError(Reason.CONNECTION_BROKEN, "commit"), False),
    ],
)
def test_only_failures_of_the_destination_count_toward_giving_up(
    exc: MQError | PluginError, counts: bool
) -> None:
    assert belongs_to_destination(exc) is counts


#: Seconds an entry's destination may refuse before it is given up, in these tests.
BOUND = 1.0


def _open_entries(svc: RequestReplyService) -> list[PendingRequest | PendingService]:
    return svc.store.due(math.inf, 1000)


def _last_try(entry: PendingRequest | PendingService, sweep_interval: float) -> float:
    """When the sweeper last tried ``entry`` (it postponed it to ``retry_at`` by the
    backoff of its attempts before that try); -inf before any try."""
    if entry.retry_at is None or entry.attempts == 0:
        return -math.inf
    return entry.retry_at - retry_delay(sweep_interval, entry.attempts - 1)


async def _tried_past_the_bound(svc: RequestReplyService, count: int) -> None:
    """Wait until the sweeper has tried each of ``count`` open entries more than
    :data:`BOUND` seconds past its deadline, or has finished some (given them up)."""
    interval = svc.config.sweep_interval

    def settled() -> bool:
        entries = _open_entries(svc)
        return len(entries) < count or all(
            _last_try(e, interval) > e.deadline + BOUND for e in entries
        )

    # the backoff doubles from 2 sweep intervals (0.2 s): the first try more than 1 s
    # past the deadline is the fifth, 3 s past it; 10 s is ample
    await wait_for(settled, timeout=10)


async def test_error_replies_wait_out_a_plugin_outage_longer_than_the_bound(
    net: Network, gateway: Callable[..., Gateway]
) -> None:
    """The requester's plugin is down longer than undeliverable_after: the timeout
    error replies are delivered when it comes back, not given up (an outage is not a
    refusal of the reply topic)."""
    gw = gateway(
        requests=[{"name": "q", "plugin": "req", "source": "quote/req",
                   "destination": "SVC.QUOTE", "timeout": 0.3}],
        reply_to_q="MQGW.REPLY.ALIAS", undeliverable_after=BOUND,
    )
    svc = await gw.start(req="outage1")
    bus = get_bus("outage1")
    await bus.exchanges.append([
        Envelope("", "quote/req", b"x", reply_topic=f"back/{i}", correlation_data=b"%d" % i)
        for i in range(3)
    ])
    await wait_for(lambda: svc.stats().get("requests_sent") == 3, timeout=20)
    bus.down = True  # before the deadlines (0.3 s): every error reply meets the outage
    await _tried_past_the_bound(svc, 3)
    assert svc.stats().get("undeliverable", 0) == 0
    assert len(_open_entries(svc)) == 3
    bus.down = False
    for i in range(3):
        (err,) = await bus.exchanges.wait_on(f"back/{i}", 1, timeout=20)
        assert json.loads(err.payload)["error"] == "timeout"
    stats = svc.stats()
    assert stats["requester_open"] == 0
    assert stats.get("error_replies.timeout") == 3
    assert stats.get("undeliverable", 0) == 0


class SwitchedQueueManager:
    """The gateway's queue manager behind a switch: while ``down``, connecting fails as
    for a queue manager that is not available (2059)."""

    def __init__(self, qm: QueueManager) -> None:
        self.qm = qm
        self.down = False

    @property
    def name(self) -> str:
        return self.qm.name

    async def connect(self) -> Connection:
        if self.down:
            raise MQError(Reason.Q_MGR_NOT_AVAILABLE, "switched off")
        return await self.qm.connect()


async def test_expiration_reports_wait_out_a_queue_manager_outage_longer_than_the_bound(
    net: Network, gateway: Callable[..., Gateway]
) -> None:
    """The sweeper cannot connect to the queue manager for longer than
    undeliverable_after: the expiration report reaches the requester when it can again,
    neither given up nor dead-lettered (``reports_lost`` before)."""
    gw = gateway(services=[{**SERVICE, "timeout": 0.3}], undeliverable_after=BOUND)
    switch = SwitchedQueueManager(net["GW"].qm)
    gw.qm = switch
    svc = await gw.start(resp="outage2")
    sent = await put_request(net, report=int(Report.EXPIRATION))
    await wait_for(lambda: svc.stats().get("service_requests") == 1, timeout=20)
    switch.down = True
    await _tried_past_the_bound(svc, 1)
    assert svc.stats().get("undeliverable", 0) == 0
    switch.down = False
    report = await get_one(net["QMA"].qm, "APP.REPLY", wait_ms=20_000)
    assert report.md.msg_type == MsgType.REPORT and report.md.correl_id == sent.msg_id
    stats = svc.stats()
    assert stats["service_open"] == 0
    assert stats.get("undeliverable", 0) == 0 and stats.get("reports_lost", 0) == 0
    assert await drain(net["GW"].qm, "SYSTEM.DEAD.LETTER.QUEUE") == []
