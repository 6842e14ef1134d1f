"""The rules table of a runmqdlq-style dead-letter queue handler: parse it, match messages.

Why sans-I/O: the table is text an operator writes and the matching is a pure function of
a message's MQDLH and MQMD, so both are tested without a queue manager; the handler
(:mod:`gateway.mq.dlq_handler`) does the gets and puts.

The syntax and meaning are IBM MQ's runmqdlq rules table (IBM MQ documentation: "The DLQ
handler rules table", "DLQ control data", "DLQ rules (patterns and actions)", "DLQ rules
table conventions", "How the DLQ rules table is processed"):

* An optional first entry of control data: ``INPUTQ``, ``INPUTQM``, ``RETRYINT``, ``WAIT``.
* Then at least one rule: pattern keywords (``APPLIDAT APPLNAME APPLTYPE DESTQ DESTQM
  FEEDBACK FORMAT MSGTYPE PERSIST REASON REPLYQ REPLYQM USERID``, each ``*`` by default)
  and action keywords (``ACTION`` (required) ``FWDQ FWDQM HEADER PUTAUT RETRY``).
* Keywords in any order, once per entry, not case sensitive, separated by blanks or
  commas; blanks allowed around parentheses. Values not in single quotes are folded to
  upper case; a quoted value is taken as written (``''`` is one quote). A value needs at
  least one significant character (``FORMAT('')`` and ``FORMAT()`` are errors).
* ``*`` starts a comment line; blank lines are ignored; ``+`` as the last non-blank
  character continues the entry from the first non-blank character of the next line,
  ``-`` from the start of the next line.
* String patterns are generic: ``?`` is any one character, ``*`` any run of characters.
  Numeric patterns take IBM's symbolic names (``MQRC_Q_FULL``, ``MQMT_REQUEST``,
  ``MQPER_PERSISTENT``, ``MQFB_COA``, ``MQAT_UNIX``) or numbers.

What is matched: ``REASON``, ``DESTQ``, ``DESTQM`` and ``FORMAT`` come from the MQDLH (the
format of the original data, the MQMD's own is ``MQDEAD``); the other pattern keywords
from the MQMD of the message on the DLQ.

Anything else (an unknown keyword, a control-data keyword in a rule, a rule without
``ACTION``, ``FWD`` without ``FWDQ``) is a :class:`DlqRulesError` naming the line, as
runmqdlq validates the whole table before it starts.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, fields, replace
from typing import Literal

from gateway.wire import formats
from gateway.wire.constants import Feedback, MsgType, Persistence, PutApplType
from gateway.wire.dlh import MQDLH
from gateway.wire.mqmd import MQMD
from gateway.wire.reasons import Reason

#: RETRYINT default (seconds) and the RETRY bounds, as runmqdlq documents them.
DEFAULT_RETRY_INTERVAL = 60
MAX_RETRY = 999_999_999


class DlqRulesError(ValueError):
    """The rules table is not valid; ``line`` is the 1-based line of the faulty entry."""

    def __init__(self, line: int, message: str) -> None:
        self.line = line
        self.detail = message
        super().__init__(f"rules table line {line}: {message}")


class Action(enum.Enum):
    """ACTION(...): what the handler does with a matching message."""

    DISCARD = "DISCARD"
    IGNORE = "IGNORE"
    RETRY = "RETRY"
    FWD = "FWD"


WaitMode = Literal["YES", "NO"] | int


@dataclass(frozen=True, slots=True)
class ControlData:
    """The control-data entry. Blank ``input_q``: the queue manager's DEADQ.

    ``wait``: ``"YES"`` waits for ever for new messages, ``"NO"`` ends once nothing on
    the DLQ can be processed, an integer waits that many seconds for new work first.
    """

    input_q: str = ""
    input_q_mgr: str = ""
    retry_int: int = DEFAULT_RETRY_INTERVAL
    wait: WaitMode = "YES"


@dataclass(frozen=True, slots=True)
class Pattern:
    """The pattern of a rule; ``None`` is the default ``*`` (matches anything)."""

    applidat: str | None = None
    applname: str | None = None
    appltype: int | None = None
    destq: str | None = None
    destqm: str | None = None
    feedback: int | None = None
    format: str | None = None
    msgtype: int | None = None
    persist: int | None = None
    reason: int | None = None
    replyq: str | None = None
    replyqm: str | None = None
    userid: str | None = None

    def match(self, dlh: MQDLH, md: MQMD) -> bool:
        """True when every keyword of the pattern matches (``None`` always does)."""
        strings = (
            (self.applidat, md.appl_identity_data),
            (self.applname, md.put_appl_name),
            (self.destq, dlh.dest_q_name),
            (self.destqm, dlh.dest_q_mgr_name),
            (self.format, dlh.format),
            (self.replyq, md.reply_to_q),
            (self.replyqm, md.reply_to_q_mgr),
            (self.userid, md.user_identifier),
        )
        for pattern, value in strings:
            if pattern is not None and not match_generic(pattern, value):
                return False
        numbers = (
            (self.appltype, md.put_appl_type),
            (self.feedback, md.feedback),
            (self.msgtype, md.msg_type),
            (self.persist, md.persistence),
            (self.reason, dlh.reason),
        )
        return all(p is None or p == v for p, v in numbers)


@dataclass(frozen=True, slots=True)
class Rule:
    """One rule: its pattern, its action and the line it starts on (for reports)."""

    action: Action
    pattern: Pattern = field(default_factory=Pattern)
    fwd_q: str = ""
    fwd_q_mgr: str = ""
    header: bool = True
    put_aut: Literal["DEF", "CTX"] = "DEF"
    retry: int = 1
    line: int = field(default=0, compare=False)

    def to_text(self) -> str:
        """The rule as one rules-table line (parses back to an equal rule)."""
        parts: list[str] = []
        for f in fields(Pattern):
            value = getattr(self.pattern, f.name)
            if value is None:
                continue
            spec = _PATTERN_KEYWORDS.get(f.name.upper())
            if isinstance(value, int):
                named = spec.name_of(value) if spec and spec.name_of else None
                parts.append(f"{f.name.upper()}({named or value})")
            else:
                parts.append(f"{f.name.upper()}({_quote(value)})")
        parts.append(f"ACTION({self.action.value})")
        if self.action is Action.FWD:
            parts.append(f"FWDQ({_quote(self.fwd_q)})")
            if self.fwd_q_mgr:
                parts.append(f"FWDQM({_quote(self.fwd_q_mgr)})")
            parts.append(f"HEADER({'YES' if self.header else 'NO'})")
        if self.put_aut != "DEF":
            parts.append(f"PUTAUT({self.put_aut})")
        if self.retry != 1:
            parts.append(f"RETRY({self.retry})")
        return " ".join(parts)


@dataclass(frozen=True, slots=True)
class RulesTable:
    """A parsed rules table: control data and the rules in table order."""

    control: ControlData
    rules: tuple[Rule, ...]

    def match(self, dlh: MQDLH, md: MQMD) -> Rule | None:
        """The first rule whose pattern matches, as runmqdlq searches the table."""
        for rule in self.rules:
            if rule.pattern.match(dlh, md):
                return rule
        return None

    def matches(self, dlh: MQDLH, md: MQMD) -> Iterator[tuple[int, Rule]]:
        """Every matching rule with its index, in table order (runmqdlq moves on to the
        next matching rule once a rule's RETRY attempts are used up)."""
        for index, rule in enumerate(self.rules):
            if rule.pattern.match(dlh, md):
                yield index, rule

    def to_text(self) -> str:
        """The table as text (parses back to an equal table)."""
        c = self.control
        control = [
            f"INPUTQ({_quote(c.input_q or ' ')})",
            f"INPUTQM({_quote(c.input_q_mgr or ' ')})",
            f"RETRYINT({c.retry_int})",
            f"WAIT({c.wait})",
        ]
        return "\n".join([" ".join(control), *(r.to_text() for r in self.rules)]) + "\n"


# ---------------------------------------------------------------- generic matching


def match_generic(pattern: str, value: str) -> bool:
    """runmqdlq's generic match: ``?`` one character, ``*`` any run; trailing blanks of
    both sides are not significant (MQ pads names with blanks)."""
    return _generic_regex(pattern.rstrip(" ")).fullmatch(value.rstrip(" ")) is not None


_REGEX_CACHE: dict[str, re.Pattern[str]] = {}


def _generic_regex(pattern: str) -> re.Pattern[str]:
    regex = _REGEX_CACHE.get(pattern)
    if regex is None:
        text = "".join(
            ".*" if ch == "*" else "." if ch == "?" else re.escape(ch) for ch in pattern
        )
        regex = re.compile(text, re.DOTALL)
        if len(_REGEX_CACHE) < 1024:
            _REGEX_CACHE[pattern] = regex
    return regex


# ---------------------------------------------------------------- keyword tables


@dataclass(frozen=True, slots=True)
class _NumericSpec:
    """How a numeric pattern keyword reads symbolic names (IBM prefix + enum member)."""

    prefixes: tuple[str, ...]
    lookup: Callable[[str], int | None]
    name_of: Callable[[int], str | None] | None


def _enum_lookup(prefix: str, enum_cls: type[enum.IntEnum]) -> Callable[[str], int | None]:
    def lookup(name: str) -> int | None:
        if not name.startswith(prefix):
            return None
        member = enum_cls.__members__.get(name[len(prefix) :])
        return None if member is None else int(member)

    return lookup


def _enum_name(prefix: str, enum_cls: type[enum.IntEnum]) -> Callable[[int], str | None]:
    def name_of(value: int) -> str | None:
        try:
            return prefix + enum_cls(value).name
        except ValueError:
            return None

    return name_of


def _reason_lookup(name: str) -> int | None:
    if not name.startswith(("MQRC_", "MQRCCF_")):
        return None
    try:
        return int(Reason.from_ibm_name(name))
    except KeyError:
        return None


def _reason_name(value: int) -> str | None:
    try:
        return Reason(value).ibm_name
    except ValueError:
        return None


def _feedback_lookup(name: str) -> int | None:
    # exception reports carry an MQRC_* value in Feedback
    found = _enum_lookup("MQFB_", Feedback)(name)
    return found if found is not None else _reason_lookup(name)


_PERSIST_NAMES = {
    "MQPER_PERSISTENT": int(Persistence.PERSISTENT),
    "MQPER_NOT_PERSISTENT": int(Persistence.NOT_PERSISTENT),
    "MQPER_PERSISTENCE_AS_Q_DEF": int(Persistence.PERSISTENCE_AS_Q_DEF),
    "MQPER_PERSISTENCE_AS_PARENT": int(Persistence.PERSISTENCE_AS_PARENT),
}
_PERSIST_BY_VALUE = {v: k for k, v in _PERSIST_NAMES.items()}

_PATTERN_KEYWORDS: dict[str, _NumericSpec] = {
    "APPLTYPE": _NumericSpec(
        ("MQAT_",), _enum_lookup("MQAT_", PutApplType), _enum_name("MQAT_", PutApplType)
    ),
    "FEEDBACK": _NumericSpec(("MQFB_", "MQRC_"), _feedback_lookup, _enum_name("MQFB_", Feedback)),
    "MSGTYPE": _NumericSpec(
        ("MQMT_",), _enum_lookup("MQMT_", MsgType), _enum_name("MQMT_", MsgType)
    ),
    "PERSIST": _NumericSpec(("MQPER_",), _PERSIST_NAMES.get, _PERSIST_BY_VALUE.get),
    "REASON": _NumericSpec(("MQRC_", "MQRCCF_"), _reason_lookup, _reason_name),
}
_STRING_PATTERNS = frozenset(
    {"APPLIDAT", "APPLNAME", "DESTQ", "DESTQM", "FORMAT", "REPLYQ", "REPLYQM", "USERID"}
)
_ACTION_KEYWORDS = frozenset({"ACTION", "FWDQ", "FWDQM", "HEADER", "PUTAUT", "RETRY"})
_CONTROL_KEYWORDS = frozenset({"INPUTQ", "INPUTQM", "RETRYINT", "WAIT"})
_RULE_KEYWORDS = _STRING_PATTERNS | frozenset(_PATTERN_KEYWORDS) | _ACTION_KEYWORDS
#: Field lengths of what a string keyword names (MQ_*_LENGTH), for a clear error.
_MAX_LENGTH = {
    "APPLIDAT": 32, "APPLNAME": 28, "DESTQ": 48, "DESTQM": 48, "FORMAT": 8, "REPLYQ": 48,
    "REPLYQM": 48, "USERID": 12, "FWDQ": 48, "FWDQM": 48, "INPUTQ": 48, "INPUTQM": 48,
}
#: MQFMT_* symbolic names accepted by FORMAT(...) (the value is the 8-character name).
_FORMAT_NAMES = {
    "MQFMT_" + name.removeprefix("FMT_"): value
    for name, value in vars(formats).items()
    if name.startswith("FMT_") and isinstance(value, str)
} | {"MQFMT_RF_HEADER_1": formats.FMT_RF_HEADER_1}


# ---------------------------------------------------------------- lexing


@dataclass(frozen=True, slots=True)
class _Value:
    text: str
    quoted: bool


@dataclass(slots=True)
class _Entry:
    """One logical entry (continuations joined) with the line of each character."""

    text: str
    lines: list[int]
    first_line: int

    def line_at(self, pos: int) -> int:
        if not self.lines:
            return self.first_line
        return self.lines[min(max(pos, 0), len(self.lines) - 1)]


def _entries(text: str) -> Iterator[_Entry]:
    buf: list[str] = []
    where: list[int] = []
    first = 0
    continuing = False
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.rstrip()
        if not continuing:
            stripped = line.lstrip()
            if not stripped or stripped.startswith("*"):
                continue
            first = number
        elif buf and buf[-1] == "+":
            buf.pop()
            where.pop()
            line = line.lstrip()
        elif buf and buf[-1] == "-":
            buf.pop()
            where.pop()
        buf.extend(line)
        where.extend([number] * len(line))
        continuing = bool(buf) and buf[-1] in "+-"
        if not continuing:
            yield _Entry("".join(buf), where, first)
            buf, where = [], []
    if buf or continuing:
        if buf and buf[-1] in "+-":
            buf.pop()
            where.pop()
        if "".join(buf).strip():
            yield _Entry("".join(buf), where, first)


_BARE_VALUE = re.compile(r"[A-Za-z0-9._/%*?&\-]+")


def _tokens(entry: _Entry) -> Iterator[tuple[str, _Value, int]]:
    """(KEYWORD, value, position) for every ``KEYWORD(value)`` of an entry."""
    s = entry.text
    i, n = 0, len(s)
    while True:
        while i < n and s[i] in " \t,":
            i += 1
        if i >= n:
            return
        start = i
        while i < n and (s[i].isalnum() or s[i] == "_"):
            i += 1
        keyword = s[start:i].upper()
        if not keyword:
            raise DlqRulesError(entry.line_at(i), f"expected a keyword, found {s[i]!r}")
        while i < n and s[i] in " \t":
            i += 1
        if i >= n or s[i] != "(":
            raise DlqRulesError(
                entry.line_at(start), f"{keyword} needs a value in parentheses: {keyword}(...)"
            )
        i += 1
        while i < n and s[i] in " \t":
            i += 1
        if i < n and s[i] == "'":
            chars: list[str] = []
            i += 1
            while True:
                if i >= n:
                    raise DlqRulesError(
                        entry.line_at(start), f"{keyword}: unterminated quoted value"
                    )
                if s[i] == "'":
                    if i + 1 < n and s[i + 1] == "'":
                        chars.append("'")
                        i += 2
                        continue
                    i += 1
                    break
                chars.append(s[i])
                i += 1
            value = _Value("".join(chars), True)
        else:
            close = s.find(")", i)
            if close < 0:
                raise DlqRulesError(entry.line_at(start), f"{keyword}: missing ')'")
            raw = s[i:close].strip()
            if raw and not _BARE_VALUE.fullmatch(raw):
                raise DlqRulesError(
                    entry.line_at(start),
                    f"{keyword}({raw}): a value with blanks or special characters must "
                    "be in single quotes",
                )
            value = _Value(raw.upper(), False)
            i = close
        while i < n and s[i] in " \t":
            i += 1
        if i >= n or s[i] != ")":
            raise DlqRulesError(entry.line_at(start), f"{keyword}: missing ')'")
        i += 1
        if value.text == "":
            raise DlqRulesError(
                entry.line_at(start), f"{keyword}: the value needs at least one character"
            )
        if i < n and s[i] not in " \t,":
            raise DlqRulesError(
                entry.line_at(i), f"blank or comma expected after {keyword}(...)"
            )
        yield keyword, value, start


# ---------------------------------------------------------------- parsing


def parse_rules(text: str) -> RulesTable:
    """Parse a rules table (see the module docstring); raises :class:`DlqRulesError`."""
    control: ControlData | None = None
    rules: list[Rule] = []
    last_line = 0
    for entry in _entries(text):
        last_line = entry.first_line
        seen: dict[str, tuple[_Value, int]] = {}
        for keyword, value, pos in _tokens(entry):
            line = entry.line_at(pos)
            if keyword not in _CONTROL_KEYWORDS and keyword not in _RULE_KEYWORDS:
                raise DlqRulesError(line, f"unknown keyword {keyword}")
            if keyword in seen:
                raise DlqRulesError(line, f"{keyword} appears twice in one entry")
            seen[keyword] = (value, line)
        controls = [k for k in seen if k in _CONTROL_KEYWORDS]
        others = [k for k in seen if k not in _CONTROL_KEYWORDS]
        if controls and others:
            raise DlqRulesError(
                entry.first_line,
                f"control data ({', '.join(controls)}) and rule keywords "
                f"({', '.join(others)}) cannot share an entry",
            )
        if controls:
            if control is not None or rules:
                raise DlqRulesError(
                    entry.first_line, "control data must be the first entry of the table"
                )
            control = _control(seen)
        else:
            rules.append(_rule(seen, entry.first_line))
    if not rules:
        raise DlqRulesError(max(last_line, 1), "the rules table must contain at least one rule")
    return RulesTable(control or ControlData(), tuple(rules))


def _name(keyword: str, value: _Value, line: int, *, blank_ok: bool = False) -> str:
    text = value.text.rstrip(" ")
    if not text and not blank_ok:
        raise DlqRulesError(line, f"{keyword}(' ') is not valid: name a queue")
    limit = _MAX_LENGTH.get(keyword)
    # a generic "*" can match nothing, so it does not count
    if limit is not None and len(text.replace("*", "")) > limit and not text.startswith("&"):
        raise DlqRulesError(line, f"{keyword}: {text!r} is longer than {limit} characters")
    return text


def _integer(keyword: str, value: _Value, line: int, low: int, high: int) -> int:
    text = value.text.strip()
    if not re.fullmatch(r"-?[0-9]+", text):
        raise DlqRulesError(line, f"{keyword}({value.text}) is not a number")
    number = int(text)
    if not low <= number <= high:
        raise DlqRulesError(line, f"{keyword}({number}) is out of range {low}-{high}")
    return number


def _control(seen: dict[str, tuple[_Value, int]]) -> ControlData:
    out = ControlData()
    if "INPUTQ" in seen:
        v, line = seen["INPUTQ"]
        out = replace(out, input_q=_name("INPUTQ", v, line, blank_ok=True))
    if "INPUTQM" in seen:
        v, line = seen["INPUTQM"]
        out = replace(out, input_q_mgr=_name("INPUTQM", v, line, blank_ok=True))
    if "RETRYINT" in seen:
        v, line = seen["RETRYINT"]
        out = replace(out, retry_int=_integer("RETRYINT", v, line, 0, MAX_RETRY))
    if "WAIT" in seen:
        v, line = seen["WAIT"]
        text = v.text.strip().upper()
        wait: WaitMode
        if text in ("YES", "NO"):
            wait = "YES" if text == "YES" else "NO"
        elif re.fullmatch(r"[0-9]+", text):
            wait = _integer("WAIT", v, line, 0, MAX_RETRY)
        else:
            raise DlqRulesError(line, f"WAIT({v.text}): expected YES, NO or a number of seconds")
        out = replace(out, wait=wait)
    return out


def _pattern_value(keyword: str, value: _Value, line: int) -> str | int | None:
    text = value.text
    if text.strip() == "*":
        return None
    spec = _PATTERN_KEYWORDS.get(keyword)
    if spec is None:
        if keyword == "FORMAT" and text.upper() in _FORMAT_NAMES and not value.quoted:
            return _FORMAT_NAMES[text.upper()]
        return _name(keyword, value, line, blank_ok=True) or ""
    name = text.strip().upper()
    if re.fullmatch(r"-?[0-9]+", name):
        return int(name)
    if name.startswith(spec.prefixes):
        found = spec.lookup(name)
        if found is None:
            raise DlqRulesError(line, f"{keyword}({text}): unknown symbolic name {name}")
        return found
    raise DlqRulesError(
        line,
        f"{keyword}({text}): expected a number or a name starting "
        f"{' or '.join(spec.prefixes)}",
    )


def _rule(seen: dict[str, tuple[_Value, int]], first_line: int) -> Rule:
    if "ACTION" not in seen:
        raise DlqRulesError(first_line, "a rule needs ACTION(DISCARD|IGNORE|RETRY|FWD)")
    v, line = seen["ACTION"]
    try:
        action = Action(v.text.strip().upper())
    except ValueError:
        raise DlqRulesError(
            line, f"ACTION({v.text}): expected DISCARD, IGNORE, RETRY or FWD"
        ) from None
    pattern: dict[str, str | int | None] = {}
    for keyword, (value, kw_line) in seen.items():
        if keyword in _STRING_PATTERNS or keyword in _PATTERN_KEYWORDS:
            pattern[keyword.lower()] = _pattern_value(keyword, value, kw_line)
    fwd_q = fwd_q_mgr = ""
    header = True
    if action is Action.FWD:
        if "FWDQ" not in seen:
            raise DlqRulesError(line, "ACTION(FWD) needs FWDQ(queue|&DESTQ|&REPLYQ)")
        v, kw_line = seen["FWDQ"]
        fwd_q = _name("FWDQ", v, kw_line)
        if fwd_q.startswith("&") and fwd_q not in ("&DESTQ", "&REPLYQ"):
            raise DlqRulesError(kw_line, f"FWDQ({fwd_q}): expected a queue, &DESTQ or &REPLYQ")
        if "FWDQM" in seen:
            v, kw_line = seen["FWDQM"]
            fwd_q_mgr = _name("FWDQM", v, kw_line, blank_ok=True)
            if fwd_q_mgr.startswith("&") and fwd_q_mgr not in ("&DESTQM", "&REPLYQM"):
                raise DlqRulesError(
                    kw_line, f"FWDQM({fwd_q_mgr}): expected a queue manager, &DESTQM or &REPLYQM"
                )
        if "HEADER" in seen:
            v, kw_line = seen["HEADER"]
            text = v.text.strip().upper()
            if text not in ("YES", "NO"):
                raise DlqRulesError(kw_line, f"HEADER({v.text}): expected YES or NO")
            header = text == "YES"
    else:
        for keyword in ("FWDQ", "FWDQM", "HEADER"):
            if keyword in seen:
                raise DlqRulesError(
                    seen[keyword][1], f"{keyword} is only valid with ACTION(FWD)"
                )
    put_aut: Literal["DEF", "CTX"] = "DEF"
    if "PUTAUT" in seen:
        v, kw_line = seen["PUTAUT"]
        text = v.text.strip().upper()
        if text not in ("DEF", "CTX"):
            raise DlqRulesError(kw_line, f"PUTAUT({v.text}): expected DEF or CTX")
        put_aut = "DEF" if text == "DEF" else "CTX"
    retry = 1
    if "RETRY" in seen:
        v, kw_line = seen["RETRY"]
        retry = _integer("RETRY", v, kw_line, 1, MAX_RETRY)
    return Rule(
        action=action,
        pattern=Pattern(**pattern),  # type: ignore[arg-type]
        fwd_q=fwd_q,
        fwd_q_mgr=fwd_q_mgr,
        header=header,
        put_aut=put_aut,
        retry=retry,
        line=first_line,
    )


def _quote(text: str) -> str:
    """A value as the table writes it: bare when it parses back unchanged, else quoted."""
    if not text:
        return "' '"
    if _BARE_VALUE.fullmatch(text) and text == text.upper() and text != "-":
        return text
    return "'" + text.replace("'", "''") + "'"
