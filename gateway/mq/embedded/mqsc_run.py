"""MQSC execution: run parsed commands against a queue manager, as runmqsc does.

Why: one runner serves the queue manager at start (a script from a topology or an
``mqsc_file``) and ``mqgw mqsc QM`` at run time, through :class:`MQSCTarget`. A start
must not leave half a script applied, so :func:`check_script` first runs the whole
script against a scratch copy of the definitions (:class:`ScratchTarget`): keywords per
object type, values, re-definitions without REPLACE, missing alias targets and channel
attributes all fail there, naming the line, before anything is created.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Protocol

from gateway.mq.conname import (
    MAX_CONNAME_LENGTH,
    ConnameError,
    is_conname_list,
    parse_conname_list,
)
from gateway.mq.embedded.mqsc import (
    CHLTYPES,
    IGNORED_ATTRS,
    IGNORED_CHANNEL_ATTRS,
    QMGR_KEYWORDS,
    QTYPE_BY_OBJ,
    QUEUE_KEYWORDS,
    MQSCCommand,
    MQSCError,
    parse_command,
    split_commands,
)
from gateway.mq.embedded.mqsc_display import MQSCView, display
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


class MQSCTarget(MQSCView, Protocol):
    """What the runner needs from a queue manager: DISPLAY's view plus the changes."""

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
    allowed = QUEUE_KEYWORDS[qtype]
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
    if cmd.verb == "DISPLAY":
        return display(target, cmd)
    if cmd.obj == "QMGR":
        return _run_qmgr(target, cmd)
    if cmd.obj == "CHANNEL":
        return _run_channel(target, cmd)
    qtype = QTYPE_BY_OBJ[cmd.obj]
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
    changes: dict[str, object] = {}
    for kw, value in cmd.attrs.items():
        if kw not in QMGR_KEYWORDS:
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
    target.save_qmgr(replace(attrs, **changes))  # type: ignore[arg-type]
    return ["AMQ8005I: IBM MQ queue manager changed."]


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
            if value not in CHLTYPES:
                raise MQSCError(
                    cmd.line, f"CHLTYPE({value}) must be one of {', '.join(CHLTYPES)}"
                )
            changes["chltype"] = CHLTYPES[value]
        elif kw == "CONNAME":
            changes["conname"] = _conname_attr(cmd, value)
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


def _conname_attr(cmd: MQSCCommand, value: str) -> str:
    """CONNAME as given: a listener name, ``host(port)`` or a connection list
    ``host1(port),host2(port)``, the last two checked here (MQSCError saying what is
    wrong), not when the channel first starts."""
    conname = value.strip()
    if is_conname_list(conname):
        try:
            parse_conname_list(conname)
        except ConnameError as exc:
            raise MQSCError(cmd.line, str(exc)) from None
    elif len(conname) > MAX_CONNAME_LENGTH:
        raise MQSCError(cmd.line, f"CONNAME has {len(conname)} characters; at most "
                                  f"{MAX_CONNAME_LENGTH}")
    return conname


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


class ScratchTarget:
    """A copy of a queue manager's definitions that commands may change freely: what
    :func:`check_script` runs a script against. Depth, open handles and uncommitted
    messages are read from ``live`` (the running queue manager, if any) until the
    script deletes the queue; without ``live`` every queue is empty and closed."""

    def __init__(self, catalogue: ObjectCatalogue, live: MQSCTarget | None = None) -> None:
        # definitions are frozen: copying the dictionaries is a full copy
        self._catalogue = ObjectCatalogue(
            catalogue.qmgr, dict(catalogue.queues), dict(catalogue.channels))
        self._live = live
        self._deleted: set[str] = set()

    @property
    def catalogue(self) -> ObjectCatalogue:
        return self._catalogue

    def _reads_live(self, q_name: str) -> MQSCTarget | None:
        return None if q_name in self._deleted else self._live

    def current_depth(self, q_name: str) -> int:
        live = self._reads_live(q_name)
        return live.current_depth(q_name) if live is not None else 0

    def open_count(self, q_name: str) -> tuple[int, int]:
        live = self._reads_live(q_name)
        return live.open_count(q_name) if live is not None else (0, 0)

    def uncommitted(self, q_name: str) -> int:
        live = self._reads_live(q_name)
        return live.uncommitted(q_name) if live is not None else 0

    def save_queue(self, definition: QueueDef) -> None:
        self._catalogue.queues[definition.name] = definition

    def delete_queue(self, q_name: str, purge: bool) -> None:
        self._catalogue.queues.pop(q_name, None)
        self._deleted.add(q_name)

    def save_qmgr(self, attrs: QMgrAttrs) -> None:
        self._catalogue.qmgr = attrs

    def save_channel(self, definition: ChannelDef) -> None:
        self._catalogue.channels[definition.name] = definition

    def delete_channel(self, name: str) -> None:
        self._catalogue.channels.pop(name, None)


def check_script(
    catalogue: ObjectCatalogue, text: str, live: MQSCTarget | None = None
) -> None:
    """Raise MQSCError at the first command of ``text`` that would fail when run against
    ``catalogue`` (DISPLAY commands are skipped: they change nothing and what they show
    may only exist once the network runs). Changes nothing."""
    scratch = ScratchTarget(catalogue, live)
    for line, command in split_commands(text):
        cmd = parse_command(command, line)
        if cmd.verb != "DISPLAY":
            run_command(scratch, cmd)
