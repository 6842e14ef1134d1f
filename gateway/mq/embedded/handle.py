"""An open queue of the embedded queue manager (hobj): MQGET, MQPUT, MQINQ, MQCLOSE.

Why apart from :mod:`.connection`: what one get or put checks and does (GET/PUT inhibit,
priority and persistence defaults, MAXDEPTH/MAXMSGL, transmission headers for remote
queues, browse cursors, waiting) is the largest single part of MQ's queue semantics.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import operator
import time
from typing import TYPE_CHECKING

from gateway.mq.embedded.cluster_transmit import cluster_correl_id, cluster_lane
from gateway.mq.embedded.name_resolution import (
    Resolution,
    resolve_reply_to,
)
from gateway.mq.embedded.objects import (
    CLUSTER_TRANSMIT_QUEUE,
    ObjectCatalogue,
    QType,
    QueueDef,
)
from gateway.mq.embedded.queues import (
    LocalQueue,
    MDPacker,
    QueuedMessage,
    Waiter,
    clone_md,
    pack_md_for_store,
)
from gateway.mq.embedded.reports import arrival_report, queue_reports
from gateway.mq.port import (
    WAIT_UNLIMITED,
    Browse,
    GetOptions,
    Message,
    MQError,
    OpenOption,
    PutOptions,
    QueueAttr,
)
from gateway.wire.constants import MI_NONE, CompCode, Feedback, MsgType, Persistence
from gateway.wire.errors import WireError
from gateway.wire.mqmd import MQMD
from gateway.wire.reasons import Reason
from gateway.wire.xqh import wrap_for_xmitq

if TYPE_CHECKING:
    from collections.abc import Callable

    from gateway.mq.embedded.connection import EmbeddedConnection

log = logging.getLogger(__name__)

#: The open options that open a queue for input (MQOO_INPUT_*).
INPUT_OPTIONS = OpenOption.INPUT_AS_Q_DEF | OpenOption.INPUT_SHARED | OpenOption.INPUT_EXCLUSIVE
#: the same as int masks, tested per get (enum flag operations cost ~2 us each)
_INPUT_BITS = int(INPUT_OPTIONS)
_BROWSE_BIT = int(OpenOption.BROWSE)
_MQQA_GET_INHIBITED, _MQQA_GET_ALLOWED = 1, 0
_MQQA_PUT_INHIBITED, _MQQA_PUT_ALLOWED = 1, 0
#: The MQMD fields an owned put (see ``EmbeddedQueueHandle.put_owned``) completes in
#: place; restored if the put fails after completing them.
_COMPLETED = (
    "persistence", "priority", "msg_id", "correl_id", "reply_to_q", "reply_to_q_mgr",
    "user_identifier", "accounting_token", "appl_identity_data", "put_appl_type",
    "put_appl_name", "put_date", "put_time", "appl_origin_data", "backout_count",
)
_completed_of = operator.attrgetter(*_COMPLETED)
# Enum members as module globals for put_owned (a lookup on the enum class costs about
# half a microsecond; a fan-out makes thousands of owned puts per unit of work).
_PERSISTENT = Persistence.PERSISTENT
_NOT_PERSISTENT = Persistence.NOT_PERSISTENT
_PERSISTENCE_AS_Q_DEF = Persistence.PERSISTENCE_AS_Q_DEF
_REQUEST = MsgType.REQUEST


class EmbeddedQueueHandle:
    """An open queue (hobj)."""

    def __init__(
        self,
        conn: EmbeddedConnection,
        name: str,
        options: OpenOption,
        definition: QueueDef | None,
        resolution: Resolution | None,
        target: LocalQueue | None,
    ) -> None:
        self._conn = conn
        self._name = name
        self._options = options
        self._definition = definition
        self._resolution = resolution
        self._target = target
        self._browse_cursor: tuple[int, int] | None = None
        self._open = True
        self._not_fixed = False
        self._q_mgr_name = ""
        self._option_bits = int(options)

    @property
    def name(self) -> str:
        return self._name

    @property
    def options(self) -> OpenOption:
        return self._options

    @property
    def resolved_q_name(self) -> str:
        if self._resolution is None:
            return self._name
        return self._resolution.q_name

    @property
    def resolved_q_mgr_name(self) -> str:
        if self._resolution is None:
            return self._conn.q_mgr_name
        return self._resolution.q_mgr_name

    @property
    def resolution(self) -> Resolution | None:
        return self._resolution

    def _check(self) -> None:
        self._conn._check()
        if not self._open:
            raise MQError(Reason.HOBJ_ERROR, f"queue handle for {self._name} is closed")

    def _defs(self) -> list[QueueDef]:
        """The definitions whose GET/PUT/DEFPSIST/DEFPRTY apply: opened object, then target."""
        cat = self._conn.queue_manager.catalogue
        out: list[QueueDef] = []
        opened = cat.get(self._name) if self._definition is not None else None
        if opened is not None:
            out.append(opened)
        if self._target is not None:
            base = cat.get(self._target.name)
            if base is not None and (opened is None or base.name != opened.name):
                out.append(base)
        return out

    # ------------------------------------------------------------------ get

    async def get(self, options: GetOptions | None = None) -> Message:
        """MQGET (see :class:`GetOptions`)."""
        opts = options or GetOptions()
        self._check()
        qm = self._conn.queue_manager
        if opts.browse is not None:
            if not self._option_bits & _BROWSE_BIT:
                raise MQError(Reason.NOT_OPEN_FOR_BROWSE, f"{self._name} is not open for browse")
            if opts.syncpoint:
                raise MQError(Reason.OPTIONS_ERROR, "browse cannot be under syncpoint")
        elif not self._option_bits & _INPUT_BITS:
            raise MQError(Reason.NOT_OPEN_FOR_INPUT, f"{self._name} is not open for input")
        if opts.wait_ms < WAIT_UNLIMITED:
            raise MQError(Reason.GMO_ERROR, f"wait interval {opts.wait_ms} is not valid")
        deadline = (
            None if opts.wait_ms == WAIT_UNLIMITED else time.monotonic() + opts.wait_ms / 1000
        )
        loop = asyncio.get_running_loop()
        while True:
            self._check()
            q = self._target
            if q is None or qm._queues.get(q.name) is not q:
                raise MQError(Reason.Q_DELETED, f"queue {self._name} has been deleted")
            for d in self._defs():
                if not d.get_enabled:
                    raise MQError(Reason.GET_INHIBITED, f"gets are inhibited on {d.name}")
            now = time.time()
            after = None
            if opts.browse is Browse.NEXT:
                after = self._browse_cursor
            msg = q.first(now, qm._on_expired, opts.match_msg_id, opts.match_correl_id, after)
            if msg is not None:
                return await self._take(q, msg, opts, now)
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                if qm._expired_persistent and not self._conn._puts and not self._conn._gets:
                    await qm._complete(qm._flush_expired())
                raise MQError(Reason.NO_MSG_AVAILABLE, f"no message available on {self._name}")
            fut: asyncio.Future[None] = loop.create_future()
            waiter = Waiter(fut, opts.match_msg_id, opts.match_correl_id, opts.browse is not None)
            q.waiters.append(waiter)
            woken = False
            try:
                async with asyncio.timeout(remaining):
                    await fut
                woken = True
            except TimeoutError:
                pass
            finally:
                if not woken:
                    if fut.done() and not fut.cancelled():
                        # woken for a message but leaving (timeout/cancel): pass it on
                        q.wake()
                    else:
                        fut.cancel()
                        if waiter in q.waiters:
                            q.waiters.remove(waiter)

    async def get_batch(
        self, options: GetOptions | None = None, max_msgs: int = 1
    ) -> list[Message]:
        """Up to ``max_msgs`` messages: the first as ``options`` say (it may wait; MQError
        2033 when none came), the rest only if already there, stopping at the first get
        that finds none or fails (what was got is returned: under syncpoint it is in the
        unit of work, outside it is the caller's). The same as the local-socket client's
        ``get_batch`` (``qm_server``) without its wire byte budget; each message is got
        exactly as by :meth:`get` with ``wait_ms=0``, the checks made once for the batch
        (nothing else runs on the loop between the gets of a syncpoint batch)."""
        opts = options or GetOptions()
        if opts.browse is not None:
            raise MQError(Reason.GMO_ERROR, "get_batch does not browse")
        out = [await self.get(opts)]
        if max_msgs <= 1:
            return out
        if not opts.syncpoint:
            more = opts if opts.wait_ms == 0 else dataclasses.replace(opts, wait_ms=0)
            while len(out) < max_msgs:
                try:
                    out.append(await self.get(more))
                except MQError:
                    break
            return out
        # under syncpoint a get never suspends: one check of the handle, queue and
        # GET(ENABLED), then the same take as get's
        try:
            self._check()
        except MQError:
            return out
        qm = self._conn.queue_manager
        q = self._target
        if q is None or qm._queues.get(q.name) is not q:
            return out
        for d in self._defs():
            if not d.get_enabled:
                return out
        now = time.time()
        first, on_expired = q.first, qm._on_expired
        match_msg_id, match_correl_id = opts.match_msg_id, opts.match_correl_id
        while len(out) < max_msgs:
            msg = first(now, on_expired, match_msg_id, match_correl_id, None)
            if msg is None:
                break
            try:
                out.append(self._take_under_syncpoint(q, msg, opts, now))
            except MQError:
                break
        return out

    def syncpoint_taker(self, options: GetOptions) -> Callable[[], Message] | None:
        """The gets after the first of a batch the caller grows one message at a time
        (the broker service, which decides after each message whether to get another):
        a function that gets the next message exactly as :meth:`get` with ``options``
        (under syncpoint, no wait, not browse) would, MQError 2033 when none is there.
        The queue lookups are done once, here; every call still checks that the handle
        and connection are open, the queue is the one opened and GET is enabled, so a
        taker kept across an await (handle closed, connection gone, queue redefined or
        GET(DISABLED) meanwhile) raises the reason :meth:`get` would, never takes a
        message into a unit of work nothing will end. None when ``options`` are not such
        a get or a check fails now: the caller then uses :meth:`get`, which raises it."""
        if options.browse is not None or not options.syncpoint or options.wait_ms != 0:
            return None
        try:
            self._check()
        except MQError:
            return None
        if not self._option_bits & _INPUT_BITS:
            return None
        qm = self._conn.queue_manager
        q = self._target
        if q is None or qm._queues.get(q.name) is not q:
            return None
        for d in self._defs():
            if not d.get_enabled:
                return None
        first, on_expired = q.first, qm._on_expired
        match_msg_id, match_correl_id = options.match_msg_id, options.match_correl_id
        take_under_syncpoint, name = self._take_under_syncpoint, self._name
        check, defs, queues = self._check, self._defs, qm._queues

        def take() -> Message:
            check()
            if queues.get(q.name) is not q:
                raise MQError(Reason.Q_DELETED, f"queue {name} has been deleted")
            for d in defs():
                if not d.get_enabled:
                    raise MQError(Reason.GET_INHIBITED, f"gets are inhibited on {d.name}")
            now = time.time()
            msg = first(now, on_expired, match_msg_id, match_correl_id, None)
            if msg is None:
                raise MQError(Reason.NO_MSG_AVAILABLE, f"no message available on {name}")
            return take_under_syncpoint(q, msg, options, now)

        return take

    @staticmethod
    def _copy_out(msg: QueuedMessage, opts: GetOptions, now: float) -> tuple[MQMD, bytes]:
        """What a get hands back: the descriptor copied (Expiry counted down to now) and
        the body, truncated to the buffer when ``accept_truncated`` allows (2080 if not)."""
        body = msg.body
        if opts.max_length is not None and len(body) > opts.max_length:
            if not opts.accept_truncated:
                raise MQError(
                    Reason.TRUNCATED_MSG_FAILED,
                    f"message is {len(body)} bytes, buffer {opts.max_length}",
                    CompCode.WARNING,
                )
            body = body[: opts.max_length]
        md = clone_md(msg.md)
        if msg.expiry_at is not None:
            md.expiry = max(1, int((msg.expiry_at - now) * 10))
        return md, body

    def _take_under_syncpoint(
        self, q: LocalQueue, msg: QueuedMessage, opts: GetOptions, now: float
    ) -> Message:
        """:meth:`_take` of a get under syncpoint (not browse): nothing awaited."""
        md, body = self._copy_out(msg, opts, now)
        q.remove(msg)
        self._conn.queue_manager.stats.gets += 1
        q.locked += 1
        self._conn._track_get(q, msg)
        return Message(md, body)

    async def _take(
        self, q: LocalQueue, msg: QueuedMessage, opts: GetOptions, now: float
    ) -> Message:
        if opts.syncpoint and opts.browse is None:
            return self._take_under_syncpoint(q, msg, opts, now)
        qm = self._conn.queue_manager
        md, body = self._copy_out(msg, opts, now)
        if opts.browse is not None:
            self._browse_cursor = msg.key
            return Message(md, body)
        q.remove(msg)
        qm.stats.gets += 1
        queue_reports(qm, [(msg.md, msg.body, Feedback.COD)])
        if msg.persistent:
            # an internal unit of work: the message stays locked until its delete is on
            # disk; a caller cancelled meanwhile never receives it, so it is put back
            q.locked += 1
            delete = asyncio.ensure_future(qm._apply(deletes=[msg.seq]))
            try:
                await asyncio.shield(delete)
            except asyncio.CancelledError:
                qm._background(qm._give_back(q, msg, delete))
                raise
            except MQError:
                q.locked -= 1
                if q is qm._queues.get(q.name):
                    q.add(msg)
                    q.notify(msg)
                raise
            q.locked -= 1
        return Message(md, body)

    # ------------------------------------------------------------------ put

    async def put(self, md: MQMD, body: bytes, options: PutOptions | None = None) -> MQMD:
        """MQPUT: returns the descriptor as completed by the queue manager."""
        opts = options or PutOptions()
        self._check()
        if not self._options & OpenOption.OUTPUT:
            raise MQError(Reason.NOT_OPEN_FOR_OUTPUT, f"{self._name} is not open for output")
        qm = self._conn.queue_manager
        res = self._resolution
        q = self._target
        if res is None or q is None or qm._queues.get(q.name) is not q:
            raise MQError(Reason.Q_DELETED, f"queue {self._name} has been deleted")
        if self._not_fixed:
            res = qm.resolve(self._name, self._q_mgr_name, False)
            if res.is_local or res.xmit_q_name != q.name:
                raise MQError(
                    Reason.CLUSTER_RESOLUTION_ERROR,
                    f"{self._name} no longer resolves through {q.name}; reopen it",
                )
        defs = self._defs()
        for d in defs:
            if not d.put_enabled:
                raise MQError(Reason.PUT_INHIBITED, f"puts are inhibited on {d.name}")
        out = clone_md(md)
        now = time.time()
        first = defs[0] if defs else None
        if out.persistence == Persistence.PERSISTENCE_AS_Q_DEF:
            out.persistence = Persistence.PERSISTENT if first and first.default_persistent \
                else Persistence.NOT_PERSISTENT
        elif out.persistence not in (Persistence.PERSISTENT, Persistence.NOT_PERSISTENT):
            raise MQError(Reason.PERSISTENCE_ERROR, f"Persistence {out.persistence} is not valid")
        if out.priority == -1:
            out.priority = first.default_priority if first else 0
        elif out.priority < 0:
            raise MQError(Reason.PRIORITY_ERROR, f"Priority {out.priority} is not valid")
        if out.expiry == 0 or out.expiry < -1:
            raise MQError(Reason.EXPIRY_ERROR, f"Expiry {out.expiry} is not valid")
        if out.msg_type == MsgType.REQUEST and not out.reply_to_q:
            raise MQError(Reason.MISSING_REPLY_TO_Q, "a request message needs a ReplyToQ")
        if opts.new_msg_id or out.msg_id == MI_NONE:
            out.msg_id = qm._msg_ids()
        if opts.new_correl_id:
            out.correl_id = qm._msg_ids()
        out.reply_to_q, out.reply_to_q_mgr = resolve_reply_to(
            qm.catalogue, out.reply_to_q, out.reply_to_q_mgr
        )
        qm._context.fill(out, now, set_all=opts.set_all_context,
                         set_identity=opts.set_identity_context)
        if len(body) > qm.catalogue.qmgr.max_msg_length:
            raise MQError(
                Reason.MSG_TOO_BIG_FOR_Q_MGR,
                f"message of {len(body)} bytes exceeds the queue manager's MAXMSGL "
                f"{qm.catalogue.qmgr.max_msg_length}",
            )
        if out.persistence == Persistence.PERSISTENT and qm.space.low:
            qm.refuse_for_space(q.name, self._conn)
        stored_md, stored_body = out, body
        if not res.is_local:
            # bind-not-fixed: the header leaves the queue manager blank so the receiving
            # member may choose again (a bridge forwards, Fig. 2-48)
            header_q_mgr = "" if self._not_fixed and res.via_cluster else res.q_mgr_name
            try:
                stored_md, stored_body = wrap_for_xmitq(
                    out, body, res.q_name, header_q_mgr,
                    qmgr_ccsid=qm.catalogue.qmgr.coded_char_set_id, msg_id=qm._msg_ids(),
                )
            except WireError as exc:
                raise MQError(exc.reason, f"cannot build the transmission header: {exc}") from exc
            if res.xmit_q_name == CLUSTER_TRANSMIT_QUEUE:
                hop = res.hop or res.q_mgr_name
                lane = cluster_lane(res.q_name)
                stored_md.correl_id = cluster_correl_id(hop, lane)
                waiting = getattr(qm.remote_directory, "message_waiting", None)
                if waiting is not None:
                    waiting(hop, lane)
        else:
            stored_md = clone_md(out)
        _check_room(qm.catalogue, q, len(stored_body), self._conn)
        priority = min(max(stored_md.priority, 0), 9)
        expiry_at = now + out.expiry / 10 if out.expiry > 0 else None
        persistent = stored_md.persistence == Persistence.PERSISTENT
        stored_md.backout_count = 0
        msg = QueuedMessage(qm._next_seq(), stored_md, bytes(stored_body), priority,
                            persistent, now, expiry_at)
        if persistent:
            # pack now so a descriptor the store cannot hold fails this put (2026), not commit
            msg.packed_md = pack_md_for_store(stored_md)
        qm.stats.puts += 1
        arrival = res.is_local and arrival_report(qm, q.name)
        if opts.syncpoint:
            self._conn._track_put(q, msg, arrival)
            q.pending_puts += 1
            return out
        if arrival:
            queue_reports(qm, [(out, body, Feedback.COA)])
        if persistent:
            # shielded as one step: once the row is on disk the message is also in
            # memory, even if the caller is cancelled meanwhile
            q.pending_puts += 1
            await qm._complete(qm._store_put(q, msg))
        else:
            q.add(msg)
            q.notify(msg)
        return out

    def owns_puts(self) -> bool:
        """Whether :meth:`put_owned` may be used: open for output, a local queue, not
        bound anew at each put (a remote or cluster destination goes through put)."""
        self._check()
        res = self._resolution
        q = self._target
        qm = self._conn.queue_manager
        return (bool(self._options & OpenOption.OUTPUT) and res is not None and res.is_local
                and not self._not_fixed and q is not None and qm._queues.get(q.name) is q)

    def put_owned(
        self,
        md: MQMD,
        body: bytes,
        opts: PutOptions,
        now: float,
        defs: list[QueueDef],
        arrival: bool,
        packer: MDPacker,
        target_def: QueueDef | None = None,
    ) -> None:
        """A syncpoint put to a local queue (:meth:`owns_puts`) that takes ``md`` over:
        it is completed in place and queued as is, not copied (the caller must not use
        it again). Same checks, reasons and outcome as :meth:`put`; a put that fails
        leaves ``md`` as it was. ``defs``/``arrival`` and ``target_def`` (the target
        queue's definition) are this handle's, computed once by the caller for a run of
        puts (nothing can change them without an await)."""
        conn = self._conn
        qm = conn.queue_manager
        q = self._target
        assert q is not None and opts.syncpoint
        for d in defs:
            if not d.put_enabled:
                raise MQError(Reason.PUT_INHIBITED, f"puts are inhibited on {d.name}")
        first = defs[0] if defs else None
        persistence = md.persistence
        if persistence == _PERSISTENCE_AS_Q_DEF:
            persistence = _PERSISTENT if first and first.default_persistent \
                else _NOT_PERSISTENT
        elif persistence != _PERSISTENT and persistence != _NOT_PERSISTENT:
            raise MQError(Reason.PERSISTENCE_ERROR, f"Persistence {persistence} is not valid")
        priority = md.priority
        if priority == -1:
            priority = first.default_priority if first else 0
        elif priority < 0:
            raise MQError(Reason.PRIORITY_ERROR, f"Priority {priority} is not valid")
        if md.expiry == 0 or md.expiry < -1:
            raise MQError(Reason.EXPIRY_ERROR, f"Expiry {md.expiry} is not valid")
        if md.msg_type == _REQUEST and not md.reply_to_q:
            raise MQError(Reason.MISSING_REPLY_TO_Q, "a request message needs a ReplyToQ")
        cat = qm.catalogue
        reply_to = resolve_reply_to(cat, md.reply_to_q, md.reply_to_q_mgr)
        if len(body) > cat.qmgr.max_msg_length:
            raise MQError(
                Reason.MSG_TOO_BIG_FOR_Q_MGR,
                f"message of {len(body)} bytes exceeds the queue manager's MAXMSGL "
                f"{cat.qmgr.max_msg_length}",
            )
        _check_room(cat, q, len(body), conn, target_def)
        if persistence == _PERSISTENT and qm.space.low:
            qm.refuse_for_space(q.name, conn)
        before = _completed_of(md)
        md.persistence, md.priority = persistence, priority
        if opts.new_msg_id or md.msg_id == MI_NONE:
            md.msg_id = qm._msg_ids()
        if opts.new_correl_id:
            md.correl_id = qm._msg_ids()
        md.reply_to_q, md.reply_to_q_mgr = reply_to
        qm._context.fill(md, now, set_all=opts.set_all_context,
                         set_identity=opts.set_identity_context)
        md.backout_count = 0
        persistent = persistence == _PERSISTENT
        try:
            # packed now so a descriptor the store cannot hold fails this put (2026)
            packed = packer.pack(md) if persistent else None
            msg = QueuedMessage(qm._next_seq(), md, bytes(body), min(max(priority, 0), 9),
                                persistent, now, now + md.expiry / 10 if md.expiry > 0 else None,
                                packed)
        except MQError:
            for name, value in zip(_COMPLETED, before, strict=True):
                setattr(md, name, value)
            raise
        qm.stats.puts += 1  # counted before the syncpoint limit check, as put does
        try:
            conn._track_put(q, msg, arrival)
        except MQError:
            for name, value in zip(_COMPLETED, before, strict=True):
                setattr(md, name, value)
            raise
        q.pending_puts += 1

    # ------------------------------------------------------------------ inquire

    async def inquire(self, *selectors: QueueAttr) -> dict[QueueAttr, int | str]:
        """MQINQ. Also answers Q_MGR_NAME and DEAD_LETTER_Q_NAME (the queue manager's)."""
        self._check()
        if not self._options & OpenOption.INQUIRE:
            raise MQError(Reason.NOT_OPEN_FOR_INQUIRE, f"{self._name} is not open for inquire")
        qm = self._conn.queue_manager
        cat = qm.catalogue
        d = cat.get(self._name) if self._definition is not None else None
        if d is None and self._target is not None:
            d = cat.get(self._target.name)
        if d is None:
            raise MQError(Reason.Q_DELETED, f"queue {self._name} has been deleted")
        local = qm._queues.get(d.name) if d.qtype is QType.LOCAL else None
        out: dict[QueueAttr, int | str] = {}
        for sel in selectors:
            out[sel] = _inquire_one(sel, d, local, cat)
        return out

    async def close(self) -> None:
        """MQCLOSE."""
        if not self._open:
            return
        self._open = False
        self._conn._handles.discard(self)
        q = self._target
        if q is not None:
            if self._options & INPUT_OPTIONS:
                q.input_count -= 1
                if self._options & OpenOption.INPUT_EXCLUSIVE:
                    q.exclusive = False
            if self._options & OpenOption.OUTPUT:
                q.output_count -= 1



def _check_room(
    catalogue: ObjectCatalogue, q: LocalQueue, size: int, conn: EmbeddedConnection,
    qdef: QueueDef | None = None,
) -> None:
    """MAXMSGL and MAXDEPTH of the queue a put of ``conn`` lands on (2030, 2053): one
    check for put and put_owned, so the fan-out path refuses exactly what a single put
    does. The messages ``conn``'s unit of work got from that queue do not count: IBM MQ
    takes a got message off CURDEPTH at the get, so a unit of work that puts back what
    it got (a requeue; the sealing of a full backlog, runtime/pubsub_service/
    first_seal.py) fits a full queue there. Here CURDEPTH keeps them until the commit;
    they are counted only when the queue looks full. ``qdef``: ``q``'s definition, when
    the caller has it already (looked up here otherwise)."""
    if qdef is None:
        qdef = catalogue.get(q.name)
    assert qdef is not None
    if size > qdef.max_msg_length:
        raise MQError(
            Reason.MSG_TOO_BIG_FOR_Q,
            f"message of {size} bytes exceeds MAXMSGL {qdef.max_msg_length} of {q.name}",
        )
    depth = q.depth
    if depth >= qdef.max_depth and depth - conn.got_from(q) >= qdef.max_depth:
        raise MQError(Reason.Q_FULL, f"queue {q.name} is full (MAXDEPTH {qdef.max_depth})")

def _inquire_one(
    sel: QueueAttr, d: QueueDef, local: LocalQueue | None, cat: ObjectCatalogue
) -> int | str:
    qa = QueueAttr
    common: dict[QueueAttr, int | str] = {
        qa.Q_TYPE: int(d.qtype),
        qa.Q_NAME: d.name,
        qa.Q_MGR_NAME: cat.q_mgr_name,
        qa.DEAD_LETTER_Q_NAME: cat.qmgr.dead_letter_q_name,
        qa.DEF_PERSISTENCE: 1 if d.default_persistent else 0,
        qa.DEF_PRIORITY: d.default_priority,
        qa.INHIBIT_PUT: _MQQA_PUT_ALLOWED if d.put_enabled else _MQQA_PUT_INHIBITED,
    }
    if d.qtype is not QType.REMOTE:
        common[qa.INHIBIT_GET] = _MQQA_GET_ALLOWED if d.get_enabled else _MQQA_GET_INHIBITED
    if d.qtype is QType.ALIAS:
        common[qa.BASE_Q_NAME] = d.target
    if d.qtype is QType.REMOTE:
        common[qa.REMOTE_Q_NAME] = d.remote_name
        common[qa.REMOTE_Q_MGR_NAME] = d.remote_q_mgr_name
        common[qa.XMIT_Q_NAME] = d.xmit_q_name
    if local is not None:
        common[qa.CURRENT_Q_DEPTH] = local.depth
        common[qa.MAX_Q_DEPTH] = d.max_depth
        common[qa.MAX_MSG_LENGTH] = d.max_msg_length
        common[qa.USAGE] = int(d.usage)
        common[qa.OPEN_INPUT_COUNT] = local.input_count
        common[qa.OPEN_OUTPUT_COUNT] = local.output_count
        common[qa.BACKOUT_THRESHOLD] = d.backout_threshold
        common[qa.BACKOUT_REQ_Q_NAME] = d.backout_queue
    if sel not in common:
        raise MQError(
            Reason.SELECTOR_NOT_FOR_TYPE, f"{sel.name} does not apply to a {d.qtype.mqsc}"
        )
    return common[sel]
