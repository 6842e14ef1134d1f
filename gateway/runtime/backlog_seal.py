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
MQ: it must survive restarts with the backlog, and is part of a backup (a backlog
restored without its key is dead-lettered, 2035, not lost). A worker process gets it
from the main process in its spec (a private pipe).

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

__all__ = ["KEY_FILE", "KEY_SIZE", "BacklogSeal", "load_backlog_key"]

#: The key's file name in its directory (see module docstring).
KEY_FILE = "backlog.key"
KEY_SIZE = 32
_blake2b = hashlib.blake2b
_same = hmac.compare_digest


class BacklogSeal:
    """Seals backlog message bodies and checks a got message (see module docstring)."""

    __slots__ = ("_key",)

    def __init__(self, key: bytes) -> None:
        if len(key) != KEY_SIZE:
            raise ValueError(f"a backlog key has {KEY_SIZE} bytes, not {len(key)}")
        self._key = key

    @property
    def key(self) -> bytes:
        """The key (handed to a worker process in its spec)."""
        return self._key

    def seal(self, body: bytes) -> bytes:
        """The AccountingToken of a backlog message with ``body`` (32 bytes)."""
        return _blake2b(body, key=self._key, digest_size=KEY_SIZE).digest()

    def refusal(self, md: MQMD, body: bytes) -> int:
        """0 when ``md``/``body`` is a backlog message this gateway sealed; otherwise the
        MQDLH reason it is dead-lettered with (2110 wrong Format, 2035 not sealed)."""
        if md.format != BACKLOG_FORMAT:
            return Reason.FORMAT_ERROR
        if not _same(md.accounting_token, self.seal(body)):
            return Reason.NOT_AUTHORIZED
        return 0


def load_backlog_key(directory: Path) -> bytes:
    """The backlog key kept in ``directory`` (:data:`KEY_FILE`), made on first use
    (mode 0600, written whole before it is visible under its name). OSError when it
    cannot be read or made; ValueError when the file is not a key (damaged: the
    operator restores it from the backup, or removes it and accepts that what is on the
    backlogs now is dead-lettered)."""
    path = directory / KEY_FILE
    try:
        key = path.read_bytes()
    except FileNotFoundError:
        directory.mkdir(parents=True, exist_ok=True)
        new = directory / f".{KEY_FILE}.{os.getpid()}"
        fd = os.open(new, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.write(fd, os.urandom(KEY_SIZE))
            os.fsync(fd)
        finally:
            os.close(fd)
        try:
            os.link(new, path)  # fails if another process made it meanwhile: use theirs
        except FileExistsError:
            pass
        finally:
            with contextlib.suppress(OSError):
                os.unlink(new)
        key = path.read_bytes()
    if len(key) != KEY_SIZE:
        raise ValueError(f"{path} is not a backlog key ({len(key)} bytes, not {KEY_SIZE})")
    return key
