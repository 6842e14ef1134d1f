"""Message context and identifiers the queue manager fills at MQPUT.

IBM MQ "MQMD - Message descriptor", context fields: PutDate (YYYYMMDD) and PutTime
(HHMMSSTH) in UTC, PutApplName (28 chars), UserIdentifier (12 chars), PutApplType
MQAT_UNIX (6) on Linux. MsgId is 24 bytes unique within and across queue managers. MQ's form is
``AMQ <qmgr-name-12><8-byte counter>``; names sharing their first 12 characters
(``GATEWAY.EUROPE.1``/``GATEWAY.EUROPE.2``) would then share a prefix, so ours is
``AMQ <name-4><hash of the full name, 4><random per instance, 4><counter, 8>``, the
counter starting from the clock so it keeps rising across restarts.
"""

from __future__ import annotations

import hashlib
import itertools
import os
import pwd
import sys
import time

from gateway.wire.constants import PutApplType
from gateway.wire.mqmd import MQMD
from gateway.wire.put_time import put_date_time


def process_appl_name() -> str:
    """The last 28 characters of the program's name, as MQ records PutApplName."""
    name = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else "python"
    return name[-28:]


def process_user() -> str:
    """The process's user name from the account database (as the local socket names its
    peers), not from $USER/$LOGNAME, which a caller's environment can change."""
    try:
        user = pwd.getpwuid(os.getuid()).pw_name
    except KeyError:
        user = str(os.getuid())
    return user[:12]


class MsgIdGenerator:
    """24-byte message identifiers: b"AMQ " + 4 name characters (an operator's hint) +
    4 bytes hashing the full name + 4 random bytes per instance + an 8-byte counter."""

    def __init__(self, q_mgr_name: str) -> None:
        name = q_mgr_name.encode("utf-8")
        self._prefix = (b"AMQ " + q_mgr_name.encode("ascii", "replace")[:4].ljust(4)
                        + hashlib.blake2b(name, digest_size=4).digest() + os.urandom(4))
        self._counter = itertools.count(time.time_ns() // 1000)

    def __call__(self) -> bytes:
        return self._prefix + next(self._counter).to_bytes(8, "big")


class PutContext:
    """The context one queue manager stamps on messages (fixed per process)."""

    def __init__(self, appl_name: str | None = None, user: str | None = None) -> None:
        self.appl_name = process_appl_name() if appl_name is None else appl_name[:28]
        self.user = process_user() if user is None else user[:12]

    def fill(self, md: MQMD, now: float, *, set_all: bool, set_identity: bool) -> None:
        """Set the context fields MQ sets unless the putter supplied them (SET_*_CONTEXT)."""
        if set_all:
            return
        if not set_identity:
            md.user_identifier = self.user
            md.accounting_token = bytes(32)
            md.appl_identity_data = ""
        md.put_appl_type = PutApplType.UNIX
        md.put_appl_name = self.appl_name
        md.put_date, md.put_time = put_date_time(now)
        md.appl_origin_data = ""
