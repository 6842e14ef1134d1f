"""The queue-manager port over IBM MQ, through IBM's ``ibmmq`` package or pymqi.

Why a thread per connection: an MQI connection handle (hconn) is bound to the thread that
made it (unless shared-handle options are used), and every MQI call blocks (MQGET with a
wait interval for seconds). Each :class:`IBMMQConnection` therefore owns a single-thread
executor; all its MQI calls run there, in order, and the event loop only awaits them.

Client connections use host/port/channel/queue-manager name, optionally TLS (cipher spec
plus key repository) and user/password (MQCSP). Connecting retries with jittered
exponential backoff on the reasons that mean "the queue manager is not reachable yet"
(2009, 2059, 2161, 2162, 2538, 2543). A connection that breaks while in use raises a
retriable :class:`MQError`; its unit of work is lost (MQ backs it out), so the *next*
call reconnects and reopens the handles, and the caller redoes its unit of work.

The MQI module is imported lazily (``ibmmq`` first, then ``pymqi``; both expose the same
classes); a test can pass a stand-in module instead.
"""

from __future__ import annotations

import asyncio
import importlib
import logging
import random
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, fields
from types import ModuleType, TracebackType
from typing import Any, Self, TypeVar

from pydantic import BaseModel, ConfigDict, Field, SecretStr

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
from gateway.wire.constants import CompCode
from gateway.wire.mqmd import MQMD
from gateway.wire.reasons import Reason

log = logging.getLogger(__name__)
T = TypeVar("T")

#: Reasons after which connecting again later can succeed.
RECONNECT_REASONS = frozenset({2009, 2059, 2161, 2162, 2538, 2543})

# MQI constants (cmqc.h); passed as plain integers so any MQI module accepts them.
MQGMO_WAIT = 0x1
MQGMO_SYNCPOINT = 0x2
MQGMO_NO_SYNCPOINT = 0x4
MQGMO_BROWSE_FIRST = 0x10
MQGMO_BROWSE_NEXT = 0x20
MQGMO_ACCEPT_TRUNCATED_MSG = 0x40
MQGMO_FAIL_IF_QUIESCING = 0x2000
MQMO_NONE = 0
MQMO_MATCH_MSG_ID = 0x1
MQMO_MATCH_CORREL_ID = 0x2
MQPMO_SYNCPOINT = 0x2
MQPMO_NO_SYNCPOINT = 0x4
MQPMO_NEW_MSG_ID = 0x40
MQPMO_NEW_CORREL_ID = 0x80
MQPMO_SET_IDENTITY_CONTEXT = 0x400
MQPMO_SET_ALL_CONTEXT = 0x800
MQPMO_FAIL_IF_QUIESCING = 0x2000
MQCHT_CLNTCONN = 6
MQXPT_TCP = 2
MQMD_VERSION_2 = 2
MQGMO_VERSION_2 = 2
MQOD_VERSION_3 = 3

# (our MQMD attribute, MQI MD attribute, is a character field)
_MD_FIELDS: tuple[tuple[str, str, bool], ...] = (
    ("report", "Report", False),
    ("msg_type", "MsgType", False),
    ("expiry", "Expiry", False),
    ("feedback", "Feedback", False),
    ("encoding", "Encoding", False),
    ("coded_char_set_id", "CodedCharSetId", False),
    ("format", "Format", True),
    ("priority", "Priority", False),
    ("persistence", "Persistence", False),
    ("msg_id", "MsgId", False),
    ("correl_id", "CorrelId", False),
    ("backout_count", "BackoutCount", False),
    ("reply_to_q", "ReplyToQ", True),
    ("reply_to_q_mgr", "ReplyToQMgr", True),
    ("user_identifier", "UserIdentifier", True),
    ("accounting_token", "AccountingToken", False),
    ("appl_identity_data", "ApplIdentityData", True),
    ("put_appl_type", "PutApplType", False),
    ("put_appl_name", "PutApplName", True),
    ("put_date", "PutDate", True),
    ("put_time", "PutTime", True),
    ("appl_origin_data", "ApplOriginData", True),
    ("group_id", "GroupId", False),
    ("msg_seq_number", "MsgSeqNumber", False),
    ("offset", "Offset", False),
    ("msg_flags", "MsgFlags", False),
    ("original_length", "OriginalLength", False),
)


class IBMMQConfig(BaseModel):
    """How to reach an IBM MQ queue manager as an MQ client."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    q_mgr_name: str = Field(min_length=1, max_length=48)
    host: str = "127.0.0.1"
    port: int = Field(default=1414, ge=1, le=65535)
    channel: str = Field(default="DEV.APP.SVRCONN", min_length=1, max_length=20)
    user: str | None = None
    password: SecretStr | None = None
    tls_cipher_spec: str | None = None
    key_repository: str | None = None
    connect_attempts: int = Field(default=8, ge=1)
    backoff_initial_s: float = Field(default=0.5, gt=0)
    backoff_max_s: float = Field(default=30.0, gt=0)

    @property
    def connection_name(self) -> str:
        return f"{self.host}({self.port})"


class MQIUnavailableError(MQError):
    """Neither ``ibmmq`` nor ``pymqi`` could be imported."""

    def __init__(self, detail: str) -> None:
        super().__init__(
            Reason.ENVIRONMENT_ERROR,
            "IBM MQ support needs the 'mq' extra (pip install 'mq-stream-gateway[mq]') and "
            "IBM's MQ client libraries (the MQ redistributable client, with "
            f"LD_LIBRARY_PATH pointing at its lib64 directory): {detail}",
        )


def load_mqi_module() -> ModuleType:
    """Import ``ibmmq``, else ``pymqi``; a clear error when neither works."""
    problems = []
    for name in ("ibmmq", "pymqi"):
        try:
            return importlib.import_module(name)
        except ImportError as exc:  # also missing libmqic_r.so
            problems.append(f"{name}: {exc}")
    raise MQIUnavailableError("; ".join(problems))


def backoff_delays(config: IBMMQConfig, rnd: random.Random | None = None) -> list[float]:
    """The waits between connection attempts: exponential, capped, full jitter."""
    r = rnd or random.Random()
    out = []
    for attempt in range(config.connect_attempts - 1):
        ceiling = min(config.backoff_max_s, config.backoff_initial_s * (2**attempt))
        out.append(r.uniform(ceiling / 2, ceiling))
    return out


def _mq_error(exc: BaseException) -> MQError | None:
    reason = getattr(exc, "reason", None)
    comp = getattr(exc, "comp", None)
    if isinstance(reason, int) and isinstance(comp, int):
        return MQError(reason, str(exc), comp)
    return None


def _to_bytes(value: str) -> bytes:
    return value.encode("utf-8")


def _from_field(value: Any) -> str:
    if isinstance(value, bytes | bytearray):
        value = bytes(value).split(b"\0", 1)[0].decode("utf-8", "replace")
    return str(value).rstrip(" ")


#: MQCHARn lengths of the MQMD character fields (IBM MQ reference, MQMD). The MQI
#: modules pad short values with NULs, which MQ keeps (a Format of "MQSTR\0\0\0" is not
#: MQFMT_STRING), so every field is blank-padded to its full length here.
MD_CHAR_LENGTHS: dict[str, int] = {
    "Format": 8, "ReplyToQ": 48, "ReplyToQMgr": 48, "UserIdentifier": 12,
    "ApplIdentityData": 32, "PutApplName": 28, "PutDate": 8, "PutTime": 8,
    "ApplOriginData": 4,
}


def _char_field(name: str, value: str) -> bytes:
    length = MD_CHAR_LENGTHS[name]
    raw = _to_bytes(value)
    if len(raw) > length or b"\0" in raw:
        raise MQError(Reason.MD_ERROR,
                      f"MQMD.{name} {value!r} is not valid (at most {length} bytes, no NULs)")
    return raw.ljust(length, b" ")


def md_to_mqi(mqi: ModuleType, md: MQMD) -> Any:
    """Our MQMD as the MQI module's MD (version 2), character fields blank-padded."""
    out = mqi.MD()
    out.Version = MQMD_VERSION_2
    for ours, theirs, is_char in _MD_FIELDS:
        value = getattr(md, ours)
        setattr(out, theirs, _char_field(theirs, value) if is_char else value)
    return out


def md_from_mqi(raw: Any) -> MQMD:
    md = MQMD(version=2)
    for ours, theirs, is_char in _MD_FIELDS:
        value = getattr(raw, theirs)
        if is_char:
            setattr(md, ours, _from_field(value))
        elif ours in ("msg_id", "correl_id", "accounting_token", "group_id"):
            setattr(md, ours, bytes(value))
        else:
            setattr(md, ours, int(value))
    return md


class IBMMQQueueManager:
    """Hands out client connections to one IBM MQ queue manager."""

    def __init__(self, config: IBMMQConfig, *, mqi: ModuleType | None = None,
                 sleep: Callable[[float], Awaitable[None]] = asyncio.sleep) -> None:
        self.config = config
        self._mqi = mqi
        self._sleep = sleep

    @property
    def name(self) -> str:
        return self.config.q_mgr_name

    def mqi(self) -> ModuleType:
        if self._mqi is None:
            self._mqi = load_mqi_module()
        return self._mqi

    async def connect(self) -> IBMMQConnection:
        """MQCONNX with retries on transient reasons."""
        conn = IBMMQConnection(self)
        try:
            await conn._connect()
        except BaseException:
            conn._executor.shutdown(wait=False)
            raise
        return conn


@dataclass(slots=True)
class _HandleSpec:
    q_name: str
    options: OpenOption
    q_mgr_name: str


class IBMMQConnection:
    """One MQ client connection; every MQI call runs on its own thread."""

    def __init__(self, qm: IBMMQQueueManager) -> None:
        self._qm = qm
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="mqi")
        self._hconn: Any = None
        self._generation = 0
        self._broken = False
        self._in_uow = False
        self._closed = False
        self._handles: set[IBMMQQueueHandle] = set()

    @property
    def q_mgr_name(self) -> str:
        return self._qm.name

    async def _run(self, fn: Callable[[], T]) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, fn)

    def _connect_once(self) -> Any:
        cfg = self._qm.config
        mqi = self._qm.mqi()
        cd = mqi.CD()
        cd.ChannelName = _to_bytes(cfg.channel)
        cd.ConnectionName = _to_bytes(cfg.connection_name)
        cd.ChannelType = MQCHT_CLNTCONN
        cd.TransportType = MQXPT_TCP
        kwargs: dict[str, Any] = {"cd": cd}
        if cfg.tls_cipher_spec:
            cd.SSLCipherSpec = _to_bytes(cfg.tls_cipher_spec)
            sco = mqi.SCO()
            if cfg.key_repository:
                sco.KeyRepository = _to_bytes(cfg.key_repository)
            kwargs["sco"] = sco
        if cfg.user:
            kwargs["user"] = cfg.user
            kwargs["password"] = cfg.password.get_secret_value() if cfg.password else ""
        hconn = mqi.QueueManager(None)
        hconn.connect_with_options(cfg.q_mgr_name, **kwargs)
        return hconn

    async def _connect(self) -> None:
        cfg = self._qm.config
        delays = backoff_delays(cfg)
        attempt = 0
        while True:
            try:
                self._hconn = await self._run(self._connect_once)
            except MQError:
                raise
            except Exception as exc:
                err = _mq_error(exc)
                if err is None:
                    raise
                if err.reason not in RECONNECT_REASONS or attempt >= len(delays):
                    raise err from exc
                delay = delays[attempt]
                attempt += 1
                log.warning("connecting to %s at %s failed (%s); retrying in %.1fs",
                            cfg.q_mgr_name, cfg.connection_name, err, delay)
                await self._qm._sleep(delay)
                continue
            self._generation += 1
            self._broken = False
            self._in_uow = False
            return

    async def _call(self, fn: Callable[[], T], *, uow: bool = False) -> T:
        """Run one MQI call; map MQMIError to MQError; note broken connections."""
        if self._closed:
            raise MQError(Reason.HCONN_ERROR, "the connection has been disconnected")
        if self._broken:
            await self._connect()
        if uow:
            # before the call: once submitted it may have started a unit of work even if
            # we never see its answer (cancelled, connection lost)
            self._in_uow = True
        try:
            result = await self._run(fn)
        except Exception as exc:
            err = _mq_error(exc)
            if err is None:
                raise
            if err.reason in RECONNECT_REASONS:
                self._broken = True
                if self._in_uow:
                    err = MQError(err.reason, f"{err.detail}; the unit of work was backed out",
                                  err.comp_code)
                self._in_uow = False
            raise err from exc
        return result

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.disconnect()

    def _od(self, q_name: str, q_mgr_name: str) -> Any:
        mqi = self._qm.mqi()
        od = mqi.OD()
        od.Version = MQOD_VERSION_3  # version 3 returns ResolvedQName/ResolvedQMgrName
        od.ObjectName = _to_bytes(q_name)
        if q_mgr_name:
            od.ObjectQMgrName = _to_bytes(q_mgr_name)
        return od

    async def open(
        self, q_name: str, options: OpenOption, q_mgr_name: str = ""
    ) -> IBMMQQueueHandle:
        spec = _HandleSpec(q_name, OpenOption(options), q_mgr_name)
        handle = IBMMQQueueHandle(self, spec)
        await handle._ensure_open()
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
        mqi = self._qm.mqi()
        opts = options or PutOptions()
        raw_md = md_to_mqi(mqi, md)
        pmo = _pmo(mqi, opts)

        def call() -> None:
            self._hconn.put1(self._od(q_name, q_mgr_name), body, raw_md, pmo)

        await self._call(call, uow=opts.syncpoint)
        return md_from_mqi(raw_md)

    async def commit(self) -> None:
        await self._call(lambda: self._hconn.commit())
        self._in_uow = False

    async def backout(self) -> None:
        await self._call(lambda: self._hconn.backout())
        self._in_uow = False

    async def disconnect(self) -> None:
        if self._closed:
            return
        for h in list(self._handles):
            await h.close()
        hconn = self._hconn

        def call() -> None:
            # always MQBACK first (harmless without a unit of work): MQDISC alone would
            # commit one on most platforms, and our _in_uow may not know of every call
            try:
                hconn.backout()
            except Exception as exc:
                if _mq_error(exc) is None:
                    raise
                log.debug("MQBACK before MQDISC failed: %s", exc)
            hconn.disconnect()

        try:
            if hconn is not None and not self._broken:
                await self._run(call)
        except Exception as exc:
            if _mq_error(exc) is None:
                raise
            log.debug("MQDISC failed: %s", exc)
        finally:
            self._closed = True
            self._executor.shutdown(wait=False)


def _pmo(mqi: ModuleType, opts: PutOptions) -> Any:
    pmo = mqi.PMO()
    flags = MQPMO_FAIL_IF_QUIESCING
    flags |= MQPMO_SYNCPOINT if opts.syncpoint else MQPMO_NO_SYNCPOINT
    if opts.new_msg_id:
        flags |= MQPMO_NEW_MSG_ID
    if opts.new_correl_id:
        flags |= MQPMO_NEW_CORREL_ID
    if opts.set_all_context:
        flags |= MQPMO_SET_ALL_CONTEXT
    elif opts.set_identity_context:
        flags |= MQPMO_SET_IDENTITY_CONTEXT
    pmo.Options = flags
    return pmo


class IBMMQQueueHandle:
    """An open IBM MQ queue; reopened transparently after the connection was remade."""

    def __init__(self, conn: IBMMQConnection, spec: _HandleSpec) -> None:
        self._conn = conn
        self._spec = spec
        self._hobj: Any = None
        self._generation = -1
        self._closed = False
        self._resolved = (spec.q_name, spec.q_mgr_name or conn.q_mgr_name)

    @property
    def name(self) -> str:
        return self._spec.q_name

    @property
    def resolved_q_name(self) -> str:
        return self._resolved[0]

    @property
    def resolved_q_mgr_name(self) -> str:
        return self._resolved[1]

    async def _ensure_open(self) -> Any:
        if self._closed:
            raise MQError(Reason.HOBJ_ERROR, f"queue handle for {self._spec.q_name} is closed")
        conn = self._conn
        if self._hobj is not None and self._generation == conn._generation and not conn._broken:
            return self._hobj
        mqi = conn._qm.mqi()
        spec = self._spec

        def call() -> Any:
            od = conn._od(spec.q_name, spec.q_mgr_name)
            hobj = mqi.Queue(conn._hconn, od, int(spec.options))
            resolved = (_from_field(getattr(od, "ResolvedQName", b"")),
                        _from_field(getattr(od, "ResolvedQMgrName", b"")))
            return hobj, resolved

        hobj, resolved = await conn._call(call)
        self._hobj = hobj
        self._generation = conn._generation
        if resolved[0]:
            self._resolved = (resolved[0], resolved[1] or self._resolved[1])
        return hobj

    async def get(self, options: GetOptions | None = None) -> Message:
        opts = options or GetOptions()
        hobj = await self._ensure_open()
        mqi = self._conn._qm.mqi()
        raw_md = mqi.MD()
        raw_md.Version = MQMD_VERSION_2
        gmo = mqi.GMO()
        flags = MQGMO_FAIL_IF_QUIESCING
        if opts.browse is Browse.FIRST:
            flags |= MQGMO_BROWSE_FIRST
        elif opts.browse is Browse.NEXT:
            flags |= MQGMO_BROWSE_NEXT
        flags |= MQGMO_SYNCPOINT if opts.syncpoint else MQGMO_NO_SYNCPOINT
        if opts.wait_ms != 0:
            flags |= MQGMO_WAIT
            gmo.WaitInterval = -1 if opts.wait_ms == WAIT_UNLIMITED else opts.wait_ms
        if opts.accept_truncated:
            flags |= MQGMO_ACCEPT_TRUNCATED_MSG
        match = MQMO_NONE
        if opts.match_msg_id is not None:
            match |= MQMO_MATCH_MSG_ID
            raw_md.MsgId = opts.match_msg_id
        if opts.match_correl_id is not None:
            match |= MQMO_MATCH_CORREL_ID
            raw_md.CorrelId = opts.match_correl_id
        gmo.Version = MQGMO_VERSION_2
        gmo.Options = flags
        gmo.MatchOptions = match

        def call() -> bytes:
            try:
                return bytes(hobj.get(opts.max_length, raw_md, gmo))
            except Exception as exc:
                err = _mq_error(exc)
                if err is not None and err.reason == Reason.TRUNCATED_MSG_ACCEPTED:
                    # MQCC_WARNING: the MQI module carries the truncated data on the error
                    return bytes(getattr(exc, "message", b"") or b"")
                raise

        try:
            body = await self._conn._call(call, uow=opts.syncpoint and opts.browse is None)
        except MQError as exc:
            if exc.reason == Reason.TRUNCATED_MSG_FAILED:
                raise MQError(exc.reason, exc.detail, CompCode.WARNING) from exc
            raise
        return Message(md_from_mqi(raw_md), body)

    async def put(self, md: MQMD, body: bytes, options: PutOptions | None = None) -> MQMD:
        opts = options or PutOptions()
        hobj = await self._ensure_open()
        mqi = self._conn._qm.mqi()
        raw_md = md_to_mqi(mqi, md)
        pmo = _pmo(mqi, opts)
        await self._conn._call(lambda: hobj.put(body, raw_md, pmo), uow=opts.syncpoint)
        return md_from_mqi(raw_md)

    async def inquire(self, *selectors: QueueAttr) -> dict[QueueAttr, int | str]:
        hobj = await self._ensure_open()

        def call() -> dict[QueueAttr, int | str]:
            out: dict[QueueAttr, int | str] = {}
            for sel in selectors:
                value = hobj.inquire(int(sel))
                out[sel] = _from_field(value) if int(sel) >= 2000 else int(value)
            return out

        return await self._conn._call(call)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._conn._handles.discard(self)
        hobj = self._hobj
        if hobj is None or self._generation != self._conn._generation or self._conn._broken:
            return
        try:
            await self._conn._run(lambda: hobj.close())
        except Exception as exc:
            if _mq_error(exc) is None:
                raise
            log.debug("MQCLOSE failed: %s", exc)


assert {f.name for f in fields(MQMD)} >= {ours for ours, _, _ in _MD_FIELDS}
