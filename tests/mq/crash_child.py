"""Child process for the crash test: puts and gets under syncpoint until it is killed.

Journal lines (each fsynced before the next MQI call):
``PI b1 b2 ..`` before committing a put batch, ``PC ..`` after the commit returned,
``GI ..`` / ``GC ..`` the same for get batches, ``NP ..`` non-persistent puts committed.
Puts and gets outside syncpoint are journalled the same way around the single call.
Usage: crash_child.py DATA_DIR JOURNAL TRIAL SEED
"""

from __future__ import annotations

import asyncio
import os
import random
import sys

from gateway.mq.embedded.qmgr import EmbeddedQueueManager
from gateway.mq.port import Browse, GetOptions, MQError, OpenOption, PutOptions
from gateway.wire.constants import Persistence
from gateway.wire.mqmd import MQMD
from gateway.wire.reasons import Reason

QUEUE = "CRASH.Q"


def journal(fd: int, tag: str, bodies: list[bytes]) -> None:
    os.write(fd, (tag + " " + " ".join(b.decode() for b in bodies) + "\n").encode())
    os.fsync(fd)


async def main(data_dir: str, journal_path: str, trial: int, seed: int) -> None:
    rnd = random.Random(seed)
    qm = EmbeddedQueueManager("CRASHQM", data_dir)
    qm.run_mqsc(f"DEFINE QLOCAL({QUEUE}) MAXDEPTH(100000) REPLACE")
    fd = os.open(journal_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    conn = await qm.connect()
    q = await conn.open(QUEUE, OpenOption.INPUT_SHARED | OpenOption.OUTPUT | OpenOption.BROWSE)
    print("ready", flush=True)
    n = 0
    while True:
        action = rnd.random()
        if action < 0.55:
            batch = []
            for _ in range(rnd.randint(1, 20)):
                n += 1
                body = f"t{trial}-{n}".encode()
                await q.put(MQMD(persistence=Persistence.PERSISTENT, format="MQSTR"), body,
                            PutOptions(syncpoint=True))
                batch.append(body)
            if rnd.random() < 0.15:
                await conn.backout()
                continue
            journal(fd, "PI", batch)
            await conn.commit()
            journal(fd, "PC", batch)
        elif action < 0.6:
            n += 1
            body = f"np{trial}-{n}".encode()
            await q.put(MQMD(persistence=Persistence.NOT_PERSISTENT, format="MQSTR"), body)
            journal(fd, "NP", [body])
        elif action < 0.68:
            # persistent put outside syncpoint: durable when put() returns
            n += 1
            body = f"t{trial}-{n}".encode()
            journal(fd, "PI", [body])
            await q.put(MQMD(persistence=Persistence.PERSISTENT, format="MQSTR"), body)
            journal(fd, "PC", [body])
        elif action < 0.75:
            # get outside syncpoint: browse to learn which message, then take exactly it
            try:
                seen = await q.get(GetOptions(browse=Browse.FIRST))
            except MQError as exc:
                assert exc.reason == Reason.NO_MSG_AVAILABLE
                continue
            journal(fd, "GI", [seen.body])
            got = await q.get(GetOptions(match_msg_id=seen.md.msg_id))
            assert got.body == seen.body
            journal(fd, "GC", [got.body])
        else:
            batch = []
            for _ in range(rnd.randint(1, 15)):
                try:
                    m = await q.get(GetOptions(syncpoint=True))
                except MQError as exc:
                    assert exc.reason == Reason.NO_MSG_AVAILABLE
                    break
                batch.append(m.body)
            if not batch:
                continue
            if rnd.random() < 0.2:
                await conn.backout()
                continue
            journal(fd, "GI", batch)
            await conn.commit()
            journal(fd, "GC", batch)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])))
