"""The seed's stream table through BrokerService on the embedded queue manager: commands
and publications are real messages on the serviced queues, deliveries are read from
the subscriber queues. One case per cell and publisher variant (16)."""

from __future__ import annotations

import pytest

from gateway.mq.embedded.qmgr import EmbeddedQueueManager
from gateway.runtime.pubsub_service import BrokerService
from gateway.wire.formats import FMT_RF_HEADER, FMT_RF_HEADER_2
from tests.support.pubsub_messages import DEFAULT
from tests.support.seed_table import CELLS, IDS, PREFIXED, STREAMX, TOPIC, publication, subscription
from tests.support.service_client import drain, put, settle


@pytest.mark.parametrize(("sub_fmt", "pub_fmt", "stream", "variant"), CELLS, ids=IDS)
async def test_seed_table_cell_on_embedded_qm(
    qm: EmbeddedQueueManager,
    service: BrokerService,
    sub_fmt: str,
    pub_fmt: str,
    stream: str,
    variant: str,
) -> None:
    other = STREAMX if stream == DEFAULT else DEFAULT
    await put(qm, subscription(sub_fmt, stream, "SUB.SAME"))
    await put(qm, subscription(sub_fmt, other, "SUB.OTHER"))
    await settle(qm, service)
    replies = await drain(qm, "REPLY.Q")
    assert len(replies) == 2
    assert all(
        r.get("MQPSReason" if sub_fmt == "RFH" else "pscr/Completion") in ("0", "ok")
        for r in replies
    )

    await put(qm, publication(pub_fmt, stream, variant))
    await settle(qm, service)

    assert await drain(qm, "SUB.OTHER") == []
    assert await drain(qm, "SYSTEM.DEAD.LETTER.QUEUE") == []
    [got] = await drain(qm, "SUB.SAME")
    assert got.payload == b"payload"
    if sub_fmt == "RFH":
        assert got.fmt == FMT_RF_HEADER
        assert got.topic == TOPIC
        assert got.get("MQPSStreamName") == (STREAMX if stream == STREAMX else None)
    else:
        assert got.fmt == FMT_RF_HEADER_2
        assert got.topic == (PREFIXED if stream == STREAMX else TOPIC)
