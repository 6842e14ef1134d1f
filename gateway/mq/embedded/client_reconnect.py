"""A local-socket client that reconnects, as an MQ client with MQCNO_RECONNECT_Q_MGR.

Why: the active instance of a multi-instance node can die; its standby takes over and
serves the same queue manager on the same socket (or, listed, another one). An
application given the sockets in order (a connection list) connects to the first that
accepts one and, when the connection breaks, reconnects through the list with a bounded
backoff, reopening its queues, instead of failing for good.

What the application sees is MQ's: a unit of work open when the connection broke was
backed out by the queue manager (its syncpoint gets are back on their queues, its
syncpoint puts gone), so the call that met the break, every later syncpoint put or get
of that unit and its MQCMIT fail with MQRC_BACKED_OUT (2003) until MQCMIT or MQBACK ends
it; the application does the unit again. A put, MQPUT1, get outside syncpoint, MQCMIT or
MQSC command that met the break fails with MQRC_CALL_INTERRUPTED (2549): it may or may
not have been done (a commit's reply lost with the instance), as IBM MQ reports it.
Nothing is retried silently but what has no effect to lose (open, inquire, close,
MQBACK). When no address accepts within ``timeout_s`` the call fails with
MQRC_RECONNECT_FAILED (2548) and the connection is closed. Asynchronous puts are made
synchronously (a put whose outcome would come after the break could not be reported).
A reconnection only to a queue manager of the same name is accepted (a different one
behind a listed socket is refused and the next address tried).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Self, TypeVar

from gateway.mq.conname import MAX_ADDRESSES
from gateway.mq.embedded.client import ClientConnection, ClientQueueHandle, connect_local
from gateway.mq.port import GetOptions, Message, MQError, OpenOption, PutOptions, QueueAttr
from gateway.wire.constants import CompCode
from gateway.wire.mqmd import MQMD
from gateway.wire.reasons import Reason

__all__ = [
    "ReconnectPolicy",
    "ReconnectingConnection",
    "ReconnectingQueueHandle",
    "connect_reconnecting",
    "parse_socket_list",
]

log = logging.getLogger(__name__)

T = TypeVar("T")

#: Seconds one connect attempt (socket and the connect reply) may take.
ATTEMPT_TIMEOUT_S = 10.0


@dataclasses.dataclass(frozen=True, slots=True)
class ReconnectPolicy:
    """How long and how often to try the list again after a break: rounds through every
    address, the wait between rounds doubling from ``initial_s`` up to ``max_s``; given
    up after ``timeout_s`` (IBM MQ's default reconnect timeout is 1800 s)."""

    initial_s: float = 0.1
    max_s: float = 2.0
    timeout_s: float = 1800.0

    def __post_init__(self) -> None:
        if not 0 < self.initial_s <= self.max_s or self.timeout_s <= 0:
            raise ValueError("reconnect policy: 0 < initial_s <= max_s and timeout_s > 0")


def parse_socket_list(text: str) -> list[Path]:
    """``DIR1,DIR2`` (data directories or their ``qm.sock``) -> paths in order; ValueError
    for an empty entry or more than :data:`gateway.mq.conname.MAX_ADDRESSES` of them."""
    entries = text.split(",")
    if len(entries) > MAX_ADDRESSES:
        raise ValueError(f"{len(entries)} queue manager addresses; at most {MAX_ADDRESSES}")
    out: list[Path] = []
    for number, entry in enumerate(entries, 1):
        if not entry.strip():
            raise ValueError(f"queue manager address {number} of {text!r} is empty "
                             "(a stray comma?)")
        out.append(Path(entry.strip()))
    return out


def _addresses(where: Path | str | Sequence[Path | str]) -> list[Path]:
    if isinstance(where, (str, Path)):
        return [Path(where)]
    paths = [Path(p) for p in where]
    if not paths or len(paths) > MAX_ADDRESSES:
        raise ValueError(f"give 1 to {MAX_ADDRESSES} queue manager addresses, not {len(paths)}")
    return paths


async def connect_reconnecting(
    where: Path | str | Sequence[Path | str],
    *,
    appl_name: str | None = None,
    policy: ReconnectPolicy | None = None,
) -> ReconnectingConnection:
    """MQCONNX with MQCNO_RECONNECT_Q_MGR over the first of ``where`` (data directories
    or sockets, tried in order) that accepts. MQError 2059 when none does now (the first
    connect is not retried, as MQ's)."""
    conn = ReconnectingConnection(_addresses(where), appl_name, policy or ReconnectPolicy())
    conn._conn, conn.address = await conn._first_accepting(required_name="")
    conn._q_mgr_name = conn._conn.q_mgr_name
    return conn


class ReconnectingConnection:
    """An hconn over a list of local sockets that survives a takeover (module doc)."""

    def __init__(self, addresses: list[Path], appl_name: str | None,
                 policy: ReconnectPolicy) -> None:
        self.addresses = addresses
        self.appl_name = appl_name
        self.policy = policy
        #: the address of the current connection; how many times it reconnected
        self.address = addresses[0]
        self.reconnects = 0
        self._conn: ClientConnection | None = None
        self._q_mgr_name = ""
        self._generation = 0
        self._in_uow = False
        self._uow_backed_out = False
        self._closed = False
        self._lock = asyncio.Lock()

    @property
    def q_mgr_name(self) -> str:
        return self._q_mgr_name

    @property
    def user(self) -> str:
        return self._conn.user if self._conn is not None else ""

    @property
    def async_put_supported(self) -> bool:
        return False

    async def _first_accepting(self, required_name: str) -> tuple[ClientConnection, Path]:
        """One round through the list: the first address serving the queue manager."""
        failure: MQError | None = None
        for path in self.addresses:
            try:
                # asyncio.timeout, not wait_for: on Python 3.11 wait_for can lose a
                # cancellation that arrives as the connect fails at once
                async with asyncio.timeout(ATTEMPT_TIMEOUT_S):
                    conn = await connect_local(path, appl_name=self.appl_name)
            except MQError as exc:
                failure = exc
                continue
            except TimeoutError:
                failure = MQError(Reason.Q_MGR_NOT_AVAILABLE,
                                  f"{path}: no connect reply in {ATTEMPT_TIMEOUT_S:.0f} s")
                continue
            except OSError as exc:  # not a socket, a path too long, ...
                failure = MQError(Reason.Q_MGR_NOT_AVAILABLE, f"{path}: {exc}")
                continue
            if required_name and conn.q_mgr_name != required_name:
                await conn.disconnect()
                failure = MQError(Reason.Q_MGR_NAME_ERROR,
                                  f"{path} serves queue manager {conn.q_mgr_name}, not "
                                  f"{required_name}: not reconnected there")
                continue
            return conn, path
        assert failure is not None
        raise failure

    async def _reconnect(self, generation: int) -> None:
        """Connect again through the list (once per break: callers that met the same
        break wait for the first one's reconnection)."""
        async with self._lock:
            if self._generation != generation or self._closed:
                return
            deadline = time.monotonic() + self.policy.timeout_s
            delay = self.policy.initial_s
            log.warning("connection to queue manager %s lost; reconnecting through %s",
                        self._q_mgr_name, ", ".join(str(p) for p in self.addresses))
            while True:
                if self._closed:  # disconnected by the application meanwhile
                    raise MQError(Reason.HCONN_ERROR, "the connection has been disconnected")
                try:
                    conn, path = await self._first_accepting(self._q_mgr_name)
                except MQError as exc:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        self._closed = True
                        raise MQError(Reason.RECONNECT_FAILED,
                                      f"queue manager {self._q_mgr_name} not reached again "
                                      f"within {self.policy.timeout_s:g} s: {exc.detail}"
                                      ) from None
                    await asyncio.sleep(min(delay, left))
                    delay = min(delay * 2, self.policy.max_s)
                    continue
                break
            if self._closed:
                await conn.disconnect()
                raise MQError(Reason.HCONN_ERROR, "the connection has been disconnected")
            self._conn, self.address = conn, path
            self._generation += 1
            self.reconnects += 1
            log.warning("reconnected to queue manager %s through %s", self._q_mgr_name, path)

    async def _current(self) -> tuple[ClientConnection, int]:
        if self._closed:
            raise MQError(Reason.HCONN_ERROR, "the connection has been disconnected")
        generation = self._generation
        assert self._conn is not None
        if self._conn.broken:  # broken between calls: reconnect before this one
            self._broken(uow_call=False)
            await self._reconnect(generation)
            assert self._conn is not None
        return self._conn, self._generation

    def _broken(self, uow_call: bool) -> None:
        """The connection broke with a unit of work open: it is backed out."""
        if self._in_uow or uow_call:
            self._uow_backed_out = True
        self._in_uow = False

    async def _do(self, call: Callable[[ClientConnection, int], Awaitable[T]], *,
                  kind: str) -> T:
        """Run ``call`` on the current connection. ``kind``: ``uow`` (a syncpoint put or
        get), ``unsure`` (an effect that may be lost or done), ``safe`` (none: retried
        once on the new connection)."""
        conn, generation = await self._current()
        if kind == "uow" and self._uow_backed_out:
            raise MQError(Reason.BACKED_OUT, "the unit of work was backed out when the "
                          "connection to the queue manager broke; MQBACK (or MQCMIT) ends it")
        if kind == "uow":
            self._in_uow = True  # before the call: it may start the unit unseen
        try:
            return await call(conn, generation)
        except MQError as exc:
            if not conn.broken or self._closed:
                raise
            broken = exc
        self._broken(kind == "uow")
        await self._reconnect(generation)
        if kind == "safe":
            conn, generation = await self._current()
            return await call(conn, generation)
        if kind == "uow":
            raise MQError(Reason.BACKED_OUT, "the connection to the queue manager broke: "
                          f"the unit of work was backed out ({broken.detail}); reconnected "
                          f"through {self.address}")
        raise MQError(Reason.CALL_INTERRUPTED, "the connection to the queue manager broke "
                      f"during the call ({broken.detail}); reconnected through "
                      f"{self.address}: whether it was done is not known")

    async def open(self, q_name: str, options: OpenOption,
                   q_mgr_name: str = "") -> ReconnectingQueueHandle:
        async def call(conn: ClientConnection, generation: int) -> ReconnectingQueueHandle:
            inner = await conn.open(q_name, options, q_mgr_name)
            return ReconnectingQueueHandle(self, inner, generation, options, q_mgr_name)
        return await self._do(call, kind="safe")

    async def put1(self, q_name: str, md: MQMD, body: bytes,
                   options: PutOptions | None = None, q_mgr_name: str = "") -> MQMD:
        opts = dataclasses.replace(options or PutOptions(), async_response=False)

        async def call(conn: ClientConnection, _: int) -> MQMD:
            return await conn.put1(q_name, md, body, opts, q_mgr_name)
        return await self._do(call, kind="uow" if opts.syncpoint else "unsure")

    async def commit(self) -> None:
        await self._current()  # a break since the last call backed the unit out
        if self._uow_backed_out:
            self._uow_backed_out = self._in_uow = False
            raise MQError(Reason.BACKED_OUT, "the unit of work was backed out when the "
                          "connection to the queue manager broke", CompCode.WARNING)

        async def call(conn: ClientConnection, _: int) -> None:
            await conn.commit()
        try:
            await self._do(call, kind="unsure")
        finally:  # committed, backed out or not known (2549): the unit is over
            self._in_uow = self._uow_backed_out = False

    async def backout(self) -> None:
        async def call(conn: ClientConnection, _: int) -> None:
            await conn.backout()
        await self._do(call, kind="safe")
        self._in_uow = self._uow_backed_out = False

    async def mqsc(self, script: str) -> tuple[str, list[dict[str, Any]]]:
        async def call(conn: ClientConnection, _: int) -> tuple[str, list[dict[str, Any]]]:
            return await conn.mqsc(script)
        return await self._do(call, kind="unsure")

    async def disconnect(self) -> None:
        """MQDISC (an open unit of work is backed out by the server); no reconnection."""
        if self._closed:
            return
        self._closed = True
        if self._conn is not None:
            await self._conn.disconnect()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None:
        await self.disconnect()


class ReconnectingQueueHandle:
    """An open queue of a :class:`ReconnectingConnection`, opened again (same name and
    options) on the first call after a reconnection. A browse cursor starts again."""

    def __init__(self, conn: ReconnectingConnection, inner: ClientQueueHandle,
                 generation: int, options: OpenOption, q_mgr_name: str) -> None:
        self._conn = conn
        self._inner = inner
        self._generation = generation
        self._options = options
        self._q_mgr_name = q_mgr_name
        self._open = True

    @property
    def name(self) -> str:
        return self._inner.name

    @property
    def resolved_q_name(self) -> str:
        return self._inner.resolved_q_name

    @property
    def resolved_q_mgr_name(self) -> str:
        return self._inner.resolved_q_mgr_name

    async def _handle(self, conn: ClientConnection, generation: int) -> ClientQueueHandle:
        if not self._open:
            raise MQError(Reason.HOBJ_ERROR, f"queue {self.name} has been closed")
        if generation != self._generation:  # reconnected since: open it there
            self._inner = await conn.open(self._inner.name, self._options, self._q_mgr_name)
            self._generation = generation
        return self._inner

    async def get(self, options: GetOptions | None = None) -> Message:
        opts = options or GetOptions()

        async def call(conn: ClientConnection, generation: int) -> Message:
            return await (await self._handle(conn, generation)).get(opts)
        return await self._conn._do(call, kind="uow" if opts.syncpoint else "unsure")

    async def get_batch(self, options: GetOptions | None = None, max_msgs: int = 1, *,
                        compact: bool = True) -> list[Message]:
        opts = options or GetOptions()

        async def call(conn: ClientConnection, generation: int) -> list[Message]:
            return await (await self._handle(conn, generation)).get_batch(
                opts, max_msgs, compact=compact)
        return await self._conn._do(call, kind="uow" if opts.syncpoint else "unsure")

    async def put(self, md: MQMD, body: bytes, options: PutOptions | None = None) -> MQMD:
        opts = dataclasses.replace(options or PutOptions(), async_response=False)

        async def call(conn: ClientConnection, generation: int) -> MQMD:
            return await (await self._handle(conn, generation)).put(md, body, opts)
        return await self._conn._do(call, kind="uow" if opts.syncpoint else "unsure")

    async def inquire(self, *selectors: QueueAttr) -> dict[QueueAttr, int | str]:
        async def call(conn: ClientConnection, generation: int) -> dict[QueueAttr, int | str]:
            return await (await self._handle(conn, generation)).inquire(*selectors)
        return await self._conn._do(call, kind="safe")

    async def close(self) -> None:
        if not self._open:
            return
        inner, generation = self._inner, self._generation
        self._open = False
        if self._conn._closed or self._conn._generation != generation:
            return  # its connection is gone, and the handle with it
        with contextlib.suppress(MQError):
            await inner.close()
