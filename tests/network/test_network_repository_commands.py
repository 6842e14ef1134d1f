"""The repository manager never lets one bad command block SYSTEM.CLUSTER.COMMAND.QUEUE,
and changes the repository only when a command's unit of work commits."""

from __future__ import annotations

import json
from typing import Any

import pytest

from gateway.mq.embedded import cluster as cluster_mod
from gateway.mq.embedded.connection import EmbeddedConnection
from gateway.mq.embedded.repository import Repository, RepositoryRecord
from gateway.mq.embedded.repository_commands import RepositoryCommandError, decode_command
from gateway.mq.embedded.repository_queue import save_repository
from gateway.mq.port import MQError
from gateway.wire.constants import Feedback
from gateway.wire.dlh import unwrap_from_dlq
from gateway.wire.mqmd import MQMD
from gateway.wire.reasons import Reason
from tests.network.network_helpers import NetworkFactory, drain, wait_for

FULL = ("ALTER QMGR REPOS(C1)\n"
        "DEFINE CHANNEL(TO.QM1) CHLTYPE(CLUSRCVR) CONNAME('QM1') CLUSTER(C1) REPLACE\n")
CMDQ = "SYSTEM.CLUSTER.COMMAND.QUEUE"
DLQ = "SYSTEM.DEAD.LETTER.QUEUE"


def record(name: str, seq: int = 1) -> dict[str, Any]:
    return {"kind": "QUEUE", "cluster": "C1", "name": name, "q_mgr": "QMX", "seq": seq,
            "qtype": "QLOCAL"}


def update(*records: dict[str, Any]) -> bytes:
    return json.dumps({"op": "update", "from": "QMX", "records": list(records)}).encode()


@pytest.mark.parametrize("body", [
    b"[1]", b"not json", b"\xff\xfe", b'"text"', b"{}", b'{"op":"drop"}',
    b'{"op":"query","from":"X"}', b'{"op":"query","cluster":"C1","names":[1]}',
    b'{"op":"update","records":{}}', b'{"op":"update","records":[1]}',
    b'{"op":"update","records":[{"kind":"QUEUE","cluster":"C1","name":"Q"}]}',
    b'{"op":"update","records":[{"kind":"QUEUE","cluster":"C1","name":"Q","q_mgr":"X",'
    b'"seq":"7"}]}',
])
def test_malformed_commands_are_rejected(body: bytes) -> None:
    with pytest.raises(RepositoryCommandError) as err:
        decode_command(body)
    assert err.value.feedback == Feedback.NOT_A_REPOSITORY_MSG


def test_well_formed_commands_parse() -> None:
    assert decode_command(update(record("Q")))["records"][0]["name"] == "Q"
    assert decode_command(b'{"op":"query","cluster":"C1","names":["Q"],"from":"X"}')["op"] \
        == "query"


async def test_unparsable_command_is_dead_lettered_and_the_next_runs(
    make_network: NetworkFactory,
) -> None:
    async with make_network({"QM1": FULL}) as net:
        qm = net["QM1"].qm
        manager = net["QM1"].cluster
        async with await qm.connect() as conn:
            await conn.put1(CMDQ, MQMD(format="MQSTR"), b"[1]")
            await conn.put1(CMDQ, MQMD(format="MQSTR"), update(record("AFTER.BAD")))
        await wait_for(lambda: qm.queue_depth(CMDQ) == 0 and any(
            r.name == "AFTER.BAD" for r in manager.repository.records.values()))
        dead = await drain(qm, DLQ)
        assert len(dead) == 1
        dlh, _, body = unwrap_from_dlq(dead[0].md, dead[0].body)
        assert body == b"[1]" and dlh.reason == Feedback.NOT_A_REPOSITORY_MSG
        assert dlh.dest_q_name == CMDQ


async def test_command_that_keeps_failing_is_dead_lettered_past_threshold(
    make_network: NetworkFactory,
) -> None:
    attempts: list[int] = []

    async def failing(conn: EmbeddedConnection, repository: Repository) -> None:
        if any(r.name == "POISON" for r in repository.records.values()):
            attempts.append(1)
            raise RuntimeError("cannot handle this one")
        await save_repository(conn, repository)

    async with make_network({"QM1": FULL}) as net:
        qm = net["QM1"].qm
        manager = net["QM1"].cluster
        manager.store_repository = failing
        async with await qm.connect() as conn:
            await conn.put1(CMDQ, MQMD(format="MQSTR"), update(record("POISON")))
            await conn.put1(CMDQ, MQMD(format="MQSTR"), update(record("AFTER.POISON")))
        await wait_for(lambda: qm.queue_depth(CMDQ) == 0 and any(
            r.name == "AFTER.POISON" for r in manager.repository.records.values()))
        dead = await drain(qm, DLQ)
        assert len(dead) == 1
        dlh, _, body = unwrap_from_dlq(dead[0].md, dead[0].body)
        assert dlh.reason == Feedback.NOT_A_REPOSITORY_MSG and b"POISON" in body
        assert len(attempts) == cluster_mod.COMMAND_BACKOUT_THRESHOLD
        assert all(r.name != "POISON" for r in manager.repository.records.values())


async def test_failed_commit_leaves_the_repository_unchanged(
    make_network: NetworkFactory,
) -> None:
    """An update whose unit of work backs out must be applied (and forwarded) again on
    redelivery, not counted as a duplicate of its own backed-out attempt."""
    failures = [1]

    async def save_once_failing(conn: EmbeddedConnection, repository: Repository) -> None:
        if failures and any(r.name == "NEWQ" for r in repository.records.values()):
            failures.pop()
            raise MQError(Reason.RESOURCE_PROBLEM, "disk full (test)")
        await save_repository(conn, repository)

    async with make_network({"QM1": FULL}) as net:
        qm = net["QM1"].qm
        manager = net["QM1"].cluster
        await wait_for(lambda: any(r.q_mgr == "QM1" for r in manager.repository.records.values()))
        manager.store_repository = save_once_failing
        stats = manager.repository.stats
        applied, duplicates = stats.applied, stats.duplicates
        async with await qm.connect() as conn:
            await conn.put1(CMDQ, MQMD(format="MQSTR"), update(record("NEWQ")))
        await wait_for(lambda: qm.queue_depth(CMDQ) == 0 and not failures
                       and any(r.name == "NEWQ" for r in manager.repository.records.values()))
        assert stats.applied - applied == 2  # the failed attempt and the committed one
        assert stats.duplicates == duplicates  # the redelivery is no duplicate of itself
        assert await drain(qm, DLQ) == []


def test_restore_undoes_only_its_own_side() -> None:
    """The command loop (others' records) and the publisher (own records) run
    concurrently: each undo must leave the other's changes alone."""

    def rec(name: str, q_mgr: str, seq: int) -> RepositoryRecord:
        return RepositoryRecord("QUEUE", "C1", name, q_mgr, seq)

    repo = Repository()
    repo.apply(rec("OLD", "QMX", 1))
    saved = repo.copy()
    repo.apply(rec("FOREIGN", "QMX", 2))      # a command's change, to be undone
    repo.apply(rec("OLD", "QMX", 5))
    repo.subscribe(["FOREIGN"], "QMY")
    repo.apply(rec("MINE", "QM1", repo.next_seq()))  # the publisher's, concurrent
    repo.restore(saved, "QM1", own=False)
    assert {(r.name, r.seq) for r in repo.records.values()} == {("OLD", 1), ("MINE", 1)}
    assert repo.subscribers == {}
    repo.restore(saved, "QM1", own=True)
    assert {(r.name, r.seq) for r in repo.records.values()} == {("OLD", 1)}
