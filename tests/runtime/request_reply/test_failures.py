"""Request/reply under failures (review of issue 14): one route that cannot produce does
not stall the others, correlation-less requests are not merged, replies that cannot be
put nor dead-lettered are refused to the plugin's dead-letter path, the service entry
exists before the request is produced, and the MQ loops restart after a crash."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

from gateway.mq.embedded.network import Network
from gateway.plugin_api import Envelope, PluginError
from gateway.routing.correlation_store import CorrelationStoreError
from gateway.wire.constants import MsgType, Report
from gateway.wire.dlh import unwrap_from_dlq
from plugins.memory import get_bus
from tests.network.network_helpers import drain, get_one, wait_for
from tests.runtime.request_reply.conftest import Gateway, echo
from tests.runtime.request_reply.test_service import SERVICE, put_request
from tests.support.exchanges import started_memory

#: MQRC_BACKOUT_THRESHOLD_REACHED: the MQDLH reason of a reply backed out too often.
BACKOUT_THRESHOLD_REACHED = 2362


def _two_routes(down_timeout: float, up_timeout: float) -> list[dict[str, object]]:
    return [
        {"name": "down", "plugin": "kd", "source": "d/req", "destination": "SVC.QUOTE",
         "timeout": down_timeout},
        {"name": "up", "plugin": "ku", "source": "u/req", "destination": "SVC.QUOTE",
         "timeout": up_timeout},
    ]


async def test_a_route_that_cannot_produce_does_not_stop_other_routes_timeouts(
    net: Network, gateway: Callable[..., Gateway]
) -> None:
    gw = gateway(requests=_two_routes(0.2, 1.0), reply_to_q="MQGW.REPLY.ALIAS")
    svc = await gw.start(kd="fd1", ku="fu1")
    await get_bus("fd1").exchanges.append(
        [Envelope("", "d/req", b"1", reply_topic="d/rep", correlation_data=b"d1")]
    )
    await wait_for(lambda: svc.stats().get("requests_sent") == 1)
    svc.detach("kd")  # its broker is down: every produce to it fails retriably
    await get_bus("fu1").exchanges.append(
        [Envelope("", "u/req", b"2", reply_topic="u/rep", correlation_data=b"u1")]
    )
    (err,) = await get_bus("fu1").exchanges.wait_on("u/rep", 1, timeout=8)
    assert json.loads(err.payload)["error"] == "timeout"
    assert svc.stats()["requester_open"] == 1  # down's entry waits for its instance


async def test_a_timeout_error_reply_the_plugin_refuses_finishes_the_entry(
    net: Network, gateway: Callable[..., Gateway]
) -> None:
    gw = gateway(requests=_two_routes(0.2, 1.0), reply_to_q="MQGW.REPLY.ALIAS")
    svc = await gw.start(ku="fu2")
    # kd refuses everything larger than 1 byte: the timeout error reply for good
    gw.instances["kd"] = kd = await started_memory("kd", "fd2", refuse_larger_than=1)
    svc.attach("kd", kd)
    await get_bus("fd2").exchanges.append(
        [Envelope("", "d/req", b"1", reply_topic="d/rep", correlation_data=b"d1")]
    )
    await get_bus("fu2").exchanges.append(
        [Envelope("", "u/req", b"2", reply_topic="u/rep", correlation_data=b"u1")]
    )
    await get_bus("fu2").exchanges.wait_on("u/rep", 1, timeout=8)
    await wait_for(lambda: svc.stats().get("error_replies_undeliverable") == 1)
    assert svc.stats()["requester_open"] == 0
    assert svc.store.counts()["requester_done"] == 2


async def test_a_reply_for_a_down_route_is_dead_lettered_after_the_backout_bound(
    net: Network, gateway: Callable[..., Gateway]
) -> None:
    gw = gateway(requests=_two_routes(30, 30), reply_to_q="MQGW.REPLY.ALIAS")
    svc = await gw.start(kd="fd3", ku="fu3")
    svc.reply_retry = 1.0  # the route has been failing this long: not a restart
    await get_bus("fd3").exchanges.append(
        [Envelope("", "d/req", b"1", reply_topic="d/rep", correlation_data=b"d1")]
    )
    await wait_for(lambda: svc.stats().get("requests_sent") == 1)
    svc.detach("kd")
    await get_bus("fu3").exchanges.append(
        [Envelope("", "u/req", b"2", reply_topic="u/rep", correlation_data=b"u1")]
    )
    await wait_for(lambda: svc.stats().get("requests_sent") == 2)
    await echo(net["QMA"].qm, "SVC.QUOTE", 2)  # down's request first: its reply first
    (reply,) = await get_bus("fu3").exchanges.wait_on("u/rep", 1, timeout=15)
    assert reply.payload == b"re:2"
    await wait_for(lambda: svc.stats().get("replies_backed_out") == 1)
    (dead,) = await drain(net["GW"].qm, "SYSTEM.DEAD.LETTER.QUEUE")
    dlh, _, body = unwrap_from_dlq(dead.md, dead.body)
    assert dlh.reason == BACKOUT_THRESHOLD_REACHED and body == b"re:1"


async def test_a_reply_waits_for_a_plugin_that_restarts_within_the_retry_time(
    net: Network, gateway: Callable[..., Gateway]
) -> None:
    gw = gateway(requests=_two_routes(30, 30), reply_to_q="MQGW.REPLY.ALIAS")
    svc = await gw.start(kd="fd4")
    svc.reply_retry = 5.0
    await get_bus("fd4").exchanges.append(
        [Envelope("", "d/req", b"1", reply_topic="d/rep", correlation_data=b"d1")]
    )
    await wait_for(lambda: svc.stats().get("requests_sent") == 1)
    kd = gw.instances["kd"]
    svc.detach("kd")  # the instance restarts
    await echo(net["QMA"].qm, "SVC.QUOTE")
    await asyncio.sleep(2.0)  # backed out more than BACKOUT_LIMIT times meanwhile
    svc.attach("kd", kd)
    (reply,) = await get_bus("fd4").exchanges.wait_on("d/rep", 1, timeout=15)
    assert reply.payload == b"re:1"
    assert svc.stats().get("replies_backed_out", 0) == 0
    assert await drain(net["GW"].qm, "SYSTEM.DEAD.LETTER.QUEUE", wait_ms=100) == []


async def test_identical_requests_without_correlation_data_are_two_requests(
    net: Network, gateway: Callable[..., Gateway]
) -> None:
    gw = gateway(requests=[{"name": "q", "plugin": "req", "source": "quote/req",
                            "destination": "SVC.QUOTE", "timeout": 15}],
                 reply_to_q="MQGW.REPLY.ALIAS")
    svc = await gw.start(req="fa")
    bus = get_bus("fa")
    app = asyncio.create_task(echo(net["QMA"].qm, "SVC.QUOTE", 2))
    await bus.exchanges.append([Envelope("", "quote/req", b"time?")])  # MQTT 3.1.1 style
    await bus.exchanges.append([Envelope("", "quote/req", b"time?")])
    replies = await bus.exchanges.wait_on("quote/req/reply", 2, timeout=20)
    assert len(await app) == 2
    assert [r.payload for r in replies] == [b"re:time?", b"re:time?"]
    assert svc.stats().get("duplicates_filtered", 0) == 0


async def test_oversize_and_unknown_replies_go_to_the_plugins_dead_letter_path(
    net: Network, gateway: Callable[..., Gateway]
) -> None:
    gw = gateway(services=[{**SERVICE, "timeout": 30}])
    svc = await gw.start(resp="ff")
    bus = get_bus("ff")
    await put_request(net)
    await put_request(net)
    reqs = await bus.exchanges.wait_on("pricing/req", 2, timeout=20)
    junk = Envelope("", "pricing/rep", b"junk", correlation_data=b"nope")
    big = Envelope("", "pricing/rep", b"x" * 4_194_400, correlation_data=reqs[0].correlation_data)
    ok = Envelope("", "pricing/rep", b"ok", correlation_data=reqs[1].correlation_data)
    await bus.exchanges.append([junk])
    await bus.exchanges.append([big])
    await bus.exchanges.append([ok])
    reply = await get_one(net["QMA"].qm, "APP.REPLY", wait_ms=15_000)
    assert reply.body == b"ok"
    await wait_for(lambda: len(bus.exchanges.refused) == 2)
    assert [e for _, e in bus.exchanges.refused] == [junk, big]
    stats = svc.stats()
    assert stats["replies_unmatched"] == 1 and stats["replies_refused"] == 1


async def test_a_late_responder_reply_goes_to_the_plugins_dead_letter_path(
    net: Network, gateway: Callable[..., Gateway]
) -> None:
    gw = gateway(services=[{**SERVICE, "timeout": 0.2}])
    svc = await gw.start(resp="fl")
    bus = get_bus("fl")
    await put_request(net)
    (req,) = await bus.exchanges.wait_on("pricing/req", 1, timeout=20)
    await wait_for(lambda: svc.stats().get("timeouts") == 1, timeout=10)
    late = Envelope("", "pricing/rep", b"late", correlation_data=req.correlation_data)
    await bus.exchanges.append([late])
    await wait_for(lambda: len(bus.exchanges.refused) == 1, timeout=10)
    assert bus.exchanges.refused[0][1] is late
    assert svc.stats()["replies_late"] == 1
    assert await drain(net["QMA"].qm, "APP.REPLY", wait_ms=200) == []


async def test_the_service_entry_exists_before_the_request_is_produced(
    net: Network, gateway: Callable[..., Gateway]
) -> None:
    """A crash after the produce, before the MQ commit: the responder's answer to the
    first copy arrives before the request is got again, and still reaches the app."""
    gw = gateway(services=[SERVICE])
    svc = await gw.start(resp="fs")
    real = svc.produce
    crashed = asyncio.Event()
    release = asyncio.Event()

    async def produce_then_crash(instance: str, envs: Any) -> None:
        if not crashed.is_set():
            await real(instance, envs)
            crashed.set()
            raise PluginError("crash before the MQ commit", retriable=True)
        if not release.is_set():
            raise PluginError("still down", retriable=True)
        await real(instance, envs)

    svc.produce = produce_then_crash  # type: ignore[method-assign]
    sent = await put_request(net)
    (req,) = await get_bus("fs").exchanges.wait_on("pricing/req", 1, timeout=20)
    await get_bus("fs").exchanges.append(
        [Envelope("", req.reply_topic, b"42", correlation_data=req.correlation_data)]
    )
    reply = await get_one(net["QMA"].qm, "APP.REPLY", wait_ms=15_000)
    assert reply.md.correl_id == sent.msg_id and reply.body == b"42"
    release.set()
    await wait_for(lambda: svc.stats().get("duplicates_filtered") == 1, timeout=10)
    assert len(get_bus("fs").exchanges.on("pricing/req")) == 1


async def test_the_sweeper_restarts_after_an_unexpected_failure_and_health_shows_it(
    net: Network, gateway: Callable[..., Gateway]
) -> None:
    gw = gateway(requests=[{"name": "q", "plugin": "req", "source": "quote/req",
                            "destination": "SVC.QUOTE", "timeout": 0.3}],
                 reply_to_q="MQGW.REPLY.ALIAS")
    svc = await gw.start(req="fr")
    real_due = svc.store.due
    failures = 0

    def failing_due(now: float, limit: int = 100) -> list[Any]:
        nonlocal failures
        if failures < 2:
            failures += 1
            raise CorrelationStoreError("disk full")
        return real_due(now, limit)

    svc.store.due = failing_due  # type: ignore[method-assign]
    await wait_for(lambda: svc.stats().get("tasks_failing") == 1, timeout=5)
    assert not svc.healthy
    await get_bus("fr").exchanges.append(
        [Envelope("", "quote/req", b"t", reply_topic="r", correlation_data=b"k")]
    )
    (err,) = await get_bus("fr").exchanges.wait_on("r", 1, timeout=10)
    assert json.loads(err.payload)["error"] == "timeout"
    assert svc.stats()["tasks_failing"] == 0 and svc.healthy


async def test_a_refused_request_whose_error_reply_is_refused_goes_to_the_dead_letter_topic(
    net: Network, gateway: Callable[..., Gateway]
) -> None:
    gw = gateway(requests=[{"name": "q", "plugin": "req", "source": "quote/req",
                            "destination": "NO.SUCH.Q@GW", "timeout": 15}])
    svc = await gw.start()
    gw.instances["req"] = inst = await started_memory("req", "fx", refuse_larger_than=1)
    svc.attach("req", inst)
    bus = get_bus("fx")
    env = Envelope("", "quote/req", b"?", reply_topic="r", correlation_data=b"q")
    await bus.exchanges.append([env])
    await wait_for(lambda: len(bus.exchanges.refused) == 1, timeout=10)
    assert bus.exchanges.refused[0][1] is env
    assert svc.stats()["requester_open"] == 0


async def test_a_reply_and_the_timeout_racing_give_the_requester_one_answer(
    net: Network, gateway: Callable[..., Gateway]
) -> None:
    """The reply's produce is still running when the deadline passes: the sweeper must
    not send a timeout error reply as well (only the one that finishes produces)."""
    gw = gateway(requests=[{"name": "q", "plugin": "req", "source": "quote/req",
                            "destination": "SVC.QUOTE", "timeout": 1.0}],
                 reply_to_q="MQGW.REPLY.ALIAS")
    svc = await gw.start(req="fz")
    real = svc.produce

    async def slow_replies(instance: str, envs: Any) -> None:
        if all("mq.error" not in e.properties for e in envs):
            await asyncio.sleep(1.5)  # past the deadline and a few sweeps
        await real(instance, envs)

    svc.produce = slow_replies  # type: ignore[method-assign]
    app = asyncio.create_task(echo(net["QMA"].qm, "SVC.QUOTE"))
    await get_bus("fz").exchanges.append(
        [Envelope("", "quote/req", b"r", reply_topic="rz", correlation_data=b"z")]
    )
    await app
    (answer,) = await get_bus("fz").exchanges.wait_on("rz", 1, timeout=10)
    await asyncio.sleep(1.0)
    assert [e.payload for e in get_bus("fz").exchanges.on("rz")] == [b"re:r"]
    assert "mq.error" not in answer.properties
    assert svc.stats().get("timeouts", 0) == 0


async def test_a_request_the_plugin_refuses_is_dead_lettered_with_an_exception_report(
    net: Network, gateway: Callable[..., Gateway]
) -> None:
    gw = gateway(services=[SERVICE])
    svc = await gw.start()
    gw.instances["resp"] = inst = await started_memory("resp", "fe", refuse_larger_than=1)
    svc.attach("resp", inst)
    sent = await put_request(net, report=int(Report.EXCEPTION))
    report = await get_one(net["QMA"].qm, "APP.REPLY", wait_ms=15_000)
    assert report.md.msg_type == MsgType.REPORT and report.md.feedback == 2030
    assert report.md.correl_id == sent.msg_id
    (dead,) = await drain(net["GW"].qm, "SYSTEM.DEAD.LETTER.QUEUE")
    dlh, _, body = unwrap_from_dlq(dead.md, dead.body)
    assert dlh.reason == 2030 and body == b"price?"
    stats = svc.stats()
    assert stats["service_requests_refused"] == 1 and stats["service_open"] == 0
