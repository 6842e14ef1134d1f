"""A runmqdlq-style dead-letter queue handler over the queue-manager port.

Why: messages a channel, the broker or the gateway could not deliver wait on the DLQ
behind an MQDLH; an operator wants them retried once the cause is fixed (the queue now
exists, the queue is no longer full), forwarded for inspection or discarded, by rules,
as IBM MQ's ``runmqdlq`` does (IBM MQ documentation: "runmqdlq", "How the DLQ rules
table is processed"). The rules are parsed by :mod:`gateway.mq.dlq_rules`.

How a pass works: the handler browses the DLQ; for each message it finds the first
matching rule whose RETRY attempts are not used up (the attempt counts are kept in
memory, per message and rule, as runmqdlq does, also for a message this run moved off
the DLQ, so one that is dead-lettered again, with the same MsgId and CorrelId, uses up
its RETRY(n) instead of looping) and applies it:

* RETRY: strip the MQDLH (its Format/CodedCharSetId/Encoding go back into the MQMD) and
  put the message to DestQName at DestQMgrName;
* FWD: put it to FWDQ at FWDQM, with the MQDLH (HEADER(YES)) or without it;
* DISCARD: remove it; IGNORE: leave it.

Every removal is a destructive get under syncpoint in the same unit of work as the put
that replaces it, committed together: a failed put is backed out and the message stays
on the DLQ; a crash before the commit backs both out (no loss, no duplicate). Puts pass
all context (MQPMO_SET_ALL_CONTEXT with the message's own context), so the delivered
message is the original one: body, MsgId, CorrelId, context, Format.

When no matching rule has attempts left, or no rule matches, the message is left on the
DLQ (ACTION(IGNORE) assumed), like runmqdlq. Messages that do not begin with an MQDLH
are reported and left.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TextIO

from gateway.mq.dlq_rules import Action, ControlData, Rule, RulesTable
from gateway.mq.port import (
    WAIT_UNLIMITED,
    Browse,
    Connection,
    GetOptions,
    Message,
    MQError,
    OpenOption,
    PutOptions,
    QueueAttr,
    QueueHandle,
)
from gateway.wire.dlh import MQDLH, unwrap_from_dlq
from gateway.wire.errors import WireError
from gateway.wire.mqmd import MQMD
from gateway.wire.reasons import Reason, reason_text

#: A queue every queue manager has, opened for inquire to learn DEADQ when the rules
#: table has no INPUTQ (the embedded queue manager answers DEADQ on any queue handle).
_INQUIRE_VIA = "SYSTEM.ADMIN.COMMAND.QUEUE"


#: Reasons that end the run (the queue manager or connection is gone), not an attempt.
_CONNECTION_LOST = frozenset({
    Reason.CONNECTION_BROKEN, Reason.HCONN_ERROR, Reason.Q_MGR_STOPPING,
    Reason.Q_MGR_NOT_AVAILABLE, Reason.CONNECTION_QUIESCING, Reason.Q_MGR_QUIESCING,
})


#: How many moved messages a run remembers (their attempt counts) against coming back.
MOVED_MEMORY = 100_000


class DlqHandlerError(Exception):
    """The handler cannot start: no DLQ to read, or a DLQ on another queue manager."""


@dataclass(slots=True)
class DlqReport:
    """What a run did: counts by outcome, and one line per message handled."""

    retried: int = 0
    forwarded: int = 0
    discarded: int = 0
    ignored: int = 0
    failed: int = 0
    no_header: int = 0
    passes: int = 0
    lines: list[str] = field(default_factory=list)

    @property
    def removed(self) -> int:
        """Messages taken off the DLQ (retried, forwarded or discarded)."""
        return self.retried + self.forwarded + self.discarded

    def totals(self) -> str:
        return (
            f"totals: retried {self.retried}, forwarded {self.forwarded}, "
            f"discarded {self.discarded}, ignored {self.ignored}, failed {self.failed}, "
            f"without MQDLH {self.no_header}, passes {self.passes}"
        )


@dataclass(slots=True)
class _Outcome:
    action: str
    destination: str
    outcome: str
    removed: bool = False
    failed: bool = False


@dataclass(slots=True)
class _Handler:
    conn: Connection
    rules: RulesTable
    dry_run: bool
    out: TextIO
    report: DlqReport
    dlq: QueueHandle
    dlq_name: str
    #: attempts made, per message (MsgId, CorrelId) and rule index
    attempts: dict[tuple[bytes, bytes], dict[int, int]] = field(default_factory=dict)
    #: messages this run took off the DLQ (oldest first, at most MOVED_MEMORY): their
    #: attempt counts are kept, so one that comes back (a retried command the broker
    #: refuses again) uses up RETRY(n) instead of looping for ever
    moved: dict[tuple[bytes, bytes], None] = field(default_factory=dict)
    #: called with the report after each message handled (a CLI progress display)
    on_message: Callable[[DlqReport], None] | None = None

    # ------------------------------------------------------------------ a pass

    async def run_pass(self) -> bool:
        """Handle every message on the DLQ once; True when one is waiting for a retry."""
        self.report.passes += 1
        pending = False
        seen: set[tuple[bytes, bytes]] = set()
        browse = Browse.FIRST
        while True:
            try:
                msg = await self.dlq.get(GetOptions(browse=browse, wait_ms=0))
            except MQError as exc:
                if exc.reason == Reason.NO_MSG_AVAILABLE:
                    break
                raise
            browse = Browse.NEXT
            key = (msg.md.msg_id, msg.md.correl_id)
            seen.add(key)
            pending = await self.handle(msg, key) or pending
        for key in list(self.attempts):
            if key not in seen and key not in self.moved:  # gone, not by us: forget it
                del self.attempts[key]
        return pending

    async def handle(self, msg: Message, key: tuple[bytes, bytes]) -> bool:
        """Apply the rules to one browsed message; True when a later retry may help."""
        msg_id = msg.md.msg_id.hex()
        try:
            dlh, original_md, data = unwrap_from_dlq(msg.md, msg.body)
        except WireError as exc:
            self.report.no_header += 1
            self._line(msg_id, "-", "-", "IGNORE", f"left: no MQDLH ({exc})")
            return False
        reason = reason_text(dlh.reason)
        counts = self.attempts.setdefault(key, {})
        chosen: tuple[int, Rule] | None = None
        matched = False
        for index, rule in self.rules.matches(dlh, msg.md):
            matched = True
            if counts.get(index, 0) < rule.retry:
                chosen = (index, rule)
                break
        if chosen is None:
            self.report.ignored += 1
            why = "retries exhausted" if matched else "no matching rule"
            self._line(msg_id, reason, _dest(dlh), "IGNORE", f"left ({why})")
            return False
        index, rule = chosen
        if not self.dry_run:
            counts[index] = counts.get(index, 0) + 1
        result = await self.apply(rule, msg, dlh, original_md, data)
        if result.removed:
            self._remember_moved(key)
            if rule.action is Action.RETRY:
                self.report.retried += 1
            elif rule.action is Action.FWD:
                self.report.forwarded += 1
            else:
                self.report.discarded += 1
        elif result.failed:
            self.report.failed += 1
        else:
            self.report.ignored += 1
        self._line(msg_id, reason, result.destination, result.action, result.outcome)
        if not result.failed:
            return False
        # another attempt of this rule, or a later matching rule, may still apply
        return any(
            counts.get(i, 0) < r.retry for i, r in self.rules.matches(dlh, msg.md)
        )

    def _remember_moved(self, key: tuple[bytes, bytes]) -> None:
        self.moved.pop(key, None)
        self.moved[key] = None
        while len(self.moved) > MOVED_MEMORY:
            oldest = next(iter(self.moved))
            del self.moved[oldest]
            self.attempts.pop(oldest, None)

    # ------------------------------------------------------------------ actions

    async def apply(
        self, rule: Rule, msg: Message, dlh: MQDLH, original_md: MQMD, data: bytes
    ) -> _Outcome:
        action = rule.action
        attempt = f"rule line {rule.line}"
        if action is Action.IGNORE:
            return _Outcome("IGNORE", _dest(dlh), f"left ({attempt})")
        if action is Action.DISCARD:
            if self.dry_run:
                return _Outcome("DISCARD", _dest(dlh), f"dry run: would discard ({attempt})")
            return await self._move(msg, None, "DISCARD", _dest(dlh), attempt)
        if action is Action.RETRY:
            q, qm = dlh.dest_q_name, dlh.dest_q_mgr_name
            put_md, put_body = original_md, data
        else:
            q, qm, problem = _forward_target(rule, dlh, msg.md)
            if problem:
                return _Outcome("FWD", "-", f"failed: {problem} ({attempt})", failed=True)
            put_md, put_body = (msg.md, msg.body) if rule.header else (original_md, data)
        where = f"{q}@{qm}" if qm else q
        if not q:
            return _Outcome(action.value, "-", f"failed: no destination queue ({attempt})",
                            failed=True)
        if self.dry_run:
            return await self._dry_put(action.value, q, qm, where, attempt)
        return await self._move(msg, (q, qm, put_md, put_body), action.value, where, attempt)

    async def _move(
        self,
        msg: Message,
        put: tuple[str, str, MQMD, bytes] | None,
        action: str,
        where: str,
        attempt: str,
    ) -> _Outcome:
        """Destructive get of ``msg`` and its put (if any) in one unit of work."""
        conn = self.conn
        try:
            taken = await self.dlq.get(GetOptions(
                syncpoint=True,
                match_msg_id=msg.md.msg_id,
                match_correl_id=msg.md.correl_id,
            ))
            if taken.body != msg.body:  # another message with the same ids: not ours
                await conn.backout()
                return _Outcome(action, where, f"skipped: message changed ({attempt})")
            if put is not None:
                q, qm, md, body = put
                try:
                    await self._put(q, qm, md, body)
                except MQError as exc:
                    if exc.reason in _CONNECTION_LOST:
                        raise
                    await conn.backout()
                    return _Outcome(
                        action, where,
                        f"failed: {reason_text(exc.reason)}, kept on the DLQ ({attempt})",
                        failed=True,
                    )
            await conn.commit()
        except MQError as exc:
            if exc.reason == Reason.NO_MSG_AVAILABLE:
                return _Outcome(action, where, f"skipped: message left the DLQ ({attempt})")
            await _backout_quietly(conn)
            raise
        except BaseException:
            # a crash (bug, cancellation) before the commit: nothing is half done
            await _backout_quietly(conn)
            raise
        done = {"RETRY": "retried", "FWD": "forwarded", "DISCARD": "discarded"}[action]
        return _Outcome(action, where, f"{done} ({attempt})", removed=True)

    async def _put(self, q: str, qm: str, md: MQMD, body: bytes) -> None:
        local = "" if qm in ("", self.conn.q_mgr_name) else qm
        handle = await self.conn.open(q, OpenOption.OUTPUT | OpenOption.SET_ALL_CONTEXT, local)
        try:
            await handle.put(md, body, PutOptions(syncpoint=True, set_all_context=True))
        finally:
            await handle.close()

    async def _dry_put(self, action: str, q: str, qm: str, where: str,
                       attempt: str) -> _Outcome:
        """Dry run: open the destination (changes nothing) to say whether it resolves."""
        local = "" if qm in ("", self.conn.q_mgr_name) else qm
        verb = {"RETRY": "retry", "FWD": "forward"}[action]
        try:
            handle = await self.conn.open(q, OpenOption.OUTPUT, local)
        except MQError as exc:
            return _Outcome(action, where, f"dry run: would {verb}, but the destination "
                            f"does not open: {reason_text(exc.reason)} ({attempt})")
        await handle.close()
        return _Outcome(action, where, f"dry run: would {verb} ({attempt})")

    def _line(self, msg_id: str, reason: str, dest: str, action: str, outcome: str) -> None:
        line = f"msgid={msg_id} reason={reason} dest={dest} action={action} {outcome}"
        self.report.lines.append(line)
        print(line, file=self.out, flush=True)
        if self.on_message is not None:
            self.on_message(self.report)


async def _backout_quietly(conn: Connection) -> None:
    with contextlib.suppress(MQError):  # connection gone: the queue manager backs out
        await conn.backout()


def _dest(dlh: MQDLH) -> str:
    if not dlh.dest_q_name:
        return "-"
    return f"{dlh.dest_q_name}@{dlh.dest_q_mgr_name}" if dlh.dest_q_mgr_name else dlh.dest_q_name


def _forward_target(rule: Rule, dlh: MQDLH, md: MQMD) -> tuple[str, str, str]:
    """(queue, queue manager, problem) of a FWD rule, with &DESTQ/&REPLYQ... resolved."""
    q = {"&DESTQ": dlh.dest_q_name, "&REPLYQ": md.reply_to_q}.get(rule.fwd_q, rule.fwd_q)
    qm = {"&DESTQM": dlh.dest_q_mgr_name, "&REPLYQM": md.reply_to_q_mgr}.get(
        rule.fwd_q_mgr, rule.fwd_q_mgr
    )
    if not q.strip():
        return "", "", f"FWDQ({rule.fwd_q}) is blank for this message"
    return q.strip(), qm.strip(), ""


async def _dlq_name(conn: Connection, control: ControlData) -> str:
    if control.input_q_mgr and control.input_q_mgr != conn.q_mgr_name:
        raise DlqHandlerError(
            f"INPUTQM({control.input_q_mgr}) is not the queue manager connected to "
            f"({conn.q_mgr_name}); the DLQ handler reads a local dead-letter queue"
        )
    if control.input_q:
        return control.input_q
    try:
        handle = await conn.open(_INQUIRE_VIA, OpenOption.INQUIRE)
        try:
            attrs = await handle.inquire(QueueAttr.DEAD_LETTER_Q_NAME)
        finally:
            await handle.close()
        name = str(attrs.get(QueueAttr.DEAD_LETTER_Q_NAME, "")).strip()
    except MQError as exc:
        raise DlqHandlerError(
            f"cannot inquire the dead-letter queue of {conn.q_mgr_name} "
            f"({reason_text(exc.reason)}); name it with INPUTQ(...) in the rules table"
        ) from exc
    if not name:
        raise DlqHandlerError(
            f"queue manager {conn.q_mgr_name} has no DEADQ; name the queue with INPUTQ(...)"
        )
    return name


async def run_dlq_handler(
    conn: Connection,
    rules: RulesTable,
    *,
    once: bool,
    dry_run: bool,
    out: TextIO,
    on_message: Callable[[DlqReport], None] | None = None,
) -> DlqReport:
    """Process the DLQ by ``rules`` (see the module docstring) and return the report.

    ``once``: one pass over the DLQ, then stop. Otherwise passes repeat: every RETRYINT
    seconds while a message waits for another attempt, and as WAIT says when none does
    (YES: wait for new messages for ever; NO: stop; n: stop after n seconds without a new
    message). ``dry_run``: one pass that prints what would be done and changes nothing
    (destinations are only opened, to say whether they resolve). The caller owns
    ``conn``; the handler leaves no unit of work open. ``on_message``, if given, is
    called with the report after each message handled.
    """
    report = DlqReport()
    control = rules.control
    name = await _dlq_name(conn, control)
    options = OpenOption.BROWSE | OpenOption.FAIL_IF_QUIESCING
    if not dry_run:
        options |= OpenOption.INPUT_SHARED
    try:
        dlq = await conn.open(name, options)
    except MQError as exc:
        raise DlqHandlerError(
            f"cannot open the dead-letter queue {name}: {reason_text(exc.reason)}"
        ) from exc
    handler = _Handler(conn, rules, dry_run, out, report, dlq, name, on_message=on_message)
    mode = "dry run" if dry_run else ("one pass" if once else f"WAIT({control.wait})")
    print(f"dead-letter queue {name} on {conn.q_mgr_name}: {len(rules.rules)} rules, {mode}",
          file=out, flush=True)
    try:
        while True:
            pending = await handler.run_pass()
            if once or dry_run:
                break
            if pending:
                await asyncio.sleep(control.retry_int)
                continue
            if control.wait == "NO":
                break
            if not await _wait_for_new(dlq, control):
                break
    finally:
        await dlq.close()
        print(report.totals(), file=out, flush=True)
    return report


async def _wait_for_new(dlq: QueueHandle, control: ControlData) -> bool:
    """Wait (per WAIT) for a message the last pass did not see; False when none came.

    Browse-next from the cursor left at the end of the last pass returns only messages
    that arrived after it (the browse cursor is after the last message browsed).
    """
    wait_ms = WAIT_UNLIMITED if control.wait == "YES" else int(control.wait) * 1000
    try:
        await dlq.get(GetOptions(browse=Browse.NEXT, wait_ms=wait_ms))
    except MQError as exc:
        if exc.reason == Reason.NO_MSG_AVAILABLE:
            return False
        raise
    return True
