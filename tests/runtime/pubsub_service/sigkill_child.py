"""Child process of the restart test: runs BrokerService on an embedded queue manager,
registers subscriptions and a retained publication through real command messages,
prints ``ready`` once the broker committed them, then keeps serving until SIGKILLed.

Usage: sigkill_child.py QM_DIR STORE_FILE
"""

from __future__ import annotations

import asyncio
import sys

from gateway.mq.embedded.qmgr import EmbeddedQueueManager
from gateway.pubsub.engine import PubSubEngine
from gateway.pubsub.sqlite_store import SqliteStore
from gateway.runtime.pubsub_service import BrokerConfig, BrokerService, StreamQueueConfig
from tests.runtime.pubsub_service.conftest import QUEUES
from tests.support.pubsub_messages import CONTROL, rfh2_message, rfh_message
from tests.support.service_client import drain, put, settle


async def main(qm_dir: str, store_file: str) -> None:
    qm = EmbeddedQueueManager("QM1", qm_dir)
    qm.run_mqsc(QUEUES, stop_on_error=True)
    config = BrokerConfig(streams=[StreamQueueConfig(name="StreamX")], wait_ms=50)
    service = BrokerService(qm, PubSubEngine(qm.name, SqliteStore(store_file)), config)
    await service.start()
    await put(
        qm,
        rfh_message(
            CONTROL,
            [("MQPSCommand", "RegSub"), ("MQPSTopic", "k/*"), ("MQPSQName", "SUB.Q")],
            reply_to_q="REPLY.Q",
            msg_type=1,
        ),
    )
    await put(
        qm,
        rfh2_message(
            CONTROL,
            [("Command", "RegSub"), ("Topic", "$SYS/STREAM/StreamX/#"), ("QName", "SUB2.Q")],
            reply_to_q="REPLY.Q",
            msg_type=1,
        ),
    )
    await put(
        qm,
        rfh_message(
            "StreamX",
            [("MQPSCommand", "Publish"), ("MQPSTopic", "k/1"), ("MQPSPubOpts", "RetainPub")],
            b"retained-1",
            persistence=1,
        ),
    )
    await settle(qm, service)
    replies = await drain(qm, "REPLY.Q")
    assert [r.get("MQPSReason") or r.get("pscr/Completion") for r in replies] == ["0", "ok"]
    print("ready", flush=True)
    while True:  # keep serving until killed
        await asyncio.sleep(3600)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2]))
