"""The seed's stream table (seeds/streams.en.txt), one test per cell and publisher variant.

Rows: MQRFH / MQRFH2 subscriber (notes S1-S4). Columns: MQRFH / MQRFH2 publisher on
the default stream or StreamX (notes P1-P4). Each publisher note allows two ways to
publish (explicit stream name vs. Implicit Stream Naming; default-stream queue vs. some
other queue), so each of the 8 cells runs with both: 16 cases. Every case also checks
that a subscriber of the *other* stream receives nothing (streams partition topics).
The same table runs through the broker service in tests/pubsub_service.
"""

from __future__ import annotations

import pytest

from gateway.pubsub.engine import PubSubEngine
from gateway.pubsub.store import MemoryStore
from gateway.wire.formats import FMT_RF_HEADER, FMT_RF_HEADER_2
from tests.support.pubsub_messages import DEFAULT, decode
from tests.support.seed_table import CELLS, IDS, PREFIXED, STREAMX, TOPIC, publication, subscription


@pytest.mark.parametrize(("sub_fmt", "pub_fmt", "stream", "variant"), CELLS, ids=IDS)
def test_seed_table_cell(sub_fmt: str, pub_fmt: str, stream: str, variant: str) -> None:
    engine = PubSubEngine("QM1", MemoryStore())
    other = STREAMX if stream == DEFAULT else DEFAULT
    for s, q in ((stream, "SUB.SAME"), (other, "SUB.OTHER")):
        reg = engine.handle(subscription(sub_fmt, s, q))
        assert (reg.comp_code, reg.reason) == (0, 0)

    outcome = engine.handle(publication(pub_fmt, stream, variant))

    assert outcome.dead_letter is None
    assert [d.destination.queue for d in outcome.deliveries] == ["SUB.SAME"]
    got = decode(outcome.deliveries[0].md, outcome.deliveries[0].body)
    assert got.payload == b"payload"
    if sub_fmt == "RFH":
        assert got.fmt == FMT_RF_HEADER
        assert got.get("MQPSCommand") == "Publish"
        # the $SYS/STREAM prefix is removed for MQRFH subscribers ...
        assert got.topic == TOPIC
        # ... who learn the stream from MQPSStreamName instead
        assert got.get("MQPSStreamName") == (STREAMX if stream == STREAMX else None)
    else:
        assert got.fmt == FMT_RF_HEADER_2
        assert got.get("psc/Command") == "Publish"
        assert got.topic == (PREFIXED if stream == STREAMX else TOPIC)
