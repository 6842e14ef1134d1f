"""The nine scenarios of clusters-digest.md, with real embedded queue managers and channels.

Every test asserts where each message ends up, its MQMD after alias resolution and the
headers it travelled with. Queue managers run in one process, talking over 127.0.0.1.
"""

from __future__ import annotations

import json

from gateway.mq.embedded.cluster_transmit import cluster_correl_id
from gateway.mq.embedded.network import Network
from gateway.mq.embedded.repository import QUEUE, RepositoryRecord
from gateway.mq.port import Browse, GetOptions, OpenOption, PutOptions
from gateway.wire.constants import MsgType, Persistence
from gateway.wire.dlh import unwrap_from_dlq
from gateway.wire.mqmd import MQMD
from gateway.wire.reasons import Reason
from gateway.wire.xqh import unwrap_from_xmitq
from tests.network.network_helpers import NetworkFactory, drain, get_one, wait_for

CLUSTER_XMITQ = "SYSTEM.CLUSTER.TRANSMIT.QUEUE"
DLQ = "SYSTEM.DEAD.LETTER.QUEUE"


def member(name: str, cluster: str, fr: str, *, full: bool = False,
           rcvr: str | None = None) -> str:
    """MQSC joining ``cluster``: own CLUSRCVR, manual CLUSSDR to full repository ``fr``."""
    out = f"DEFINE CHANNEL({rcvr or 'TO.' + name}) CHLTYPE(CLUSRCVR) CONNAME('{name}') " \
          f"CLUSTER({cluster})\n"
    if full:
        out += f"ALTER QMGR REPOS({cluster})\n"
    if fr != name:
        out += f"DEFINE CHANNEL(TO.{fr}) CHLTYPE(CLUSSDR) CONNAME('{fr}') CLUSTER({cluster})\n"
    return out


def link(src: str, dst: str, xmitq: str | None = None) -> tuple[str, str]:
    """(MQSC on src, MQSC on dst) for a plain SDR/RCVR channel src -> dst."""
    xq = xmitq or dst
    return (f"DEFINE QLOCAL({xq}) USAGE(XMITQ)\n"
            f"DEFINE CHANNEL({src}.TO.{dst}) CHLTYPE(SDR) CONNAME('{dst}') XMITQ({xq})\n",
            f"DEFINE CHANNEL({src}.TO.{dst}) CHLTYPE(RCVR)\n")


async def joined(net: Network, fr: str, *members: str) -> None:
    """Wait until full repository ``fr`` holds every member's queue-manager record."""
    repo = net[fr].cluster
    await wait_for(lambda: all(
        any(r.kind == "QMGR" and r.name == m for r in repo.repository.live())
        for m in members))


async def put(net: Network, qm: str, q_name: str, body: bytes, q_mgr_name: str = "",
              options: OpenOption = OpenOption.OUTPUT, **md: object) -> MQMD:
    async with await net[qm].qm.connect() as conn:
        q = await conn.open(q_name, options, q_mgr_name)
        d = MQMD(format="MQSTR", persistence=Persistence.PERSISTENT, **md)  # type: ignore[arg-type]
        out = await q.put(d, body, PutOptions())
        await q.close()
        return out


async def test_scenario1_york_qm_alias_to_clusqm(make_network: NetworkFactory) -> None:
    a = member("A", "C1", "CLUSQM") + "DEFINE QREMOTE(YORK) RNAME(' ') RQMNAME(CLUSQM)\n"
    clusqm = member("CLUSQM", "C1", "CLUSQM", full=True) + "DEFINE QLOCAL(Q)\n"
    async with make_network({"CLUSQM": clusqm, "A": a}) as net:
        await joined(net, "CLUSQM", "A")
        await wait_for(lambda: net["A"].cluster.xmit_q_for_q_mgr("CLUSQM") == CLUSTER_XMITQ)
        # hold the message on A's cluster transmission queue to read its header
        node = net["A"].cluster.node
        net["A"].cluster.node = None
        for s in list(net["A"].senders.values()):
            await s.stop()
        sent = await put(net, "A", "Q", b"to york", "YORK", reply_to_q="R")
        async with await net["A"].qm.connect() as conn:
            xq = await conn.open(CLUSTER_XMITQ, OpenOption.BROWSE)
            held = await xq.get(GetOptions(browse=Browse.FIRST,
                                           match_correl_id=cluster_correl_id("CLUSQM")))
        xmit = unwrap_from_xmitq(held.md, held.body)
        assert (xmit.remote_q_name, xmit.remote_q_mgr_name) == ("Q", "CLUSQM")  # not YORK
        assert held.md.format == "MQXMIT"
        net["A"].cluster.node = node
        for s in list(net["A"].senders.values()):
            s.start()
        got = await get_one(net["CLUSQM"].qm, "Q")
        assert got.body == b"to york"
        assert got.md.msg_id == sent.msg_id
        assert (got.md.reply_to_q, got.md.reply_to_q_mgr) == ("R", "A")
        await wait_for(lambda: net["A"].qm.queue_depth(CLUSTER_XMITQ) == 0)


async def test_scenario2_gateway_to_outside_qm(make_network: NetworkFactory) -> None:
    to_palermo, palermo_rcvr = link("GW", "PALERMO", "X")
    gw = (member("GW", "ITALY", "GW", full=True) + to_palermo +
          "DEFINE QREMOTE(ROME) RNAME(' ') RQMNAME(PALERMO) XMITQ(X) CLUSTER(ITALY)\n")
    m1 = member("M1", "ITALY", "GW")
    palermo = palermo_rcvr + "DEFINE QLOCAL(Q)\n"
    async with make_network({"GW": gw, "M1": m1, "PALERMO": palermo}) as net:
        await joined(net, "GW", "M1")
        sent = await put(net, "M1", "Q", b"via rome", "ROME", reply_to_q="BACK")
        got = await get_one(net["PALERMO"].qm, "Q")
        assert got.body == b"via rome"
        assert got.md.msg_id == sent.msg_id
        assert (got.md.reply_to_q, got.md.reply_to_q_mgr) == ("BACK", "M1")
        await wait_for(lambda: net["GW"].qm.queue_depth("X") == 0)
        # M1 learned ROME from the full repository on first use
        assert any(r.name == "ROME" and r.q_mgr_alias
                   for r in net["M1"].cluster.repository.live())


def fig_2_46(extra_qm1: str = "", extra_qm3: str = "") -> dict[str, str]:
    qm3_to_qm1, qm1_rcvr = link("QM3", "QM1")
    qm1_to_qm3, qm3_rcvr = link("QM1", "QM3", "X")
    return {
        "QM1": member("QM1", "DEMO", "QM1", full=True) + qm1_rcvr + qm1_to_qm3 + extra_qm1,
        "QM2": member("QM2", "DEMO", "QM1") + "DEFINE QLOCAL(Q2) CLUSTER(DEMO)\n",
        "QM3": qm3_to_qm1 + qm3_rcvr + "DEFINE QLOCAL(Q3)\n" + extra_qm3,
    }


async def test_scenario3_outside_qm_into_cluster_and_reply(make_network: NetworkFactory) -> None:
    topo = fig_2_46(
        extra_qm1="DEFINE QREMOTE(QM3) RNAME(' ') RQMNAME(QM3) XMITQ(X) CLUSTER(DEMO)\n",
        extra_qm3="DEFINE QREMOTE(Q2) RNAME(Q2) RQMNAME(QM2) XMITQ(QM1)\n")
    async with make_network(topo) as net:
        await joined(net, "QM1", "QM2")
        await wait_for(lambda: any(r.name == "Q2" for r in net["QM1"].cluster.repository.live()))
        sent = await put(net, "QM3", "Q2", b"request", msg_type=MsgType.REQUEST,
                         reply_to_q="Q3")
        req = await get_one(net["QM2"].qm, "Q2")
        assert req.body == b"request" and req.md.msg_id == sent.msg_id
        assert (req.md.reply_to_q, req.md.reply_to_q_mgr) == ("Q3", "QM3")
        # app2 on QM2 replies to Q3@QM3: through the gateway's advertised QM alias and X
        await put(net, "QM2", req.md.reply_to_q, b"reply", req.md.reply_to_q_mgr,
                  msg_type=MsgType.REPLY, correl_id=req.md.msg_id)
        rep = await get_one(net["QM3"].qm, "Q3")
        assert rep.body == b"reply"
        assert rep.md.correl_id == sent.msg_id
        assert rep.md.put_appl_name  # context of the replying application kept
        for qm, q in (("QM1", "X"), ("QM1", CLUSTER_XMITQ), ("QM2", CLUSTER_XMITQ),
                      ("QM3", "QM1")):
            await wait_for(lambda: net[qm].qm.queue_depth(q) == 0)  # noqa: B023
        assert await drain(net["QM1"].qm, DLQ, 50) == []


async def test_scenario4_any_cluster_balances(make_network: NetworkFactory) -> None:
    topo = fig_2_46(
        extra_qm1="DEFINE QREMOTE(ANY.CLUSTER) RNAME(' ') RQMNAME(' ')\n",
        extra_qm3="DEFINE QREMOTE(Q2) RNAME(Q2) RQMNAME(ANY.CLUSTER) XMITQ(QM1)\n")
    topo["QM4"] = member("QM4", "DEMO", "QM1") + "DEFINE QLOCAL(Q2) CLUSTER(DEMO)\n"
    async with make_network(topo) as net:
        await joined(net, "QM1", "QM2", "QM4")
        await wait_for(lambda: len(net["QM1"].cluster.repository.queue_instances(
            "Q2", {"DEMO"})) == 2)
        for i in range(10):
            await put(net, "QM3", "Q2", f"m{i}".encode())
        at2 = [await get_one(net["QM2"].qm, "Q2") for _ in range(5)]
        at4 = [await get_one(net["QM4"].qm, "Q2") for _ in range(5)]
        assert await drain(net["QM2"].qm, "Q2", 200) == []
        assert await drain(net["QM4"].qm, "Q2", 50) == []
        bodies = sorted(m.body for m in at2 + at4)
        assert bodies == sorted(f"m{i}".encode() for i in range(10))
        # the application's context travelled with every message
        assert {m.md.put_appl_name for m in at2 + at4} == {at2[0].md.put_appl_name}
        assert all(m.md.persistence == Persistence.PERSISTENT for m in at2 + at4)


async def test_scenario5_cluster_out_to_outside_qm(make_network: NetworkFactory) -> None:
    qm1_to_qm3, qm3_rcvr = link("QM1", "QM3")
    qm3_to_qm1, qm1_rcvr = link("QM3", "QM1")
    topo = {
        "QM1": member("QM1", "DEMO", "QM1", full=True) + qm1_to_qm3 + qm1_rcvr +
        "DEFINE QREMOTE(Q3) RNAME(Q3) RQMNAME(QM3) CLUSTER(DEMO)\n",
        "QM2": member("QM2", "DEMO", "QM1") + "DEFINE QLOCAL(Q2) CLUSTER(DEMO)\n",
        "QM3": qm3_to_qm1 + qm3_rcvr + "DEFINE QLOCAL(Q3)\n"
        "DEFINE QREMOTE(QM2) RNAME(' ') RQMNAME(QM2) XMITQ(QM1)\n",
    }
    async with make_network(topo) as net:
        await joined(net, "QM1", "QM2")
        sent = await put(net, "QM2", "Q3", b"out", msg_type=MsgType.REQUEST, reply_to_q="Q2")
        req = await get_one(net["QM3"].qm, "Q3")
        assert req.body == b"out" and req.md.msg_id == sent.msg_id
        assert (req.md.reply_to_q, req.md.reply_to_q_mgr) == ("Q2", "QM2")
        await put(net, "QM3", req.md.reply_to_q, b"back", req.md.reply_to_q_mgr,
                  msg_type=MsgType.REPLY, correl_id=req.md.msg_id)
        rep = await get_one(net["QM2"].qm, "Q2")
        assert rep.body == b"back" and rep.md.correl_id == sent.msg_id
        assert (rep.md.reply_to_q, rep.md.reply_to_q_mgr) == ("", "")


async def test_scenario6_reply_to_queue_alias(make_network: NetworkFactory) -> None:
    a_to_b, b_rcvr = link("QMA", "QMB")
    b_to_pisa, pisa_rcvr = link("QMB", "PISA")
    topo = {
        "QMA": a_to_b + "DEFINE QREMOTE(QUEUE) RNAME(OTHERQ) RQMNAME(PISA)\n",
        "QMB": b_rcvr + b_to_pisa + "DEFINE QLOCAL(REQ)\n",
        "PISA": pisa_rcvr + "DEFINE QLOCAL(OTHERQ)\n",
    }
    async with make_network(topo) as net:
        sent = await put(net, "QMA", "REQ", b"ask", "QMB", msg_type=MsgType.REQUEST,
                         reply_to_q="QUEUE", reply_to_q_mgr="")
        assert (sent.reply_to_q, sent.reply_to_q_mgr) == ("OTHERQ", "PISA")
        req = await get_one(net["QMB"].qm, "REQ")
        assert (req.md.reply_to_q, req.md.reply_to_q_mgr) == ("OTHERQ", "PISA")
        await put(net, "QMB", req.md.reply_to_q, b"answer", req.md.reply_to_q_mgr,
                  msg_type=MsgType.REPLY, correl_id=req.md.msg_id)
        rep = await get_one(net["PISA"].qm, "OTHERQ")
        assert rep.body == b"answer" and rep.md.correl_id == sent.msg_id


def fig_2_48() -> dict[str, str]:
    return {
        "QM1": member("QM1", "CORNISH", "QM2", rcvr="TO.QM1").replace(
            "TO.QM2)", "TO.QM2.CORNISH)"),
        "QM2": member("QM2", "CORNISH", "QM2", full=True, rcvr="TO.QM2.CORNISH") +
        member("QM2", "WINDSOR", "QM3", rcvr="TO.QM2.WINDSOR") +
        "DEFINE QALIAS(MYQ3) TARGET(Q3) CLUSTER(CORNISH) DEFBIND(NOTFIXED)\n",
        "QM3": member("QM3", "WINDSOR", "QM3", full=True) + "DEFINE QLOCAL(Q3) CLUSTER(WINDSOR)\n",
    }


async def test_scenario7_bridge_between_clusters(make_network: NetworkFactory) -> None:
    async with make_network(fig_2_48()) as net:
        await joined(net, "QM2", "QM1")
        await joined(net, "QM3", "QM2")
        await wait_for(lambda: any(r.name == "Q3" for r in net["QM3"].cluster.repository.live()))
        # QM1 is only in CORNISH: it cannot see Q3 itself
        async with await net["QM1"].qm.connect() as conn:
            try:
                await conn.open("Q3", OpenOption.OUTPUT)
                raise AssertionError("Q3 must not resolve on QM1")
            except Exception as exc:  # MQError
                assert getattr(exc, "reason", None) == Reason.UNKNOWN_OBJECT_NAME
        s1 = await put(net, "QM1", "MYQ3", b"not fixed", options=OpenOption.OUTPUT |
                       OpenOption.BIND_NOT_FIXED)
        s2 = await put(net, "QM1", "MYQ3", b"as q def")
        got = [await get_one(net["QM3"].qm, "Q3") for _ in range(2)]
        assert sorted(m.body for m in got) == [b"as q def", b"not fixed"]
        assert {m.md.msg_id for m in got} == {s1.msg_id, s2.msg_id}
        assert all(m.md.reply_to_q_mgr == "" for m in got)
        # bind on open: resolved to the bridge QM2, which does not forward -> its DLQ
        s3 = await put(net, "QM1", "MYQ3", b"bound", options=OpenOption.OUTPUT |
                       OpenOption.BIND_ON_OPEN)
        dl = await get_one(net["QM2"].qm, DLQ)
        dlh, md, body = unwrap_from_dlq(dl.md, dl.body)
        assert body == b"bound" and md.msg_id == s3.msg_id
        assert (dlh.dest_q_name, dlh.dest_q_mgr_name) == ("MYQ3", "QM2")
        assert dlh.reason == Reason.UNKNOWN_ALIAS_BASE_Q
        assert await drain(net["QM3"].qm, "Q3", 200) == []


async def test_scenario8_duplicate_repository_updates(make_network: NetworkFactory) -> None:
    topo = {
        "FR1": member("FR1", "DEMO", "FR2", full=True),
        "FR2": member("FR2", "DEMO", "FR1", full=True),
        "P": member("P", "DEMO", "FR1") + "DEFINE QLOCAL(PQ) CLUSTER(DEMO)\n",
        "P2": member("P2", "DEMO", "FR2"),
    }
    async with make_network(topo) as net:
        frs = [net["FR1"].cluster, net["FR2"].cluster]

        def held(c: object, name: str = "PQ") -> RepositoryRecord | None:
            for r in c.repository.live():  # type: ignore[attr-defined]
                if r.kind == QUEUE and r.name == name:
                    return r
            return None

        await wait_for(lambda: all(held(c) is not None for c in frs))
        # P2 learns PQ on first use (a partial repository)
        assert held(net["P2"].cluster) is None
        await put(net, "P2", "PQ", b"hello")
        assert (await get_one(net["P"].qm, "PQ")).body == b"hello"
        assert held(net["P2"].cluster) is not None
        await wait_for(lambda: all(c.repository.stats.duplicates > 0 for c in frs))
        before = [(c.repository.stats.applied, c.repository.stats.duplicates) for c in frs]
        seq = held(frs[0]).seq  # type: ignore[union-attr]
        # a later change: applied once by each full repository, the second copy discarded
        net["P"].qm.run_mqsc("ALTER QLOCAL(PQ) DEFBIND(NOTFIXED)")
        await wait_for(lambda: all(held(c) is not None and held(c).seq > seq  # type: ignore
                                   for c in frs))
        await wait_for(lambda: all(c.repository.stats.duplicates > b[1]
                                   for c, b in zip(frs, before, strict=True)))
        assert [c.repository.stats.applied - b[0] for c, b in zip(frs, before, strict=True)] \
            == [1, 1]
        # the partial repository that used PQ is told of the change
        await wait_for(lambda: held(net["P2"].cluster).bind_not_fixed)  # type: ignore
        # the same update delivered again by hand is discarded everywhere
        rec = held(frs[0])
        assert rec is not None and rec.bind_not_fixed
        update = json.dumps({"op": "update", "from": "P",
                             "records": [rec.to_json()]}).encode()
        applied = [c.repository.stats.applied for c in frs]
        dups = [c.repository.stats.duplicates for c in frs]
        for name in ("FR1", "FR2"):
            async with await net[name].qm.connect() as conn:
                for _ in range(2):
                    await conn.put1("SYSTEM.CLUSTER.COMMAND.QUEUE", MQMD(format="MQSTR"),
                                    update)
        await wait_for(lambda: all(c.repository.stats.duplicates >= d + 2
                                   for c, d in zip(frs, dups, strict=True)))
        assert [c.repository.stats.applied for c in frs] == applied
        rows = net["FR2"].qm.run_mqsc("DISPLAY QCLUSTER(PQ)")[0]
        assert rows.ok and any("CLUSQMGR(P)" in line for line in rows.lines)
        assert any("DEFBIND(NOTFIXED)" in line for line in rows.lines)
        rows = net["FR1"].qm.run_mqsc("DISPLAY CLUSQMGR(*)")[0]
        text = "\n".join(rows.lines)
        for name in ("FR1", "FR2", "P", "P2"):
            assert f"CLUSQMGR({name})" in text
        assert text.count("QMTYPE(REPOS)") == 2
