"""lastvalue over real Kafka and local Spark: latest per topic, tombstones delete."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from analytics.job import JobOptions
from analytics.jobs import lastvalue
from analytics.runner import run_job
from analytics.source import KafkaInput
from tests.analytics.bridged import Publication, hour_start_ms, produce, unique


def test_last_value_honours_tombstones(
    kafka_broker: Any, spark_session: Any, tmp_path: Path
) -> None:
    t0 = hour_start_ms()
    s1 = unique("RETAIN.A/")  # '/' is escaped in the Kafka topic name
    s2 = unique("RETAIN.B")
    k1 = "mqgw-retained." + s1.replace("/", "_2F")
    k2 = "mqgw-retained." + s2
    pubs1 = [
        Publication(s1, "IBM/Latest", b"ibm 1", t0 + 1, retain=True),
        Publication(s1, "HPQ/Latest", b"hpq 1", t0 + 2, retain=True),
        Publication(s1, "IBM/Latest", b"ibm 2", t0 + 3, retain=True),
        Publication(s1, "SUN/Latest", b"sun 1", t0 + 4, retain=True),
        Publication(s1, "HPQ/Latest", None, t0 + 5),  # retained delete
        Publication(s1, "SUN/Latest", None, t0 + 6),
        Publication(s1, "SUN/Latest", b"sun 2", t0 + 7, retain=True),  # republished
        # a tombstone written without contract headers (e.g. by a compaction tool):
        # the stream comes from the topic name, the topic from the key
        Publication(s1, "DEC/Latest", b"dec 1", t0 + 8, retain=True),
        Publication(s1, "DEC/Latest", None, t0 + 9, drop=("mq.contract", "mq.stream",
                                                          "mq.topic", "mq.origin")),
    ]
    # Stream B ends up empty: its partition directory must disappear with its last row.
    pubs2 = [
        Publication(s2, "X", b"x 1", t0 + 1, retain=True),
        Publication(s2, "X", None, t0 + 2),
    ]
    produce(kafka_broker.bootstrap, k1, pubs1)
    produce(kafka_broker.bootstrap, k2, pubs2)

    source = KafkaInput(kafka_broker.bootstrap, topics=(k1, k2), fail_on_data_loss=False,
                        max_offsets_per_trigger=3)
    options = JobOptions(source=source, out=str(tmp_path / "out"))
    result = run_job(spark_session, "lastvalue", lastvalue.build, options,
                     checkpoint=str(tmp_path / "ckpt"), once=True)
    assert result.stats["lastvalue"].rows == len(pubs1) + len(pubs2)
    assert result.stats["lastvalue"].batches >= 3

    table = lastvalue.LASTVALUE_SCHEMA
    rows = spark_session.read.schema(table).parquet(str(tmp_path / "out" / "lastvalue"))
    got = {(r.stream, r.topic): r for r in rows.collect()}
    assert {k: r.value_text for k, r in got.items()} == {
        (s1, "IBM/Latest"): "ibm 2",
        (s1, "SUN/Latest"): "sun 2",
    }
    ibm = got[(s1, "IBM/Latest")]
    assert ibm.value == b"ibm 2"
    assert ibm.msg_id_hex == pubs1[2].msg_id.hex().upper()
    assert (ibm.kafka_topic, ibm.offset, ibm.format, ibm.ccsid) == (k1, 2, "MQSTR", 1208)
    assert ibm.retain is True

    # A later run that deletes IBM and republishes HPQ continues from the checkpoint.
    produce(kafka_broker.bootstrap, k1, [
        Publication(s1, "IBM/Latest", None, t0 + 10),
        Publication(s1, "HPQ/Latest", b"hpq 2", t0 + 11, retain=True),
    ])
    run_job(spark_session, "lastvalue", lastvalue.build, options,
            checkpoint=str(tmp_path / "ckpt"), once=True)
    rows = spark_session.read.schema(table).parquet(str(tmp_path / "out" / "lastvalue"))
    assert sorted((r.stream, r.topic, r.value_text) for r in rows.collect()) == [
        (s1, "HPQ/Latest", "hpq 2"),
        (s1, "SUN/Latest", "sun 2"),
    ]
    dirs = sorted(p.name for p in (tmp_path / "out" / "lastvalue").iterdir()
                  if p.name.startswith("stream="))
    assert dirs == ["stream=" + s1.replace("/", "%2F")]
