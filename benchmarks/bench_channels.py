"""Channel throughput between two embedded queue managers in separate processes.

1 KiB persistent messages are preloaded on the sender's transmission queue; the sending
queue manager then runs in a child process (``python -m gateway.mq.embedded.network``)
and moves them over 127.0.0.1 to the receiving queue manager, which runs in this process.
The figure is messages/s from the child's READY line until the last message is
committed on the receiver (channel start included). Every message is committed on the
receiver together with the channel's batch record before the sender removes it
(once-only), so each batch costs one fsync on each side. Bounded to about a minute.
"""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from gateway.mq.embedded.network import Network
from gateway.mq.embedded.qmgr import EmbeddedQueueManager
from gateway.mq.embedded.topology import load_topology
from gateway.mq.port import OpenOption, PutOptions
from gateway.wire.constants import Persistence
from gateway.wire.mqmd import MQMD

REPO = Path(__file__).resolve().parents[1]
MESSAGES = 20000
BODY = os.urandom(1024)
DEADLINE_S = 40.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def topology(path: Path, batch: int) -> None:
    path.write_text(yaml.safe_dump({"data_dir": "data", "queue_managers": {
        "SENDQM": {"port": free_port(), "mqsc":
                   "DEFINE QLOCAL(RECVQM) USAGE(XMITQ) MAXDEPTH(100000) REPLACE\n"
                   "DEFINE QREMOTE(TARGET) RNAME(IN) RQMNAME(RECVQM) XMITQ(RECVQM) REPLACE\n"
                   f"DEFINE CHANNEL(S.TO.R) CHLTYPE(SDR) CONNAME('RECVQM') XMITQ(RECVQM) "
                   f"BATCHSZ({batch}) REPLACE\n"},
        "RECVQM": {"port": free_port(), "mqsc":
                   "DEFINE QLOCAL(IN) MAXDEPTH(100000) REPLACE\n"
                   "DEFINE CHANNEL(S.TO.R) CHLTYPE(RCVR) REPLACE\n"},
    }}))


async def preload(data: Path, script: str) -> None:
    qm = EmbeddedQueueManager("SENDQM", data / "SENDQM")
    try:
        qm.run_mqsc(script)
        async with await qm.connect() as conn:
            q = await conn.open("TARGET", OpenOption.OUTPUT)
            for i in range(MESSAGES):
                await q.put(MQMD(format="MQSTR", persistence=Persistence.PERSISTENT), BODY,
                            PutOptions(syncpoint=True))
                if i % 500 == 499:
                    await conn.commit()
            await conn.commit()
    finally:
        await qm.close()


async def run_case(batch: int, separate: bool) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "topology.yaml"
        topology(path, batch)
        topo = load_topology(path)
        await preload(Path(tmp) / "data", topo.queue_managers["SENDQM"].mqsc)
        net = Network(topo)
        child: subprocess.Popen[bytes] | None = None
        try:
            if separate:
                await net.start(["RECVQM"])
                child = subprocess.Popen(
                    [sys.executable, "-m", "gateway.mq.embedded.network", str(path),
                     "--qm", "SENDQM"], stdout=subprocess.PIPE, cwd=REPO,
                    env=dict(os.environ, PYTHONPATH=str(REPO)))
                assert child.stdout is not None
                line = await asyncio.to_thread(child.stdout.readline)
                assert line.startswith(b"READY"), line
                t0 = time.perf_counter()
            else:
                t0 = time.perf_counter()
                await net.start(["RECVQM", "SENDQM"])
            qm = net["RECVQM"].qm
            while qm.queue_depth("IN") < MESSAGES:
                if time.perf_counter() - t0 > DEADLINE_S:
                    raise RuntimeError(f"only {qm.queue_depth('IN')} of {MESSAGES} arrived")
                await asyncio.sleep(0.005)
            return MESSAGES / (time.perf_counter() - t0)
        finally:
            if child is not None:
                child.terminate()
                child.wait(timeout=15)
            await net.stop()


async def amain() -> None:
    print(f"channel throughput, {MESSAGES} x 1 KiB persistent, SDR -> RCVR over 127.0.0.1")
    for batch in (50, 200):
        rate = await run_case(batch, separate=True)
        print(f"  separate processes, BATCHSZ({batch}): {rate:8.0f} msgs/s")
    rate = await run_case(50, separate=False)
    print(f"  one process (both QMs on one loop), BATCHSZ(50): {rate:8.0f} msgs/s")


def main() -> None:
    asyncio.run(amain())


if __name__ == "__main__":
    main()
