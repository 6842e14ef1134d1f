"""Name resolution as a pure function over a catalogue (reference §7, clusters digest)."""

from __future__ import annotations

import pytest

from gateway.mq.embedded.name_resolution import (
    UNKNOWN_DEF_XMIT_Q,
    ClusterQueue,
    Resolution,
    ResolutionError,
    resolve_queue,
    resolve_reply_to,
)
from gateway.mq.embedded.objects import (
    ObjectCatalogue,
    QMgrAttrs,
    QType,
    QueueDef,
    Usage,
    new_catalogue,
)
from gateway.wire.reasons import Reason


def cat(*defs: QueueDef, defxmitq: str = "", name: str = "QM1") -> ObjectCatalogue:
    c = new_catalogue(name)
    for d in defs:
        c.queues[d.name] = d
    if defxmitq:
        c.qmgr = QMgrAttrs(name=name, default_xmit_q_name=defxmitq)
    return c


def local(name: str, xmit: bool = False) -> QueueDef:
    return QueueDef(name, QType.LOCAL, usage=Usage.TRANSMISSION if xmit else Usage.NORMAL)


def remote(name: str, rname: str, rqm: str, xmitq: str = "") -> QueueDef:
    return QueueDef(name, QType.REMOTE, remote_name=rname, remote_q_mgr_name=rqm,
                    xmit_q_name=xmitq)


def alias(name: str, target: str) -> QueueDef:
    return QueueDef(name, QType.ALIAS, target=target)


def t3(r: Resolution) -> tuple[str, str, str]:
    return (r.q_name, r.q_mgr_name, r.xmit_q_name)


def reason_of(c: ObjectCatalogue, q: str, m: str = "") -> int:
    with pytest.raises(ResolutionError) as err:
        resolve_queue(c, q, m)
    return err.value.reason


def test_local_and_alias() -> None:
    c = cat(local("A"), alias("AL", "A"), alias("AA", "AL"), alias("AX", "NONE"))
    assert resolve_queue(c, "A") == Resolution("A", "QM1", "", ("A",))
    assert resolve_queue(c, "A", "QM1").is_local
    r = resolve_queue(c, "AL")
    assert (r.q_name, r.q_mgr_name, r.is_local) == ("A", "QM1", True)
    assert reason_of(c, "AA") == Reason.ALIAS_BASE_Q_TYPE_ERROR
    assert reason_of(c, "AX") == Reason.UNKNOWN_ALIAS_BASE_Q
    assert reason_of(c, "NOPE") == Reason.UNKNOWN_OBJECT_NAME


def test_remote_definition_xmitq_selection() -> None:
    c = cat(local("QM2", xmit=True), local("X", xmit=True), local("PLAIN"),
            remote("R1", "APP.IN", "QM2"), remote("R2", "APP.IN", "QM2", "X"),
            remote("R3", "APP.IN", "QM2", "MISSING"), remote("R4", "APP.IN", "QM2", "PLAIN"),
            remote("R5", "APP.IN", "QM9"), remote("R6", "APP.IN", "QM1"),
            remote("R7", "APP.IN", "QM2", "R1"), alias("ALR", "R2"))
    assert t3(resolve_queue(c, "R1")) == ("APP.IN", "QM2", "QM2")
    assert t3(resolve_queue(c, "R2")) == ("APP.IN", "QM2", "X")
    assert t3(resolve_queue(c, "ALR")) == ("APP.IN", "QM2", "X")
    assert reason_of(c, "R3") == Reason.UNKNOWN_XMIT_Q
    assert reason_of(c, "R4") == Reason.XMIT_Q_USAGE_ERROR
    assert reason_of(c, "R7") == Reason.XMIT_Q_TYPE_ERROR
    assert reason_of(c, "R5") == Reason.UNKNOWN_REMOTE_Q_MGR
    assert reason_of(c, "R6") == Reason.UNKNOWN_REMOTE_Q_MGR
    c2 = cat(local("DEF.X", xmit=True), remote("R5", "APP.IN", "QM9"), defxmitq="DEF.X")
    assert t3(resolve_queue(c2, "R5")) == ("APP.IN", "QM9", "DEF.X")


def test_named_qmgr_routes() -> None:
    c = cat(local("QM2", xmit=True), local("X", xmit=True), local("Q"),
            remote("YORK", "", "CLUSQM", "X"),   # QM alias with xmitq
            remote("ROME", "", "QM2"),            # QM alias via xmitq named after target
            remote("HOME", "", "QM1"),            # QM alias to the local QM
            remote("BAD", "SOMEQ", "QM2"))        # remote queue used as a QM name
    assert t3(resolve_queue(c, "Q", "YORK")) == ("Q", "CLUSQM", "X")
    assert t3(resolve_queue(c, "Q", "ROME")) == ("Q", "QM2", "QM2")
    assert t3(resolve_queue(c, "Q", "HOME")) == ("Q", "QM1", "")
    assert t3(resolve_queue(c, "Q", "QM2")) == ("Q", "QM2", "QM2")
    assert reason_of(c, "Q", "BAD") == Reason.UNKNOWN_REMOTE_Q_MGR
    assert reason_of(c, "Q", "NOWHERE") == Reason.UNKNOWN_REMOTE_Q_MGR
    assert reason_of(c, "MISSING", "HOME") == Reason.UNKNOWN_OBJECT_NAME
    loop = cat(remote("L1", "", "L2"), remote("L2", "", "L1"))
    assert reason_of(loop, "Q", "L1") == Reason.UNKNOWN_REMOTE_Q_MGR
    c3 = cat(remote("R", "", "QM5"), defxmitq="NOT.DEFINED")
    assert reason_of(c3, "Q", "R") == UNKNOWN_DEF_XMIT_Q


def test_same_name_qm_alias_routes_via_xmitq() -> None:
    # DEFINE QREMOTE(QM3) RNAME(' ') RQMNAME(QM3) XMITQ(QM2): route QM3 via QM2
    c = cat(local("QM2", xmit=True), remote("QM3", "", "QM3", "QM2"))
    assert t3(resolve_queue(c, "Q3", "QM3")) == ("Q3", "QM3", "QM2")


class Directory:
    """A stand-in cluster view: the hook issue 8 implements."""

    def __init__(self) -> None:
        self.members = {"CLUSQM": "SYSTEM.CLUSTER.TRANSMIT.QUEUE"}
        self.queues = {"Q2": ClusterQueue("QM2")}

    def xmit_q_for_q_mgr(self, q_mgr_name: str) -> str | None:
        return self.members.get(q_mgr_name)

    def cluster_queue(self, q_name: str, bind_on_open: bool) -> ClusterQueue | None:
        return self.queues.get(q_name)


def test_directory_hook_for_clusters() -> None:
    d = Directory()
    c = cat(remote("YORK", "", "CLUSQM"), remote("ANY.CLUSTER", "", ""),
            alias("MYQ2", "Q2"))
    r = resolve_queue(c, "Q", "YORK", directory=d)
    assert t3(r) == ("Q", "CLUSQM", "SYSTEM.CLUSTER.TRANSMIT.QUEUE")
    assert t3(resolve_queue(c, "Q2", directory=d)) == ("Q2", "QM2",
                                                      "SYSTEM.CLUSTER.TRANSMIT.QUEUE")
    assert t3(resolve_queue(c, "Q2", "ANY.CLUSTER", directory=d))[:2] == ("Q2", "QM2")
    assert t3(resolve_queue(c, "MYQ2", directory=d))[:2] == ("Q2", "QM2")
    with pytest.raises(ResolutionError):
        resolve_queue(c, "Q2", "ANY.CLUSTER")  # no directory: blank RQMNAME cannot resolve


def test_reply_to_alias() -> None:
    c = cat(remote("QUEUE", "OTHERQ", "PISA"))
    assert resolve_reply_to(c, "QUEUE", "") == ("OTHERQ", "PISA")
    assert resolve_reply_to(c, "QUEUE", "QMX") == ("QUEUE", "QMX")
    assert resolve_reply_to(c, "MINE", "") == ("MINE", "QM1")
    assert resolve_reply_to(c, "", "") == ("", "")


def test_remote_definition_with_blank_xmitq_ignores_qmgr_aliases() -> None:
    """§7.1 role 1: XMITQ, else a local queue named RQMNAME, else DEFXMITQ, else 2087;
    "when a remote definition exists no alias definitions are consulted". A queue-manager
    alias named like RQMNAME must not re-route the definition's target (here to QM3)."""
    qm_alias = remote("QM2", "", "QM3", "XQ3")
    target = remote("R", "X", "QM2")
    c = cat(local("XQ3", xmit=True), qm_alias, target)
    assert reason_of(c, "R") == Reason.UNKNOWN_REMOTE_Q_MGR
    with pytest.raises(ResolutionError, match="for remote queue R: no transmission queue"):
        resolve_queue(c, "R")
    c2 = cat(local("XQ3", xmit=True), local("DEF.X", xmit=True), qm_alias, target,
             defxmitq="DEF.X")
    assert t3(resolve_queue(c2, "R")) == ("X", "QM2", "DEF.X")
    # the alias still applies to an opener naming QM2 itself (role 2)
    assert t3(resolve_queue(c2, "Q", "QM2")) == ("Q", "QM3", "XQ3")
