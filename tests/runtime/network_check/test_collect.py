"""The view a gateway builds of its embedded queue manager: definitions from the
catalogue of a real queue manager (MQSC), cluster queues and members from its
repository, and the bound on what it sends."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from gateway.mq.embedded.qmgr import EmbeddedQueueManager
from gateway.mq.embedded.repository import QMGR, QUEUE, Repository, RepositoryRecord
from gateway.runtime.network_check import collect
from gateway.runtime.network_check.collect import mq_view, node_view


async def test_definitions_and_cluster_repository(tmp_path: Path) -> None:
    qm = EmbeddedQueueManager("QMA", tmp_path / "qm")
    try:
        qm.run_mqsc(
            "DEFINE QLOCAL(S1) REPLACE\n"
            "DEFINE QLOCAL(QMB) USAGE(XMITQ) REPLACE\n"
            "DEFINE QREMOTE(S2) RNAME(S2) RQMNAME(QMB) REPLACE\n"
            "DEFINE QREMOTE(HUB) RNAME(' ') RQMNAME(QMB) XMITQ(QMB) REPLACE\n"
            "DEFINE QALIAS(PUB.S1) TARGET(S1) REPLACE\n"
            "ALTER QMGR DEFXMITQ(QMB)\n",
            stop_on_error=True,
        )
        repo = Repository()
        for rec in (
            RepositoryRecord(QMGR, "C", "QMC", "QMC", 1),
            RepositoryRecord(QMGR, "C", "QMA", "QMA", 1),
            RepositoryRecord(QUEUE, "C", "S3", "QMC", 2, qtype="QLOCAL"),
            RepositoryRecord(QUEUE, "C", "S3", "QMD", 2, qtype="QLOCAL"),
            RepositoryRecord(QUEUE, "C", "S1", "QMA", 3, qtype="QLOCAL"),  # its own
            RepositoryRecord(QUEUE, "C", "GONE", "QMC", 4, deleted=True),
        ):
            repo.apply(rec)
        directory = SimpleNamespace(repository=repo, clusters={"C"})
        view = mq_view(SimpleNamespace(name="QMA", catalogue=qm.catalogue,
                                       remote_directory=directory))
    finally:
        await qm.close()
    assert view is not None
    assert "S1" in view.local_queues and not any(q.startswith("SYSTEM.")
                                                 for q in view.local_queues)
    assert view.transmission_queues == ["QMB"] and view.default_xmit_q == "QMB"
    assert view.remote_queues["S2"].rname == "S2" and view.remote_queues["HUB"].rname == ""
    assert view.alias_queues == {"PUB.S1": "S1"}
    assert view.cluster_queues == {"S3": ["QMC", "QMD"]}
    assert view.cluster_q_mgrs == ["QMC"]


def test_ibm_mq_describes_no_definitions() -> None:
    assert mq_view(SimpleNamespace(name="QM1")) is None


def test_a_view_is_cut_at_the_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(collect, "MAX_ITEMS", 3)
    view = node_view(q_mgr="QMA", gateway_id="gw", serviced=[f"S{i}" for i in range(10)],
                     sinks={}, neighbours=None, qm=SimpleNamespace(name="QMA"))
    assert view.truncated and view.serviced == ["S0", "S1", "S2"]
