"""Command messages of queued publish/subscribe, parsed from either header format.

MQRFH (v1) carries ``MQPS*`` name/value pairs (reference §5.2, §5.4); MQRFH2 carries a
``psc`` folder with one element per parameter (§5.5). Both parse into one
:class:`Command` model with options as bit sets, so the engine never looks at the wire
form again. Wire names are the short forms (``RegSub``, ``InformIfRet``, ...). Every
protocol violation raises :class:`~gateway.pubsub.errors.CommandError` with the reason
code the broker answers with.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass, field

from gateway.pubsub.errors import CommandError
from gateway.pubsub.options import (
    DEL_KEYWORDS,
    DEREGPUB_ALLOWED,
    DEREGSUB_ALLOWED,
    PERSISTENCE_CHOICES,
    PUB_KEYWORDS,
    PUBLISH_PUB_ALLOWED,
    PUBLISH_REG_ALLOWED,
    REG_KEYWORDS,
    REGPUB_ALLOWED,
    REGSUB_ALLOWED,
    REQUPDATE_ALLOWED,
    RFH2_EXCLUDED_KEYWORDS,
    DelOpt,
    PubOpt,
    RegOpt,
)
from gateway.wire.reasons import Reason


class CommandName(enum.StrEnum):
    """MQPSCommand / psc ``Command`` values (the short wire forms)."""

    PUBLISH = "Publish"
    REG_SUB = "RegSub"
    DEREG_SUB = "DeregSub"
    DELETE_PUB = "DeletePub"
    REQ_UPDATE = "ReqUpdate"
    REG_PUB = "RegPub"
    DEREG_PUB = "DeregPub"


#: Commands serviced on stream queues; all others belong on SYSTEM.BROKER.CONTROL.QUEUE.
STREAM_COMMANDS = frozenset({CommandName.PUBLISH, CommandName.DELETE_PUB})
#: Commands MQRFH2's psc folder knows (no RegPub/DeregPub there).
RFH2_COMMANDS = frozenset(
    {
        CommandName.PUBLISH,
        CommandName.REG_SUB,
        CommandName.DEREG_SUB,
        CommandName.DELETE_PUB,
        CommandName.REQ_UPDATE,
    }
)


class HeaderKind(enum.IntEnum):
    """Which header the command came in (and its response goes out in)."""

    RFH = 1
    RFH2 = 2


@dataclass(slots=True)
class Command:
    """One publish/subscribe command, whatever header it came in.

    ``stream`` is MQPSStreamName when given (MQRFH only; None otherwise); ``q_mgr_name``
    / ``q_name`` the identity queue when given (the MQMD ReplyTo fields otherwise);
    ``correl_id`` a psc ``CorrelId`` (hex) overriding the MQMD CorrelId.

    Read-only once decoded: messages carrying the same psc folder share one decoded
    command (``gateway.pubsub.inbound``).
    """

    name: CommandName
    header: HeaderKind
    topics: list[str] = field(default_factory=list)
    reg_opts: RegOpt = RegOpt.NONE
    pub_opts: PubOpt = PubOpt.NONE
    del_opts: DelOpt = DelOpt.NONE
    stream: str | None = None
    q_mgr_name: str | None = None
    q_name: str | None = None
    sub_name: str = ""
    sub_identity: str = ""
    sub_user_data: str = ""
    pub_time: str = ""
    seq_num: str = ""
    int_data: list[str] = field(default_factory=list)
    string_data: list[str] = field(default_factory=list)
    correl_id: bytes | None = None
    sub_point: str = ""
    filter: str = ""
    user_pairs: list[tuple[str, str]] = field(default_factory=list)


# ------------------------------------------------------------------ MQRFH (v1) -------

_RFH_REPEATABLE = frozenset(
    {"MQPSTopic", "MQPSRegOpts", "MQPSPubOpts", "MQPSDelOpts", "MQPSIntData", "MQPSStringData"}
)
_RFH_COMMON = frozenset({"MQPSTopic", "MQPSQMgrName", "MQPSQName", "MQPSStreamName"})
_RFH_TAGS: dict[CommandName, frozenset[str]] = {
    CommandName.PUBLISH: _RFH_COMMON
    | {"MQPSRegOpts", "MQPSPubOpts", "MQPSPubTime", "MQPSSeqNum", "MQPSIntData", "MQPSStringData"},
    CommandName.REG_SUB: _RFH_COMMON
    | {"MQPSRegOpts", "MQPSSubName", "MQPSSubIdentity", "MQPSSubUserData"},
    CommandName.DEREG_SUB: _RFH_COMMON | {"MQPSRegOpts", "MQPSSubName", "MQPSSubIdentity"},
    CommandName.REQ_UPDATE: _RFH_COMMON | {"MQPSRegOpts", "MQPSSubName"},
    CommandName.REG_PUB: _RFH_COMMON | {"MQPSRegOpts"},
    CommandName.DEREG_PUB: _RFH_COMMON | {"MQPSRegOpts"},
    CommandName.DELETE_PUB: _RFH_COMMON | {"MQPSDelOpts"},
}
#: Every tag of the protocol (reference §5.2): an MQPS tag outside a command's set is a
#: parameter error, an MQ* name that is not a tag at all is reserved and refused too.
_RFH_ALL_TAGS = frozenset(
    {
        "MQPSCommand",
        "MQPSCompCode",
        "MQPSCorrelId",
        "MQPSDelOpts",
        "MQPSErrorId",
        "MQPSErrorPos",
        "MQPSIntData",
        "MQPSParmId",
        "MQPSPubOpts",
        "MQPSPubTime",
        "MQPSQMgrName",
        "MQPSQName",
        "MQPSReason",
        "MQPSReasonText",
        "MQPSRegOpts",
        "MQPSSeqNum",
        "MQPSStreamName",
        "MQPSStringData",
        "MQPSSubIdentity",
        "MQPSSubName",
        "MQPSSubUserData",
        "MQPSTopic",
        "MQPSUserId",
    }
)


#: every command by its value (exact spelling)
_COMMAND_NAMES: dict[str, CommandName] = {c.value: c for c in CommandName}


def _command_name(value: str, parm_id: str, allowed: Iterable[CommandName]) -> CommandName:
    name = _COMMAND_NAMES.get(value)  # CommandName(value) without enum's lookup per call
    if name is None:
        try:
            name = CommandName(value)
        except ValueError:
            raise CommandError(
                Reason.RFH_COMMAND_ERROR, f"unknown command {value!r}", parm_id=parm_id,
                value=value,
            ) from None
    if name not in (allowed if isinstance(allowed, frozenset) else set(allowed)):
        raise CommandError(
            Reason.RFH_COMMAND_ERROR,
            f"{value} is not a command of this header",
            parm_id=parm_id,
            value=value,
        )
    return name


def _reg_opt(keyword: str, parm_id: str, rfh2: bool) -> RegOpt:
    bit = REG_KEYWORDS.get(keyword)
    if bit is None or (rfh2 and keyword in RFH2_EXCLUDED_KEYWORDS):
        raise CommandError(
            Reason.REG_OPTIONS_ERROR,
            f"unknown registration option {keyword!r}",
            parm_id=parm_id,
            value=keyword,
        )
    return bit


def _pub_opt(keyword: str, parm_id: str, rfh2: bool) -> PubOpt:
    bit = PUB_KEYWORDS.get(keyword)
    if bit is None or (rfh2 and keyword in RFH2_EXCLUDED_KEYWORDS):
        raise CommandError(
            Reason.PUB_OPTIONS_ERROR,
            f"unknown publication option {keyword!r}",
            parm_id=parm_id,
            value=keyword,
        )
    return bit


def _del_opt(keyword: str, parm_id: str) -> DelOpt:
    bit = DEL_KEYWORDS.get(keyword)
    if bit is None:
        raise CommandError(
            Reason.DEL_OPTIONS_ERROR,
            f"unknown delete option {keyword!r}",
            parm_id=parm_id,
            value=keyword,
        )
    return bit


def decode_rfh_command(name_values: Iterable[tuple[str, str]]) -> Command:
    """Parse the NameValueString pairs of an MQRFH (v1) command (reference §5.2, §5.4)."""
    pairs = list(name_values)
    first_mqps = next((i for i, (n, _) in enumerate(pairs) if n.startswith("MQPS")), None)
    if first_mqps is None or pairs[first_mqps][0] != "MQPSCommand":
        raise CommandError(
            Reason.RFH_COMMAND_ERROR,
            "MQPSCommand must be the first MQPS tag",
            parm_id="MQPSCommand",
        )
    cmd = Command(_command_name(pairs[first_mqps][1], "MQPSCommand", CommandName), HeaderKind.RFH)
    allowed = _RFH_TAGS[cmd.name]
    seen: set[str] = set()
    for index, (tag, value) in enumerate(pairs):
        if index == first_mqps:
            continue
        if not tag.startswith("MQ"):
            cmd.user_pairs.append((tag, value))
            continue
        if tag == "MQPSCommand":
            raise CommandError(
                Reason.RFH_DUPLICATE_PARM, "MQPSCommand repeated", parm_id=tag, value=value
            )
        if tag not in allowed:
            raise CommandError(
                Reason.RFH_PARM_ERROR,
                f"{tag} is not a parameter of {cmd.name}"
                if tag in _RFH_ALL_TAGS
                else f"unknown reserved tag {tag}",
                parm_id=tag,
                value=value,
            )
        if tag in seen and tag not in _RFH_REPEATABLE:
            raise CommandError(
                Reason.RFH_DUPLICATE_PARM, f"{tag} repeated", parm_id=tag, value=value
            )
        seen.add(tag)
        if tag == "MQPSTopic":
            cmd.topics.append(value)
        elif tag == "MQPSRegOpts":
            cmd.reg_opts |= _reg_opt(value, tag, rfh2=False)
        elif tag == "MQPSPubOpts":
            cmd.pub_opts |= _pub_opt(value, tag, rfh2=False)
        elif tag == "MQPSDelOpts":
            cmd.del_opts |= _del_opt(value, tag)
        elif tag == "MQPSStreamName":
            cmd.stream = value
        elif tag == "MQPSQMgrName":
            cmd.q_mgr_name = value
        elif tag == "MQPSQName":
            cmd.q_name = value
        elif tag == "MQPSSubName":
            cmd.sub_name = value
        elif tag == "MQPSSubIdentity":
            cmd.sub_identity = value
        elif tag == "MQPSSubUserData":
            cmd.sub_user_data = value
        elif tag == "MQPSPubTime":
            cmd.pub_time = value
        elif tag == "MQPSSeqNum":
            cmd.seq_num = value
        elif tag == "MQPSIntData":
            cmd.int_data.append(value)
        elif tag == "MQPSStringData":
            cmd.string_data.append(value)
    _validate(cmd, "MQPSTopic", "MQPSRegOpts", "MQPSPubOpts")
    return cmd


# ------------------------------------------------------------------ MQRFH2 psc -------

_PSC_REPEATABLE = frozenset({"Topic", "RegOpt", "PubOpt", "DelOpt"})
_PSC_ELEMENTS = frozenset(
    {
        "Command",
        "RegOpt",
        "PubOpt",
        "DelOpt",
        "Topic",
        "SubPoint",
        "Filter",
        "QMgrName",
        "QName",
        "PubTime",
        "SeqNum",
        "SubName",
        "SubIdentity",
        "SubUserData",
        "CorrelId",
    }
)


def decode_psc_command(elements: Iterable[tuple[str, str]]) -> Command:
    """Parse the ``(element name, text)`` list of a ``psc`` folder (reference §5.5)."""
    items = list(elements)
    commands = [text for name, text in items if name == "Command"]
    if not commands:
        raise CommandError(
            Reason.RFH_COMMAND_ERROR, "psc folder without Command", parm_id="Command"
        )
    if len(commands) > 1:
        raise CommandError(
            Reason.RFH_DUPLICATE_PARM, "Command repeated", parm_id="Command", value=commands[1]
        )
    cmd = Command(_command_name(commands[0].strip(), "Command", RFH2_COMMANDS), HeaderKind.RFH2)
    seen: set[str] = set()
    for name, text in items:
        if name == "Command":
            continue
        if name not in _PSC_ELEMENTS:
            raise CommandError(
                Reason.RFH_PARM_ERROR, f"unknown psc element <{name}>", parm_id=name, value=text
            )
        if name in seen and name not in _PSC_REPEATABLE:
            raise CommandError(
                Reason.RFH_DUPLICATE_PARM, f"<{name}> repeated", parm_id=name, value=text
            )
        seen.add(name)
        if name == "Topic":
            cmd.topics.append(text)
        elif name == "RegOpt":
            cmd.reg_opts |= _reg_opt(text.strip(), name, rfh2=True)
        elif name == "PubOpt":
            cmd.pub_opts |= _pub_opt(text.strip(), name, rfh2=True)
        elif name == "DelOpt":
            cmd.del_opts |= _del_opt(text.strip(), name)
        elif name == "QMgrName":
            cmd.q_mgr_name = text.strip()
        elif name == "QName":
            cmd.q_name = text.strip()
        elif name == "SubName":
            cmd.sub_name = text
        elif name == "SubIdentity":
            cmd.sub_identity = text
        elif name == "SubUserData":
            cmd.sub_user_data = text
        elif name == "PubTime":
            cmd.pub_time = text
        elif name == "SeqNum":
            cmd.seq_num = text
        elif name == "SubPoint":
            cmd.sub_point = text
        elif name == "Filter":
            cmd.filter = text
        elif name == "CorrelId":
            try:
                cmd.correl_id = bytes.fromhex(text.strip()).ljust(24, b"\x00")[:24]
            except ValueError:
                raise CommandError(
                    Reason.RFH_PARM_ERROR, "CorrelId is not hexadecimal", parm_id=name, value=text
                ) from None
    if cmd.name not in (CommandName.PUBLISH, CommandName.DELETE_PUB) and "DelOpt" in seen:
        raise CommandError(
            Reason.RFH_PARM_ERROR, "DelOpt only belongs to DeletePub", parm_id="DelOpt"
        )
    if cmd.name is not CommandName.PUBLISH and "PubOpt" in seen:
        raise CommandError(
            Reason.RFH_PARM_ERROR, "PubOpt only belongs to Publish", parm_id="PubOpt"
        )
    if cmd.filter:
        # Content filters need a selection provider the gateway does not have.
        raise CommandError(
            Reason.FILTER_ERROR,
            "content filters are not supported",
            parm_id="Filter",
            value=cmd.filter,
        )
    _validate(cmd, "Topic", "RegOpt", "PubOpt")
    return cmd


# ------------------------------------------------------------------ shared rules -----

_REG_ALLOWED: dict[CommandName, RegOpt] = {
    CommandName.PUBLISH: PUBLISH_REG_ALLOWED,
    CommandName.REG_SUB: REGSUB_ALLOWED,
    CommandName.DEREG_SUB: DEREGSUB_ALLOWED,
    CommandName.REQ_UPDATE: REQUPDATE_ALLOWED,
    CommandName.REG_PUB: REGPUB_ALLOWED,
    CommandName.DEREG_PUB: DEREGPUB_ALLOWED,
    CommandName.DELETE_PUB: RegOpt.NONE,
}


#: the same rules as plain int masks (enum flag arithmetic costs ~2 us per operation);
#: ``~`` of a flag keeps to the defined bits, so the "not allowed" masks are made with it
_REG_NOT_ALLOWED: dict[CommandName, int] = {k: int(~v) for k, v in _REG_ALLOWED.items()}
_PUB_NOT_ALLOWED = int(~PUBLISH_PUB_ALLOWED)
_PERSISTENCE_CHOICES = int(PERSISTENCE_CHOICES)
_DIRECT_REQUESTS, _ANONYMOUS = int(RegOpt.DIRECT_REQUESTS), int(RegOpt.ANONYMOUS)
_JOIN_SHARED, _JOIN_EXCLUSIVE = int(RegOpt.JOIN_SHARED), int(RegOpt.JOIN_EXCLUSIVE)
_DEREGISTER_ALL = int(RegOpt.DEREGISTER_ALL)


def _validate(cmd: Command, topic_parm: str, reg_parm: str, pub_parm: str) -> None:
    """Per-command rules of reference §5.4/§5.5 common to both header forms."""
    reg = int(cmd.reg_opts)
    if reg & _REG_NOT_ALLOWED[cmd.name]:
        bad_reg = cmd.reg_opts & ~_REG_ALLOWED[cmd.name]
        raise CommandError(
            Reason.REG_OPTIONS_ERROR,
            f"option(s) {bad_reg!r} not valid for {cmd.name}",
            parm_id=reg_parm,
        )
    if int(cmd.pub_opts) & _PUB_NOT_ALLOWED:
        raise CommandError(Reason.PUB_OPTIONS_ERROR, "unknown publication option", parm_id=pub_parm)
    if (reg & _PERSISTENCE_CHOICES).bit_count() > 1:
        raise CommandError(
            Reason.REG_OPTIONS_ERROR, "more than one persistence option", parm_id=reg_parm
        )
    if reg & _DIRECT_REQUESTS and reg & _ANONYMOUS:
        raise CommandError(
            Reason.REG_OPTIONS_ERROR, "DirectReq cannot be combined with Anon", parm_id=reg_parm
        )
    if reg & _JOIN_SHARED and reg & _JOIN_EXCLUSIVE:
        raise CommandError(
            Reason.REG_OPTIONS_ERROR, "JoinShared and JoinExcl exclude each other", parm_id=reg_parm
        )
    dereg_all = bool(reg & _DEREGISTER_ALL)
    if not cmd.topics and not dereg_all:
        raise CommandError(Reason.RFH_PARM_MISSING, f"{cmd.name} needs a topic", parm_id=topic_parm)
    if cmd.name is CommandName.REQ_UPDATE and len(cmd.topics) > 1:
        raise CommandError(
            Reason.RFH_DUPLICATE_PARM, "ReqUpdate takes exactly one topic", parm_id=topic_parm
        )
