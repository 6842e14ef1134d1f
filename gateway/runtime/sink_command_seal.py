"""The seal that makes a RegSub/DeregSub naming a sink's backlog queue the gateway's
own (``mqgw streams move``, step ``sinks``; docs/security.md, "Sink subscriptions").

Why a secret, not an identity: a sink sends on to Kafka or MQTT with the gateway's
authority, so whoever changes its subscriptions chooses what the gateway sends there.
Every MQMD field can be chosen by a party the gateway must not trust: a message
arriving over a channel is put with all its context as the sender wrote it (its
UserIdentifier may be the gateway's own user, its ReplyToQMgr any name). What no outsider
has is the gateway's backlog key (:mod:`gateway.runtime.backlog_seal`, 0600 in the
embedded queue manager's data directory): whoever can read that directory is the
gateway's authority, whatever user runs the command. So the move reads each node's key
and seals each command: the MQMD AccountingToken carries a keyed BLAKE2b of the
command's MsgId, PutDate, PutTime and body (personalised, so neither a sealed backlog
message nor a command is the other's seal). The broker takes a command only when the
seal matches and its put time is within :data:`MAX_AGE_S` of its clock: a captured
command can be replayed only that long (each is idempotent: the move's own replay is
harmless).

Pure: the clock is given; the caller reads the key.
"""

from __future__ import annotations

import hashlib
import hmac
import time
from collections.abc import Callable

from gateway.wire.mqmd import MQMD
from gateway.wire.put_time import put_date_time, put_time_ms

__all__ = ["MAX_AGE_S", "SinkCommandCheck", "command_seal", "seal_command"]

#: Seconds a sealed command's put time may be from the broker's clock (either way).
MAX_AGE_S = 300.0
#: BLAKE2b personalisation: a command's seal is never a backlog message's.
_PERSON = b"mqgw-sink-cmd"
_SEAL_SIZE = 32


def command_seal(key: bytes, md: MQMD, body: bytes) -> bytes:
    """The AccountingToken of a sink command ``md``/``body`` under ``key``."""
    h = hashlib.blake2b(key=key, digest_size=_SEAL_SIZE, person=_PERSON)
    h.update(bytes(md.msg_id).ljust(24, b"\0")[:24])
    h.update(f"{md.put_date:8.8}{md.put_time:8.8}".encode("utf-8", "replace"))
    h.update(body)
    return h.digest()


def seal_command(key: bytes, md: MQMD, body: bytes, now: float) -> None:
    """Stamp ``md`` with the put time ``now`` and seal it (put it with all context set:
    the queue manager keeps the stamp)."""
    md.put_date, md.put_time = put_date_time(now)
    md.accounting_token = command_seal(key, md, body)


class SinkCommandCheck:
    """The broker's check of a sink command: "" when sealed with ``key`` and put within
    :data:`MAX_AGE_S` of ``clock()``, else why not (for the refusal)."""

    __slots__ = ("_key", "clock", "max_age")

    def __init__(self, key: bytes, clock: Callable[[], float] = time.time,
                 max_age: float = MAX_AGE_S) -> None:
        self._key = key
        self.clock = clock
        self.max_age = max_age

    def __repr__(self) -> str:
        return f"SinkCommandCheck(max_age={self.max_age!r})"  # never the key

    def __call__(self, md: MQMD, body: bytes) -> str:
        if not hmac.compare_digest(bytes(md.accounting_token), command_seal(self._key, md, body)):
            return "not sealed with this gateway's backlog key"
        put_ms = put_time_ms(md.put_date, md.put_time)
        if put_ms is None:
            return "no put time"
        age = self.clock() - put_ms / 1000
        if abs(age) > self.max_age:
            return (f"put {age:.0f} s from now, more than {self.max_age:g} s (a stale or "
                    "replayed command)")
        return ""
