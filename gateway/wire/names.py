"""MQ object names: what a queue or queue-manager name may be (1 to 48 characters of
``A-Z a-z 0-9 . / _ %``; MQI fields pad them with trailing blanks).

Why here, at the bottom: a name that arrives inside a message (a subscriber queue in a
RegSub, a stream a neighbour announces) is checked before anything is stored or opened
with it -- a longer name is cut to 48 bytes by the MQI field it is put in, so the name
checked would not be the name opened.
"""

from __future__ import annotations

import re

from gateway.wire.constants import Q_NAME_LENGTH

__all__ = ["MQ_NAME_CHARS", "name_problem"]

#: The characters of an MQ object name.
MQ_NAME_CHARS = "A-Z a-z 0-9 . / _ %"
_NAME = re.compile(r"[A-Za-z0-9._/%]+")


def name_problem(name: str, what: str = "queue name", limit: int = Q_NAME_LENGTH) -> str:
    """Why ``name`` (trailing blanks ignored, as MQ pads names) is no MQ object name, or
    "" when it is one."""
    text = name.rstrip(" ")
    if not text:
        return f"the {what} is blank"
    if len(text) > limit:
        return f"the {what} {text[:limit]!r}... is longer than {limit} characters"
    if not _NAME.fullmatch(text):
        return f"the {what} {text!r} has characters MQ does not allow (only {MQ_NAME_CHARS})"
    return ""
