"""MQRFH2 folder contents: a small element tree, a bounded parser and a serializer.

Why hand-written: NameValueData is XML-like but not XML (MQ's own syntax, q099240 /
js51616). A full XML library would expand entities and DTDs from untrusted input; this
parser knows only elements, attributes, text and the five predefined entities plus
numeric character references, refuses anything else, never recurses (one tokenizing
regular expression and an explicit element stack) and caps nesting depth; the
serializer recurses at most MAX_DEPTH levels.
Reference: IBM MQ "NameValueData" (q099320), protocol reference §4.2.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from gateway.wire.errors import WireError
from gateway.wire.reasons import Reason

#: Deepest element nesting accepted in one folder (MQ folders are a few levels deep).
MAX_DEPTH = 64

_ENTITIES = {"lt": "<", "gt": ">", "amp": "&", "quot": '"', "apos": "'"}
_WS = " \t\r\n"


@dataclass(slots=True)
class Element:
    """One element of a folder: ``<name attr="v">text<child/>...</name>``.

    ``text`` is the element's character content (blanks significant); an element with
    children normally has empty text (whitespace between tags is dropped).
    """

    name: str
    attributes: dict[str, str] = field(default_factory=dict)
    text: str = ""
    children: list[Element] = field(default_factory=list)

    # -- builders -------------------------------------------------------------------
    @classmethod
    def from_pairs(
        cls,
        name: str,
        pairs: Mapping[str, object] | Iterable[tuple[str, object]],
        *,
        attributes: Mapping[str, str] | None = None,
    ) -> Element:
        """Build a flat folder, e.g. ``Element.from_pairs('usr', {'Colour': 'Blue'})``.

        Values are converted with ``str``; a list/tuple value repeats the element
        (``{'Topic': ['a', 'b']}``); an :class:`Element` value is inserted as is.
        """
        folder = cls(name, dict(attributes or {}))
        items = pairs.items() if isinstance(pairs, Mapping) else pairs
        for key, value in items:
            values = value if isinstance(value, list | tuple) else [value]
            for v in values:
                folder.children.append(v if isinstance(v, Element) else cls(key, text=_text(v)))
        return folder

    # -- navigation -----------------------------------------------------------------
    def find(self, path: str) -> Element | None:
        """First descendant along ``path`` (``'Response/Reason'``), or None."""
        node: Element | None = self
        for part in path.split("/"):
            if node is None:
                return None
            node = next((c for c in node.children if c.name == part), None)
        return node

    def findall(self, path: str) -> list[Element]:
        """Every element matching ``path``; the last step may repeat (``'Topic'``)."""
        parent_path, _, last = path.rpartition("/")
        parent = self.find(parent_path) if parent_path else self
        if parent is None:
            return []
        return [c for c in parent.children if c.name == last]

    def get(self, path: str, default: str | None = None) -> str | None:
        """Text of the first element at ``path``, or ``default``."""
        node = self.find(path)
        return default if node is None else node.text

    def get_all(self, path: str) -> list[str]:
        """Texts of every element at ``path`` (repeated options, several topics)."""
        return [c.text for c in self.findall(path)]

    def set(self, path: str, value: object, *, dt: str | None = None) -> Element:
        """Set the text at ``path`` (creating elements), replacing the first match."""
        node = self
        for part in path.split("/"):
            nxt = next((c for c in node.children if c.name == part), None)
            if nxt is None:
                nxt = Element(part)
                node.children.append(nxt)
            node = nxt
        node.text = _text(value)
        node.children = []
        if dt is not None:
            node.attributes["dt"] = dt
        return node

    def add(self, name: str, value: object, *, dt: str | None = None) -> Element:
        """Append a child ``<name>value</name>`` (for repeatable elements)."""
        child = Element(name, {"dt": dt} if dt else {}, _text(value))
        self.children.append(child)
        return child

    def remove(self, path: str) -> int:
        """Remove every element at ``path``; returns how many were removed."""
        parent_path, _, last = path.rpartition("/")
        parent = self.find(parent_path) if parent_path else self
        if parent is None:
            return 0
        before = len(parent.children)
        parent.children = [c for c in parent.children if c.name != last]
        return before - len(parent.children)

    def to_dict(self) -> dict[str, str]:
        """Flat {child name: text} view (last repeat wins); handy for usr properties."""
        return {c.name: c.text for c in self.children}

    def to_xml(self) -> str:
        """Serialize (see :func:`serialize_folder`)."""
        return serialize_folder(self)


def _text(value: object) -> str:
    if isinstance(value, bool):
        return "TRUE" if value else "FALSE"
    return value if isinstance(value, str) else str(value)


_ESCAPES = {"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&apos;"}
_NEEDS_ESCAPE = re.compile("[&<>\"']")


def _escape_match(match: re.Match[str]) -> str:
    return _ESCAPES[match.group()]


def escape(text: str, *, attribute: bool = False) -> str:
    """Escape ``& < > " '`` (all five, in text and attribute values alike)."""
    if _NEEDS_ESCAPE.search(text) is None:
        return text
    return _NEEDS_ESCAPE.sub(_escape_match, text)


#: Names already validated (bounded cache: folder vocabularies are small).
_VALID_NAMES: set[str] = set()


def _check_name(name: str, what: str) -> None:
    if name in _VALID_NAMES:
        return
    if _NAME_RE.fullmatch(name) is None:
        raise WireError(Reason.RFH_FORMAT_ERROR, f"{what} name {name!r} is not a valid name")
    if len(_VALID_NAMES) < 4096:
        _VALID_NAMES.add(name)


def _serialize(el: Element, depth: int, out: list[str]) -> None:
    # Recursion is bounded by MAX_DEPTH, checked before descending.
    if depth > MAX_DEPTH:
        raise WireError(Reason.RFH_FORMAT_ERROR, f"folder nests deeper than {MAX_DEPTH}")
    name = el.name
    _check_name(name, "element")
    if el.attributes:
        out.append("<" + name)
        for key, value in el.attributes.items():
            _check_name(key, "attribute")
            out.append(f' {key}="{escape(value, attribute=True)}"')
        out.append(">")
    else:
        out.append(f"<{name}>")
    if el.text:
        out.append(escape(el.text))
    for child in el.children:
        _serialize(child, depth + 1, out)
    out.append(f"</{name}>")


def serialize_folder(root: Element) -> str:
    """Serialize a folder without padding; names are validated, text escaped."""
    out: list[str] = []
    _serialize(root, 1, out)
    return "".join(out)


_NAME = r"[^\s/>=<&\"']+"
_ATTRIBUTE = re.compile(rf"\s+({_NAME})\s*=\s*(?:\"([^\"<]*)\"|'([^'<]*)')")
_REFERENCE = re.compile(r"&(lt|gt|amp|quot|apos|#[0-9]{1,8}|#[xX][0-9a-fA-F]{1,6});")
_NAME_RE = re.compile(_NAME)
_ATTRS = rf"(?:\s+{_NAME}\s*=\s*(?:\"[^\"<]*\"|'[^'<]*'))*"
_TOKEN = re.compile(
    # A whole leaf element in one match (the common case), then tags and text.
    rf"(?P<leaf><(?P<lname>{_NAME})(?P<lattrs>{_ATTRS})\s*>(?P<ltext>[^<]*)</(?P=lname)\s*>)"
    rf"|(?P<end></(?P<ename>{_NAME})\s*>)"
    rf"|(?P<start><(?P<sname>{_NAME})(?P<attrs>{_ATTRS})\s*(?P<empty>/?)>)"
    r"|(?P<text>[^<]+)"
)
_LEADING_WS = re.compile(r"[ \t\r\n]*")


class _Parser:
    """Single-pass, non-recursive, regex-tokenized parser over one folder's text."""

    __slots__ = ("base", "pos", "text")

    def __init__(self, text: str, base: int) -> None:
        self.text = text
        self.pos = 0
        self.base = base

    def fail(self, message: str) -> WireError:
        return WireError(
            Reason.RFH_FORMAT_ERROR,
            f"NameValueData: {message} (character {self.pos})",
            self.base if self.base >= 0 else -1,
        )

    def _reference(self, match: re.Match[str]) -> str:
        ref = match.group(1)
        if ref[0] != "#":
            return _ENTITIES[ref]
        code = int(ref[2:], 16) if ref[1] in "xX" else int(ref[1:])
        if code <= 0 or code > 0x10FFFF or 0xD800 <= code <= 0xDFFF:
            raise self.fail(f"bad character reference &{ref};")
        return chr(code)

    def unescape(self, raw: str) -> str:
        if "&" not in raw:
            return raw
        if raw.count("&") != len(_REFERENCE.findall(raw)):
            bad = raw[raw.find("&") :][:12]
            raise self.fail(f"unknown or unterminated entity reference near {bad!r}")
        return _REFERENCE.sub(self._reference, raw)

    def attributes(self, raw: str) -> dict[str, str]:
        attrs: dict[str, str] = {}
        for match in _ATTRIBUTE.finditer(raw):
            key = match.group(1)
            if key in attrs:
                raise self.fail(f"duplicate attribute {key}")
            value = match.group(2) if match.group(2) is not None else match.group(3)
            attrs[key] = self.unescape(value)
        return attrs

    def parse(self) -> Element:
        text = self.text
        n = len(text)
        m = _LEADING_WS.match(text)
        pos = m.end() if m else 0
        stack: list[Element] = []
        chunks: list[list[str]] = []  # text pieces per open element (avoids quadratic +=)
        token = _TOKEN.match
        root: Element | None = None
        while root is None:
            if pos >= n:
                self.pos = pos
                raise self.fail("unexpected end of folder" if stack else "empty folder")
            tm = token(text, pos)
            if tm is None:
                self.pos = pos
                raise self.fail("malformed tag" if text[pos] == "<" else "expected '<'")
            kind = tm.lastgroup
            if kind == "leaf":
                if len(stack) >= MAX_DEPTH:
                    self.pos = pos
                    raise self.fail(f"folder nests deeper than {MAX_DEPTH}")
                raw_attrs = tm.group("lattrs")
                el = Element(
                    tm.group("lname"),
                    self.attributes(raw_attrs) if raw_attrs else {},
                    self.unescape(tm.group("ltext")),
                )
                if stack:
                    stack[-1].children.append(el)
                else:
                    root = el
            elif kind == "text":
                if not stack:
                    self.pos = pos
                    raise self.fail("expected '<'")
                chunks[-1].append(self.unescape(tm.group("text")))
            elif kind == "end":
                name = tm.group("ename")
                if not stack or stack[-1].name != name:
                    self.pos = pos
                    expected = stack[-1].name if stack else "nothing"
                    raise self.fail(f"end tag </{name}> does not match <{expected}>")
                el = stack.pop()
                content = "".join(chunks.pop())
                el.text = "" if el.children and not content.strip(_WS) else content
                if not stack:
                    root = el
            else:
                raw_attrs = tm.group("attrs")
                el = Element(tm.group("sname"), self.attributes(raw_attrs) if raw_attrs else {})
                if stack:
                    stack[-1].children.append(el)
                if tm.group("empty"):
                    if not stack:
                        root = el
                elif len(stack) >= MAX_DEPTH:
                    self.pos = pos
                    raise self.fail(f"folder nests deeper than {MAX_DEPTH}")
                else:
                    stack.append(el)
                    chunks.append([])
            pos = tm.end()
        self.pos = pos
        if text[pos:].strip(" \x00\t\r\n"):
            raise self.fail("data after the folder's end tag")
        return root


#: Fast path: a flat folder of leaf elements without attributes or references, e.g.
#: ``<psc><Command>Publish</Command><Topic>a/b</Topic></psc>`` (what publishers send).
_FLAT = re.compile(rf"<({_NAME})>((?:<{_NAME}>[^<&]*</{_NAME}>)*)</\1>[ \x00\t\r\n]*")
_FLAT_LEAF = re.compile(rf"<({_NAME})>([^<&]*)</\1>")


def _parse_flat(text: str) -> Element | None:
    """``text`` parsed when it is a flat folder (see ``_FLAT``), else None."""
    m = _FLAT.fullmatch(text)
    if m is None:
        return None
    inner = m.group(2)
    children = [Element(name, {}, value) for name, value in _FLAT_LEAF.findall(inner)]
    # Each leaf's end tag must close that leaf (``<a>x</b>`` matched _FLAT's pattern):
    # the leaves found must account for every character of the folder's content.
    if sum(2 * len(c.name) + 5 + len(c.text) for c in children) != len(inner):
        return None
    return Element(m.group(1), {}, "", children)


def parse_flat_canonical(text: str) -> tuple[Element, str] | None:
    """(tree, its serialization) of a flat folder (see ``_FLAT``) whose text needs no
    escaping, else None. Why: a folder passed through is kept as its serialization, and
    for such a folder that is its own text without the padding (the ``usr`` folder a
    publisher changes each message is not re-serialised)."""
    m = _FLAT.fullmatch(text)
    if m is None:
        return None
    inner = m.group(2)
    children = [Element(name, {}, value) for name, value in _FLAT_LEAF.findall(inner)]
    # as in _parse_flat: the leaves found account for every character of the content;
    # the serializer escapes > " ' in text (names hold none of them, each leaf has two >)
    if (
        sum(2 * len(c.name) + 5 + len(c.text) for c in children) != len(inner)
        or inner.count(">") != 2 * len(children)
        or '"' in inner
        or "'" in inner
    ):
        return None
    name = m.group(1)
    return Element(name, {}, "", children), text[: m.end(2) + len(name) + 3]


def parse_folder(text: str, *, offset: int = -1) -> Element:
    """Parse one NameValueData folder (already decoded to str).

    Trailing blanks/NULs (padding) are allowed after the end tag; anything else raises
    WireError MQRC_RFH_FORMAT_ERROR; ``offset`` is the folder's byte offset for errors.
    A flat folder (leaves only, no attributes, no references) takes a fast path that
    gives the same tree.
    """
    if text[:1] == "<":
        flat = _parse_flat(text)
        if flat is not None:
            return flat
    return _Parser(text, offset).parse()


def clone_element(element: Element) -> Element:
    """A deep copy of ``element`` (its attributes and children copied too)."""
    return Element(
        element.name,
        dict(element.attributes) if element.attributes else {},
        element.text,
        [clone_element(c) for c in element.children] if element.children else [],
    )


def usr_properties_of(root: Element) -> tuple[list[tuple[str, str]], dict[str, str]]:
    """(properties in message order, repeats kept; their ``dt`` types) of one parsed
    ``usr`` folder. A nested group's elements get dotted names (``group.name``), as IBM MQ
    names the message properties of a nested ``usr`` group."""
    props: list[tuple[str, str]] = []
    types: dict[str, str] = {}
    for child in root.children:
        _flatten(child, child.name, props, types)
    return props, types


def usr_properties(folders: Iterable[str]) -> tuple[list[tuple[str, str]], dict[str, str]]:
    """:func:`usr_properties_of` over every ``usr`` folder among ``folders`` (MQRFH2
    folder XML text). A folder that does not parse is skipped, not fatal (the message
    was accepted before)."""
    props: list[tuple[str, str]] = []
    types: dict[str, str] = {}
    for text in folders:
        if "usr" not in text[:16]:
            continue
        known = _USR_CACHE.get(text)
        if known is None:
            try:
                root = parse_folder(text)
            except WireError:
                continue
            if root.name != "usr":
                continue
            more, more_types = usr_properties_of(root)
            known = (tuple(more), more_types)
            if len(text) <= _USR_CACHE_MAX_CHARS:
                if len(_USR_CACHE) >= _USR_CACHE_MAX:
                    del _USR_CACHE[next(iter(_USR_CACHE))]
                _USR_CACHE[text] = known
        props.extend(known[0])
        types.update(known[1])
    return props, types


def remember_usr_properties(text: str, root: Element) -> None:
    """Tell :func:`usr_properties` the properties of ``text``, the serialization of the
    ``usr`` folder ``root`` the caller holds, so it need not parse ``text`` again. Only a
    flat folder is remembered (leaves without attributes, text free of markup), for
    which parsing ``text`` gives ``root`` exactly (the fast path's own condition)."""
    if (
        root.name != "usr"
        or root.attributes
        or root.text
        or len(text) > _USR_CACHE_MAX_CHARS
        or text in _USR_CACHE
    ):
        return
    props: list[tuple[str, str]] = []
    for child in root.children:
        if child.children or child.attributes or _MARKUP.search(child.text):
            return
        props.append((child.name, child.text))
    if len(_USR_CACHE) >= _USR_CACHE_MAX:
        del _USR_CACHE[next(iter(_USR_CACHE))]
    _USR_CACHE[text] = (tuple(props), {})


_MARKUP = re.compile(r"[<>&\"']")

#: usr folder text -> its properties (the service decodes a publication's folders, then
#: each sink delivery asks for its properties: no second parse of the same folder).
_USR_CACHE: dict[str, tuple[tuple[tuple[str, str], ...], dict[str, str]]] = {}
_USR_CACHE_MAX = 512
_USR_CACHE_MAX_CHARS = 1024


def _flatten(
    element: Element, path: str, props: list[tuple[str, str]], types: dict[str, str]
) -> None:
    if not element.children:
        props.append((path, element.text))
        dt = element.attributes.get("dt", "")
        if dt:
            types[path] = dt
        return
    for child in element.children:
        _flatten(child, f"{path}.{child.name}", props, types)
