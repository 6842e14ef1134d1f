"""A start script that parses but would fail when run stops the start before anything
is created, naming the file, the queue manager and the line (issue 11, item 6)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from gateway.mq.embedded.mqsc import MQSCError
from gateway.mq.embedded.network import Network
from gateway.mq.embedded.qmgr import EmbeddedQueueManager
from gateway.mq.embedded.topology import TopologyError, load_topology, topology_from_dict
from gateway.wire.mqmd import MQMD

REPO = Path(__file__).resolve().parents[2]

BAD_SCRIPTS = {
    "unknown keyword": ("DEFINE QLOCAL(EARLY.Q)\nDEFINE QLOCAL(BAD.Q) COLOUR(RED)\n", 2,
                        "COLOUR"),
    "MAXDEPTH on an alias": ("DEFINE QLOCAL(EARLY.Q)\n* a comment\n"
                             "DEFINE QALIAS(BAD.A) TARGET(EARLY.Q) MAXDEPTH(5)\n", 3,
                             "MAXDEPTH"),
    "re-DEFINE without REPLACE": ("DEFINE QLOCAL(EARLY.Q)\nDEFINE QLOCAL(EARLY.Q) +\n"
                                  "  DESCR('again')\n", 2, "already exists"),
    "bad value": ("DEFINE QLOCAL(EARLY.Q)\nDEFINE QLOCAL(BAD.Q) MAXDEPTH(lots)\n", 2,
                  "not a number"),
}


@pytest.mark.parametrize("case", list(BAD_SCRIPTS))
def test_topology_load_runs_the_mqsc_against_scratch_definitions(
    tmp_path: Path, case: str
) -> None:
    script, line, words = BAD_SCRIPTS[case]
    with pytest.raises(TopologyError) as info:
        topology_from_dict({"data_dir": "d", "queue_managers": {
            "QM1": {"mqsc": "DEFINE QLOCAL(FINE.Q)\n"}, "QM2": {"mqsc": script}}},
            tmp_path, str(tmp_path / "net.yaml"))
    message = str(info.value)
    assert message.startswith(str(tmp_path / "net.yaml")), message
    assert f"queue manager QM2: line {line}:" in message and words in message, message
    assert not (tmp_path / "d").exists()


def test_mqgw_network_reports_a_bad_line_without_traceback_and_creates_nothing(
    tmp_path: Path,
) -> None:
    (tmp_path / "qm2.mqsc").write_text(
        "DEFINE QLOCAL(Q2.EARLY)\n\nDEFINE QLOCAL(Q2.BAD) COLOUR(RED)\n")
    topo = tmp_path / "net.yaml"
    topo.write_text("data_dir: d\nqueue_managers:\n"
                    "  QM1:\n    mqsc: |\n      DEFINE QLOCAL(Q1.EARLY)\n"
                    "  QM2:\n    mqsc_file: qm2.mqsc\n")
    done = subprocess.run(
        [sys.executable, "-m", "gateway.runtime.cli", "network", str(topo)],
        capture_output=True, text=True, cwd=REPO, timeout=120,
    )
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert "Traceback" not in done.stderr, done.stderr
    assert str(tmp_path / "qm2.mqsc") in done.stderr, done.stderr
    assert "queue manager QM2: line 3:" in done.stderr and "COLOUR" in done.stderr
    assert "READY" not in done.stdout
    assert not (tmp_path / "d").exists()  # no queue manager, no queue was created


def test_inline_mqsc_after_an_mqsc_file_names_the_topology_and_its_own_line(
    tmp_path: Path,
) -> None:
    (tmp_path / "qm1.mqsc").write_text("DEFINE QLOCAL(A)\nDEFINE QLOCAL(B)\n")
    topo = tmp_path / "net.yaml"
    topo.write_text("queue_managers:\n  QM1:\n    mqsc_file: qm1.mqsc\n"
                    "    mqsc: |\n      DEFINE QLOCAL(C)\n      DEFINE QLOCAL(A)\n")
    with pytest.raises(TopologyError) as info:
        load_topology(topo)
    assert str(info.value).startswith(f"{topo}: queue manager QM1: line 2:"), str(info.value)


async def test_a_definition_stored_by_an_earlier_run_is_checked_before_the_start(
    tmp_path: Path,
) -> None:
    first = topology_from_dict(
        {"queue_managers": {"QM1": {"mqsc": "DEFINE QLOCAL(OLD.Q) REPLACE\n"}}}, tmp_path)
    async with Network(first, tmp_path / "data"):
        pass
    second = topology_from_dict(
        {"queue_managers": {"QM1": {"mqsc": "DEFINE QLOCAL(NEW.Q)\nDEFINE QLOCAL(OLD.Q)\n"}}},
        tmp_path, str(tmp_path / "net.yaml"))
    net = Network(second, tmp_path / "data")
    with pytest.raises(TopologyError) as info:
        await net.start()
    assert "queue manager QM1: line 2:" in str(info.value) and "already exists" in str(
        info.value)
    assert not net.nodes
    async with EmbeddedQueueManager("QM1", tmp_path / "data" / "QM1") as qm:
        assert qm.catalogue.get("OLD.Q") is not None
        assert qm.catalogue.get("NEW.Q") is None


async def test_mqsc_file_of_a_queue_manager_is_all_or_nothing(tmp_path: Path) -> None:
    script = tmp_path / "qm.mqsc"
    script.write_text("DEFINE QLOCAL(FIRST.Q)\nDEFINE QREMOTE(R) RNAME(X) MAXDEPTH(3)\n")
    with pytest.raises(MQSCError) as info:
        EmbeddedQueueManager("QMF", tmp_path / "QMF", mqsc_file=script)
    assert info.value.line == 2
    async with EmbeddedQueueManager("QMF", tmp_path / "QMF") as qm:
        assert qm.catalogue.get("FIRST.Q") is None


async def test_the_check_sees_the_messages_of_the_running_queue_manager(tmp_path: Path) -> None:
    async with EmbeddedQueueManager("QMD", tmp_path / "QMD") as qm:
        [created] = qm.run_mqsc("DEFINE QLOCAL(FULL.Q)")
        assert created.ok
        async with await qm.connect() as conn:
            await conn.put1("FULL.Q", MQMD(), b"kept")
        with pytest.raises(MQSCError) as info:
            qm.run_mqsc("DEFINE QLOCAL(BEFORE.Q)\nDELETE QLOCAL(FULL.Q)\n", stop_on_error=True)
        assert info.value.line == 2 and "not empty" in str(info.value)
        assert qm.catalogue.get("BEFORE.Q") is None
        # deleted earlier in the same script, the queue is empty when defined again
        qm.check_mqsc("DELETE QLOCAL(FULL.Q) PURGE\nDEFINE QLOCAL(FULL.Q)\nDELETE QLOCAL(FULL.Q)\n")
        assert qm.queue_depth("FULL.Q") == 1
