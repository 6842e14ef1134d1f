"""The seal that tells the gateway's own backlog messages from anything else on a sink's
backlog queue (issue 29).

Why: a sink's backlog queue ``SYSTEM.MQGW.SINK.<instance>`` is sent on to Kafka or MQTT
with the gateway's authority, and its format (``MQGWENV1``, docs/operations.md) is
public. Every MQMD field can be chosen by whoever makes the gateway put a message (a
service route's reply to a named ReplyToQ, a subscriber registration's identity), or by
a local application with the gateway's own user; so an origin check on UserIdentifier,
PutApplName or ApplIdentityData proves nothing. What no outsider has is a secret: each
backlog message carries, in its MQMD AccountingToken, a keyed BLAKE2b of its body
under the gateway's backlog key. The forwarder moves a message whose Format is not
``MQGWENV1`` (MQRC_FORMAT_ERROR 2110) or whose seal does not match (MQRC_NOT_AUTHORIZED
2035) to the dead-letter queue; the queue manager's authority (embedded:
``gateway.mq.embedded.authority``; IBM MQ: ``setmqaut``) keeps other users off the
queue in the first place.

Cost: one keyed hash when a delivery is put on a backlog (0.6 µs for a 100-byte body,
1.5 µs for 1 KB on the build machine); the forwarder checks it only for a message its
envelope cache does not know (a hit proves the body is one this process put), so the
usual path adds one string comparison (the Format).

The key (32 random bytes) is made once, in the file :data:`KEY_FILE` (mode 0600) of
the embedded queue manager's data directory, or of the broker store's directory on IBM
MQ: it must survive restarts with the backlog, and is part of a backup. A worker process
gets it from the main process in its spec (a private pipe).

A key is made when there is none: a new install, or the first start of a version with
the seal on backlogs an older version filled (an upgrade, often while a target is down:
that is why the backlog exists). What is already on the backlogs then carries no seal,
so the start seals it in place before anything is forwarded
(``gateway.runtime.pubsub_service.first_seal``). Until that is done the new key is kept
as :data:`NEW_KEY_FILE` (:attr:`BacklogSeal.new_in`); :func:`keep_new_key` then gives
it its real name. A start cut short meanwhile leaves :data:`NEW_KEY_FILE`, and the next
start finishes the sealing with that same key. The same happens to a backlog restored
without its key: the next start seals what it holds.

The same key authorises the sink commands of ``mqgw streams move``
(:mod:`gateway.runtime.sink_command_seal`, a seal of its own kind): whoever can read it
is the gateway's authority.

A sealed message keeps its seal on the dead-letter queue, so a DLQ handler can put a
refused delivery back on its backlog; the seal binds the body, not the time: someone
who can read the dead-letter queue *and* put to a backlog can replay what was dead-
lettered, nothing else.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import os
from pathlib import Path

from gateway.runtime.backlog_format import BACKLOG_FORMAT
from gateway.wire.mqmd import MQMD
from gateway.wire.reasons import Reason

__all__ = [
    "KEY_FILE",
    "KEY_SIZE",
    "NEW_KEY_FILE",
    "BacklogSeal",
    "keep_new_key",
    "load_backlog_seal",
]

#: The key's file name in its directory (see module docstring).
KEY_FILE = "backlog.key"
#: A key made by a start that has not sealed what was already on the backlogs yet.
NEW_KEY_FILE = "backlog.key.new"
KEY_SIZE = 32
_blake2b = hashlib.blake2b
_same = hmac.compare_digest


class BacklogSeal:
    """Seals backlog message bodies and checks a got message (see module docstring)."""

    __slots__ = ("_key", "interrupted", "new_in")

    def __init__(
        self, key: bytes, new_in: Path | None = None, *, interrupted: bool = False
    ) -> None:
        if len(key) != KEY_SIZE:
            raise ValueError(f"a backlog key has {KEY_SIZE} bytes, not {len(key)}")
        self._key = key
        #: the directory of a key made by this start and not kept yet
        #: (:data:`NEW_KEY_FILE`): what is on the backlogs is sealed with it first,
        #: then :func:`keep_new_key`; None once kept (or a key of this process only)
        self.new_in = new_in
        #: that new key was made by an earlier start, cut short while sealing
        self.interrupted = interrupted

    def __repr__(self) -> str:
        return f"BacklogSeal(new_in={self.new_in!r})"  # never the key

    @property
    def key(self) -> bytes:
        """The key (handed to a worker process in its spec)."""
        return self._key

    def seal(self, body: bytes) -> bytes:
        """The AccountingToken of a backlog message with ``body`` (32 bytes)."""
        return _blake2b(body, key=self._key, digest_size=KEY_SIZE).digest()

    def sealed(self, md: MQMD, body: bytes) -> bool:
        """Whether ``md`` carries this key's seal of ``body`` (Format not checked)."""
        return _same(md.accounting_token, self.seal(body))

    def refusal(self, md: MQMD, body: bytes) -> int:
        """0 when ``md``/``body`` is a backlog message this gateway sealed; otherwise the
        MQDLH reason it is dead-lettered with (2110 wrong Format, 2035 not sealed)."""
        if md.format != BACKLOG_FORMAT:
            return Reason.FORMAT_ERROR
        if not self.sealed(md, body):
            return Reason.NOT_AUTHORIZED
        return 0


def load_backlog_seal(directory: Path) -> BacklogSeal:
    """The seal of the backlog key kept in ``directory`` (:data:`KEY_FILE`). Without
    one: the key a start made and has not kept yet (:data:`NEW_KEY_FILE`), or a new one
    made there (mode 0600, written whole before it is visible under its name); either
    way :attr:`BacklogSeal.new_in` says the backlogs must be sealed with it and the key
    kept (see module docstring). OSError when it cannot be read or made; ValueError when
    a file is not a key (damaged: the operator restores it from the backup, or removes it
    and the next start seals what the backlogs hold with a new key)."""
    path = directory / KEY_FILE
    new_in: Path | None = None
    made = True
    try:
        key = path.read_bytes()
    except FileNotFoundError:
        path, new_in = directory / NEW_KEY_FILE, directory
        key, made = _read_or_make(path)
    else:
        _forget_kept(directory / NEW_KEY_FILE, key)
    if len(key) != KEY_SIZE:
        raise ValueError(f"{path} is not a backlog key ({len(key)} bytes, not {KEY_SIZE})")
    return BacklogSeal(key, new_in, interrupted=not made)


def keep_new_key(seal: BacklogSeal) -> None:
    """Give the new key of ``seal`` its real name (:data:`KEY_FILE`), durably, once what
    was on the backlogs is sealed with it; then :attr:`BacklogSeal.new_in` is None. A
    key already there is kept only if it is this one (ValueError otherwise: another
    process made one meanwhile, and what was sealed here would be refused)."""
    directory = seal.new_in
    if directory is None:
        return
    new, path = directory / NEW_KEY_FILE, directory / KEY_FILE
    try:
        os.link(new, path)
    except FileExistsError:
        if path.read_bytes() != seal.key:
            raise ValueError(f"{path} appeared while the backlogs were sealed with "
                             f"another key ({new})") from None
    os.unlink(new)
    _sync_directory(directory)
    seal.new_in = None


def _forget_kept(new: Path, key: bytes) -> None:
    """Remove ``new`` if it holds ``key``: a start stopped between keeping the new key
    and removing its first name (:func:`keep_new_key`)."""
    with contextlib.suppress(OSError):
        if new.read_bytes() == key:
            new.unlink()


def _read_or_make(path: Path) -> tuple[bytes, bool]:
    """The bytes of ``path`` and whether they were made now (a random key, mode 0600,
    fsynced) because it was missing. Written under a temporary name and linked:
    another process making it meanwhile wins, and its key is used."""
    try:
        return path.read_bytes(), False
    except FileNotFoundError:
        pass
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f".{path.name}.{os.getpid()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, os.urandom(KEY_SIZE))
        os.fsync(fd)
    finally:
        os.close(fd)
    try:
        os.link(tmp, path)  # fails if another process made it meanwhile: use theirs
    except FileExistsError:
        pass
    finally:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
    _sync_directory(path.parent)
    return path.read_bytes(), True


def _sync_directory(directory: Path) -> None:
    """fsync ``directory``: a name linked or removed there survives a power loss."""
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
