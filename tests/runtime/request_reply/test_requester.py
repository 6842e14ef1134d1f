"""Gateway as requester: plugin requests → MQ REQUEST through the cluster → the MQ
application's reply comes back through the reply-to alias → reply on the plugin side."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable

import pytest

from gateway.mq.embedded.network import Network
from gateway.mq.port import PutOptions
from gateway.plugin_api import Envelope, PluginError
from gateway.wire.constants import MsgType, Report
from gateway.wire.dlh import unwrap_from_dlq
from gateway.wire.mqmd import MQMD
from gateway.wire.rfh2 import decode_rfh2
from plugins.memory import get_bus
from tests.network.network_helpers import drain, wait_for
from tests.runtime.request_reply.conftest import Gateway, echo
from tests.support.exchanges import started_memory


def _route(**over: object) -> dict[str, object]:
    return {"name": "quote", "plugin": "req", "source": "quote/req",
            "destination": "SVC.QUOTE", "timeout": 15.0, **over}


@pytest.mark.parametrize("correlation", ["msg_id", "correl_id"])
async def test_round_trip_through_the_cluster_and_a_reply_to_alias(
    net: Network, gateway: Callable[..., Gateway], correlation: str
) -> None:
    gw = gateway(requests=[_route(correlation=correlation)], reply_to_q="MQGW.REPLY.ALIAS")
    svc = await gw.start(req="b1")
    bus = get_bus("b1")
    app = asyncio.create_task(echo(net["QMA"].qm, "SVC.QUOTE"))
    await bus.exchanges.append(
        [Envelope("", "quote/req", b"IBM?", reply_topic="quote/answers", correlation_data=b"c-1")]
    )
    (reply,) = await bus.exchanges.wait_on("quote/answers", 1, timeout=20)
    (request,) = await app
    # the request as the MQ application saw it: reply-to alias resolved at put
    assert request.md.msg_type == MsgType.REQUEST
    assert request.md.reply_to_q.strip() == "MQGW.REPLY"
    assert request.md.reply_to_q_mgr.strip() == "GWREPLY"
    assert bool(request.md.report & Report.PASS_CORREL_ID) == (correlation == "correl_id")
    assert reply.payload == b"re:IBM?"
    assert reply.correlation_data == b"c-1"
    assert reply.properties.get("mq.msg.type") == "reply"
    # counted once the reply's get committed (just after the produce)
    await wait_for(lambda: svc.stats().get("replies_delivered") == 1)
    stats = svc.stats()
    assert stats["requests_sent"] == 1 and stats["requester_open"] == 0


async def test_request_without_reply_topic_uses_the_route_template(
    net: Network, gateway: Callable[..., Gateway]
) -> None:
    gw = gateway(requests=[_route()], reply_to_q="MQGW.REPLY.ALIAS")
    await gw.start(req="b2")
    bus = get_bus("b2")
    app = asyncio.create_task(echo(net["QMA"].qm, "SVC.QUOTE"))
    await bus.exchanges.append([Envelope("", "quote/req", b"x")])  # MQTT 3.1.1 style
    (reply,) = await bus.exchanges.wait_on("quote/req/reply", 1, timeout=20)
    await app
    assert reply.payload == b"re:x"


async def test_no_reply_in_time_gives_a_timeout_error_reply_and_a_late_reply_is_dead_lettered(
    net: Network, gateway: Callable[..., Gateway]
) -> None:
    gw = gateway(requests=[_route(timeout=0.3)], reply_to_q="MQGW.REPLY.ALIAS")
    svc = await gw.start(req="b3")
    bus = get_bus("b3")
    await bus.exchanges.append(
        [Envelope("", "quote/req", b"slow", reply_topic="r", correlation_data=b"k")]
    )
    (err,) = await bus.exchanges.wait_on("r", 1, timeout=10)
    body = json.loads(err.payload)
    assert body["error"] == "timeout" and body["route"] == "quote"
    assert err.correlation_data == b"k" and err.properties["mq.error"] == "timeout"
    # the application answers late: the reply is dead-lettered, not delivered
    await echo(net["QMA"].qm, "SVC.QUOTE")
    await wait_for(lambda: svc.stats().get("replies_late", 0) == 1, timeout=15)
    dead = await drain(net["GW"].qm, "SYSTEM.DEAD.LETTER.QUEUE")
    assert len(dead) == 1 and len(bus.exchanges.on("r")) == 1


async def test_redelivered_request_is_put_once_and_answered_once(
    net: Network, gateway: Callable[..., Gateway]
) -> None:
    gw = gateway(requests=[_route()], reply_to_q="MQGW.REPLY.ALIAS")
    svc = await gw.start()  # no consumer: the handler is driven directly
    gw.instances["req"] = inst = await started_memory("req", "b4")
    svc.attach("req", inst)
    env = Envelope("", "quote/req", b"once", reply_topic="r4", correlation_data=b"same")
    route = svc.requests["quote"]
    await svc.on_requests(route, [env])
    await svc.on_requests(route, [env])  # the source redelivers (crash before its ack)
    got = await echo(net["QMA"].qm, "SVC.QUOTE")
    assert len(got) == 1
    await get_bus("b4").exchanges.wait_on("r4", 1, timeout=15)
    await asyncio.sleep(0.3)
    assert len(await drain(net["QMA"].qm, "SVC.QUOTE", wait_ms=100)) == 0
    assert len(get_bus("b4").exchanges.on("r4")) == 1
    assert svc.stats()["duplicates_filtered"] == 1


async def test_an_instance_attached_after_the_stop_gets_no_consumer(
    net: Network, gateway: Callable[..., Gateway]
) -> None:
    """A plugin start that ends during the gateway's shutdown (after request/reply
    stopped) must not get a consumer nobody stops: its requests are not taken."""
    gw = gateway(requests=[_route()], reply_to_q="MQGW.REPLY.ALIAS")
    svc = await gw.start()
    gw.instances["req"] = inst = await started_memory("req", "b9")
    await svc.stop()
    svc.attach("req", inst)
    await get_bus("b9").exchanges.append(
        [Envelope("", "quote/req", b"late", reply_topic="r9", correlation_data=b"c9")]
    )
    await asyncio.sleep(0.3)
    consumers = [t for t in asyncio.all_tasks() if t.get_name() == "memory-exchange:quote"]
    assert consumers == []  # the instance's exchange was never asked to consume
    with pytest.raises(PluginError, match="not started"):
        await svc.produce("req", [Envelope("", "quote/rep", b"x")])  # not registered
    assert len(await drain(net["QMA"].qm, "SVC.QUOTE", wait_ms=100)) == 0


async def test_restart_between_request_and_reply_still_delivers_the_reply(
    net: Network, gateway: Callable[..., Gateway]
) -> None:
    gw = gateway(requests=[_route()], reply_to_q="MQGW.REPLY.ALIAS")
    await gw.start(req="b5")
    bus = get_bus("b5")
    await bus.exchanges.append([Envelope("", "quote/req", b"r", reply_topic="r5",
                                         correlation_data=b"z")])
    await wait_for(lambda: gw.svc is not None and gw.svc.stats().get("requests_sent") == 1)
    await gw.stop()
    await echo(net["QMA"].qm, "SVC.QUOTE")  # replies while the gateway is down
    await gw.start(req="b5")
    (reply,) = await bus.exchanges.wait_on("r5", 1, timeout=15)
    assert reply.payload == b"re:r" and reply.correlation_data == b"z"


async def test_request_to_an_unknown_queue_is_refused_with_the_reason(
    net: Network, gateway: Callable[..., Gateway]
) -> None:
    gw = gateway(requests=[_route(destination="NO.SUCH.Q@GW")])
    await gw.start(req="b6")
    bus = get_bus("b6")
    await bus.exchanges.append([Envelope("", "quote/req", b"?", reply_topic="r6",
                                         correlation_data=b"q")])
    (err,) = await bus.exchanges.wait_on("r6", 1, timeout=10)
    body = json.loads(err.payload)
    assert body["error"] == "refused" and body["feedback"] == 2085


async def test_reply_matching_no_request_is_dead_lettered_as_no_pending_request(
    net: Network, gateway: Callable[..., Gateway]
) -> None:
    gw = gateway(requests=[_route()])
    svc = await gw.start(req="b7")
    async with await net["GW"].qm.connect() as conn:
        md = MQMD(msg_type=MsgType.REPLY, format="MQSTR", correl_id=b"U" * 24)
        await conn.put1("MQGW.REPLY", md, b"stray", PutOptions())
    await wait_for(lambda: svc.stats().get("replies_unmatched") == 1)
    (dead,) = await drain(net["GW"].qm, "SYSTEM.DEAD.LETTER.QUEUE")
    dlh, original, body = unwrap_from_dlq(dead.md, dead.body)
    assert dlh.reason == 65537 and dlh.dest_q_name.strip() == "MQGW.REPLY"
    assert original.correl_id == b"U" * 24 and body == b"stray"
    assert get_bus("b7").exchanges.entries == []


async def test_request_properties_reach_mq_as_an_mqrfh2_usr_folder(
    net: Network, gateway: Callable[..., Gateway]
) -> None:
    gw = gateway(requests=[_route()], reply_to_q="MQGW.REPLY.ALIAS")
    svc = await gw.start()
    gw.instances["req"] = inst = await started_memory("req", "b8")
    svc.attach("req", inst)
    env = Envelope("", "quote/req", "p€".encode(), reply_topic="r8", correlation_data=b"1",
                   property_list=(("trace", "abc"), ("a.b", "nested"), ("bad name", "x")))
    await svc.on_requests(svc.requests["quote"], [env])
    (m,) = await drain(net["QMA"].qm, "SVC.QUOTE", wait_ms=2000)
    assert m.md.format.strip() == "MQHRF2"
    rfh2, length = decode_rfh2(m.body, m.md.encoding, ccsid=m.md.coded_char_set_id)
    assert rfh2.format.strip() == "MQSTR" and rfh2.coded_char_set_id == 1208
    assert m.body[length:] == "p€".encode()
    (usr,) = rfh2.folders_named("usr")
    assert usr.get("trace") == "abc" and usr.get("a/b") == "nested"
    assert len(usr.children) == 2  # "bad name" cannot be an element name
    # a request without properties stays a plain MQSTR message
    plain_env = Envelope("", "quote/req", b"q", reply_topic="r8", correlation_data=b"2")
    await svc.on_requests(svc.requests["quote"], [plain_env])
    (plain,) = await drain(net["QMA"].qm, "SVC.QUOTE", wait_ms=2000)
    assert plain.md.format.strip() == "MQSTR" and plain.body == b"q"
