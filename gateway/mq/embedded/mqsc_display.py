"""MQSC DISPLAY: what runmqsc prints for queues, channels, the queue manager and clusters.

Why apart from :mod:`.mqsc_run`: DISPLAY only reads, so it needs only the read side of a
queue manager (:class:`MQSCView`) and its layout rules (attribute order, two columns)
are a concern of their own.
"""

from __future__ import annotations

from typing import Protocol

from gateway.mq.embedded.mqsc import OBJECTS, QTYPE_BY_OBJ, MQSCCommand, MQSCError
from gateway.mq.embedded.objects import DefBind, ObjectCatalogue, QType, QueueDef, Usage


class MQSCView(Protocol):
    """What DISPLAY reads from a queue manager."""

    @property
    def catalogue(self) -> ObjectCatalogue: ...

    def current_depth(self, q_name: str) -> int: ...

    def open_count(self, q_name: str) -> tuple[int, int]:
        """(IPPROCS, OPPROCS) of a local queue."""
        ...


DISPLAY_ORDER: dict[QType, tuple[str, ...]] = {
    QType.LOCAL: ("DESCR", "PUT", "GET", "DEFPSIST", "DEFPRTY", "MAXDEPTH", "MAXMSGL",
                  "BOTHRESH", "BOQNAME", "USAGE", "CLUSTER", "DEFBIND", "CURDEPTH",
                  "IPPROCS", "OPPROCS"),
    QType.ALIAS: ("DESCR", "PUT", "GET", "DEFPSIST", "DEFPRTY", "TARGET", "CLUSTER",
                  "DEFBIND"),
    QType.REMOTE: ("DESCR", "PUT", "DEFPSIST", "DEFPRTY", "RNAME", "RQMNAME", "XMITQ",
                   "CLUSTER", "DEFBIND"),
}


def display(target: MQSCView, cmd: MQSCCommand) -> list[str]:
    """Run one DISPLAY command; returns runmqsc's lines or raises MQSCError."""
    if cmd.obj == "QMGR":
        return display_qmgr(target)
    if cmd.obj == "CHANNEL":
        return display_channels(target, cmd)
    if cmd.obj in ("CLUSQMGR", "QCLUSTER"):
        return display_cluster(target, cmd)
    if cmd.obj == "QSTATUS":
        return display_qstatus(target, cmd)
    if cmd.obj in STATUS_CODES:
        return display_status(target, cmd)
    return display_queues(target, cmd)


def display_qmgr(target: MQSCView) -> list[str]:
    attrs = target.catalogue.qmgr
    return ["AMQ8408I: Display Queue Manager details.", *columns([
        f"QMNAME({attrs.name})", f"CCSID({attrs.coded_char_set_id})",
        f"DEADQ({attrs.dead_letter_q_name})", f"DEFXMITQ({attrs.default_xmit_q_name})",
        f"DESCR({attrs.description})", f"MAXMSGL({attrs.max_msg_length})",
        f"REPOS({attrs.repository})",
    ])]


def display_channels(target: MQSCView, cmd: MQSCCommand) -> list[str]:
    channels = target.catalogue.channels
    pattern = cmd.name or "*"
    names = sorted(n for n in channels
                   if (n.startswith(pattern[:-1]) if pattern.endswith("*") else n == pattern))
    if not names:
        raise MQSCError(cmd.line, f"IBM MQ object {pattern} not found.", "AMQ8147E")
    out: list[str] = []
    for n in names:
        c = channels[n]
        out.append("AMQ8414I: Display Channel details.")
        out.extend(columns([
            f"CHANNEL({c.name})", f"CHLTYPE({c.chltype.name})", f"CONNAME({c.conname})",
            f"XMITQ({c.xmit_q_name})", f"CLUSTER({c.cluster})", f"BATCHSZ({c.batch_size})",
            f"DESCR({c.description})",
        ]))
    return out


def display_cluster(target: MQSCView, cmd: MQSCCommand) -> list[str]:
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
        out.extend(columns(items))
    return out


def display_qstatus(target: MQSCView, cmd: MQSCCommand) -> list[str]:
    """DISPLAY QSTATUS: depth, handles and uncommitted messages of local queues."""
    pattern = cmd.name or "*"
    names = sorted(n for n, d in target.catalogue.queues.items() if d.qtype is QType.LOCAL
                   and (n.startswith(pattern[:-1]) if pattern.endswith("*") else n == pattern))
    if not names:
        raise MQSCError(cmd.line, f"IBM MQ object {pattern} not found.", "AMQ8147E")
    uncommitted = getattr(target, "uncommitted", None)
    out: list[str] = []
    for n in names:
        ipprocs, opprocs = target.open_count(n)
        uncom = uncommitted(n) if uncommitted is not None else 0
        out.append("AMQ8450I: Display queue status details.")
        out.extend(columns([f"QUEUE({n})", "TYPE(QUEUE)",
                            f"CURDEPTH({target.current_depth(n)})", f"IPPROCS({ipprocs})",
                            f"OPPROCS({opprocs})", f"UNCOM({'YES' if uncom else 'NO'})"]))
    return out


#: DISPLAY CHSTATUS/SUB/PUBSUB: the message heading each row and the one when none match.
STATUS_CODES = {
    "CHSTATUS": ("AMQ8417I: Display Channel Status details.",
                 "AMQ8420I: Channel Status not found."),
    "SUB": ("AMQ8096I: IBM MQ subscription inquired.", "AMQ8147E: IBM MQ object {} not found."),
    "PUBSUB": ("AMQ8723I: Display pub/sub status details.",
               "AMQ8147E: IBM MQ object {} not found."),
}


def display_status(target: MQSCView, cmd: MQSCCommand) -> list[str]:
    """DISPLAY CHSTATUS / SUB / PUBSUB from the provider the owning process registered
    (``status_report(what, pattern)``; None: nothing here can answer)."""
    pattern = cmd.name or "*"
    report = getattr(target, "status_report", None)
    rows: list[list[str]] | None = report(cmd.obj, pattern) if report is not None else None
    if rows is None:
        raise MQSCError(
            cmd.line,
            f"DISPLAY {cmd.obj} needs the gateway's broker state: run it against the running "
            "gateway or give the gateway's configuration (mqgw qm mqsc -c CONFIG)",
            "AMQ8147E",
        )
    heading, missing = STATUS_CODES[cmd.obj]
    if not rows:
        code, _, text = missing.format(pattern).partition(": ")
        raise MQSCError(cmd.line, text, code)
    out: list[str] = []
    for items in rows:
        out.append(heading)
        out.extend(columns(items))
    return out


def queue_attributes(target: MQSCView, d: QueueDef) -> dict[str, str]:
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


def display_queues(target: MQSCView, cmd: MQSCCommand) -> list[str]:
    pattern = cmd.name or "*"
    want_type = QTYPE_BY_OBJ.get(cmd.obj)
    type_filter = cmd.attrs.get("TYPE")
    if type_filter:
        obj = OBJECTS.get(type_filter)
        if obj not in QTYPE_BY_OBJ:
            raise MQSCError(cmd.line, f"TYPE({type_filter}) must be QLOCAL, QALIAS or QREMOTE")
        want_type = QTYPE_BY_OBJ[obj]
    requested = [kw for kw in cmd.attrs if kw not in ("TYPE", "ALL")]
    for kw in requested:
        if kw not in DISPLAY_ORDER[QType.LOCAL] + DISPLAY_ORDER[QType.REMOTE] + ("TARGET",):
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
        order = DISPLAY_ORDER[d.qtype]
        shown = order if show_all else tuple(k for k in requested if k in order)
        items = [f"QUEUE({d.name})", f"TYPE({d.qtype.mqsc})"]
        items += [f"{k}({values[k]})" for k in shown]
        out.append("AMQ8409I: Display Queue details.")
        out.extend(columns(items))
    return out


def columns(items: list[str]) -> list[str]:
    """runmqsc prints attributes two to a line, the second at column 43."""
    lines = []
    for i in range(0, len(items), 2):
        pair = items[i : i + 2]
        if len(pair) == 2 and len(pair[0]) < 40:
            lines.append(f"   {pair[0]:<40}{pair[1]}")
        else:
            lines.extend(f"   {p}" for p in pair)
    return lines
