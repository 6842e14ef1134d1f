"""The put phase of a batch, and everything that sets a message aside.

A message is set aside in four cases: its BackoutCount reached BOTHRESH (moved as is to
its BOQNAME, or to the dead-letter queue behind an MQDLH), the engine refused it, a
delivery cannot be put (unknown queue, queue full, put inhibited), or its sink is not
loaded in this process. :func:`dead_letter` builds the MQDLH-wrapped put for all of them
and :func:`put_all` puts a batch's messages, replacing a failed delivery by its
dead-letter put. Moves and dead-letters are only counted once their unit of work has
committed (the service does that with what :func:`put_all` returns).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from gateway.mq.port import (
    Connection,
    MQError,
    OpenOption,
    PutOptions,
    QueueAttr,
    QueueHandle,
    close_opened,
    put_many,
    puts_in_one_pass,
)
from gateway.runtime.pubsub_service.errors import (
    CONNECTION_REASONS,
    AsideQueueError,
    BacklogFullError,
)
from gateway.wire.dlh import wrap_for_dlq
from gateway.wire.mqmd import MQMD
from gateway.wire.reasons import Reason

__all__ = ["DeliveryReport", "Put", "dead_letter", "dead_letter_queue_of", "put_all"]


class DeliveryReport(Protocol):
    """Told how delivery puts went (the engine suspends subscriptions whose queue keeps
    failing). ``delivered`` only ends a queue's run of failures, so :func:`put_all`
    tells it once per queue between failures, not once per message (a fan-out puts
    thousands to the same few queues); ``delivery_failed`` is told of every failure."""

    def delivered(self, q_mgr: str, queue: str) -> None: ...

    def delivery_failed(self, q_mgr: str, queue: str, reason: int) -> None: ...


@dataclass(slots=True)
class Put:
    """One message a batch puts under its unit of work."""

    q_mgr: str
    queue: str
    md: MQMD
    body: bytes
    #: what to dead-letter if this put fails (None: a failure backs the batch out)
    dead_letter_on_failure: bool = True
    #: what this put is, counted and logged only once the unit of work is committed:
    #: "" (a delivery/response), "dead_letter" or "backout_queue"
    kind: str = ""
    #: the queue the moved/dead-lettered message came from (for the log)
    source: str = ""
    backout_count: int = 0
    #: a put to a sink's backlog queue: when the queue is full, BacklogFullError
    backpressure: bool = False


def dead_letter(
    md: MQMD,
    body: bytes,
    reason: int,
    *,
    dlq: str,
    dest_queue: str,
    dest_q_mgr: str,
    q_mgr: str,
    kind: str = "dead_letter",
    source: str = "",
) -> Put:
    """The put of ``md``/``body`` to ``dlq`` behind an MQDLH with ``reason``, naming the
    destination it could not reach (``dest_queue`` at ``dest_q_mgr``)."""
    dl_md, dl_body = wrap_for_dlq(md, body, reason, dest_queue[:48], dest_q_mgr, q_mgr[:28])
    return Put("", dlq, dl_md, dl_body, False, kind, source or dest_queue, md.backout_count)


async def dead_letter_queue_of(handle: QueueHandle, fallback: str) -> tuple[str, str]:
    """The DLQ and where its name came from (logged at start).

    The embedded queue manager answers DEADQ on a queue handle; IBM MQ keeps DEADQ on the
    queue-manager object, so there the ``dead_letter_queue`` setting must name it
    (docs/operations.md).
    """
    try:
        attrs = await handle.inquire(QueueAttr.DEAD_LETTER_Q_NAME)
        name = str(attrs.get(QueueAttr.DEAD_LETTER_Q_NAME, "")).strip()
        if name:
            return name, "queue manager's DEADQ"
    except MQError:
        pass
    return fallback, "broker setting dead_letter_queue"


def _holds_back(p: Put, reason: int, conn: Connection) -> bool:
    """A failed put that is back-pressure, not the message's fault, so the batch waits:
    a sink-backlog put whose queue is full (2053) or has no space (2056: on IBM MQ its
    queue file reached MAXFSIZE), or any delivery or response while the queue manager's
    disk is at its free-space watermark (2056 on a connection whose ``space_low`` says
    so: the embedded queue manager's). A subscriber queue's own 2056 (IBM MQ: that
    queue's file is full) is not: it is dead-lettered and counts toward suspending the
    subscription, like any failed delivery, so one full queue never stalls its stream."""
    if reason == Reason.Q_SPACE_NOT_AVAILABLE:
        return p.backpressure or (not p.kind and getattr(conn, "space_low", False) is True)
    return p.backpressure and reason == Reason.Q_FULL


def _plain(p: Put) -> bool:
    """A delivery, response or sink-backlog put: dead-lettered when it fails (a backlog
    put that finds its queue full is back-pressure instead: BacklogFullError)."""
    return not p.kind and p.dead_letter_on_failure


def _plain_delivery(p: Put) -> bool:
    """:func:`_plain`, but not a sink-backlog put: what joins a ``put_many`` run on a
    connection whose puts are round trips (review 18d, F2: a full backlog ends the batch
    at its first Q_FULL, so the later puts of a run would be wasted MQPUTs, made again on
    every back-pressure retry)."""
    return not p.kind and p.dead_letter_on_failure and not p.backpressure


async def put_all(
    conn: Connection, puts: list[Put], dlq: str, report: DeliveryReport | None = None
) -> list[Put]:
    """Put everything under syncpoint; returns the moves/dead-letters made (to count
    after the commit). A failed put to the DLQ/backout queue raises AsideQueueError.
    ``report`` hears, per destination queue, of the first delivery put that worked since
    that queue last failed, and of every failed delivery (dead-lettered). One call per
    delivery would tell the engine the same: a run of successes ends a failure run once."""
    done: list[Put] = []
    # per queue: its handle, or why a delivery's open failed (kept, as put_each does)
    handles: dict[tuple[str, str], QueueHandle | MQError] = {}
    opts = PutOptions(syncpoint=True, set_all_context=True)
    q_mgr = conn.q_mgr_name
    told: set[tuple[str, str]] = set()  # told delivered since their last failure

    def delivered(target: tuple[str, str]) -> None:
        if report is not None and target not in told:
            told.add(target)
            report.delivered(*target)

    async def set_aside(p: Put, exc: MQError) -> None:
        # Undeliverable to this destination: the DLQ keeps it on its behalf.
        dl = dead_letter(
            p.md,
            p.body,
            exc.reason,
            dlq=dlq,
            dest_queue=p.queue,
            dest_q_mgr=p.q_mgr or q_mgr,
            q_mgr=q_mgr,
            source=f"undeliverable {p.queue}@{p.q_mgr or q_mgr} ({exc.reason})",
        )
        try:
            await conn.put1(dlq, dl.md, dl.body, opts)
        except MQError as dl_exc:
            if dl_exc.reason in CONNECTION_REASONS:
                raise
            raise AsideQueueError(dlq, dl_exc) from dl_exc
        done.append(dl)
        if report is not None:
            told.discard((p.q_mgr or q_mgr, p.queue))
            report.delivery_failed(p.q_mgr or q_mgr, p.queue, exc.reason)

    in_run = _plain if puts_in_one_pass(conn) else _plain_delivery
    i, n = 0, len(puts)
    try:
        while i < n:
            p = puts[i]
            if in_run(p):
                # A run of deliveries (one publication's fan-out, or several, and, on
                # the embedded queue manager, the batch's sink-backlog puts): one
                # put_many; each failed delivery is dead-lettered as a single put would
                # be, in order. A backlog put that found its queue full raises
                # BacklogFullError where the single put did: the later puts of the run
                # were made (in process, at no cost) but the batch backs out.
                j = i + 1
                while j < n and in_run(puts[j]):
                    j += 1
                run = puts[i:j]
                i = j
                results = await put_many(
                    conn,
                    [(r.queue, "" if r.q_mgr == q_mgr else r.q_mgr, r.md, r.body) for r in run],
                    opts,
                )
                for r, result in zip(run, results, strict=True):
                    if isinstance(result, MQError):
                        if result.reason in CONNECTION_REASONS:
                            raise result
                        if _holds_back(r, result.reason, conn):
                            raise BacklogFullError(r.queue, result) from result
                        await set_aside(r, result)
                    else:
                        delivered((r.q_mgr or q_mgr, r.queue))
                continue
            i += 1
            key = (p.q_mgr, p.queue)
            try:
                handle = handles.get(key)
                if handle is None:
                    try:
                        handle = await conn.open(
                            p.queue,
                            OpenOption.OUTPUT | OpenOption.SET_ALL_CONTEXT,
                            "" if p.q_mgr == q_mgr else p.q_mgr,
                        )
                    except MQError as exc:
                        if _plain(p) and exc.reason not in CONNECTION_REASONS:
                            handles[key] = exc  # the batch's other puts there fail alike
                        raise
                    handles[key] = handle
                elif isinstance(handle, MQError):
                    raise handle
                await handle.put(p.md, p.body, opts)
                if p.kind:
                    done.append(p)
                else:
                    delivered((p.q_mgr or q_mgr, p.queue))
            except MQError as exc:
                if exc.reason in CONNECTION_REASONS:
                    raise
                if _holds_back(p, exc.reason, conn):
                    # a sink-backlog put on a connection whose puts are round trips, or
                    # any delivery while the queue manager's disk is at its watermark
                    # (_holds_back)
                    raise BacklogFullError(p.queue, exc) from exc
                if p.kind or not p.dead_letter_on_failure:
                    if p.kind:
                        raise AsideQueueError(p.queue, exc) from exc
                    raise
                await set_aside(p, exc)
    finally:
        await close_opened(handles.values())
    return done
