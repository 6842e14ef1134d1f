"""The fast paths of folder decoding equal the slow path: the flat-folder parser
(``gateway.wire.folder.parse_folder``), the cache of parsed MQRFH2 folders by their bytes
(``gateway.wire.rfh2``), handed out as copies or, to a reader, shared, and the cache of
``usr`` properties by folder text."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.wire import rfh2 as rfh2_module
from gateway.wire.chain import parse_message
from gateway.wire.errors import WireError
from gateway.wire.folder import (
    Element,
    _parse_flat,
    _Parser,
    clone_element,
    parse_flat_canonical,
    parse_folder,
    serialize_folder,
    usr_properties,
)
from gateway.wire.formats import FMT_RF_HEADER_2, FMT_STRING
from gateway.wire.mqmd import MQMD
from gateway.wire.rfh2 import MQRFH2, decode_rfh2, encode_rfh2
from tests.wire.strategies import elements, xml_name, xml_text


def _slow(text: str) -> Element | WireError:
    try:
        return _Parser(text, -1).parse()
    except WireError as exc:
        return exc


def _fast(text: str) -> Element | WireError:
    try:
        return parse_folder(text)
    except WireError as exc:
        return exc


def _same(text: str) -> None:
    fast, slow = _fast(text), _slow(text)
    if isinstance(slow, WireError):
        assert isinstance(fast, WireError), text
        assert (fast.reason, str(fast)) == (slow.reason, str(slow))
    else:
        assert fast == slow, text


flat_folders = st.builds(
    lambda name, leaves: Element(name, {}, "", [Element(n, {}, t) for n, t in leaves]),
    xml_name,
    st.lists(st.tuples(xml_name, xml_text), max_size=6),
)
_padding = st.text(alphabet=" \x00\t\r\n", max_size=4)


@settings(max_examples=400, deadline=None)
@given(folder=flat_folders, pad=_padding)
def test_flat_folders_parse_as_the_slow_path_does(folder: Element, pad: str) -> None:
    text = serialize_folder(folder) + pad
    _same(text)
    assert parse_folder(text) == folder


@settings(max_examples=300, deadline=None)
@given(folder=elements(), pad=_padding)
def test_any_folder_parses_as_the_slow_path_does(folder: Element, pad: str) -> None:
    _same(serialize_folder(folder) + pad)


_PIECES = [
    "<psc>",
    "</psc>",
    "<Command>",
    "</Command>",
    "<Topic>",
    "</Topic>",
    "<a>",
    "</a>",
    "</b>",
    "<b>",
    "Publish",
    "x/y",
    "&amp;",
    "&bad;",
    " ",
    "\x00",
    "<a/>",
    "<x y='1'>",
    "</x>",
    "<",
    ">",
    "</",
    "<a >",
    "</a >",
    "\n",
    "'",
    '"',
    "=",
]


@settings(max_examples=1500, deadline=None)
@given(st.lists(st.sampled_from(_PIECES) | xml_text, max_size=12))
def test_fuzzed_folder_text_parses_or_fails_as_the_slow_path_does(pieces: list[str]) -> None:
    _same("".join(pieces))


@pytest.mark.parametrize(
    "text",
    [
        "<psc><Command>Publish</Command><Topic>a/b</Topic></psc>",
        "<psc></psc>   ",
        "<mcd><Msd>jms_text</Msd></mcd>\x00\x00",
        "<usr><a>1</a><b></b></usr>",
    ],
)
def test_common_folders_take_the_fast_path(text: str) -> None:
    assert _parse_flat(text) is not None
    _same(text)


@pytest.mark.parametrize(
    "text",
    [
        "<psc><a>x</b><b>y</a></psc>",  # crossed end tags
        "<psc>text<a>x</a></psc>",
        " <psc></psc>",
        "<psc><a x='1'>x</a></psc>",
        "<psc><a>&amp;</a></psc>",
        "<psc><a/></psc>",
        "<psc><a>x</a></psd>",
    ],
)
def test_other_folders_take_the_slow_path(text: str) -> None:
    assert _parse_flat(text) is None
    _same(text)


def test_clone_is_deep() -> None:
    folder = Element("usr", {"k": "v"}, "", [Element("a", {"dt": "i4"}, "1")])
    copy = clone_element(folder)
    assert copy == folder
    copy.children[0].attributes["dt"] = "x"
    copy.children.append(Element("b"))
    copy.attributes["k"] = "w"
    assert folder == Element("usr", {"k": "v"}, "", [Element("a", {"dt": "i4"}, "1")])


@settings(max_examples=150, deadline=None)
@given(folders=st.lists(elements(6), max_size=3), ccsid=st.sampled_from([1208, 1200, 17584]))
def test_rfh2_decoded_twice_is_equal_and_never_shared(folders: list[Element], ccsid: int) -> None:
    raw = encode_rfh2(MQRFH2(folders=folders, name_value_ccsid=ccsid))
    first, _ = decode_rfh2(raw)
    second, _ = decode_rfh2(raw)  # from the cache
    assert first == second
    assert first.folders == folders
    for a, b in zip(first.folders, second.folders, strict=True):
        assert a is not b
        a.children.append(Element("changed"))
    third, _ = decode_rfh2(raw)
    assert third.folders == folders


@settings(max_examples=150, deadline=None)
@given(folders=st.lists(elements(6), max_size=3), ccsid=st.sampled_from([1208, 1200, 17584]))
def test_shared_folders_equal_copies_and_are_the_caches_own(
    folders: list[Element], ccsid: int
) -> None:
    raw = encode_rfh2(MQRFH2(folders=folders, name_value_ccsid=ccsid))
    copied, used = decode_rfh2(raw)
    shared, shared_used = decode_rfh2(raw, shared_folders=True)
    again, _ = decode_rfh2(raw, shared_folders=True)
    assert shared == copied and shared_used == used
    assert shared.folders == folders
    for a, b, c in zip(shared.folders, again.folders, copied.folders, strict=True):
        cached = len(rfh2_module.encode_folder(a, ccsid)) <= rfh2_module._FOLDER_CACHE_MAX_BYTES
        assert (a is b) == cached  # a small folder: the cached tree, not a copy
        assert a is not c
    # a caller that edits gets its own copy: the shared trees are untouched
    for folder in copied.folders:
        folder.children.append(Element("changed"))
    assert decode_rfh2(raw, shared_folders=True)[0].folders == folders


def test_parse_message_shares_mqrfh2_folders_only_when_asked() -> None:
    psc = Element.from_pairs("psc", {"Command": "Publish", "Topic": "a/b"})
    body = encode_rfh2(MQRFH2(folders=[psc], format=FMT_STRING)) + b"data"
    md = MQMD(format=FMT_RF_HEADER_2)
    shared = [parse_message(md, body, depth=1, shared_folders=True) for _ in range(2)]
    copied = parse_message(md, body, depth=1)
    assert shared[0] == shared[1] == copied
    assert shared[0].payload == b"data" and shared[0].format == FMT_STRING
    first, second = (m.headers[0] for m in shared)
    assert isinstance(first, MQRFH2) and isinstance(second, MQRFH2)
    assert isinstance(copied.headers[0], MQRFH2)
    assert first.folders[0] is second.folders[0]
    assert copied.headers[0].folders[0] is not first.folders[0]


def test_rfh2_folder_cache_is_bounded() -> None:
    for n in range(rfh2_module._FOLDER_CACHE_MAX + 50):
        raw = encode_rfh2(MQRFH2(folders=[Element("usr", {}, "", [Element("n", {}, str(n))])]))
        decode_rfh2(raw)
    assert len(rfh2_module._FOLDER_CACHE) <= rfh2_module._FOLDER_CACHE_MAX


@settings(max_examples=150, deadline=None)
@given(leaves=st.lists(st.tuples(xml_name, xml_text), max_size=5))
def test_usr_properties_from_the_cache_equal_a_fresh_parse(leaves: list[tuple[str, str]]) -> None:
    text = serialize_folder(Element("usr", {}, "", [Element(n, {}, t) for n, t in leaves]))
    first = usr_properties([text])
    first[0].append(("mutated", "x"))
    first[1]["mutated"] = "x"
    again = usr_properties([text])
    assert again == (list(leaves), {})


def _canonical(text: str) -> tuple[Element, str] | WireError:
    try:
        folder = parse_folder(text)
        return folder, serialize_folder(folder)
    except WireError as exc:
        return exc


_raw_leaf_text = st.text(alphabet=st.characters(blacklist_characters="<&"), max_size=12)


@settings(max_examples=600, deadline=None)
@given(
    name=xml_name,
    leaves=st.lists(st.tuples(xml_name, _raw_leaf_text), max_size=5),
    pad=_padding,
)
def test_a_flat_folders_own_text_is_its_serialization_when_nothing_needs_escaping(
    name: str, leaves: list[tuple[str, str]], pad: str
) -> None:
    text = f"<{name}>" + "".join(f"<{n}>{t}</{n}>" for n, t in leaves) + f"</{name}>" + pad
    expected = _canonical(text)
    got = parse_flat_canonical(text)
    needs_escaping = any(c in t for _, t in leaves for c in ">\"'")
    if needs_escaping:
        assert got is None
    else:
        assert got is not None and got == expected and got[1] == text[: len(text) - len(pad)]


@settings(max_examples=1000, deadline=None)
@given(st.lists(st.sampled_from(_PIECES) | xml_text, max_size=12))
def test_fuzzed_folder_text_has_its_serialization_or_none(pieces: list[str]) -> None:
    text = "".join(pieces)
    got = parse_flat_canonical(text)
    if got is not None:
        assert got == _canonical(text)


@settings(max_examples=200, deadline=None)
@given(
    folders=st.lists(elements(6) | flat_folders, max_size=3),
    ccsid=st.sampled_from([1208, 1200, 17584]),
)
def test_shared_decode_gives_each_folders_serialization_or_none(
    folders: list[Element], ccsid: int
) -> None:
    raw = encode_rfh2(MQRFH2(folders=folders, name_value_ccsid=ccsid))
    for _ in range(2):  # parsed, then from the cache
        shared, _ = decode_rfh2(raw, shared_folders=True)
        assert len(shared.folder_texts) == len(shared.folders) == len(folders)
        for folder, text in zip(shared.folders, shared.folder_texts, strict=True):
            assert text is None or text == folder.to_xml()
            # a flat folder written as the serializer writes it: its text is known
            assert (text is not None) == (_parse_flat(folder.to_xml()) is not None)
    assert decode_rfh2(raw)[0].folder_texts == []  # a copy the caller may edit: none
