"""A standby instance of a node: wait for the data directory's lock, then become active.

``mqgw run --multi-instance`` (IBM MQ's ``strmqm -x``) that finds the lock held waits
here (docs/operations.md, "High availability"). Nothing of the node is opened while it
waits — no queue manager, store, listener, plugin — so it cannot write what the active
instance owns. It answers ``/healthz`` (200, ``"status": "standby"``) and ``/metrics``
(``mqgw_instance_active 0``) on ``metrics.port`` when it can bind it; on the active
instance's host that port is taken, and the standby says so and waits without it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest

from gateway.runtime.config import LoadedConfig
from gateway.runtime.errors import GatewayRuntimeError
from gateway.runtime.instance_lock import (
    InstanceLock,
    InstanceRecord,
    StandbyMarker,
    read_holder,
)
from gateway.runtime.metrics import HealthServer, InstanceCollector, server_ssl_context

__all__ = ["POLL_S", "wait_as_standby"]

log = logging.getLogger(__name__)

#: Seconds between a standby's attempts at the lock (a non-blocking ``F_SETLK``: a
#: blocking wait could not be cancelled by SIGTERM, and NFS clients poll anyway).
POLL_S = 0.25


class StandbyMetrics:
    """``/metrics`` of a standby: its instance series only."""

    def __init__(self, record: InstanceRecord) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.registry.register(InstanceCollector(record, active=False))

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


def _describe(holder: InstanceRecord | None) -> str:
    return holder.describe() if holder is not None else "an instance not yet recorded"


async def _serve_http(
    loaded: LoadedConfig, record: InstanceRecord, directory: Path
) -> HealthServer | None:
    mc = loaded.gateway.metrics
    if not mc.enabled:
        return None

    def health() -> tuple[bool, dict[str, object]]:
        holder = read_holder(directory)
        return True, {
            "status": "standby",
            "gateway": loaded.gateway.gateway_id,
            "instance": {"role": "standby", **record.to_json()},
            "active_instance": holder.to_json() if holder is not None else None,
        }

    try:
        tls = server_ssl_context(mc.tls, loaded.path) if mc.tls else None
    except ValueError as exc:
        raise GatewayRuntimeError(str(exc)) from None
    server = HealthServer(StandbyMetrics(record), health, mc.host, mc.port,
                          ssl_context=tls, auth=mc.auth)
    try:
        await server.start()
    except OSError as exc:
        log.warning(
            "standby: metrics.port %s on %s cannot be used (%s; the active instance's, on "
            "the same host?): no /healthz while waiting; give each instance on one host "
            "its own port (docs/operations.md, \"High availability\")",
            mc.port, mc.host, exc.strerror)
        return None
    log.info("standby: /healthz and /metrics on %s", server.url)
    return server


async def _wait_for_admin_commands(directory: Path, stop: asyncio.Event) -> bool:
    """Holding the node's lock: wait while a command that opened the stopped queue
    manager's directory itself (``mqgw qm ...`` between the active instance's end and
    this takeover) still has it, rather than fail to open it. True once free."""
    from gateway.mq.embedded.store import dir_lock_owner

    owner = dir_lock_owner(directory)
    if owner is None:
        return True
    log.warning("standby: holding the lock on %s, waiting for the command that has the queue "
                "manager's data directory open (%s) to end", directory, owner)
    while not stop.is_set():
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), POLL_S)
        if dir_lock_owner(directory) is None:
            return True
    return False


async def wait_as_standby(
    loaded: LoadedConfig, lock: InstanceLock, stop: asyncio.Event
) -> bool:
    """Wait until ``lock`` is this process's and no administration command holds the
    queue manager's directory (True), or until ``stop`` is set (False).

    Raises GatewayRuntimeError when the active instance does not permit a standby (it
    was started without ``--multi-instance``), as ``strmqm -x`` refuses then.
    """
    directory = lock.directory
    holder = read_holder(directory)
    if holder is not None and not holder.multi_instance:
        raise GatewayRuntimeError(
            f"the data directory {directory} is in use by {holder.describe()}, which was "
            "started without --multi-instance and so permits no standby")
    record = InstanceRecord.of_this_process(True)
    try:
        marker = StandbyMarker(directory, record)
    except OSError as exc:
        raise GatewayRuntimeError(f"cannot write to {directory} ({exc.strerror})") from None
    http: HealthServer | None = None
    try:
        http = await _serve_http(loaded, record, directory)
        log.info("standby: waiting for the lock on %s held by %s", directory, _describe(holder))
        failing = False
        while not stop.is_set():
            try:
                acquired = lock.try_acquire()
                failing = False
            except OSError as exc:  # the shared storage went away: say so once, poll on
                if not failing:
                    log.warning("standby: cannot try the lock on %s (%s); trying on",
                                directory, exc.strerror)
                failing, acquired = True, False
            if acquired:
                return await _wait_for_admin_commands(directory, stop)
            latest = read_holder(directory)
            if latest != holder:  # another takeover meanwhile (a third instance won)
                holder = latest
                log.info("standby: the lock on %s is now held by %s", directory,
                         _describe(holder))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), POLL_S)
        log.info("standby: stopped while waiting for the lock on %s", directory)
        return False
    finally:
        if http is not None:
            await http.stop()
        marker.remove()
