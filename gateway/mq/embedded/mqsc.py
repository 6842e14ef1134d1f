"""The MQSC language the embedded queue manager understands: keywords and the parser.

Supported (IBM MQ "MQSC commands" reference):
``DEFINE QLOCAL|QALIAS|QREMOTE(name) [attrs] [REPLACE|NOREPLACE]``, ``ALTER`` of the same,
``DELETE QLOCAL|QALIAS|QREMOTE(name) [PURGE|NOPURGE]``, ``DISPLAY Q|QUEUE|QLOCAL|QALIAS|
QREMOTE(generic*) [ALL|attr ...]``, ``ALTER QMGR DEADQ() DEFXMITQ() DESCR() REPOS()``,
``DISPLAY QMGR``; ``CLUSTER()``/``DEFBIND()`` on queues; ``DEFINE|ALTER|DELETE|DISPLAY
CHANNEL(name) CHLTYPE(SDR|RCVR|CLUSSDR|CLUSRCVR) CONNAME() XMITQ() CLUSTER() BATCHSZ()``;
``DISPLAY CLUSQMGR(generic*)`` and ``DISPLAY QCLUSTER(generic*)`` (from the repository);
``DISPLAY QSTATUS(generic*)``, ``DISPLAY CHSTATUS(generic*)``, ``DISPLAY SUB(generic*)``
(the broker's subscriptions) and ``DISPLAY PUBSUB`` (its neighbours), the last three
from providers the process owning the queue manager registers.
Abbreviations (DEF, ALT, DEL, DIS, QL, QA, QR, Q) and runmqsc's lexical rules apply:
keywords in any case, unquoted values folded to upper case, quoted values kept, ``''``
inside quotes, ``*`` comment lines, ``+``/``-`` continuation.

Three modules, one per step: this one parses (pure: text -> :class:`MQSCCommand`, plus the
keyword tables saying which keywords each object type takes), :mod:`.mqsc_run` executes
(and validates a whole script before a start changes anything), :mod:`.mqsc_display`
renders DISPLAY. Every error names the line its command started on.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

from gateway.mq.embedded.objects import (
    ChannelType,
    QType,
    check_object_name,
)


class MQSCError(Exception):
    """A command could not be parsed or executed; ``line`` is where the command started."""

    def __init__(self, line: int, message: str, code: str = "AMQ8405I") -> None:
        self.line = line
        self.code = code
        self.detail = message
        super().__init__(f"line {line}: {message}")


@dataclass(slots=True)
class MQSCCommand:
    """One parsed command: ``verb`` DEFINE/ALTER/DELETE/DISPLAY, ``obj`` QLOCAL/QALIAS/
    QREMOTE/QUEUE/QMGR, ``name`` the object (or generic) name, ``attrs`` keyword -> value
    (``None`` for a bare keyword such as REPLACE)."""

    line: int
    text: str
    verb: str
    obj: str
    name: str
    attrs: dict[str, str | None] = field(default_factory=dict)


_VERBS = {"DEFINE": "DEFINE", "DEF": "DEFINE", "ALTER": "ALTER", "ALT": "ALTER",
          "DELETE": "DELETE", "DEL": "DELETE", "DISPLAY": "DISPLAY", "DIS": "DISPLAY"}
OBJECTS = {"QLOCAL": "QLOCAL", "QL": "QLOCAL", "QALIAS": "QALIAS", "QA": "QALIAS",
           "QREMOTE": "QREMOTE", "QR": "QREMOTE", "QUEUE": "QUEUE", "Q": "QUEUE",
           "QMGR": "QMGR", "CHANNEL": "CHANNEL", "CHL": "CHANNEL",
           "CLUSQMGR": "CLUSQMGR", "QCLUSTER": "QCLUSTER", "QC": "QCLUSTER",
           "QSTATUS": "QSTATUS", "QS": "QSTATUS", "CHSTATUS": "CHSTATUS", "CHS": "CHSTATUS",
           "SUB": "SUB", "PUBSUB": "PUBSUB"}
#: Objects only DISPLAY takes (status, the repository's and the broker's views).
DISPLAY_ONLY = frozenset({"CLUSQMGR", "QCLUSTER", "QSTATUS", "CHSTATUS", "SUB", "PUBSUB"})
QTYPE_BY_OBJ = {"QLOCAL": QType.LOCAL, "QALIAS": QType.ALIAS, "QREMOTE": QType.REMOTE}

# Attributes each queue type accepts (MQSC names) and attributes accepted but not modelled.
_COMMON_QUEUE_KEYWORDS = {"DESCR", "PUT", "DEFPSIST", "DEFPRTY", "CLUSTER", "DEFBIND"}
QUEUE_KEYWORDS: dict[QType, set[str]] = {
    QType.LOCAL: _COMMON_QUEUE_KEYWORDS | {"MAXDEPTH", "MAXMSGL", "GET", "BOTHRESH", "BOQNAME",
                                           "USAGE"},
    QType.ALIAS: _COMMON_QUEUE_KEYWORDS | {"TARGET", "TARGQ", "GET"},
    QType.REMOTE: _COMMON_QUEUE_KEYWORDS | {"RNAME", "RQMNAME", "XMITQ"},
}
IGNORED_ATTRS = frozenset({
    "SHARE", "NOSHARE", "DEFSOPT", "TRIGGER", "NOTRIGGER", "TRIGTYPE", "TRIGDPTH", "TRIGMPRI",
    "TRIGDATA", "INITQ", "PROCESS", "CLUSNL", "CLWLUSEQ", "CLWLPRTY",
    "CLWLRANK", "MSGDLVSQ", "HARDENBO", "NOHARDENBO", "STATQ", "MONQ", "ACCTQ", "DEFPRESP",
    "DEFREADA", "PROPCTL", "SCOPE", "TARGTYPE", "QDEPTHHI", "QDEPTHLO", "QDPHIEV", "QDPLOEV",
    "QDPMAXEV", "QSVCIEV", "QSVCINT", "RETINTVL", "NPMCLASS", "CUSTOM", "IMGRCOVQ", "DISTL",
})
QMGR_KEYWORDS = {"DEADQ", "DEFXMITQ", "DESCR", "MAXMSGL", "CCSID", "REPOS"}
CHLTYPES = {"SDR": ChannelType.SDR, "RCVR": ChannelType.RCVR,
            "CLUSSDR": ChannelType.CLUSSDR, "CLUSRCVR": ChannelType.CLUSRCVR}
#: Channel attributes accepted but not modelled (the embedded channels have no TLS,
#: heartbeats or exits).
IGNORED_CHANNEL_ATTRS = frozenset({
    "TRPTYPE", "HBINT", "DISCINT", "SHORTRTY", "SHORTTMR", "LONGRTY", "LONGTMR", "MAXMSGL",
    "NPMSPEED", "SSLCIPH", "SSLPEER", "SSLCAUTH", "MCAUSER", "CONVERT", "SEQWRAP",
    "KAINT", "COMPHDR", "COMPMSG", "MONCHL", "STATCHL", "NETPRTY", "CLWLPRTY", "CLWLRANK",
    "CLWLWGHT", "MRDATA", "MREXIT", "MRRTY", "MRTMR", "PUTAUT", "BATCHHB", "BATCHINT",
    "BATCHLIM", "CLUSNL", "PROPCTL", "RESETSEQ", "DEFRECON", "MODENAME", "TPNAME",
})


def split_commands(text: str) -> Iterator[tuple[int, str]]:
    """Yield (first line number, command text) with comments removed and continuations joined."""
    buf: list[str] = []
    start = 0
    for lineno, raw in enumerate(text.splitlines(), start=1):
        line = raw.rstrip()
        if not buf:
            if not line.strip() or line.lstrip().startswith("*"):
                continue
            start = lineno
        if line.endswith("+"):
            buf.append(line[:-1])
            continue
        if line.endswith("-"):
            buf.append(line[:-1])
            continue
        buf.append(line)
        command = "".join(part if i == 0 else part.lstrip() for i, part in enumerate(buf))
        buf = []
        command = command.strip().rstrip(";").strip()
        if command:
            yield start, command
    if buf:
        raise MQSCError(start, "the last command ends with a continuation character")


def _tokens(text: str, line: int) -> list[tuple[str, str | None]]:
    """Split a command into (KEYWORD, value-or-None) pairs following runmqsc's rules."""
    out: list[tuple[str, str | None]] = []
    i, n = 0, len(text)
    while i < n:
        ch = text[i]
        if ch in " \t,":
            i += 1
            continue
        j = i
        while j < n and text[j] not in " \t,()":
            j += 1
        keyword = text[i:j].upper()
        if not keyword:
            raise MQSCError(line, f"unexpected {text[j]!r} at column {j + 1}")
        i = j
        if i < n and text[i] == "(":
            value, i = _value(text, i + 1, line)
            out.append((keyword, value))
        else:
            out.append((keyword, None))
    return out


def _value(text: str, i: int, line: int) -> tuple[str, int]:
    """Read a parenthesised value starting after '('; return (value, index after ')')."""
    n = len(text)
    while i < n and text[i] == " ":
        i += 1
    if i < n and text[i] == "'":
        chars: list[str] = []
        i += 1
        while True:
            if i >= n:
                raise MQSCError(line, "a quoted value is not closed")
            if text[i] == "'":
                if i + 1 < n and text[i + 1] == "'":
                    chars.append("'")
                    i += 2
                    continue
                i += 1
                break
            chars.append(text[i])
            i += 1
        while i < n and text[i] == " ":
            i += 1
        if i >= n or text[i] != ")":
            raise MQSCError(line, "expected ')' after a quoted value")
        return "".join(chars).rstrip(), i + 1
    j = text.find(")", i)
    if j < 0:
        raise MQSCError(line, "a '(' is not closed")
    return text[i:j].strip().upper(), j + 1


def parse_command(text: str, line: int) -> MQSCCommand:
    tokens = _tokens(text, line)
    if not tokens:
        raise MQSCError(line, "empty command")
    verb_kw, verb_val = tokens[0]
    verb = _VERBS.get(verb_kw)
    if verb is None or verb_val is not None:
        raise MQSCError(line, f"unknown or unsupported command {verb_kw!r}")
    if len(tokens) < 2:
        raise MQSCError(line, f"{verb} needs an object, e.g. {verb} QLOCAL(NAME)")
    obj_kw, name = tokens[1]
    obj = OBJECTS.get(obj_kw)
    if obj is None:
        raise MQSCError(line, f"unsupported object type {obj_kw!r} for {verb}")
    if obj in DISPLAY_ONLY:
        if verb != "DISPLAY":
            raise MQSCError(line, f"{verb} {obj} is not supported (only DISPLAY {obj})")
        name = name or "*"
    elif obj == "QMGR":
        if name is not None:
            raise MQSCError(line, "QMGR takes no name")
        if verb not in ("ALTER", "DISPLAY"):
            raise MQSCError(line, f"{verb} QMGR is not supported")
        name = ""
    else:
        if name is None or (not name and verb != "DISPLAY"):
            raise MQSCError(line, f"{obj_kw} needs a name in parentheses")
        if obj == "CHANNEL" and verb != "DISPLAY":
            problem = None if len(name) <= 20 else f"channel name {name!r} is longer than 20"
            if problem:
                raise MQSCError(line, problem)
        if obj == "QUEUE" and verb != "DISPLAY":
            raise MQSCError(line, f"{verb} needs a queue type (QLOCAL, QALIAS or QREMOTE)")
        if verb != "DISPLAY":
            problem = check_object_name(name)
            if problem:
                raise MQSCError(line, problem)
    attrs: dict[str, str | None] = {}
    for kw, value in tokens[2:]:
        if kw in attrs:
            raise MQSCError(line, f"keyword {kw} given twice")
        attrs[kw] = value
    return MQSCCommand(line, text, verb, obj, name, attrs)


def parse_mqsc(text: str) -> list[MQSCCommand]:
    """Parse a whole script; the first syntax error raises MQSCError naming its line."""
    return [parse_command(cmd, line) for line, cmd in split_commands(text)]
