"""The pure parts of ``mqgw streams check``: the union, the report's judgement and the
migration's fixed stream set."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

from gateway.pubsub.streams import DEFAULT_STREAM
from gateway.runtime.streams.check import QueueState, StreamReport, build_report
from gateway.runtime.streams.health import stream_metric_families
from gateway.runtime.streams.migration import MigrationRecord, stream_set_changes
from gateway.runtime.streams.union import neighbour_streams, stream_union

B, S, T = "BULLETIN.STREAM", "SPORTS.STREAM", "STOCK.STREAM"


def test_neighbour_streams_read_from_config_when_present() -> None:
    loaded = SimpleNamespace(
        gateway=SimpleNamespace(
            neighbours=[
                SimpleNamespace(q_mgr="BROKERA", streams=[T, B]),
                SimpleNamespace(q_mgr="BROKERB", streams=None),
            ]
        )
    )
    got = neighbour_streams(loaded)
    assert got == {"BROKERA": {DEFAULT_STREAM, T, B}, "BROKERB": {DEFAULT_STREAM}}
    assert neighbour_streams(SimpleNamespace(gateway=SimpleNamespace())) == {}
    assert stream_union({T}, got, [S]) == {DEFAULT_STREAM, T, B, S}


def _report(**kw: Any) -> StreamReport:
    wanted = {DEFAULT_STREAM: ("gateway",), B: ("neighbour BROKERB",), T: ("gateway",)}
    queues = {
        DEFAULT_STREAM: QueueState(True),
        T: QueueState(True, 0),
        B: QueueState(True, 3, oldest_put=100.0),
    }
    args: dict[str, Any] = {
        "serviced": {DEFAULT_STREAM, T},
        "queues": queues,
        "dead_lettered": {},
    }
    args.update(kw)
    return build_report(
        wanted,
        args["serviced"],
        args["queues"],
        args["dead_lettered"],
        now=160.0,
        dead_letter_queue="SYSTEM.DEAD.LETTER.QUEUE",
        migrated_from=kw.get("migrated_from"),
        migrated=kw.get("migrated", frozenset()),
    )


def test_unserviced_queue_reports_depth_and_age() -> None:
    r = _report()
    assert not r.ok
    (b,) = [f for f in r.streams if f.stream == B]
    assert (b.serviced, b.depth, b.oldest_age_s, b.unserviced_depth) == (False, 3, 60.0, 3)
    assert r.problems == [
        f"{B}: stream queue {B} is not serviced: add it to broker.streams (3 message(s) waiting)"
    ]
    text = r.text()
    assert "NO" in text and "1 problem(s):" in text


def test_missing_queue_and_dead_letters_are_problems_all_well_otherwise() -> None:
    r = _report(
        serviced={DEFAULT_STREAM, T, B},
        queues={DEFAULT_STREAM: QueueState(True), T: QueueState(True)},
        dead_lettered={B: 4},
    )
    (b,) = [f for f in r.streams if f.stream == B]
    assert not b.queue_exists and b.dead_lettered == 4
    assert len(b.problems) == 2 and "missing" in b.problems[0] and "4 publication" in b.problems[1]
    ok = _report(serviced={DEFAULT_STREAM, T, B})
    assert ok.ok and ok.problems == [] and "all well" in ok.text()


def test_migration_incomplete_until_every_migrated_stream_serviced() -> None:
    r = _report(serviced={DEFAULT_STREAM, T, B}, migrated_from="OLDQM", migrated=frozenset({S, T}))
    assert r.migration_pending == (S,)
    assert r.problems[-1].startswith("migration incomplete (from OLDQM)")
    assert r.to_json()["migration"] == {"from": "OLDQM", "complete": False, "pending": [S]}
    assert StreamReport.from_json(json.loads(json.dumps(r.to_json()))) == r


def test_metric_families_carry_the_same_facts() -> None:
    r = _report(
        queues={DEFAULT_STREAM: QueueState(True), B: QueueState(True, 3)},
        dead_lettered={T: 2},
    )
    fams = {f.name: f for f in stream_metric_families(r)}

    def value(name: str, stream: str) -> float:
        return next(s.value for s in fams[name].samples if s.labels.get("stream") == stream)

    assert value("mqgw_stream_queue_missing", T) == 1.0
    assert value("mqgw_stream_queue_missing", B) == 0.0
    assert value("mqgw_stream_unserviced_depth", B) == 3.0
    assert value("mqgw_stream_dead_lettered", T) == 2.0
    assert [s.value for s in fams["mqgw_migration_incomplete"].samples] == [0.0]
    assert all(not f.samples for f in stream_metric_families(None))


def test_stream_set_fixed_after_migration() -> None:
    rec = MigrationRecord(from_q_mgr="OLDQM", streams=[B, T])
    assert stream_set_changes(rec, [T]) == ([], [])  # incomplete: not yet all serviced
    assert stream_set_changes(rec, [T, B, S]) == ([S], [])
    done = rec.model_copy(update={"complete": True})
    assert stream_set_changes(done, [T]) == ([], [B])
    assert stream_set_changes(done, [B, T, DEFAULT_STREAM]) == ([], [])
