"""Reaching a queue manager's data directory for administration, running or stopped.

Why: an operator's command (``mqgw qm ...``, ``mqgw mqsc``) should not care whether the
gateway runs. When a process serves the directory's socket (:mod:`.qm_server`) the
command connects through it; when none does, the command opens the directory itself
(it then owns it for the command's duration, so a gateway cannot start meanwhile).
:func:`open_admin` chooses and says which in :attr:`AdminSession.mode`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from gateway.mq.embedded.client import ClientConnection, connect_local
from gateway.mq.embedded.mqsc_run import format_results
from gateway.mq.embedded.qm_protocol import SOCKET_NAME
from gateway.mq.embedded.qmgr import EmbeddedQueueManager
from gateway.mq.embedded.store import DB_FILE, MessageStore, StoreError
from gateway.mq.port import Connection, MQError
from gateway.wire.reasons import Reason

#: The two ways a command reaches the queue manager.
RUNNING = "running"
STOPPED = "stopped"


class AdminError(Exception):
    """The data directory cannot be administered (none there, held without a socket)."""


def stored_q_mgr_name(data_dir: Path) -> str:
    """The name of the queue manager stored in ``data_dir`` (takes the directory's lock
    for a moment: only call it when no process owns the directory)."""
    store = MessageStore(data_dir)
    try:
        cat = store.load_catalogue()
    finally:
        store.close()
    if cat is None:
        raise AdminError(f"{data_dir} holds no queue manager definitions")
    return cat.q_mgr_name


@dataclass(slots=True)
class AdminSession:
    """A connection to the queue manager of one data directory and how it was reached."""

    mode: str
    data_dir: Path
    conn: Connection
    q_mgr_name: str
    #: the queue manager opened directly (STOPPED mode), closed by :meth:`close`
    qm: EmbeddedQueueManager | None = None
    _extra: list[Connection] = field(default_factory=list)

    @property
    def how(self) -> str:
        """One line for ``-v``: which way the command went."""
        if self.mode == RUNNING:
            return (f"queue manager {self.q_mgr_name} is running: connected through "
                    f"{self.data_dir / SOCKET_NAME}")
        return (f"queue manager {self.q_mgr_name} is not running: opened {self.data_dir} "
                "directly")

    async def connect(self) -> Connection:
        """Another connection (a second unit of work) to the same queue manager."""
        if self.qm is not None:
            conn: Connection = await self.qm.connect()
        else:
            conn = await connect_local(self.data_dir)
        self._extra.append(conn)
        return conn

    async def mqsc(self, script: str) -> tuple[str, bool]:
        """runmqsc: (its output, whether every command succeeded)."""
        if isinstance(self.conn, ClientConnection):
            output, results = await self.conn.mqsc(script)
            return output, all(r["ok"] for r in results)
        assert self.qm is not None
        done = self.qm.run_mqsc(script)
        return format_results(self.q_mgr_name, done), all(r.ok for r in done)

    async def close(self) -> None:
        for conn in [*self._extra, self.conn]:
            with contextlib.suppress(MQError):
                await conn.disconnect()
        if self.qm is not None:
            await self.qm.close()


async def open_admin(
    data_dir: Path,
    *,
    status_reports: dict[str, Callable[[str], list[list[str]]]] | None = None,
    appl_name: str | None = None,
) -> AdminSession:
    """Connect to the queue manager stored in ``data_dir``: through its socket when a
    process serves it, else by opening the directory. ``status_reports`` (DISPLAY SUB,
    PUBSUB providers) are installed on a directly opened queue manager."""
    data_dir = Path(data_dir)
    sock = data_dir / SOCKET_NAME
    if sock.exists():
        try:
            conn = await connect_local(sock, appl_name=appl_name)
        except MQError as exc:
            if exc.reason != Reason.Q_MGR_NOT_AVAILABLE:
                raise
        else:
            return AdminSession(RUNNING, data_dir, conn, conn.q_mgr_name)
    if not (data_dir / DB_FILE).is_file():
        raise AdminError(f"no queue manager in {data_dir} (no {DB_FILE}); is the data "
                         "directory right? (queue_manager.data_dir of the gateway's config)")
    try:
        name = stored_q_mgr_name(data_dir)
        qm = EmbeddedQueueManager(name, data_dir, appl_name=appl_name)
    except StoreError as exc:
        raise AdminError(f"{exc} (its socket {sock} does not answer)") from None
    except MQError as exc:
        raise AdminError(f"{exc.detail} (its socket {sock} does not answer)") from None
    qm.status_reports.update(status_reports or {})
    try:
        conn2 = await qm.connect()
    except BaseException:
        await qm.close()
        raise
    return AdminSession(STOPPED, data_dir, conn2, name, qm)
