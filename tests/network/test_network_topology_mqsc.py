"""Topology files, channel/cluster MQSC, and repository persistence across restarts."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from gateway.mq.embedded.channels import (
    ChannelError,
    ChannelSender,
    decode_batch,
    encode_batch,
    parse_conname,
)
from gateway.mq.embedded.mqsc import MQSCError
from gateway.mq.embedded.objects import ChannelType, DefBind
from gateway.mq.embedded.qmgr import EmbeddedQueueManager
from gateway.mq.embedded.topology import TopologyError, load_topology, topology_from_dict
from gateway.wire.mqmd import MQMD
from tests.network.network_helpers import NetworkFactory, get_one, wait_for


def test_topology_file_is_validated(tmp_path: Path) -> None:
    (tmp_path / "qm2.mqsc").write_text("DEFINE QLOCAL(Q2)\n")
    good = tmp_path / "net.yaml"
    good.write_text("data_dir: d\nqueue_managers:\n  QM1:\n    port: 14001\n"
                    "    mqsc: |\n      DEFINE QLOCAL(Q1)\n  QM2:\n    mqsc_file: qm2.mqsc\n")
    topo = load_topology(good)
    assert topo.address_book() == {"QM1": ("127.0.0.1", 14001)}
    assert "DEFINE QLOCAL(Q2)" in topo.queue_managers["QM2"].script(topo.base_dir)
    cases = {
        "queue_managers: {}\n": "at least one queue manager",
        "queue_managers:\n  QM1: {port: 5}\n  QM2: {port: 5}\n": "both use port 5",
        "queue_managers:\n  'BAD NAME': {}\n": "characters MQ does not allow",
        "queue_managers:\n  QM1: {colour: red}\n": "colour",
        "queue_managers:\n  QM1: {mqsc: 'DEFINE QLOCAL('}\n": "queue manager QM1: line 1",
        "- just a list\n": "must be a mapping",
    }
    for text, expected in cases.items():
        bad = tmp_path / "bad.yaml"
        bad.write_text(text)
        with pytest.raises(TopologyError) as info:
            load_topology(bad)
        assert expected in str(info.value), (text, str(info.value))


async def test_channel_mqsc_define_display_alter_delete(tmp_path: Path) -> None:
    qm = EmbeddedQueueManager("QM1", tmp_path / "qm1")
    try:
        ok = qm.run_mqsc(
            "DEFINE QLOCAL(QM2) USAGE(XMITQ)\n"
            "DEFINE CHANNEL(QM1.TO.QM2) CHLTYPE(SDR) CONNAME('127.0.0.1(1414)') XMITQ(QM2)\n"
            "DEFINE CHANNEL(QM2.TO.QM1) CHLTYPE(RCVR) TRPTYPE(TCP)\n"
            "DEFINE CHANNEL(TO.QM1) CHLTYPE(CLUSRCVR) CONNAME('QM1') CLUSTER(DEMO)\n"
            "DEFINE CHANNEL(TO.FR) CHLTYPE(CLUSSDR) CONNAME('FR') CLUSTER(DEMO) BATCHSZ(10)\n"
            "ALTER QMGR REPOS(DEMO)\n"
            "DEFINE QALIAS(PUB) TARGET(LOC) CLUSTER(DEMO) DEFBIND(NOTFIXED)\n")
        assert all(r.ok for r in ok), [r.lines for r in ok]
        chans = qm.catalogue.channels
        assert chans["QM1.TO.QM2"].chltype is ChannelType.SDR
        assert chans["QM1.TO.QM2"].conname == "127.0.0.1(1414)"
        assert chans["TO.FR"].batch_size == 10 and chans["TO.FR"].cluster == "DEMO"
        assert qm.catalogue.qmgr.repository == "DEMO"
        assert qm.catalogue.get("PUB").default_bind is DefBind.NOTFIXED  # type: ignore[union-attr]
        shown = qm.run_mqsc("DISPLAY CHANNEL(TO.*)")[0]
        assert shown.ok and sum("CHLTYPE(CLUS" in line for line in shown.lines) == 2
        q = qm.run_mqsc("DISPLAY QALIAS(PUB) CLUSTER DEFBIND")[0]
        assert any("CLUSTER(DEMO)" in line and "DEFBIND(NOTFIXED)" in line for line in q.lines)
        errors = {
            "DEFINE CHANNEL(X) CHLTYPE(SDR) XMITQ(QM2)": "needs CONNAME",
            "DEFINE CHANNEL(X) CHLTYPE(SDR) CONNAME('h(1)')": "needs XMITQ",
            "DEFINE CHANNEL(X) CHLTYPE(RCVR) XMITQ(QM2)": "only valid for SDR",
            "DEFINE CHANNEL(X) CHLTYPE(CLUSRCVR) CONNAME('h(1)')": "needs CLUSTER",
            "DEFINE CHANNEL(X) CHLTYPE(SVRCONN)": "CHLTYPE(SVRCONN)",
            "DEFINE CHANNEL(X) CONNAME('h(1)')": "needs CHLTYPE",
            "DEFINE CHANNEL(QM2.TO.QM1) CHLTYPE(RCVR)": "already exists",
            "ALTER CHANNEL(QM2.TO.QM1) CHLTYPE(SDR)": "cannot be altered",
            "DEFINE QLOCAL(XQ) USAGE(XMITQ) CLUSTER(DEMO)": "cannot be a cluster queue",
            "DEFINE QLOCAL(B) DEFBIND(SOMETIMES)": "DEFBIND(SOMETIMES)",
        }
        for command, expected in errors.items():
            r = qm.run_mqsc(command)[0]
            assert not r.ok and expected in " ".join(r.lines), (command, r.lines)
        assert qm.run_mqsc("ALTER CHANNEL(QM1.TO.QM2) CONNAME('127.0.0.1(1415)')")[0].ok
        assert qm.run_mqsc("DELETE CHANNEL(QM2.TO.QM1)")[0].ok
        with pytest.raises(MQSCError):
            qm.run_mqsc("DELETE CHANNEL(QM2.TO.QM1)", stop_on_error=True)
    finally:
        await qm.close()
    again = EmbeddedQueueManager("QM1", tmp_path / "qm1")  # definitions survive a restart
    try:
        assert set(again.catalogue.channels) == {"QM1.TO.QM2", "TO.QM1", "TO.FR"}
        assert again.catalogue.channels["QM1.TO.QM2"].conname == "127.0.0.1(1415)"
        assert again.catalogue.qmgr.repository == "DEMO"
    finally:
        await again.close()


def test_batch_codec_round_trip_and_rejects_damage() -> None:
    msgs = [(MQMD(format="MQXMIT", msg_id=bytes([i]) * 24), bytes([i]) * (i * 100))
            for i in range(3)]
    frame = encode_batch(7, msgs)
    seq, back = decode_batch(frame[5:])
    assert seq == 7
    assert [(m.msg_id, b) for m, b in back] == [(m.msg_id, b) for m, b in msgs]
    with pytest.raises(ChannelError):
        decode_batch(frame[5:-1])
    with pytest.raises(ChannelError):
        decode_batch(frame[5:] + b"x")
    assert parse_conname("127.0.0.1(1414)", {}) == ("127.0.0.1", 1414)
    assert parse_conname("qm2", {"QM2": ("127.0.0.1", 9)}) == ("127.0.0.1", 9)
    with pytest.raises(ChannelError):
        parse_conname("nowhere", {})


async def test_repository_survives_restart(tmp_path: Path, make_network: NetworkFactory) -> None:
    # topology MQSC runs at every start: REPLACE makes it repeatable
    fr = ("DEFINE CHANNEL(TO.FR) CHLTYPE(CLUSRCVR) CONNAME('FR') CLUSTER(C) REPLACE\n"
          "ALTER QMGR REPOS(C)\n")
    pr = ("DEFINE CHANNEL(TO.PR) CHLTYPE(CLUSRCVR) CONNAME('PR') CLUSTER(C) REPLACE\n"
          "DEFINE CHANNEL(TO.FR) CHLTYPE(CLUSSDR) CONNAME('FR') CLUSTER(C) REPLACE\n")
    async with make_network({"FR": fr, "PR": pr}) as net:
        net["PR"].qm.run_mqsc("DEFINE QLOCAL(Q) CLUSTER(C)")
        await wait_for(lambda: any(r.name == "Q" for r in net["FR"].cluster.repository.live()))
        before = dict(net["FR"].cluster.repository.records)
        await net.stop()
        await net.start(["FR"])  # the full repository alone: its records come from disk
        assert net["FR"].cluster.repository.records == before
        await net.start(["PR"])
        # a later deletion reaches the full repository as a newer record
        net["PR"].qm.run_mqsc("DELETE QLOCAL(Q)")
        await wait_for(lambda: not any(r.name == "Q"
                                       for r in net["FR"].cluster.repository.live()))
        # and an application on FR now gets 2085 for Q
        async with await net["FR"].qm.connect() as conn:
            from gateway.mq.port import MQError, OpenOption
            with pytest.raises(MQError) as info:
                await conn.open("Q", OpenOption.OUTPUT)
            assert info.value.reason == 2085


async def test_in_process_and_topology_network_delivers(make_network: NetworkFactory) -> None:
    a = ("DEFINE QLOCAL(B) USAGE(XMITQ)\n"
         "DEFINE CHANNEL(A.B) CHLTYPE(SDR) CONNAME('B') XMITQ(B)\n")
    b = "DEFINE QLOCAL(IN)\nDEFINE CHANNEL(A.B) CHLTYPE(RCVR)\n"
    async with make_network({"A": a, "B": b}) as net:
        async with await net["A"].qm.connect() as conn:
            await conn.put1("IN", MQMD(format="MQSTR"), b"np", q_mgr_name="B")
        assert (await get_one(net["B"].qm, "IN")).body == b"np"


def test_topology_from_dict_requires_mapping(tmp_path: Path) -> None:
    with pytest.raises(TopologyError):
        topology_from_dict([], tmp_path)


async def test_stop_waits_for_channels_stopped_by_mqsc(
    make_network: NetworkFactory, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A channel replaced (ALTER CONNAME) or deleted by MQSC is stopped in the background;
    stopping the node must wait for those stops, not leave them running."""
    finished: list[str] = []
    real_stop = ChannelSender.stop

    async def slow_stop(self: ChannelSender) -> None:
        if self.spec.conname == "QM2":  # the channels MQSC replaced or deleted
            await asyncio.sleep(1.0)
        await real_stop(self)
        finished.append(self.spec.channel)

    monkeypatch.setattr(ChannelSender, "stop", slow_stop)
    mqsc = ("DEFINE QLOCAL(QM2) USAGE(XMITQ)\n"
            "DEFINE CHANNEL(A.TO.QM2) CHLTYPE(SDR) CONNAME('QM2') XMITQ(QM2)\n"
            "DEFINE CHANNEL(B.TO.QM2) CHLTYPE(SDR) CONNAME('QM2') XMITQ(QM2)\n")
    async with make_network({"QM1": mqsc}) as net:
        qm = net["QM1"].qm
        assert qm.run_mqsc("ALTER CHANNEL(A.TO.QM2) CONNAME('127.0.0.1(1)')")[0].ok
        assert qm.run_mqsc("DELETE CHANNEL(B.TO.QM2)")[0].ok
        finished.clear()
    # the replaced A, the deleted B, and the new A stopped with the node
    assert sorted(finished) == ["A.TO.QM2", "A.TO.QM2", "B.TO.QM2"]
