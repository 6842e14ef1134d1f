"""The queue-manager port over IBM MQ: queue manager, client connections, queue handles.

Why a thread per connection: an MQI connection handle (hconn) is bound to the thread that
made it (unless shared-handle options are used), and every MQI call blocks (MQGET with a
wait interval for seconds). Each :class:`IBMMQConnection` therefore owns a single-thread
executor; all its MQI calls (:mod:`gateway.mq.ibmmq.mqi`) run there, in order, and the
event loop only awaits them.

Connecting retries with jittered exponential backoff on the reasons that mean "the queue
manager is not reachable yet" (:data:`~gateway.mq.ibmmq.mqi.RECONNECT_REASONS`). A
connection that breaks while in use raises a retriable :class:`MQError`; its unit of work
is lost (MQ backs it out), so the *next* call reconnects and reopens the handles, and the
caller redoes its unit of work. Connection and handle share one module: a handle reopens
itself through its connection's state, and the connection closes its handles.
"""

from __future__ import annotations

import asyncio
import importlib
import logging
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from types import ModuleType, TracebackType
from typing import Any, Self, TypeVar

import gateway.mq.ibmmq.mqi as mqi_calls
from gateway.mq.ibmmq.config import IBMMQConfig, backoff_delays
from gateway.mq.ibmmq.mqi import CONNECT_CAUSES, RECONNECT_REASONS, load_mqi_module, mq_error
from gateway.mq.port import (
    AsyncPutStatus,
    GetOptions,
    Message,
    MQError,
    OpenOption,
    PutItem,
    PutOptions,
    QueueAttr,
    put_each,
    reason_name,
)
from gateway.wire.constants import CompCode
from gateway.wire.mqmd import MQMD
from gateway.wire.reasons import Reason

__all__ = ["IBMMQConnection", "IBMMQQueueHandle", "IBMMQQueueManager"]

#: Reason names the port's table lacks (MQRC_JSSE_ERROR is not in gateway.wire.reasons).
_EXTRA_REASON_NAMES = {2397: "MQRC_JSSE_ERROR"}


def _reason_text(reason: int) -> str:
    """``MQRC_NOT_AUTHORIZED (2035)``."""
    name = _EXTRA_REASON_NAMES.get(reason) or reason_name(reason)
    return f"{name} ({reason})" if not name.isdigit() else f"reason {reason}"

log = logging.getLogger(__name__)
T = TypeVar("T")


class IBMMQQueueManager:
    """Hands out client connections to one IBM MQ queue manager."""

    def __init__(
        self,
        config: IBMMQConfig,
        *,
        mqi: ModuleType | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        import_module: Callable[[str], ModuleType] = importlib.import_module,
    ) -> None:
        """``mqi`` replaces the MQI module outright; else it is imported on first use
        through ``import_module`` (``ibmmq``, then ``pymqi``)."""
        self.config = config
        self._mqi = mqi
        self._sleep = sleep
        self._import_module = import_module
        #: Failed MQCONNX attempts by MQ reason (retried or not), for /metrics.
        self.connect_failures: dict[int, int] = {}

    @property
    def name(self) -> str:
        return self.config.q_mgr_name

    def mqi(self) -> ModuleType:
        if self._mqi is None:
            self._mqi = load_mqi_module(self._import_module)
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
        #: asynchronous puts made under syncpoint in the open unit of work (commit asks
        #: MQSTAT first), and the status MQSTAT returned to such a commit, kept for the
        #: caller's next async_status (MQSTAT resets what it returns)
        self._async_in_uow = False
        self._held_status = AsyncPutStatus()
        #: the failure an MQSTAT read while the unit of work was open (the caller's own
        #: async_status): MQSTAT resets its record, so it is kept here until the unit is
        #: backed out (commit then backs out and fails; only a successful backout clears it)
        self._doomed: AsyncPutStatus | None = None
        #: asynchronous puts made outside a unit of work since the last MQSTAT: before
        #: the next unit's first asynchronous syncpoint put, an MQSTAT takes them out of
        #: the record, so their failures do not back out a unit they are not part of
        self._async_unstated = False

    @property
    def q_mgr_name(self) -> str:
        return self._qm.name

    async def _run(self, fn: Callable[[], T]) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, fn)

    def _connect_once(self) -> Any:
        return mqi_calls.connect_client(self._qm.mqi(), self._qm.config)

    async def _connect(self) -> None:
        """MQCONNX; transient reasons are retried with backoff (one warning line each,
        naming the cause), the others raise at once with the cause in the message."""
        cfg = self._qm.config
        delays = backoff_delays(cfg)
        attempt = 0
        where = f"IBM MQ queue manager {cfg.q_mgr_name} at {cfg.connection_name}"
        while True:
            try:
                self._hconn = await self._run(self._connect_once)
            except MQError:
                raise
            except Exception as exc:
                err = mq_error(exc)
                if err is None:
                    raise
                failures = self._qm.connect_failures
                failures[err.reason] = failures.get(err.reason, 0) + 1
                cause = CONNECT_CAUSES.get(err.reason, "see the queue manager's error log")
                # MQError's own text leads with the reason code and name
                summary = f"{where}: connect failed: {cause}"
                if err.reason not in RECONNECT_REASONS:
                    raise MQError(err.reason, summary, err.comp_code) from None
                if attempt >= len(delays):
                    raise MQError(
                        err.reason,
                        f"{summary}; gave up after {cfg.connect_attempts} attempt(s)",
                        err.comp_code,
                    ) from None
                delay = delays[attempt]
                attempt += 1
                log.warning("%s: connect failed with %s: %s; retrying in %.1fs (attempt %d of %d)",
                            where, _reason_text(err.reason), cause, delay, attempt + 1,
                            cfg.connect_attempts)
                await self._qm._sleep(delay)
                continue
            self._generation += 1
            self._broken = False
            self._in_uow = False
            self._async_in_uow = False
            self._doomed = None  # the unit of work went with the old connection
            self._async_unstated = False
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
            err = mq_error(exc)
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
        raw_md = mqi_calls.md_to_mqi(mqi, md)
        pmo = mqi_calls.put_options(mqi, opts)

        def call() -> None:
            od = mqi_calls.object_descriptor(mqi, q_name, q_mgr_name)
            self._hconn.put1(od, body, raw_md, pmo)

        await self._before_async_put(opts)
        await self._call(call, uow=opts.syncpoint)
        self._after_async_put(opts)
        return mqi_calls.md_from_mqi(raw_md)

    async def _before_async_put(self, opts: PutOptions) -> None:
        """Before the first asynchronous syncpoint put of a unit of work: if asynchronous
        puts outside any unit were made since the last MQSTAT, read MQSTAT now (kept for
        the caller's next async_status), so the commit's MQSTAT counts this unit only."""
        if opts.async_response and opts.syncpoint and not self._async_in_uow \
                and self._async_unstated:
            status = await self._call(lambda: mqi_calls.async_status(self._hconn))
            self._held_status.merge(status)
            self._async_unstated = False

    def _after_async_put(self, opts: PutOptions) -> None:
        if not opts.async_response:
            return
        if opts.syncpoint:
            self._async_in_uow = True
        elif not self._async_in_uow:
            self._async_unstated = True

    async def async_status(self) -> AsyncPutStatus:
        """MQSTAT(MQSTAT_TYPE_ASYNC_ERROR) (``gateway.mq.port.async_put_status``): the
        first failure of the asynchronous puts since the last call, and their counts."""
        read = await self._call(lambda: mqi_calls.async_status(self._hconn))
        if self._async_in_uow and read.put_failure_count and self._doomed is None:
            # MQSTAT has now forgotten this failure; the open unit must not commit
            self._doomed = replace(read)
        if not self._async_in_uow:
            self._async_unstated = False
        status, self._held_status = self._held_status, AsyncPutStatus()
        status.merge(read)
        return status

    async def put_many(
        self, items: Sequence[PutItem], options: PutOptions | None = None
    ) -> list[MQMD | MQError]:
        """``gateway.mq.port.put_many``: one open per queue, one MQPUT per item."""
        return await put_each(self, items, options)

    async def commit(self) -> None:
        if self._async_in_uow:
            # the gateway's rule for asynchronous puts (not IBM's: MQCMIT commits the
            # puts that succeeded): a unit of work with a failed one does not commit.
            # MQSTAT tells, before MQCMIT; a failure an earlier MQSTAT of this unit saw
            # is kept in _doomed. The markers are cleared only once the unit is decided.
            failed = self._doomed
            if failed is None:
                status = await self._call(lambda: mqi_calls.async_status(self._hconn))
                self._held_status.merge(status)
                if status.put_failure_count:
                    failed = self._doomed = replace(status)
            if failed is not None:
                await self.backout()  # clears the markers once it has succeeded
                raise MQError(
                    Reason.BACKED_OUT,
                    f"an asynchronous put to {failed.object_name or 'a queue'} failed with "
                    f"{_reason_text(failed.reason)}; the unit of work was backed out",
                    CompCode.WARNING,
                )
        await self._call(lambda: self._hconn.commit())
        self._in_uow = False
        self._async_in_uow = False

    async def backout(self) -> None:
        await self._call(lambda: self._hconn.backout())
        self._in_uow = False
        self._async_in_uow = False
        self._doomed = None

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
                if mq_error(exc) is None:
                    raise
                log.debug("MQBACK before MQDISC failed: %s", exc)
            hconn.disconnect()

        try:
            if hconn is not None and not self._broken:
                await self._run(call)
        except Exception as exc:
            if mq_error(exc) is None:
                raise
            log.debug("MQDISC failed: %s", exc)
        finally:
            self._closed = True
            self._executor.shutdown(wait=False)


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

        def call() -> tuple[Any, tuple[str, str]]:
            return mqi_calls.open_queue(
                mqi, conn._hconn, spec.q_name, spec.q_mgr_name, int(spec.options)
            )

        hobj, resolved = await conn._call(call)
        self._hobj = hobj
        self._generation = conn._generation
        if resolved[0]:
            self._resolved = (resolved[0], resolved[1] or self._resolved[1])
        return hobj

    async def get(self, options: GetOptions | None = None) -> Message:
        opts = options or GetOptions()
        hobj = await self._ensure_open()
        raw_md, gmo = mqi_calls.get_options(self._conn._qm.mqi(), opts)

        def call() -> bytes:
            return mqi_calls.get_message(hobj, opts.max_length, raw_md, gmo)

        try:
            body = await self._conn._call(call, uow=opts.syncpoint and opts.browse is None)
        except MQError as exc:
            if exc.reason == Reason.TRUNCATED_MSG_FAILED:
                raise MQError(exc.reason, exc.detail, CompCode.WARNING) from exc
            raise
        return Message(mqi_calls.md_from_mqi(raw_md), body)

    async def put(self, md: MQMD, body: bytes, options: PutOptions | None = None) -> MQMD:
        opts = options or PutOptions()
        hobj = await self._ensure_open()
        mqi = self._conn._qm.mqi()
        raw_md = mqi_calls.md_to_mqi(mqi, md)
        pmo = mqi_calls.put_options(mqi, opts)
        await self._conn._before_async_put(opts)
        await self._conn._call(lambda: hobj.put(body, raw_md, pmo), uow=opts.syncpoint)
        self._conn._after_async_put(opts)
        return mqi_calls.md_from_mqi(raw_md)

    async def inquire(self, *selectors: QueueAttr) -> dict[QueueAttr, int | str]:
        hobj = await self._ensure_open()

        def call() -> dict[QueueAttr, int | str]:
            out: dict[QueueAttr, int | str] = {}
            for sel in selectors:
                out[sel] = mqi_calls.inquired_value(sel, hobj.inquire(int(sel)))
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
            if mq_error(exc) is None:
                raise
            log.debug("MQCLOSE failed: %s", exc)

