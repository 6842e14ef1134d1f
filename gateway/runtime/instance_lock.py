"""Which instance of a gateway node is active: the holder of the node directory's lock.

A node (one configuration, one data directory on storage every instance reaches) runs
one **active** instance at a time; a second ``mqgw run --multi-instance`` waits as a
**standby** until the lock is free, as IBM MQ's multi-instance queue managers do
(``strmqm -x``; docs/operations.md, "High availability").

The lock is a POSIX record lock (``fcntl.lockf``, i.e. ``F_SETLK`` on the whole file)
on ``mqgw.instance.lock``: the kernel releases it when the holder's process ends, SIGKILL
included, and NFSv4 keeps it on the server (lease-based: a host that dies loses it when
its lease expires, by default 90 s); ``flock`` on NFS depends on the client (Linux maps
it to a record lock, others keep it local), so it is not what instances on two hosts can
rely on. A stopped (SIGSTOP) or hung holder keeps its lock: a standby never takes over
from an instance that could wake up and write.

POSIX record locks belong to the process and end when *any* descriptor of the file in
that process is closed, so the lock file is opened once, by :class:`InstanceLock`, and
never read: who holds it (host, pid, since when) is in the side file
``mqgw.instance.json``, written atomically by the holder once it has the lock. Each
waiting standby locks a file of its own (``mqgw.standby.<host>.<pid>.lock``) so
``mqgw status`` tells a live standby from one that died.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from pydantic import ConfigDict, with_config
from typing_extensions import TypedDict

__all__ = [
    "HOLDER_FILE",
    "LOCK_FILE",
    "InstanceJson",
    "InstanceLock",
    "InstanceRecord",
    "NodeStatusJson",
    "StandbyMarker",
    "is_locked",
    "live_standbys",
    "read_holder",
]

LOCK_FILE = "mqgw.instance.lock"
HOLDER_FILE = "mqgw.instance.json"
STANDBY_PREFIX = "mqgw.standby."
#: Bound on what is read of a record (it is a few dozen bytes; the directory is shared).
RECORD_MAX = 4096


@with_config(ConfigDict(use_attribute_docstrings=True))
class InstanceJson(TypedDict):
    """One instance of the node (also in ``/healthz`` as ``instance``)."""

    host: str
    """The host name it runs on."""
    pid: int
    """Its process id on that host."""
    since: float
    """When it became active, or began waiting as a standby (seconds since the epoch)."""
    multi_instance: bool
    """Started with ``--multi-instance``: it permits a standby."""


@with_config(ConfigDict(use_attribute_docstrings=True))
class NodeStatusJson(TypedDict):
    """The node's instances as ``mqgw status --json`` prints them."""

    gateway: str
    """The gateway's id."""
    data_directory: str
    """The directory whose lock makes an instance active."""
    active: InstanceJson | None
    """The instance holding the lock; null when none does."""
    last_active: InstanceJson | None
    """When none holds it: the last one recorded that ended without a clean stop (a
    clean stop removes its record); null otherwise."""
    standbys: list[InstanceJson]
    """The standbys waiting for the lock."""


@dataclass(frozen=True, slots=True)
class InstanceRecord:
    """One instance of a node: where it runs and since when (Unix time) it is active or
    waiting; ``multi_instance``: started with ``--multi-instance`` (permits a standby)."""

    host: str
    pid: int
    since: float
    multi_instance: bool

    @classmethod
    def of_this_process(cls, multi_instance: bool) -> InstanceRecord:
        return cls(socket.gethostname(), os.getpid(), time.time(), multi_instance)

    def describe(self) -> str:
        """``pid N on host H since <ISO time>``: for logs and ``mqgw status``."""
        stamp = datetime.fromtimestamp(self.since, UTC).isoformat(timespec="seconds")
        return f"pid {self.pid} on host {self.host} since {stamp}"

    def to_json(self) -> InstanceJson:
        return InstanceJson(host=self.host, pid=self.pid, since=self.since,
                            multi_instance=self.multi_instance)

    @classmethod
    def parse(cls, text: str) -> InstanceRecord | None:
        """The record in ``text``; None for anything else (a torn or foreign file)."""
        try:
            raw = json.loads(text)
            return cls(str(raw["host"])[:255], int(raw["pid"]), float(raw["since"]),
                       bool(raw["multi_instance"]))
        except (ValueError, TypeError, KeyError):
            return None


def _read_record(path: Path) -> InstanceRecord | None:
    try:
        with path.open("rb") as f:
            return InstanceRecord.parse(f.read(RECORD_MAX).decode("utf-8", "replace"))
    except OSError:
        return None


def _write_atomically(path: Path, text: str) -> None:
    temp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with temp.open("w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(temp, path)


def read_holder(directory: Path) -> InstanceRecord | None:
    """The last active instance's record (it may have ended since: see :func:`is_locked`)."""
    return _read_record(directory / HOLDER_FILE)


def _probe(path: Path) -> bool:
    """Whether another process holds a lock on ``path``. Only for processes that hold
    no lock on it themselves (closing the probe's descriptor would drop theirs)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return False
    try:
        fcntl.lockf(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError:
        return True
    else:
        fcntl.lockf(fd, fcntl.LOCK_UN)
        return False
    finally:
        os.close(fd)


def is_locked(directory: Path) -> bool:
    """Whether an instance holds the node directory's lock (for ``mqgw status``: a
    probe takes a shared lock for an instant, which a standby's next poll outlasts)."""
    return _probe(directory / LOCK_FILE)


def live_standbys(directory: Path) -> list[InstanceRecord]:
    """The standbys waiting on ``directory`` (their marker locked); markers of standbys
    that died are left for :class:`StandbyMarker` of the same host and pid to replace."""
    out: list[InstanceRecord] = []
    with contextlib.suppress(OSError):
        for path in sorted(directory.glob(f"{STANDBY_PREFIX}*.lock"))[:100]:
            record = _read_record(path)
            if record is not None and _probe(path):
                out.append(record)
    return out


class InstanceLock:
    """The node directory's lock, held by this process while it is the active instance."""

    def __init__(self, directory: Path, record: InstanceRecord) -> None:
        self.directory = directory
        self.record = record
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def try_acquire(self) -> bool:
        """Take the lock if it is free (never waits); once taken, record this instance
        as the holder, its ``since`` the moment it became active."""
        if self._fd is not None:
            return True
        fd = os.open(self.directory / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            return False
        record = InstanceRecord(self.record.host, self.record.pid, time.time(),
                                self.record.multi_instance)
        try:
            _write_atomically(self.directory / HOLDER_FILE, json.dumps(record.to_json()))
        except OSError:
            # not active without its record: give the lock back, so no instance ever runs
            # under the previous holder's record (the caller sees the error)
            os.close(fd)
            raise
        self._fd, self.record = fd, record
        return True

    def still_held(self) -> bool:
        """Whether the lock is still this process's, as far as the filesystem can say.

        On a local filesystem only the process's end releases it. On NFS the server
        releases a lock whose client lost its lease (a host cut off from the server for
        longer than the lease time, 90 s by default) and may give it to a standby; the
        Linux client then fails every write through the old descriptor (EIO). So the
        active instance writes and flushes a byte of the lock file now and then, and ends
        when that fails (:func:`gateway.runtime.run`), as IBM MQ's multi-instance queue
        managers check that they still own their lock."""
        if self._fd is None:
            return False
        try:
            os.pwrite(self._fd, b"\n", 0)
            os.fsync(self._fd)
        except OSError:
            return False
        return True

    def release(self) -> None:
        """Give the lock up (a clean stop). The holder record goes first, while the lock
        still keeps any other instance from writing its own."""
        if self._fd is None:
            return
        if read_holder(self.directory) == self.record:
            with contextlib.suppress(OSError):
                (self.directory / HOLDER_FILE).unlink()
        os.close(self._fd)  # closing the descriptor releases the record lock
        self._fd = None


class StandbyMarker:
    """A waiting standby's own locked file, so ``mqgw status`` lists it while it lives."""

    def __init__(self, directory: Path, record: InstanceRecord) -> None:
        safe_host = "".join(c if c.isalnum() or c in "-_" else "_" for c in record.host)
        self.path = directory / f"{STANDBY_PREFIX}{safe_host[:64]}.{record.pid}.lock"
        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            fcntl.lockf(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            os.write(self._fd, json.dumps(record.to_json()).encode())
        except OSError:
            os.close(self._fd)
            raise

    def remove(self) -> None:
        with contextlib.suppress(OSError):
            self.path.unlink()
        os.close(self._fd)
