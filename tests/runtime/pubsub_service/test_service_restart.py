"""Subscriptions and retained publications survive a SIGKILL of the broker process."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from gateway.mq.embedded.qmgr import EmbeddedQueueManager
from gateway.pubsub.engine import PubSubEngine
from gateway.pubsub.sqlite_store import SqliteStore
from gateway.pubsub.topics import Scheme
from gateway.runtime.pubsub_service import BrokerConfig, BrokerService, StreamQueueConfig
from tests.support.pubsub_messages import CONTROL, DEFAULT, rfh_message
from tests.support.service_client import drain, put, settle

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent


async def test_subscriptions_and_retained_survive_sigkill(tmp_path: Path) -> None:
    qm_dir, store_file = tmp_path / "qm", tmp_path / "pubsub.db"
    env = dict(os.environ, PYTHONPATH=str(REPO))
    child = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.runtime.pubsub_service.sigkill_child",
            str(qm_dir),
            str(store_file),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
    )
    try:
        assert child.stdout is not None
        line = child.stdout.readline()
        assert line.strip() == b"ready", (line, child.stderr.read() if child.stderr else b"")
        assert child.poll() is None
        child.send_signal(signal.SIGKILL)
        assert child.wait(10) == -signal.SIGKILL
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(10)
        for stream in (child.stdout, child.stderr):
            if stream:
                stream.close()

    qm = EmbeddedQueueManager("QM1", qm_dir)
    store = SqliteStore(store_file)
    engine = PubSubEngine("QM1", store)
    subs = sorted((s.stream, s.topic, s.scheme, s.destination.queue) for s in engine.subscriptions)
    assert subs == [
        (DEFAULT, "k/*", Scheme.CHAR, "SUB.Q"),
        ("StreamX", "#", Scheme.TOPIC, "SUB2.Q"),
    ]
    assert [(r.topic, r.publication.payload) for r in engine.retained("StreamX")] == [
        ("k/1", b"retained-1")
    ]
    service = BrokerService(
        qm, engine, BrokerConfig(streams=[StreamQueueConfig(name="StreamX")], wait_ms=50)
    )
    await service.start()
    try:
        # the surviving subscription still receives new publications
        await put(
            qm,
            rfh_message(
                DEFAULT, [("MQPSCommand", "Publish"), ("MQPSTopic", "k/2")], b"after-restart"
            ),
        )
        # a new subscriber on StreamX still gets the surviving retained publication
        await put(
            qm,
            rfh_message(
                CONTROL,
                [
                    ("MQPSCommand", "RegSub"),
                    ("MQPSTopic", "k/*"),
                    ("MQPSStreamName", "StreamX"),
                    ("MQPSQName", "SUB.SAME"),
                ],
            ),
        )
        await settle(qm, service)
        assert [m.payload for m in await drain(qm, "SUB.Q")] == [b"after-restart"]
        [retained] = await drain(qm, "SUB.SAME")
        assert retained.payload == b"retained-1" and retained.topic == "k/1"
        # the retained publication delivered before the kill was committed exactly once
        assert [m.payload for m in await drain(qm, "SUB2.Q")] == [b"retained-1"]
    finally:
        await service.stop()
        await qm.close()
        store.close()
