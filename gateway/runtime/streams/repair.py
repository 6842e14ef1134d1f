"""``--fix`` and ``--replay-dlq``: define missing stream queues, say (or write) what the
configuration must add so they are serviced, and put dead-lettered publications back on
their stream queue.

Replay is crash-safe by MQ's units of work: each batch gets the DLQ messages and puts
their unwrapped originals under one syncpoint and commits once, so after a crash at any
point a message is either still on the DLQ or on its stream queue, never both, never
neither.
"""

from __future__ import annotations

import contextlib
import logging
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, Protocol

import yaml

from gateway.mq.port import Connection, GetOptions, MQError, OpenOption, PutOptions, QueueHandle
from gateway.runtime.streams.observe import DeadLettered
from gateway.wire.dlh import unwrap_from_dlq
from gateway.wire.errors import WireError
from gateway.wire.reasons import Reason

log = logging.getLogger(__name__)

__all__ = [
    "REPLAY_BATCH",
    "add_streams_to_config",
    "define_stream_queue",
    "replay_dead_lettered",
    "stream_queue_mqsc",
    "streams_yaml",
]

#: DLQ messages moved per unit of work.
REPLAY_BATCH = 100


class RunsMQSC(Protocol):
    def run_mqsc(self, script: str, *, stop_on_error: bool = False) -> Any: ...


def stream_queue_mqsc(name: str) -> str:
    """The definition of a stream queue, the one the gateway uses at start
    (``define_stream_queues``) and ``--fix`` uses: a local queue, persistent by default."""
    return f"DEFINE QLOCAL('{name}') DEFPSIST(YES)"


def define_stream_queue(qm: RunsMQSC, name: str) -> None:
    """Define stream queue ``name`` on the embedded queue manager ``qm``."""
    qm.run_mqsc(stream_queue_mqsc(name), stop_on_error=True)


def streams_yaml(names: Iterable[str]) -> str:
    """The YAML lines to add under ``broker:`` so the broker services ``names``."""
    lines = ["broker:", "  streams:"]
    lines += [f"    - name: {n}" for n in sorted(names)]
    return "\n".join(lines)


def add_streams_to_config(path: Path, names: Iterable[str]) -> None:
    """Add ``names`` to ``broker.streams`` in the YAML file ``path`` (``--write-config``).

    The file is rewritten from its data (comments are not kept); the original is kept as
    ``<name>.bak``. The write is atomic.
    """
    text = path.read_text(encoding="utf-8")
    data = yaml.safe_load(text) or {}
    broker = data.setdefault("broker", {}) or {}
    data["broker"] = broker
    streams = broker.setdefault("streams", []) or []
    broker["streams"] = streams
    have = {s.get("name") if isinstance(s, dict) else s for s in streams}
    streams += [{"name": n} for n in sorted(names) if n not in have]
    path.with_name(path.name + ".bak").write_text(text, encoding="utf-8")
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    tmp.replace(path)


async def replay_dead_lettered(
    conn: Connection,
    dlq: str,
    items: Sequence[DeadLettered],
    *,
    batch: int = REPLAY_BATCH,
    on_batch: Callable[[int], None] | None = None,
) -> tuple[Counter[str], MQError | None]:
    """Move ``items`` from ``dlq`` back to their stream queue: the MQDLH stripped, the
    MQMD's Format/Encoding/CodedCharSetId restored from it, context kept. Streams whose
    queue cannot be opened are left on the DLQ. Returns the count moved per stream (in
    committed batches) and the MQ error that stopped it, if any (its batch backed out).
    ``on_batch(moved so far)`` is called after each committed batch (progress)."""
    moved: Counter[str] = Counter()
    src = await conn.open(dlq, OpenOption.INPUT_SHARED)
    outs: dict[str, QueueHandle | None] = {}
    try:
        for start in range(0, len(items), batch):
            done: Counter[str] = Counter()
            for item in items[start : start + batch]:
                out = outs.get(item.stream, ...)
                if out is ...:
                    try:
                        out = await conn.open(
                            item.stream, OpenOption.OUTPUT | OpenOption.SET_ALL_CONTEXT
                        )
                    except MQError:
                        out = None
                    outs[item.stream] = out
                if out is None:
                    continue
                try:
                    msg = await src.get(GetOptions(syncpoint=True, match_msg_id=item.msg_id))
                except MQError as exc:
                    if exc.reason == Reason.NO_MSG_AVAILABLE:
                        continue  # taken meanwhile by someone else
                    raise
                try:
                    dlh, md, body = unwrap_from_dlq(msg.md, msg.body)
                except WireError:
                    dlh = None
                if (
                    dlh is None
                    or dlh.reason != Reason.UNKNOWN_OBJECT_NAME
                    or dlh.dest_q_name.strip() != item.stream
                ):
                    # another message with the same MsgId: leave the DLQ as it was
                    await conn.backout()
                    done.clear()
                    break
                await out.put(md, body, PutOptions(syncpoint=True, set_all_context=True))
                done[item.stream] += 1
            await conn.commit()
            moved.update(done)
            log.info("replay: committed a batch of %d (%d so far)", done.total(), moved.total())
            if on_batch is not None:
                on_batch(moved.total())
    except MQError as exc:
        with contextlib.suppress(MQError):
            await conn.backout()
        return moved, exc
    except BaseException:
        with contextlib.suppress(MQError):
            await conn.backout()
        raise
    finally:
        for h in [src, *(h for h in outs.values() if h is not None)]:
            with contextlib.suppress(MQError):
                await h.close()
    return moved, None
