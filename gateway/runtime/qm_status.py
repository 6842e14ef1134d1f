"""DISPLAY SUB and DISPLAY PUBSUB for the embedded queue manager's MQSC.

Why here: the broker's subscriptions and neighbours live in the gateway's stores
(``broker.store`` and the neighbours database beside it), which the queue manager
package does not know. The running gateway registers these providers on its queue
manager; ``mqgw qm mqsc -c CONFIG`` registers them on a directly opened one. Both read
the files (SQLite WAL: a reader beside the running gateway sees committed state).
``serve_local_socket`` does that registration and opens the local socket, for ``mqgw run``
and ``mqgw broker`` alike.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gateway.mq.embedded.qm_server import QueueManagerServer
    from gateway.mq.embedded.qmgr import EmbeddedQueueManager

__all__ = ["broker_status_reports", "serve_local_socket"]

Provider = Callable[[str], list[list[str]]]


def _matches(name: str, pattern: str) -> bool:
    return name.startswith(pattern[:-1]) if pattern.endswith("*") else name == pattern


def broker_status_reports(store_path: Path) -> dict[str, Provider]:
    """``{"SUB": ..., "PUBSUB": ...}`` reading the broker store ``store_path``."""
    return {"SUB": lambda pattern: display_sub(store_path, pattern),
            "PUBSUB": lambda pattern: display_pubsub(store_path, pattern)}


async def serve_local_socket(
    qm: EmbeddedQueueManager, store_path: Path, *, runner: str, log: logging.Logger
) -> QueueManagerServer | None:
    """The embedded queue manager's local socket (docs/embedded-qm.md), with DISPLAY
    SUB/PUBSUB answered from the broker store ``store_path``: ``mqgw qm`` and separate MQ
    programs reach the running ``runner`` (gateway or broker) through it. One that cannot
    be made is logged on the runner's ``log``, not fatal: the runner's own traffic does
    not need it."""
    from gateway.mq.embedded.qm_server import QueueManagerServer

    qm.status_reports.update(broker_status_reports(store_path))
    server = QueueManagerServer(qm)
    try:
        await server.start()
    except OSError as exc:
        log.error("queue manager %s: no local socket (mqgw qm cannot reach it while the "
                  "%s runs): %s", qm.name, runner, exc)
        return None
    return server


def display_sub(store_path: Path, pattern: str) -> list[list[str]]:
    """One row per subscription whose name (or ``stream:topic`` when unnamed) matches."""
    from gateway.pubsub.sqlite_store import SqliteStore

    if not store_path.is_file():
        return []
    store = SqliteStore(store_path)
    try:
        subs = store.load().subscriptions
    finally:
        store.close()
    rows = []
    for s in sorted(subs, key=lambda s: (s.stream, s.topic, str(s.destination))):
        name = s.sub_name or f"{s.stream}:{s.topic}"
        if not _matches(name, pattern):
            continue
        d = s.destination
        dest = [f"DEST({d.queue})", f"DESTQMGR({d.q_mgr})"] if not d.is_sink \
            else [f"DEST(sink:{d.sink})", "DESTQMGR()"]
        rows.append([f"SUB({name})", f"STREAM({s.stream})", f"TOPICSTR({s.topic})",
                     *dest, f"SCHEME({s.scheme.name})", f"USERDATA({s.sub_user_data})",
                     f"SUBUSER({s.user_identifier})",
                     f"STATUS({'SUSPENDED' if s.suspended else 'ACTIVE'})"])
    return rows


def display_pubsub(store_path: Path, pattern: str) -> list[list[str]]:
    """One row per neighbour broker (issue 13's neighbours database)."""
    from gateway.runtime.neighbours.state import NeighbourState, neighbours_db_of
    from gateway.runtime.neighbours.status import neighbour_status

    db = neighbours_db_of(store_path)
    if not db.is_file():
        return []
    state = NeighbourState(db)
    try:
        items = neighbour_status(state, time.time())
    finally:
        state.close()
    rows = []
    for item in items:
        if not _matches(item["q_mgr"], pattern):
            continue
        age = item["last_heard_age"]
        rows.append([f"QMNAME({item['q_mgr']})", f"TYPE({item['role'].upper()})",
                     f"STATUS({item['state'].upper()})", f"KIND({item['kind']})",
                     f"HEARD({'NEVER' if age is None else f'{age:.0f}s'})",
                     f"PROXYSUBS({item['proxy_subscriptions']})",
                     f"STREAMS({','.join(item['common_streams'])})"])
    return rows
