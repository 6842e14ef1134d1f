"""Model-based test: random MQI operation sequences on two connections, including
graceful restarts, compared step by step with a small reference model of MQ semantics
(priority-then-FIFO, syncpoint visibility, backout counts, persistence across restart)."""

from __future__ import annotations

import asyncio
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.mq.embedded.connection import EmbeddedConnection
from gateway.mq.embedded.qmgr import EmbeddedQueueManager
from gateway.mq.port import GetOptions, MQError, OpenOption, PutOptions
from gateway.wire.constants import Persistence
from gateway.wire.mqmd import MQMD
from gateway.wire.reasons import Reason


@dataclass
class M:
    body: bytes
    priority: int
    seq: int
    persistent: bool
    backout_count: int = 0


@dataclass
class Model:
    available: list[M] = field(default_factory=list)
    pending: dict[int, list[M]] = field(default_factory=lambda: {0: [], 1: []})
    locked: dict[int, list[M]] = field(default_factory=lambda: {0: [], 1: []})

    def next_get(self) -> M | None:
        if not self.available:
            return None
        return min(self.available, key=lambda m: (-m.priority, m.seq))

    def backout(self, c: int) -> None:
        self.pending[c] = []
        for m in self.locked[c]:
            m.backout_count += 1
            self.available.append(m)
        self.locked[c] = []

    def commit(self, c: int) -> None:
        self.available.extend(self.pending[c])
        self.pending[c] = []
        self.locked[c] = []

    def restart(self) -> None:
        for c in (0, 1):
            self.backout(c)
        self.available = [m for m in self.available if m.persistent]

    @property
    def depth(self) -> int:
        return len(self.available) + sum(len(v) for v in self.pending.values()) + sum(
            len(v) for v in self.locked.values()
        )


conn = st.integers(0, 1)
op = st.one_of(
    st.tuples(st.just("put"), conn, st.integers(0, 3), st.booleans(), st.booleans()),
    st.tuples(st.just("get"), conn, st.booleans()),
    st.tuples(st.just("get"), conn, st.just(True)),
    st.tuples(st.just("commit"), conn),
    st.tuples(st.just("backout"), conn),
    st.tuples(st.just("backout"), conn),
    st.tuples(st.just("restart")),
)


async def scenario(path: Path, ops: list[tuple[object, ...]]) -> None:
    model = Model()
    seq = 0
    qm = EmbeddedQueueManager("MODEL", path)
    qm.run_mqsc("DEFINE QLOCAL(MQ) REPLACE")

    async def open_conns(qm: EmbeddedQueueManager) -> list[tuple[EmbeddedConnection, object]]:
        out = []
        for _ in range(2):
            c = await qm.connect()
            out.append((c, await c.open("MQ", OpenOption.INPUT_SHARED | OpenOption.OUTPUT)))
        return out

    conns = await open_conns(qm)
    try:
        for o in ops:
            kind = o[0]
            if kind == "put":
                _, c, prio, pers, sync = o
                seq += 1
                body = f"m{seq}".encode()
                md = MQMD(priority=prio, persistence=Persistence.PERSISTENT if pers
                          else Persistence.NOT_PERSISTENT)
                await conns[c][1].put(md, body, PutOptions(syncpoint=sync))  # type: ignore[attr-defined]
                m = M(body, prio, seq, bool(pers))
                (model.pending[c] if sync else model.available).append(m)
            elif kind == "get":
                _, c, sync = o
                expected = model.next_get()
                try:
                    got = await conns[c][1].get(GetOptions(syncpoint=sync))  # type: ignore[attr-defined]
                except MQError as exc:
                    assert exc.reason == Reason.NO_MSG_AVAILABLE
                    assert expected is None, f"expected {expected}"
                    continue
                assert expected is not None, f"got {got.body!r} from an empty model"
                assert (got.body, got.md.backout_count) == (expected.body, expected.backout_count)
                model.available.remove(expected)
                if sync:
                    model.locked[c].append(expected)
            elif kind == "commit":
                await conns[o[1]][0].commit()  # type: ignore[index]
                model.commit(o[1])  # type: ignore[arg-type]
            elif kind == "backout":
                await conns[o[1]][0].backout()  # type: ignore[index]
                model.backout(o[1])  # type: ignore[arg-type]
            else:
                await qm.close()
                model.restart()
                qm = EmbeddedQueueManager("MODEL", path)
                conns = await open_conns(qm)
            assert qm.queue_depth("MQ") == model.depth
    finally:
        await qm.close()


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(op, min_size=4, max_size=50))
def test_matches_reference_model(ops: list[tuple[object, ...]]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        asyncio.run(scenario(Path(tmp) / "qm", ops))


def test_msg_ids_differ_for_names_sharing_twelve_characters() -> None:
    """``GATEWAY.EUROPE.1`` and ``GATEWAY.EUROPE.2`` (same first 12 characters) started
    in the same microsecond must still not produce the same MsgIds."""
    from unittest import mock

    from gateway.mq.embedded.context import MsgIdGenerator

    with mock.patch("gateway.mq.embedded.context.time.time_ns", return_value=1_700_000_000_000):
        a = MsgIdGenerator("GATEWAY.EUROPE.1")
        b = MsgIdGenerator("GATEWAY.EUROPE.2")
        a2 = MsgIdGenerator("GATEWAY.EUROPE.1")  # a second instance of the same name
    ids_a = {a() for _ in range(100)}
    ids_b = {b() for _ in range(100)}
    ids_a2 = {a2() for _ in range(100)}
    assert len(ids_a) == len(ids_b) == 100
    assert not ids_a & ids_b and not ids_a & ids_a2
    assert all(len(i) == 24 and i.startswith(b"AMQ GATE") for i in ids_a | ids_b)
