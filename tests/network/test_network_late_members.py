"""A partial repository reaches a queue whose host joined the cluster after it asked.

Why: a partial repository learns a cluster queue on first use and stays subscribed to the
name. When the queue's host joins later, the full repository sends the queue on; without
the host's queue-manager record (its CLUSRCVR channel) the partial repository cannot start
a channel, and its messages would wait on SYSTEM.CLUSTER.TRANSMIT.QUEUE for ever. Issue
14's request/reply network met this at start-up when its gateway started last.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from gateway.mq.embedded.cluster import NEGATIVE_CACHE_S
from gateway.mq.embedded.network import Network
from gateway.mq.embedded.repository import QMGR, QUEUE
from gateway.mq.embedded.repository_queue import save_repository
from gateway.mq.embedded.topology import topology_from_dict
from gateway.mq.port import MQError
from gateway.wire.reasons import Reason
from tests.network.network_helpers import get_one, wait_for
from tests.network.test_network_scenarios import joined, member, put


def restartable(mqsc: str) -> str:
    """``member``'s MQSC, run again at a restart (DEFINE ... REPLACE)."""
    return "".join(line + " REPLACE\n" if line.startswith("DEFINE") else line + "\n"
                   for line in mqsc.splitlines())


TOPOLOGY = {
    "FR": restartable(member("FR", "DEMO", "FR", full=True)),
    "HOST": restartable(member("HOST", "DEMO", "FR") + "DEFINE QLOCAL(PQ) CLUSTER(DEMO)\n"),
    "USER": restartable(member("USER", "DEMO", "FR")),
}


def holds(net: Network, qm: str, kind: str, name: str) -> bool:
    return any(r.kind == kind and r.name == name for r in net[qm].cluster.repository.live())


@pytest_asyncio.fixture
async def net(tmp_path: Path) -> AsyncIterator[Network]:
    """FR and USER running; HOST (with cluster queue PQ) not started yet."""
    network = Network(topology_from_dict({"queue_managers": {
        name: {"mqsc": text} for name, text in TOPOLOGY.items()}}, tmp_path),
        tmp_path / "data")
    try:
        await network.start(["FR", "USER"])
        await joined(network, "FR", "USER")
        yield network
    finally:
        await network.stop()


async def test_a_queue_sent_on_after_its_host_joined_comes_with_the_host(net: Network) -> None:
    # USER asks about PQ before anyone advertised it: unknown (2085), and subscribed.
    with pytest.raises(MQError) as err:
        await put(net, "USER", "PQ", b"too early")
    assert err.value.reason == Reason.UNKNOWN_OBJECT_NAME
    await net.start(["HOST"])
    await wait_for(lambda: holds(net, "USER", QUEUE, "PQ"))
    # told of PQ, USER holds its host's record too, before it sends anything
    await wait_for(lambda: holds(net, "USER", QMGR, "HOST"))
    sent = await put(net, "USER", "PQ", b"hello")
    got = await get_one(net["HOST"].qm, "PQ")
    assert (got.body, got.md.msg_id) == (b"hello", sent.msg_id)
    # and, subscribed to the host with the queue, it is told when the host's channel changes
    await moves_receiver(net)


async def test_a_message_for_a_member_whose_record_is_missing_asks_for_it(
    net: Network,
) -> None:
    await host_joins_and_user_sends(net)
    await forget_host(net)
    asked = net["USER"].cluster.repository.stats.queries_sent
    sent = await put(net, "USER", "PQ", b"second")
    got = await get_one(net["HOST"].qm, "PQ")
    assert (got.body, got.md.msg_id) == (b"second", sent.msg_id)
    assert holds(net, "USER", QMGR, "HOST")
    assert net["USER"].cluster.repository.stats.queries_sent > asked


async def test_a_message_left_waiting_for_a_missing_member_asks_after_a_restart(
    net: Network,
) -> None:
    await host_joins_and_user_sends(net)
    # USER's stored repository lacks HOST's record, and the full repository is down: the
    # next message waits on USER's cluster transmission queue through USER's restart
    await net["FR"].stop()
    await forget_host(net)
    async with await net["USER"].qm.connect() as conn:
        await save_repository(conn, net["USER"].cluster.repository)
        await conn.commit()
    sent = await put(net, "USER", "PQ", b"waited")
    await net["USER"].stop()
    await net.start(["FR"])
    await net.start(["USER"])
    got = await get_one(net["HOST"].qm, "PQ")
    assert (got.body, got.md.msg_id) == (b"waited", sent.msg_id)


async def host_joins_and_user_sends(net: Network) -> None:
    """HOST joins; USER's first message to PQ makes it learn PQ and HOST."""
    await net.start(["HOST"])
    await joined(net, "FR", "HOST")
    await put(net, "USER", "PQ", b"first")
    assert (await get_one(net["HOST"].qm, "PQ")).body == b"first"


async def forget_host(net: Network) -> None:
    """USER loses HOST's record and stops its channel to HOST."""
    repo = net["USER"].cluster.repository
    for key in [k for k, r in repo.records.items() if r.kind == QMGR and r.name == "HOST"]:
        del repo.records[key]
    senders = net["USER"].senders
    for sender_key in [k for k in senders if k[-1] == "HOST"]:  # ("AUTO", chl, lane, hop)
        await senders.pop(sender_key).stop()
    assert not holds(net, "USER", QMGR, "HOST")


async def moves_receiver(net: Network) -> None:
    """HOST's cluster-receiver moves to an explicit address (the same listener); USER's
    record of HOST follows."""
    conname = f"127.0.0.1({net['HOST'].port})"
    net["HOST"].qm.run_mqsc(f"ALTER CHANNEL(TO.HOST) CHLTYPE(CLUSRCVR) CONNAME('{conname}')")

    def users_record() -> str:
        rec = net["USER"].cluster.repository.member("HOST", ["DEMO"])
        return "" if rec is None else rec.conname

    await wait_for(lambda: users_record() == conname)


async def test_a_member_that_asked_about_a_queue_is_told_when_its_host_changes(
    net: Network,
) -> None:
    await host_joins_and_user_sends(net)
    await moves_receiver(net)


async def test_waiting_messages_ask_about_an_unplaceable_member_at_most_once_a_second(
    net: Network,
) -> None:
    # FR's answer about "NOBODY" has a record (a queue of that name) but no member record:
    # the messages keep waiting, and must not each send a query
    net["FR"].qm.run_mqsc("DEFINE QLOCAL(NOBODY) CLUSTER(DEMO) REPLACE")
    cluster = net["USER"].cluster
    asked = cluster.repository.stats.queries_sent
    started = time.monotonic()
    for _ in range(20):
        cluster.message_waiting("NOBODY", "")
        await asyncio.sleep(0.05)
    took = time.monotonic() - started
    assert holds(net, "USER", QUEUE, "NOBODY")  # the answer came, and was not enough
    # one query, and one more per NEGATIVE_CACHE_S the loop took (20 without the limit)
    allowed = 1 + int(took / NEGATIVE_CACHE_S)
    assert 1 <= cluster.repository.stats.queries_sent - asked <= allowed < 20
