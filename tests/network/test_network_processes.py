"""A cluster whose queue managers live in different processes (127.0.0.1 only)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import yaml

from gateway.devstack.ports import free_port
from gateway.mq.embedded.network import Network
from gateway.mq.embedded.qmgr import EmbeddedQueueManager
from gateway.mq.embedded.topology import load_topology
from gateway.mq.port import GetOptions, OpenOption
from gateway.wire.constants import Persistence
from gateway.wire.mqmd import MQMD
from tests.network.network_helpers import wait_for

REPO = Path(__file__).resolve().parents[2]


async def test_cluster_across_processes(tmp_path: Path) -> None:
    path = tmp_path / "net.yaml"
    path.write_text(yaml.safe_dump({"data_dir": "data", "queue_managers": {
        "CLUSQM": {"port": free_port(), "mqsc":
                   "ALTER QMGR REPOS(C1)\n"
                   "DEFINE CHANNEL(TO.CLUSQM) CHLTYPE(CLUSRCVR) CONNAME('CLUSQM') CLUSTER(C1) "
                   "REPLACE\nDEFINE QLOCAL(Q) REPLACE\n"},
        "A": {"port": free_port(), "mqsc":
              "DEFINE CHANNEL(TO.A) CHLTYPE(CLUSRCVR) CONNAME('A') CLUSTER(C1) REPLACE\n"
              "DEFINE CHANNEL(TO.CLUSQM) CHLTYPE(CLUSSDR) CONNAME('CLUSQM') CLUSTER(C1) "
              "REPLACE\nDEFINE QREMOTE(YORK) RNAME(' ') RQMNAME(CLUSQM) REPLACE\n"},
    }}))
    topo = load_topology(path)
    child = subprocess.Popen(
        [sys.executable, "-m", "gateway.mq.embedded.network", str(path), "--qm", "CLUSQM"],
        stdout=subprocess.PIPE, cwd=REPO, env=dict(os.environ, PYTHONPATH=str(REPO)))
    try:
        assert child.stdout is not None
        assert child.stdout.readline().startswith(b"READY CLUSQM 127.0.0.1 ")
        net = Network(topo)
        await net.start(["A"])
        try:
            a = net["A"]
            await wait_for(lambda: a.cluster.xmit_q_for_q_mgr("CLUSQM") is not None)
            async with await a.qm.connect() as conn:
                for i in range(20):
                    await conn.put1("Q", MQMD(format="MQSTR",
                                              persistence=Persistence.PERSISTENT),
                                    f"x{i}".encode(), q_mgr_name="YORK")
            await wait_for(lambda: a.qm.queue_depth("SYSTEM.CLUSTER.TRANSMIT.QUEUE") == 0)
            # the full repository (other process) learned A from A's own advertisement
            await wait_for(lambda: any(
                r.name == "CLUSQM" and r.full for r in a.cluster.repository.live()))
        finally:
            await net.stop()
    finally:
        child.send_signal(signal.SIGTERM)
        assert child.wait(timeout=15) == 0
    qm = EmbeddedQueueManager("CLUSQM", tmp_path / "data" / "CLUSQM")
    try:
        async with await qm.connect() as conn:
            q = await conn.open("Q", OpenOption.INPUT_SHARED)
            got = [(await q.get(GetOptions())).body for _ in range(20)]
        assert got == [f"x{i}".encode() for i in range(20)]
        assert qm.queue_depth("Q") == 0
        rows = qm.run_mqsc("DISPLAY CLUSQMGR(A)")
        assert rows[0].ok and "CONNAME(A)" in " ".join(rows[0].lines)
    finally:
        await qm.close()
