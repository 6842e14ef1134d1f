"""A stand-in for IBM's ``ibmmq`` module (the pymqi-shaped MQI API) for adapter tests.

It records every MQI call with the thread it ran on, can inject failures, and performs
the calls against a real embedded queue manager running on its own event-loop thread,
so MQI semantics (waits, syncpoint, browse, match options, reason codes) are real.
Blocking calls block the calling thread, as the real MQI does.
"""

from __future__ import annotations

import asyncio
import threading
import types
from collections.abc import Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, TypeVar

from gateway.mq.embedded.qmgr import EmbeddedQueueManager
from gateway.mq.port import Browse, GetOptions, MQError, OpenOption, PutOptions, QueueAttr
from gateway.wire.mqmd import MQMD

T = TypeVar("T")

# IBM MQMD field name -> our attribute (independent of the adapter's own table)
MD_NAMES = {
    "Report": "report", "MsgType": "msg_type", "Expiry": "expiry", "Feedback": "feedback",
    "Encoding": "encoding", "CodedCharSetId": "coded_char_set_id", "Format": "format",
    "Priority": "priority", "Persistence": "persistence", "MsgId": "msg_id",
    "CorrelId": "correl_id", "BackoutCount": "backout_count", "ReplyToQ": "reply_to_q",
    "ReplyToQMgr": "reply_to_q_mgr", "UserIdentifier": "user_identifier",
    "AccountingToken": "accounting_token", "ApplIdentityData": "appl_identity_data",
    "PutApplType": "put_appl_type", "PutApplName": "put_appl_name", "PutDate": "put_date",
    "PutTime": "put_time", "ApplOriginData": "appl_origin_data", "GroupId": "group_id",
    "MsgSeqNumber": "msg_seq_number", "Offset": "offset", "MsgFlags": "msg_flags",
    "OriginalLength": "original_length",
}
BYTES = {"MsgId", "CorrelId", "AccountingToken", "GroupId"}


class MQMIError(Exception):
    def __init__(self, comp: int, reason: int, message: bytes | None = None) -> None:
        super().__init__(f"MQI Error. Comp: {comp}, Reason {reason}")
        self.comp = comp
        self.reason = reason
        self.message = message


class _Block:
    """An MQI structure: attributes with IBM names."""

    _defaults: ClassVar[dict[str, Any]] = {}

    def __init__(self, **kw: Any) -> None:
        for k, v in {**self._defaults, **kw}.items():
            setattr(self, k, v)


def _md_defaults() -> dict[str, Any]:
    base = MQMD()
    out: dict[str, Any] = {"Version": 1}
    for ibm, ours in MD_NAMES.items():
        v = getattr(base, ours)
        out[ibm] = v if ibm in BYTES or not isinstance(v, str) else v.encode()
    return out


class CD(_Block):
    _defaults: ClassVar[dict[str, Any]] = {
        "ChannelName": b"", "ConnectionName": b"", "ChannelType": 0,
        "TransportType": 0, "SSLCipherSpec": b"",
    }


class SCO(_Block):
    _defaults: ClassVar[dict[str, Any]] = {"KeyRepository": b""}


class OD(_Block):
    _defaults: ClassVar[dict[str, Any]] = {
        "ObjectName": b"", "ObjectQMgrName": b"", "ResolvedQName": b"", "ResolvedQMgrName": b"",
    }


class MD(_Block):
    _defaults: ClassVar[dict[str, Any]] = _md_defaults()


class GMO(_Block):
    _defaults: ClassVar[dict[str, Any]] = {
        "Version": 1, "Options": 0, "WaitInterval": 0, "MatchOptions": 3,
    }


class PMO(_Block):
    _defaults: ClassVar[dict[str, Any]] = {"Options": 0}


def _text(v: Any) -> str:
    return (v.decode() if isinstance(v, bytes) else str(v)).split("\0")[0].rstrip()


#: MQMD character fields a client MQI module packs as fixed-length, NUL-padded fields
CHAR_LENGTHS = {
    "Format": 8, "ReplyToQ": 48, "ReplyToQMgr": 48, "UserIdentifier": 12,
    "ApplIdentityData": 32, "PutApplName": 28, "PutDate": 8, "PutTime": 8,
    "ApplOriginData": 4,
}


def md_from_block(block: Any) -> MQMD:
    """What the queue manager receives: fields as the MQI module packs them. MQ does not
    turn NULs into blanks, so a NUL in Format names no format MQ knows: refuse it (2110)
    instead of letting it pass as if padding did not matter."""
    for ibm, length in CHAR_LENGTHS.items():
        v = getattr(block, ibm)
        raw = v if isinstance(v, bytes) else str(v).encode()
        if len(raw) > length:
            raise MQMIError(2, 2026)
        if ibm == "Format" and b"\0" in raw.ljust(length, b"\0"):
            raise MQMIError(2, 2110)
    md = MQMD(version=2)
    for ibm, ours in MD_NAMES.items():
        v = getattr(block, ibm)
        if ibm in BYTES:
            setattr(md, ours, bytes(v))
        elif isinstance(getattr(md, ours), str):
            setattr(md, ours, _text(v))
        else:
            setattr(md, ours, int(v))
    return md


def md_into_block(md: MQMD, block: Any) -> None:
    for ibm, ours in MD_NAMES.items():
        v = getattr(md, ours)
        setattr(block, ibm, v.encode() if isinstance(v, str) else v)


@dataclass
class Call:
    name: str
    thread: int
    args: dict[str, Any] = field(default_factory=dict)


class StandIn:
    """Builds the stand-in module around an embedded queue manager."""

    def __init__(self, data_dir: Path, q_mgr_name: str = "STANDIN") -> None:
        self.calls: list[Call] = []
        self.connect_failures: list[int] = []  # reasons raised by the next connects
        self.break_next_call: int | None = None  # reason raised by the next MQI call
        #: queue name -> reason every put to it fails with (IBM MQ's 2056 of a queue
        #: whose file reached MAXFSIZE, which the embedded queue manager never gives)
        self.put_failures: dict[str, int] = {}
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        self.qm: EmbeddedQueueManager = self.run(self._make(q_mgr_name, data_dir))
        self.module = self._build_module()

    async def _make(self, name: str, path: Path) -> EmbeddedQueueManager:
        return EmbeddedQueueManager(name, path)

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def close(self) -> None:
        self.run(self.qm.close())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)
        self._loop.close()

    def record(self, call_name: str, **args: Any) -> None:
        self.calls.append(Call(call_name, threading.get_ident(), args))
        if self.break_next_call is not None and call_name != "connect_with_options":
            reason, self.break_next_call = self.break_next_call, None
            raise MQMIError(2, reason)

    def refuse_put(self, q_name: str) -> None:
        reason = self.put_failures.get(q_name)
        if reason is not None:
            raise MQMIError(2, reason)

    def mq(self, coro: Coroutine[Any, Any, T]) -> T:
        try:
            return self.run(coro)
        except MQError as exc:
            raise MQMIError(exc.comp_code, exc.reason) from None

    def _build_module(self) -> types.ModuleType:
        standin = self

        class QueueManager:
            def __init__(self, name: Any) -> None:
                self.conn: Any = None

            def connect_with_options(self, name: str, **kw: Any) -> None:
                standin.record("connect_with_options", name=name, **kw)
                if standin.connect_failures:
                    raise MQMIError(2, standin.connect_failures.pop(0))
                if name != standin.qm.name:
                    raise MQMIError(2, 2058)
                self.conn = standin.mq(standin.qm.connect())

            def put1(self, od: Any, body: bytes, md: Any, pmo: Any) -> None:
                standin.record("put1", q=_text(od.ObjectName), options=pmo.Options)
                standin.refuse_put(_text(od.ObjectName))
                out = standin.mq(self.conn.put1(_text(od.ObjectName), md_from_block(md), body,
                                                _put_options(pmo.Options),
                                                _text(od.ObjectQMgrName)))
                md_into_block(out, md)

            def commit(self) -> None:
                standin.record("commit")
                standin.mq(self.conn.commit())

            def backout(self) -> None:
                standin.record("backout")
                standin.mq(self.conn.backout())

            def disconnect(self) -> None:
                standin.record("disconnect")
                standin.mq(self.conn.disconnect())

        class Queue:
            def __init__(self, qmgr: QueueManager, od: Any, options: int) -> None:
                standin.record("open", q=_text(od.ObjectName), options=options)
                self.q_name = _text(od.ObjectName)
                self.h = standin.mq(qmgr.conn.open(_text(od.ObjectName), OpenOption(options),
                                                   _text(od.ObjectQMgrName)))
                od.ResolvedQName = self.h.resolved_q_name.encode()
                od.ResolvedQMgrName = self.h.resolved_q_mgr_name.encode()

            def get(self, max_length: int | None, md: Any, gmo: Any) -> bytes:
                standin.record("get", options=gmo.Options, wait=gmo.WaitInterval)
                o, mo = gmo.Options, gmo.MatchOptions
                opts = GetOptions(
                    wait_ms=(gmo.WaitInterval if o & 0x1 else 0),
                    syncpoint=bool(o & 0x2),
                    browse=Browse.FIRST if o & 0x10 else Browse.NEXT if o & 0x20 else None,
                    match_msg_id=md.MsgId if mo & 1 and md.MsgId != bytes(24) else None,
                    match_correl_id=md.CorrelId if mo & 2 and md.CorrelId != bytes(24) else None,
                    max_length=max_length,
                )
                try:
                    msg = standin.mq(self.h.get(opts))
                except MQMIError as exc:
                    if exc.reason != 2080 or not o & 0x40:
                        raise
                    opts.accept_truncated = True
                    msg = standin.mq(self.h.get(opts))
                    md_into_block(msg.md, md)
                    raise MQMIError(1, 2079, msg.body) from None
                md_into_block(msg.md, md)
                return msg.body

            def put(self, body: bytes, md: Any, pmo: Any) -> None:
                standin.record("put", options=pmo.Options)
                standin.refuse_put(self.q_name)
                out = standin.mq(self.h.put(md_from_block(md), body, _put_options(pmo.Options)))
                md_into_block(out, md)

            def inquire(self, selector: int) -> Any:
                standin.record("inquire", selector=selector)
                value = standin.mq(self.h.inquire(QueueAttr(selector)))[QueueAttr(selector)]
                return value.encode().ljust(48) if isinstance(value, str) else value

            def close(self) -> None:
                standin.record("close")
                standin.mq(self.h.close())

        module = types.ModuleType("ibmmq_standin")
        for name, obj in {"QueueManager": QueueManager, "Queue": Queue, "CD": CD, "SCO": SCO,
                          "OD": OD, "MD": MD, "GMO": GMO, "PMO": PMO,
                          "MQMIError": MQMIError}.items():
            setattr(module, name, obj)
        return module


def _put_options(flags: int) -> PutOptions:
    return PutOptions(
        syncpoint=bool(flags & 0x2), new_msg_id=bool(flags & 0x40),
        new_correl_id=bool(flags & 0x80), set_all_context=bool(flags & 0x800),
        set_identity_context=bool(flags & 0x400),
    )
