"""A connection to the embedded queue manager (hconn): its unit of work, MQCMIT/MQBACK,
MQPUT1, and what the channels and the broker need from one (dead-letter puts, delivery
of transmission-queue messages).

Why apart from :mod:`.qmgr`: the queue manager owns queues, definitions and the store;
a connection owns a unit of work and the handles opened through it (:mod:`.handle`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, Self

from gateway.mq.embedded.authority import is_gateway_put_only
from gateway.mq.embedded.handle import INPUT_OPTIONS, EmbeddedQueueHandle
from gateway.mq.embedded.name_resolution import (
    Resolution,
)
from gateway.mq.embedded.objects import (
    DefBind,
    QType,
    QueueDef,
)
from gateway.mq.embedded.queues import LocalQueue, MDPacker, QueuedMessage, clone_md
from gateway.mq.embedded.reports import arrival_report, queue_reports
from gateway.mq.embedded.store import ChannelSync
from gateway.mq.port import (
    MQError,
    OpenOption,
    PutItem,
    PutOptions,
    close_opened,
    output_options,
    put_each,
)
from gateway.wire.constants import Feedback
from gateway.wire.dlh import wrap_for_dlq
from gateway.wire.errors import WireError
from gateway.wire.mqmd import MQMD
from gateway.wire.reasons import Reason
from gateway.wire.xqh import unwrap_from_xmitq

if TYPE_CHECKING:
    from gateway.mq.embedded.qmgr import EmbeddedQueueManager

log = logging.getLogger(__name__)

#: MQ's MaxUncommittedMsgs default (the syncpoint limit per unit of work).
MAX_UNCOMMITTED_MSGS = 10_000
_MQRO_DISCARD_MSG = 0x8000000


@dataclass(slots=True, frozen=True)
class TransmissionDelivery:
    """Where :meth:`EmbeddedConnection.deliver_transmission` put a message."""

    q_name: str
    q_mgr_name: str
    dead_lettered: bool = False
    discarded: bool = False
    reason: int = 0


#: An exception report due at commit: the message's descriptor, body and feedback.
_Report = tuple[MQMD, bytes, int]


@dataclass(slots=True)
class _UowPut:
    queue: LocalQueue
    msg: QueuedMessage
    arrival: bool = False  # a put to its destination queue: COA at commit


@dataclass(slots=True)
class _UowGet:
    queue: LocalQueue
    msg: QueuedMessage


class EmbeddedConnection:
    """A connection (hconn) with its own unit of work."""

    #: ``put_many`` puts in one in-process pass: a failing put costs no round trip
    #: (``gateway.mq.port.puts_in_one_pass``).
    put_many_in_one_pass = True

    def __init__(self, qm: EmbeddedQueueManager) -> None:
        self._qm = qm
        self._puts: list[_UowPut] = []
        self._gets: list[_UowGet] = []
        self._exceptions: list[_Report] = []  # reports due at commit
        self._handles: set[EmbeddedQueueHandle] = set()
        self._open = True
        #: a persistent put of this unit of work was refused for want of disk space
        #: (2056: the watermark, :mod:`.space`); cleared by commit and backout
        self.space_refused = False

    @property
    def q_mgr_name(self) -> str:
        return self._qm.name

    @property
    def space_low(self) -> bool:
        """The queue manager's disk is at its free-space watermark, or was when it
        refused a put of this unit of work: this queue manager's 2056 is the whole
        disk's, never one queue's (IBM MQ's is one queue's file, at MAXFSIZE). The
        publish/subscribe service holds a batch back for it instead of dead-lettering
        a delivery (read with ``getattr``: other connections have no such attribute)."""
        return self.space_refused or self._qm.space.low

    @property
    def queue_manager(self) -> EmbeddedQueueManager:
        return self._qm

    @property
    def uncommitted(self) -> int:
        return len(self._puts) + len(self._gets)

    def got_from(self, queue: LocalQueue) -> int:
        """Messages this unit of work got from ``queue`` under syncpoint (a full queue's
        MAXDEPTH check leaves them out, as IBM MQ's CURDEPTH does)."""
        return sum(1 for g in self._gets if g.queue is queue)

    def _check(self) -> None:
        if self._qm.stopping:
            raise MQError(Reason.Q_MGR_STOPPING, f"queue manager {self._qm.name} is stopping")
        if not self._open:
            raise MQError(Reason.HCONN_ERROR, "the connection has been disconnected")

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.disconnect()

    async def open(
        self, q_name: str, options: OpenOption, q_mgr_name: str = "",
        *, cluster_lookup: bool = True,
    ) -> EmbeddedQueueHandle:
        """MQOPEN: resolve the name now (MQ binds at open) and check the options.

        A cluster queue opened bind-not-fixed (MQOO_BIND_NOT_FIXED, or BIND_AS_Q_DEF with
        DEFBIND(NOTFIXED)) chooses its instance again at every put.
        """
        self._check()
        qm = self._qm
        options = OpenOption(options)
        inputs = options & INPUT_OPTIONS
        if bin(int(inputs)).count("1") > 1:
            raise MQError(Reason.OPTIONS_ERROR, "choose one of INPUT_AS_Q_DEF/SHARED/EXCLUSIVE")
        wants = options & (
            INPUT_OPTIONS | OpenOption.BROWSE | OpenOption.OUTPUT | OpenOption.INQUIRE
        )
        if not wants:
            raise MQError(
                Reason.OPTIONS_ERROR, "open for at least one of input, browse, output, inquire"
            )
        local_name = not q_mgr_name or q_mgr_name == qm.name
        definition = qm.catalogue.get(q_name) if local_name else None
        resolution: Resolution | None = None
        reads = bool(inputs or options & OpenOption.BROWSE)
        if options & OpenOption.OUTPUT or reads:
            resolution = await qm.resolve_learning(
                q_name, q_mgr_name, bool(options & OpenOption.BIND_ON_OPEN), cluster_lookup
            )
        elif definition is None:
            raise MQError(
                Reason.UNKNOWN_OBJECT_NAME, f"queue {q_name} is not defined on {qm.name}"
            )
        if reads and resolution is not None and not resolution.is_local:
            raise MQError(
                Reason.OPTION_NOT_VALID_FOR_TYPE,
                f"{q_name} resolves to a remote queue ({resolution.q_name}@"
                f"{resolution.q_mgr_name}); it can only be opened for output or inquire",
            )
        target: LocalQueue | None = None
        if resolution is not None:
            target = qm._local_queue(
                resolution.q_name if resolution.is_local else resolution.xmit_q_name
            )
        if inputs and target is not None:
            exclusive = bool(inputs & OpenOption.INPUT_EXCLUSIVE)
            if target.exclusive or (exclusive and target.input_count):
                raise MQError(
                    Reason.OBJECT_IN_USE, f"queue {target.name} is open for exclusive input"
                )
            target.exclusive = exclusive
            target.input_count += 1
        if options & OpenOption.OUTPUT and target is not None:
            target.output_count += 1
        handle = EmbeddedQueueHandle(self, q_name, options, definition, resolution, target)
        if resolution is not None and resolution.via_cluster:
            if options & OpenOption.BIND_ON_OPEN:
                not_fixed = False
            elif options & OpenOption.BIND_NOT_FIXED:
                not_fixed = True
            elif definition is not None and definition.qtype is not QType.LOCAL:
                not_fixed = definition.default_bind is DefBind.NOTFIXED
            else:
                not_fixed = resolution.bind_not_fixed
            handle._not_fixed = not_fixed
            handle._q_mgr_name = q_mgr_name
        self._handles.add(handle)
        return handle

    async def put1(
        self,
        q_name: str,
        md: MQMD,
        body: bytes,
        options: PutOptions | None = None,
        q_mgr_name: str = "",
    ) -> MQMD:
        handle = await self.open(q_name, OpenOption.OUTPUT, q_mgr_name)
        try:
            return await handle.put(md, body, options)
        finally:
            await handle.close()

    async def put_many(
        self, items: Sequence[PutItem], options: PutOptions | None = None
    ) -> list[MQMD | MQError]:
        """``gateway.mq.port.put_many``: one open per queue, then each syncpoint put to a
        local queue takes its descriptor over (no copy) and the store's copy of a run of
        descriptors differing only in MsgId/CorrelId is packed once and patched. Puts
        outside syncpoint, or to remote/cluster destinations, go through the handle's
        put. Results, reasons and the unit of work are those of a put per item; a
        successful result is the queued message's own descriptor, read-only (see the
        port's ``put_many``)."""
        opts = options or PutOptions()
        self._check()
        if not opts.syncpoint:
            return await put_each(self, items, opts)
        qm = self._qm
        open_opts = output_options(opts)
        # per queue: the handle, or why it could not be opened
        handles: dict[tuple[str, str], EmbeddedQueueHandle | MQError] = {}
        # what an owned put needs from its handle (the definitions that apply, whether a
        # COA is due, the target queue's definition), valid until the next await
        ready: dict[
            EmbeddedQueueHandle, tuple[list[QueueDef], bool, QueueDef | None] | None
        ] = {}
        # a descriptor handed over twice is copied (before any put completes it)
        seen: set[int] = set()
        shared: set[int] = set()
        for _, _, md, _ in items:
            (shared if id(md) in seen else seen).add(id(md))
        packer = MDPacker()
        now = time.time()
        out: list[MQMD | MQError] = []
        try:
            for q_name, q_mgr_name, md, body in items:
                key = (q_name, q_mgr_name)
                handle = handles.get(key)
                if handle is None:
                    ready.clear()
                    try:
                        handle = await self.open(q_name, open_opts, q_mgr_name)
                    except MQError as exc:
                        handle = exc
                    handles[key] = handle
                    now = time.time()
                if isinstance(handle, MQError):
                    out.append(handle)
                    continue
                try:
                    if handle not in ready:
                        self._check()
                        target = handle._target
                        ready[handle] = (
                            (handle._defs(), arrival_report(qm, target.name),
                             qm.catalogue.get(target.name))
                            if handle.owns_puts() and target is not None else None
                        )
                    how = ready[handle]
                    if how is None:
                        ready.clear()
                        out.append(await handle.put(md, body, opts))
                        now = time.time()
                        continue
                    if shared and id(md) in shared:
                        md = clone_md(md)
                    handle.put_owned(md, body, opts, now, how[0], how[1], packer, how[2])
                    out.append(md)
                except MQError as exc:
                    out.append(exc)
        finally:
            await close_opened(handles.values())
        return out

    async def commit(self, sync: ChannelSync | None = None) -> None:
        """MQCMIT. Persistent changes are on disk when this returns.

        ``sync`` (channels only): a channel's batch record committed in the same
        transaction as the unit of work, which is what makes channel delivery once-only.
        """
        self._check()
        self.space_refused = False
        if not self._puts and not self._gets and sync is None:
            return
        written = self._write_unit(sync, at_once=False)
        puts, gets, reports = self._take_unit()
        await self._qm._complete(self._finish_commit(puts, gets, written, sync, reports))

    def start_commit(self) -> asyncio.Future[None]:
        """MQCMIT begun (``gateway.mq.port.start_commit``): the unit of work is taken off
        the connection and its changes handed to the writer thread now, so the next
        unit may begin at once; the future ends once they are on disk, or raises as
        :meth:`commit` does (backed out). Cancelling the future does not stop the
        commit."""
        self._check()
        self.space_refused = False
        if not self._puts and not self._gets:
            nothing: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            nothing.set_result(None)
            return nothing
        written = self._write_unit(None, at_once=True)
        puts, gets, reports = self._take_unit()
        return asyncio.shield(self._finish_commit(puts, gets, written, None, reports))

    def _take_unit(self) -> tuple[list[_UowPut], list[_UowGet], list[_Report]]:
        puts, gets = self._puts, self._gets
        self._puts, self._gets = [], []
        reports, self._exceptions = self._exceptions, []
        return puts, gets, reports

    def _write_unit(
        self, sync: ChannelSync | None, *, at_once: bool
    ) -> asyncio.Future[None] | None:
        """Hand the current unit's persistent changes to the writer (``at_once``: see
        ``_apply_started``); None when it has none. Made before the unit is taken off the
        connection, so a failure here leaves the unit in place for the caller's backout."""
        qm = self._qm
        puts, gets = self._puts, self._gets
        # a queue deleted meanwhile takes nothing: its row would outlive the queue and
        # surface in a later queue of the same name after a restart
        inserts = [qm._to_row(p.queue.name, p.msg) for p in puts
                   if p.msg.persistent and p.queue is qm._queues.get(p.queue.name)]
        deletes = [g.msg.seq for g in gets if g.msg.persistent]
        deletes += qm._expired_persistent
        qm._expired_persistent = []
        syncs = [sync] if sync is not None else []
        if inserts or deletes or syncs:
            return qm._apply_started(inserts, deletes, syncs=syncs, at_once=at_once)
        return None

    async def _finish_commit(
        self,
        puts: list[_UowPut],
        gets: list[_UowGet],
        written: asyncio.Future[None] | None,
        sync: ChannelSync | None,
        reports: list[_Report],
    ) -> None:
        qm = self._qm
        if written is not None:
            try:
                await written
            except MQError as exc:
                self._undo(puts, gets)
                raise MQError(Reason.BACKED_OUT, f"commit failed, backed out: {exc}") from exc
        if sync is not None:
            qm._channel_sync[sync.channel] = sync
        for g in gets:
            g.queue.locked -= 1
        for p in puts:
            p.queue.pending_puts -= 1
            if p.queue is qm._queues.get(p.queue.name):
                p.queue.add(p.msg)
                p.queue.notify(p.msg)
        qm.stats.commits += 1
        queue_reports(qm, [(p.msg.md, p.msg.body, Feedback.COA) for p in puts
                           if p.arrival and p.msg.md.report]  # Report 0 asks for none
                      + [(g.msg.md, g.msg.body, Feedback.COD) for g in gets])
        queue_reports(qm, reports)

    async def backout(self) -> None:
        """MQBACK: syncpoint puts vanish; syncpoint gets return with BackoutCount + 1."""
        self._check()
        self.space_refused = False
        if not self._puts and not self._gets:
            return
        puts, gets = self._puts, self._gets
        self._puts, self._gets = [], []
        self._exceptions = []
        await self._qm._complete(self._finish_backout(puts, gets))

    async def _finish_backout(self, puts: list[_UowPut], gets: list[_UowGet]) -> None:
        qm = self._qm
        counts = [(g.msg.seq, g.msg.md.backout_count + 1) for g in gets if g.msg.persistent]
        if counts and not qm.closed:
            try:
                await qm._apply(backouts=counts)
            except MQError as exc:
                # a store write failure says what it is (disk full, I/O error): no traceback
                log.error(
                    "could not harden backout counts (%s); messages are returned anyway", exc
                )
        self._undo(puts, gets, count_backout=True)
        qm.stats.backouts += 1

    def _undo(self, puts: list[_UowPut], gets: list[_UowGet], count_backout: bool = False) -> None:
        for p in puts:
            p.queue.pending_puts -= 1
        for g in gets:
            g.queue.locked -= 1
            if count_backout:
                g.msg.md.backout_count += 1
            if g.queue is self._qm._queues.get(g.queue.name):
                g.queue.add(g.msg)
                g.queue.notify(g.msg)

    async def disconnect(self) -> None:
        """MQDISC: backs out an open unit of work and closes the handles."""
        if not self._open:
            return
        if self._puts or self._gets:
            puts, gets = self._puts, self._gets
            self._puts, self._gets = [], []
            self._exceptions = []
            await self._qm._complete(self._finish_backout(puts, gets))
        for h in list(self._handles):
            await h.close()
        self._open = False
        self._qm._connections.discard(self)

    # ------------------------------------------------------------ channels and DLQ

    async def put_dead_letter(
        self,
        md: MQMD,
        body: bytes,
        reason: int,
        dest_q_name: str,
        dest_q_mgr_name: str = "",
        *,
        syncpoint: bool = False,
    ) -> MQMD:
        """Put a message on this queue manager's dead-letter queue behind an MQDLH.

        What MQ's MCAs and the broker do with a message they cannot deliver (reference
        §6.3); the context of the original message is kept. Fails with 2085 when the
        queue manager has no DEADQ (the caller must then keep the message).
        """
        qm = self._qm
        dlq = qm.catalogue.qmgr.dead_letter_q_name
        if not dlq or qm.catalogue.get(dlq) is None:
            raise MQError(
                Reason.UNKNOWN_OBJECT_NAME,
                f"queue manager {qm.name} has no dead-letter queue (DEADQ {dlq or 'blank'})",
            )
        dl_md, dl_body = wrap_for_dlq(
            md, body, reason, dest_q_name, dest_q_mgr_name or qm.name, qm._context.appl_name,
            qmgr_ccsid=qm.catalogue.qmgr.coded_char_set_id,
        )
        handle = await self.open(dlq, OpenOption.OUTPUT | OpenOption.SET_ALL_CONTEXT)
        try:
            out = await handle.put(dl_md, dl_body, PutOptions(syncpoint=syncpoint,
                                                              set_all_context=True))
        finally:
            await handle.close()
        qm.stats.dead_lettered += 1
        return out

    async def deliver_transmission(
        self, md: MQMD, body: bytes, *, syncpoint: bool = False
    ) -> TransmissionDelivery:
        """Deliver a transmission-queue message arriving here, as a receiving MCA does.

        The MQXQH names are resolved as an application supplying both names would
        (reference §7.3): a local queue receives the message, another queue manager's
        transmission queue forwards it (multi-hop), and a failure (unknown queue 2085,
        no route 2087, queue full 2053, put inhibited 2051, too big 2030, ...) puts it
        on the dead-letter queue with an MQDLH carrying that reason, unless the message
        asks for MQRO_DISCARD_MSG. A sink backlog takes nothing from a channel
        (:mod:`.authority`: 2035).
        """
        try:
            xmit = unwrap_from_xmitq(md, body)
        except WireError as exc:
            await self.put_dead_letter(md, body, exc.reason, "", "", syncpoint=syncpoint)
            return TransmissionDelivery("", "", dead_lettered=True, reason=exc.reason)
        opts = PutOptions(syncpoint=syncpoint, set_all_context=True)
        try:
            handle = await self.open(
                xmit.remote_q_name, OpenOption.OUTPUT | OpenOption.SET_ALL_CONTEXT,
                xmit.remote_q_mgr_name,
                cluster_lookup=xmit.remote_q_mgr_name != self._qm.name,
            )
            try:
                if handle.resolved_q_mgr_name == self._qm.name and is_gateway_put_only(
                    handle.resolved_q_name
                ):
                    raise MQError(
                        Reason.NOT_AUTHORIZED,
                        f"{handle.resolved_q_name} takes no message from a channel",
                    )
                await handle.put(xmit.md, xmit.body, opts)
                return TransmissionDelivery(handle.resolved_q_name, handle.resolved_q_mgr_name)
            finally:
                await handle.close()
        except MQError as exc:
            if exc.reason in (Reason.CONNECTION_BROKEN, Reason.HCONN_ERROR,
                              Reason.Q_MGR_STOPPING, Reason.RESOURCE_PROBLEM):
                raise
            if xmit.md.report & _MQRO_DISCARD_MSG:
                return TransmissionDelivery(xmit.remote_q_name, xmit.remote_q_mgr_name,
                                discarded=True, reason=exc.reason)
            await self.put_dead_letter(
                xmit.md, xmit.body, exc.reason, xmit.remote_q_name, xmit.remote_q_mgr_name,
                syncpoint=syncpoint,
            )
            if syncpoint:  # the dead letter is in the channel's unit of work
                self._exceptions.append((xmit.md, xmit.body, exc.reason))
            else:
                queue_reports(self._qm, [(xmit.md, xmit.body, exc.reason)])
            return TransmissionDelivery(xmit.remote_q_name, xmit.remote_q_mgr_name,
                            dead_lettered=True, reason=exc.reason)

    # ------------------------------------------------------------ used by handles

    def _track_put(self, q: LocalQueue, msg: QueuedMessage, arrival: bool = False) -> None:
        if self.uncommitted >= MAX_UNCOMMITTED_MSGS:
            raise MQError(
                Reason.SYNCPOINT_LIMIT_REACHED,
                f"more than {MAX_UNCOMMITTED_MSGS} messages in one unit of work",
            )
        self._puts.append(_UowPut(q, msg, arrival))

    def _track_get(self, q: LocalQueue, msg: QueuedMessage) -> None:
        self._gets.append(_UowGet(q, msg))
