"""The MQSC subset the embedded queue manager understands, parsed and executed as runmqsc does.

Supported (IBM MQ "MQSC commands" reference):
``DEFINE QLOCAL|QALIAS|QREMOTE(name) [attrs] [REPLACE|NOREPLACE]``, ``ALTER`` of the same,
``DELETE QLOCAL|QALIAS|QREMOTE(name) [PURGE|NOPURGE]``, ``DISPLAY Q|QUEUE|QLOCAL|QALIAS|
QREMOTE(generic*) [ALL|attr ...]``, ``ALTER QMGR DEADQ() DEFXMITQ() DESCR() REPOS()``,
``DISPLAY QMGR``; ``CLUSTER()``/``DEFBIND()`` on queues; ``DEFINE|ALTER|DELETE|DISPLAY
CHANNEL(name) CHLTYPE(SDR|RCVR|CLUSSDR|CLUSRCVR) CONNAME() XMITQ() CLUSTER() BATCHSZ()``;
``DISPLAY CLUSQMGR(generic*)`` and ``DISPLAY QCLUSTER(generic*)`` (from the repository).
Abbreviations (DEF, ALT, DEL, DIS, QL, QA, QR, Q) and runmqsc's lexical rules apply:
keywords in any case, unquoted values folded to upper case, quoted values kept, ``''``
inside quotes, ``*`` comment lines, ``+``/``-`` continuation.

Parsing is pure; execution goes through :class:`MQSCTarget` so the same runner serves the
queue manager at start (a ``.mqsc`` file) and ``mqgw mqsc QM`` at run time. Every error
names the line its command started on.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Protocol

from gateway.mq.embedded.objects import (
    MAX_MAXDEPTH,
    MAX_MAXMSGL,
    ChannelDef,
    ChannelType,
    DefBind,
    ObjectCatalogue,
    QMgrAttrs,
    QType,
    QueueDef,
    Usage,
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
_OBJECTS = {"QLOCAL": "QLOCAL", "QL": "QLOCAL", "QALIAS": "QALIAS", "QA": "QALIAS",
            "QREMOTE": "QREMOTE", "QR": "QREMOTE", "QUEUE": "QUEUE", "Q": "QUEUE",
            "QMGR": "QMGR", "CHANNEL": "CHANNEL", "CHL": "CHANNEL",
            "CLUSQMGR": "CLUSQMGR", "QCLUSTER": "QCLUSTER", "QC": "QCLUSTER"}
_QTYPE_BY_OBJ = {"QLOCAL": QType.LOCAL, "QALIAS": QType.ALIAS, "QREMOTE": QType.REMOTE}

# Attributes each queue type accepts (MQSC names) and attributes accepted but not modelled.
_COMMON = {"DESCR", "PUT", "DEFPSIST", "DEFPRTY", "CLUSTER", "DEFBIND"}
_ALLOWED: dict[QType, set[str]] = {
    QType.LOCAL: _COMMON | {"MAXDEPTH", "MAXMSGL", "GET", "BOTHRESH", "BOQNAME", "USAGE"},
    QType.ALIAS: _COMMON | {"TARGET", "TARGQ", "GET"},
    QType.REMOTE: _COMMON | {"RNAME", "RQMNAME", "XMITQ"},
}
IGNORED_ATTRS = frozenset({
    "SHARE", "NOSHARE", "DEFSOPT", "TRIGGER", "NOTRIGGER", "TRIGTYPE", "TRIGDPTH", "TRIGMPRI",
    "TRIGDATA", "INITQ", "PROCESS", "CLUSNL", "CLWLUSEQ", "CLWLPRTY",
    "CLWLRANK", "MSGDLVSQ", "HARDENBO", "NOHARDENBO", "STATQ", "MONQ", "ACCTQ", "DEFPRESP",
    "DEFREADA", "PROPCTL", "SCOPE", "TARGTYPE", "QDEPTHHI", "QDEPTHLO", "QDPHIEV", "QDPLOEV",
    "QDPMAXEV", "QSVCIEV", "QSVCINT", "RETINTVL", "NPMCLASS", "CUSTOM", "IMGRCOVQ", "DISTL",
})
_QMGR_ATTRS = {"DEADQ", "DEFXMITQ", "DESCR", "MAXMSGL", "CCSID", "REPOS"}
_CHLTYPES = {"SDR": ChannelType.SDR, "RCVR": ChannelType.RCVR,
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
    obj = _OBJECTS.get(obj_kw)
    if obj is None:
        raise MQSCError(line, f"unsupported object type {obj_kw!r} for {verb}")
    if obj in ("CLUSQMGR", "QCLUSTER"):
        if verb != "DISPLAY":
            raise MQSCError(line, f"{verb} {obj} is not supported (the repository owns it)")
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


# --------------------------------------------------------------------------- execution


class MQSCTarget(Protocol):
    """What the runner needs from a queue manager."""

    @property
    def catalogue(self) -> ObjectCatalogue: ...

    def current_depth(self, q_name: str) -> int: ...

    def open_count(self, q_name: str) -> tuple[int, int]:
        """(IPPROCS, OPPROCS) of a local queue."""
        ...

    def uncommitted(self, q_name: str) -> int:
        """Messages of a local queue in open units of work (puts and gets)."""
        ...

    def save_queue(self, definition: QueueDef) -> None: ...

    def delete_queue(self, q_name: str, purge: bool) -> None: ...

    def save_qmgr(self, attrs: QMgrAttrs) -> None: ...


@dataclass(slots=True)
class MQSCResult:
    """The outcome of one command: runmqsc's message lines and whether it succeeded."""

    command: MQSCCommand | None
    line: int
    text: str
    ok: bool
    lines: list[str]
    syntax_error: bool = False


def _int_attr(cmd: MQSCCommand, kw: str, lo: int, hi: int) -> int:
    raw = cmd.attrs[kw]
    try:
        value = int(raw or "")
    except ValueError:
        raise MQSCError(cmd.line, f"{kw}({raw}) is not a number") from None
    if not lo <= value <= hi:
        raise MQSCError(cmd.line, f"{kw}({value}) is outside {lo}..{hi}")
    return value


def _choice(cmd: MQSCCommand, kw: str, choices: dict[str, bool]) -> bool:
    raw = (cmd.attrs[kw] or "").upper()
    if raw not in choices:
        raise MQSCError(cmd.line, f"{kw}({raw}) must be one of {', '.join(choices)}")
    return choices[raw]


def _name_attr(cmd: MQSCCommand, kw: str) -> str:
    value = (cmd.attrs[kw] or "").strip()
    if value:
        problem = check_object_name(value, kw)
        if problem:
            raise MQSCError(cmd.line, problem)
    return value


def _queue_changes(cmd: MQSCCommand, qtype: QType) -> dict[str, object]:
    allowed = _ALLOWED[qtype]
    changes: dict[str, object] = {}
    for kw, value in cmd.attrs.items():
        if kw in ("REPLACE", "NOREPLACE", "PURGE", "NOPURGE") and value is None:
            continue
        if kw in IGNORED_ATTRS:
            continue
        if kw not in allowed:
            raise MQSCError(cmd.line, f"keyword {kw} is not valid for {qtype.mqsc}")
        if value is None:
            raise MQSCError(cmd.line, f"keyword {kw} needs a value in parentheses")
        if kw == "DESCR":
            changes["description"] = value[:64]
        elif kw == "PUT":
            changes["put_enabled"] = _choice(cmd, kw, {"ENABLED": True, "DISABLED": False})
        elif kw == "GET":
            changes["get_enabled"] = _choice(cmd, kw, {"ENABLED": True, "DISABLED": False})
        elif kw == "DEFPSIST":
            changes["default_persistent"] = _choice(cmd, kw, {"YES": True, "NO": False})
        elif kw == "DEFPRTY":
            changes["default_priority"] = _int_attr(cmd, kw, 0, 9)
        elif kw == "MAXDEPTH":
            changes["max_depth"] = _int_attr(cmd, kw, 0, MAX_MAXDEPTH)
        elif kw == "MAXMSGL":
            changes["max_msg_length"] = _int_attr(cmd, kw, 0, MAX_MAXMSGL)
        elif kw == "BOTHRESH":
            changes["backout_threshold"] = _int_attr(cmd, kw, 0, 999_999_999)
        elif kw == "BOQNAME":
            changes["backout_queue"] = _name_attr(cmd, kw)
        elif kw == "USAGE":
            xmit = _choice(cmd, kw, {"NORMAL": False, "XMITQ": True})
            changes["usage"] = Usage.TRANSMISSION if xmit else Usage.NORMAL
        elif kw in ("TARGET", "TARGQ"):
            changes["target"] = _name_attr(cmd, kw)
        elif kw == "RNAME":
            changes["remote_name"] = _name_attr(cmd, kw)
        elif kw == "RQMNAME":
            changes["remote_q_mgr_name"] = _name_attr(cmd, kw)
        elif kw == "XMITQ":
            changes["xmit_q_name"] = _name_attr(cmd, kw)
        elif kw == "CLUSTER":
            changes["cluster"] = _name_attr(cmd, kw)
        elif kw == "DEFBIND":
            raw = value.upper()
            if raw not in ("OPEN", "NOTFIXED", "GROUP"):
                raise MQSCError(cmd.line, f"DEFBIND({raw}) must be OPEN or NOTFIXED")
            changes["default_bind"] = DefBind.NOTFIXED if raw == "NOTFIXED" else DefBind.OPEN
    return changes


def run_command(target: MQSCTarget, cmd: MQSCCommand) -> list[str]:
    """Execute one command; returns runmqsc's message lines or raises MQSCError."""
    if cmd.obj == "QMGR":
        return _run_qmgr(target, cmd)
    if cmd.obj == "CHANNEL":
        return _run_channel(target, cmd)
    if cmd.obj in ("CLUSQMGR", "QCLUSTER"):
        return _display_cluster(target, cmd)
    if cmd.verb == "DISPLAY":
        return _display_queues(target, cmd)
    qtype = _QTYPE_BY_OBJ[cmd.obj]
    existing = target.catalogue.get(cmd.name)
    if cmd.verb == "DEFINE":
        for kw in ("PURGE", "NOPURGE"):
            if kw in cmd.attrs:
                raise MQSCError(cmd.line, f"keyword {kw} is not valid for DEFINE")
        changes = _queue_changes(cmd, qtype)
        if existing is not None:
            if "REPLACE" not in cmd.attrs:
                raise MQSCError(
                    cmd.line, f"IBM MQ object {cmd.name} already exists.", "AMQ8150E"
                )
            if existing.qtype is not qtype:
                raise MQSCError(
                    cmd.line,
                    f"object {cmd.name} exists as a {existing.qtype.mqsc}; delete it first",
                    "AMQ8150E",
                )
        definition = QueueDef(cmd.name, qtype).with_changes(**changes)
        _check_queue(cmd, definition, target)
        target.save_queue(definition)
        return ["AMQ8006I: IBM MQ queue created."]
    if existing is None or existing.qtype is not qtype:
        raise MQSCError(cmd.line, f"IBM MQ object {cmd.name} not found.", "AMQ8147E")
    if cmd.verb == "ALTER":
        definition = existing.with_changes(**_queue_changes(cmd, qtype))
        _check_queue(cmd, definition, target)
        target.save_queue(definition)
        return ["AMQ8008I: IBM MQ queue changed."]
    # DELETE
    for kw in cmd.attrs:
        if kw not in ("PURGE", "NOPURGE"):
            raise MQSCError(cmd.line, f"keyword {kw} is not valid for DELETE")
    if qtype is QType.LOCAL:
        ipprocs, opprocs = target.open_count(cmd.name)
        if ipprocs or opprocs:
            raise MQSCError(cmd.line, f"IBM MQ queue {cmd.name} in use.", "AMQ8148E")
        if target.current_depth(cmd.name) and "PURGE" not in cmd.attrs:
            raise MQSCError(cmd.line, f"IBM MQ queue {cmd.name} not empty.", "AMQ8143E")
        pending = target.uncommitted(cmd.name)
        if pending:
            # PURGE removes committed messages only; MQ refuses while units of work
            # hold messages of the queue (their commit would have nowhere to go)
            raise MQSCError(
                cmd.line,
                f"IBM MQ queue {cmd.name} not empty: {pending} uncommitted message(s).",
                "AMQ8143E",
            )
    target.delete_queue(cmd.name, purge="PURGE" in cmd.attrs)
    return ["AMQ8007I: IBM MQ queue deleted."]


def _check_queue(cmd: MQSCCommand, d: QueueDef, target: MQSCTarget) -> None:
    if d.qtype is QType.ALIAS and not d.target:
        raise MQSCError(cmd.line, f"alias queue {d.name} needs TARGET(base queue)")
    if d.cluster and d.is_xmitq:
        raise MQSCError(cmd.line, f"transmission queue {d.name} cannot be a cluster queue")
    # MAXDEPTH below the current depth is allowed, as on MQ: puts then fail with 2053.


def _run_qmgr(target: MQSCTarget, cmd: MQSCCommand) -> list[str]:
    attrs = target.catalogue.qmgr
    if cmd.verb == "DISPLAY":
        return ["AMQ8408I: Display Queue Manager details.", *_columns([
            f"QMNAME({attrs.name})", f"CCSID({attrs.coded_char_set_id})",
            f"DEADQ({attrs.dead_letter_q_name})", f"DEFXMITQ({attrs.default_xmit_q_name})",
            f"DESCR({attrs.description})", f"MAXMSGL({attrs.max_msg_length})",
            f"REPOS({attrs.repository})",
        ])]
    changes: dict[str, object] = {}
    for kw, value in cmd.attrs.items():
        if kw not in _QMGR_ATTRS:
            if kw in IGNORED_ATTRS:
                continue
            raise MQSCError(cmd.line, f"keyword {kw} is not supported for ALTER QMGR")
        if value is None:
            raise MQSCError(cmd.line, f"keyword {kw} needs a value in parentheses")
        if kw == "DEADQ":
            changes["dead_letter_q_name"] = _name_attr(cmd, kw)
        elif kw == "DEFXMITQ":
            changes["default_xmit_q_name"] = _name_attr(cmd, kw)
        elif kw == "DESCR":
            changes["description"] = value[:64]
        elif kw == "MAXMSGL":
            changes["max_msg_length"] = _int_attr(cmd, kw, 32768, MAX_MAXMSGL)
        elif kw == "CCSID":
            changes["coded_char_set_id"] = _int_attr(cmd, kw, 1, 65535)
        elif kw == "REPOS":
            changes["repository"] = _name_attr(cmd, kw)
    from dataclasses import replace

    target.save_qmgr(replace(attrs, **changes))  # type: ignore[arg-type]
    return ["AMQ8005I: IBM MQ queue manager changed."]


_DISPLAY_ORDER: dict[QType, tuple[str, ...]] = {
    QType.LOCAL: ("DESCR", "PUT", "GET", "DEFPSIST", "DEFPRTY", "MAXDEPTH", "MAXMSGL",
                  "BOTHRESH", "BOQNAME", "USAGE", "CLUSTER", "DEFBIND", "CURDEPTH",
                  "IPPROCS", "OPPROCS"),
    QType.ALIAS: ("DESCR", "PUT", "GET", "DEFPSIST", "DEFPRTY", "TARGET", "CLUSTER",
                  "DEFBIND"),
    QType.REMOTE: ("DESCR", "PUT", "DEFPSIST", "DEFPRTY", "RNAME", "RQMNAME", "XMITQ",
                   "CLUSTER", "DEFBIND"),
}


def _channel_changes(cmd: MQSCCommand) -> dict[str, object]:
    changes: dict[str, object] = {}
    for kw, value in cmd.attrs.items():
        if kw in ("REPLACE", "NOREPLACE") and value is None:
            continue
        if kw in IGNORED_CHANNEL_ATTRS:
            continue
        if value is None:
            raise MQSCError(cmd.line, f"keyword {kw} needs a value in parentheses")
        if kw == "CHLTYPE":
            if value not in _CHLTYPES:
                raise MQSCError(
                    cmd.line, f"CHLTYPE({value}) must be one of {', '.join(_CHLTYPES)}"
                )
            changes["chltype"] = _CHLTYPES[value]
        elif kw == "CONNAME":
            changes["conname"] = value.strip()
        elif kw == "XMITQ":
            changes["xmit_q_name"] = _name_attr(cmd, kw)
        elif kw == "CLUSTER":
            changes["cluster"] = _name_attr(cmd, kw)
        elif kw == "DESCR":
            changes["description"] = value[:64]
        elif kw == "BATCHSZ":
            changes["batch_size"] = _int_attr(cmd, kw, 1, 9999)
        else:
            raise MQSCError(cmd.line, f"keyword {kw} is not valid for CHANNEL")
    return changes


def _check_channel(cmd: MQSCCommand, d: ChannelDef) -> None:
    t = d.chltype
    if t in (ChannelType.SDR, ChannelType.CLUSSDR, ChannelType.CLUSRCVR) and not d.conname:
        raise MQSCError(cmd.line, f"channel {d.name} of type {t.name} needs CONNAME")
    if t is ChannelType.SDR and not d.xmit_q_name:
        raise MQSCError(cmd.line, f"sender channel {d.name} needs XMITQ")
    if t in (ChannelType.CLUSSDR, ChannelType.CLUSRCVR) and not d.cluster:
        raise MQSCError(cmd.line, f"cluster channel {d.name} needs CLUSTER")
    if t not in (ChannelType.CLUSSDR, ChannelType.CLUSRCVR) and d.cluster:
        raise MQSCError(cmd.line, "CLUSTER is only valid for CLUSSDR and CLUSRCVR channels")
    if t is not ChannelType.SDR and d.xmit_q_name:
        raise MQSCError(cmd.line, "XMITQ is only valid for SDR channels")


def _run_channel(target: MQSCTarget, cmd: MQSCCommand) -> list[str]:
    channels = target.catalogue.channels
    if cmd.verb == "DISPLAY":
        pattern = cmd.name or "*"
        names = sorted(n for n in channels
                       if (n.startswith(pattern[:-1]) if pattern.endswith("*") else n == pattern))
        if not names:
            raise MQSCError(cmd.line, f"IBM MQ object {pattern} not found.", "AMQ8147E")
        out: list[str] = []
        for n in names:
            c = channels[n]
            out.append("AMQ8414I: Display Channel details.")
            out.extend(_columns([
                f"CHANNEL({c.name})", f"CHLTYPE({c.chltype.name})", f"CONNAME({c.conname})",
                f"XMITQ({c.xmit_q_name})", f"CLUSTER({c.cluster})", f"BATCHSZ({c.batch_size})",
                f"DESCR({c.description})",
            ]))
        return out
    save = getattr(target, "save_channel", None)
    delete = getattr(target, "delete_channel", None)
    if save is None or delete is None:
        raise MQSCError(cmd.line, "this queue manager does not support channels")
    existing = channels.get(cmd.name)
    if cmd.verb == "DELETE":
        if existing is None:
            raise MQSCError(cmd.line, f"IBM MQ object {cmd.name} not found.", "AMQ8147E")
        delete(cmd.name)
        return ["AMQ8020I: IBM MQ channel deleted."]
    changes = _channel_changes(cmd)
    if cmd.verb == "DEFINE":
        if existing is not None and "REPLACE" not in cmd.attrs:
            raise MQSCError(cmd.line, f"IBM MQ object {cmd.name} already exists.", "AMQ8150E")
        if "chltype" not in changes:
            raise MQSCError(cmd.line, "DEFINE CHANNEL needs CHLTYPE")
        chltype = changes.pop("chltype")
        assert isinstance(chltype, ChannelType)
        definition = ChannelDef(cmd.name, chltype).with_changes(**changes)
        _check_channel(cmd, definition)
        save(definition)
        return ["AMQ8014I: IBM MQ channel created."]
    if existing is None:
        raise MQSCError(cmd.line, f"IBM MQ object {cmd.name} not found.", "AMQ8147E")
    if "chltype" in changes and changes["chltype"] is not existing.chltype:
        raise MQSCError(cmd.line, "CHLTYPE cannot be altered")
    changes.pop("chltype", None)
    definition = existing.with_changes(**changes)
    _check_channel(cmd, definition)
    save(definition)
    return ["AMQ8016I: IBM MQ channel changed."]


def _display_cluster(target: MQSCTarget, cmd: MQSCCommand) -> list[str]:
    """DISPLAY CLUSQMGR / QCLUSTER: what this queue manager's repository holds."""
    report = getattr(target, "cluster_report", None)
    rows: list[list[str]] = report(cmd.obj, cmd.name or "*") if report is not None else []
    if not rows:
        raise MQSCError(cmd.line, f"IBM MQ object {cmd.name or '*'} not found.", "AMQ8147E")
    code = ("AMQ8441I: Display Cluster Queue Manager details." if cmd.obj == "CLUSQMGR"
            else "AMQ8409I: Display Queue details.")
    out: list[str] = []
    for items in rows:
        out.append(code)
        out.extend(_columns(items))
    return out


def queue_attributes(target: MQSCTarget, d: QueueDef) -> dict[str, str]:
    """The MQSC attribute values DISPLAY shows for a queue."""
    values = {
        "DESCR": d.description,
        "PUT": "ENABLED" if d.put_enabled else "DISABLED",
        "GET": "ENABLED" if d.get_enabled else "DISABLED",
        "DEFPSIST": "YES" if d.default_persistent else "NO",
        "DEFPRTY": str(d.default_priority),
        "MAXDEPTH": str(d.max_depth),
        "MAXMSGL": str(d.max_msg_length),
        "BOTHRESH": str(d.backout_threshold),
        "BOQNAME": d.backout_queue,
        "USAGE": "XMITQ" if d.usage is Usage.TRANSMISSION else "NORMAL",
        "TARGET": d.target,
        "RNAME": d.remote_name,
        "RQMNAME": d.remote_q_mgr_name,
        "XMITQ": d.xmit_q_name,
        "CLUSTER": d.cluster,
        "DEFBIND": "NOTFIXED" if d.default_bind is DefBind.NOTFIXED else "OPEN",
    }
    if d.qtype is QType.LOCAL:
        ipprocs, opprocs = target.open_count(d.name)
        values["CURDEPTH"] = str(target.current_depth(d.name))
        values["IPPROCS"] = str(ipprocs)
        values["OPPROCS"] = str(opprocs)
    return values


def _display_queues(target: MQSCTarget, cmd: MQSCCommand) -> list[str]:
    pattern = cmd.name or "*"
    want_type = _QTYPE_BY_OBJ.get(cmd.obj)
    type_filter = cmd.attrs.get("TYPE")
    if type_filter:
        obj = _OBJECTS.get(type_filter)
        if obj not in _QTYPE_BY_OBJ:
            raise MQSCError(cmd.line, f"TYPE({type_filter}) must be QLOCAL, QALIAS or QREMOTE")
        want_type = _QTYPE_BY_OBJ[obj]
    requested = [kw for kw in cmd.attrs if kw not in ("TYPE", "ALL")]
    for kw in requested:
        if kw not in _DISPLAY_ORDER[QType.LOCAL] + _DISPLAY_ORDER[QType.REMOTE] + ("TARGET",):
            raise MQSCError(cmd.line, f"keyword {kw} is not valid for DISPLAY QUEUE")
    show_all = "ALL" in cmd.attrs
    if pattern.endswith("*"):
        prefix = pattern[:-1]
        names = sorted(n for n in target.catalogue.queues if n.startswith(prefix))
    else:
        names = [pattern] if pattern in target.catalogue.queues else []
    matched = [target.catalogue.queues[n] for n in names]
    if want_type is not None:
        matched = [d for d in matched if d.qtype is want_type]
    if not matched:
        raise MQSCError(cmd.line, f"IBM MQ object {pattern} not found.", "AMQ8147E")
    out: list[str] = []
    for d in matched:
        values = queue_attributes(target, d)
        order = _DISPLAY_ORDER[d.qtype]
        shown = order if show_all else tuple(k for k in requested if k in order)
        items = [f"QUEUE({d.name})", f"TYPE({d.qtype.mqsc})"]
        items += [f"{k}({values[k]})" for k in shown]
        out.append("AMQ8409I: Display Queue details.")
        out.extend(_columns(items))
    return out


def _columns(items: list[str]) -> list[str]:
    """runmqsc prints attributes two to a line, the second at column 43."""
    lines = []
    for i in range(0, len(items), 2):
        pair = items[i : i + 2]
        if len(pair) == 2 and len(pair[0]) < 40:
            lines.append(f"   {pair[0]:<40}{pair[1]}")
        else:
            lines.extend(f"   {p}" for p in pair)
    return lines


def run_script(target: MQSCTarget, text: str, *, stop_on_error: bool = False) -> list[MQSCResult]:
    """Run every command of ``text``. With ``stop_on_error`` the first failure raises."""
    results: list[MQSCResult] = []
    try:
        commands = list(split_commands(text))
    except MQSCError as exc:
        if stop_on_error:
            raise
        return [MQSCResult(None, exc.line, "", False, [f"{exc.code}: {exc.detail}"], True)]
    for line, text_ in commands:
        try:
            cmd = parse_command(text_, line)
        except MQSCError as exc:
            if stop_on_error:
                raise
            results.append(MQSCResult(None, line, text_, False,
                                      ["AMQ8405I: Syntax error detected at or near end of "
                                       "command segment below:-", f"{exc.detail}"], True))
            continue
        try:
            lines = run_command(target, cmd)
        except MQSCError as exc:
            if stop_on_error:
                raise
            results.append(MQSCResult(cmd, line, text_, False, [f"{exc.code}: {exc.detail}"]))
            continue
        results.append(MQSCResult(cmd, line, text_, True, lines))
    return results


def format_results(q_mgr_name: str, results: list[MQSCResult]) -> str:
    """Render results as runmqsc prints them."""
    out = [f"Starting MQSC for queue manager {q_mgr_name}.", ""]
    for number, r in enumerate(results, start=1):
        out.append(f"{number:>6} : {r.text}")
        out.extend(r.lines)
    syntax = sum(1 for r in results if r.syntax_error)
    failed = sum(1 for r in results if not r.ok and not r.syntax_error)
    out.append(f"{len(results)} MQSC commands read.")
    out.append("No commands have a syntax error." if not syntax
               else f"{syntax} command{'s have' if syntax != 1 else ' has'} a syntax error.")
    out.append("All valid MQSC commands were processed." if not failed
               else "One valid MQSC command could not be processed." if failed == 1
               else f"{failed} valid MQSC commands could not be processed.")
    return "\n".join(out) + "\n"
