"""MQRFH2: framing by lengths, folder parsing/serializing, CCSIDs, builders and faults."""

from __future__ import annotations

import pytest

from gateway.wire.errors import WireError
from gateway.wire.folder import MAX_DEPTH, Element, parse_folder, serialize_folder
from gateway.wire.reasons import Reason
from gateway.wire.rfh2 import MQRFH2, decode_rfh2, encode_folder, encode_rfh2


def _frame(*folders: bytes, nv_ccsid: int = 1208, extra: int = 0) -> bytes:
    body = b"".join(len(f).to_bytes(4, "little") + f for f in folders)
    length = 36 + len(body) + extra
    return (
        b"RFH "
        + (2).to_bytes(4, "little")
        + length.to_bytes(4, "little")
        + (546).to_bytes(4, "little")
        + (1208).to_bytes(4, "little", signed=True)
        + b"MQSTR   "
        + bytes(4)
        + nv_ccsid.to_bytes(4, "little")
        + body
    )


def test_every_name_value_length_is_a_multiple_of_four() -> None:
    rfh2 = MQRFH2()
    for n in range(1, 6):
        rfh2.add_folder("usr", {"k": "x" * n})
    data = encode_rfh2(rfh2)
    pos = 36
    while pos < len(data):
        length = int.from_bytes(data[pos : pos + 4], "little")
        assert length % 4 == 0
        chunk = data[pos + 4 : pos + 4 + length]
        assert chunk.rstrip(b" ").endswith(b"</usr>")
        pos += 4 + length
    assert pos == len(data) == int.from_bytes(data[8:12], "little")


def test_convenience_access_and_builders() -> None:
    rfh2 = MQRFH2()
    rfh2.add_folder("psc", [("Command", "RegSub"), ("Topic", ["a/b", "c/#"])])
    rfh2.set("usr", "Colour", "Blue")
    rfh2.set("usr", "Size", 3, dt="i4")
    assert rfh2.get("usr", "Colour") == "Blue"
    assert rfh2.get_all("psc", "Topic") == ["a/b", "c/#"]
    assert rfh2.get("usr", "Missing") is None and rfh2.get("nofolder", "x", "d") == "d"
    data = encode_rfh2(rfh2)
    assert b'<Size dt="i4">3</Size>' in data
    back, _ = decode_rfh2(data)
    assert back == rfh2
    usr = back.folder("usr")
    assert usr is not None and usr.to_dict() == {"Colour": "Blue", "Size": "3"}


def test_nested_groups_and_paths() -> None:
    pscr = parse_folder(
        "<pscr><Completion>error</Completion><Response><Reason>3072</Reason>"
        "<Topic>a b</Topic></Response></pscr>"
    )
    assert pscr.get("Response/Reason") == "3072"
    assert pscr.get("Response/Topic") == "a b"
    assert pscr.findall("Response/Reason")[0].text == "3072"
    assert pscr.remove("Response") == 1 and pscr.find("Response") is None


def test_parser_accepts_mq_syntax_variants() -> None:
    folder = parse_folder(
        "<usr>\n  <A dt='i4'>1</A>\t<B xsi:nil='true'/>  <C dt = \"string\" >  x  </C></usr>"
        "   \x00\x00"
    )
    assert [c.name for c in folder.children] == ["A", "B", "C"]
    assert folder.children[0].attributes == {"dt": "i4"}
    assert folder.children[1].attributes == {"xsi:nil": "true"} and folder.children[1].text == ""
    assert folder.children[2].text == "  x  "  # blanks inside a value are significant


def test_escapes_round_trip() -> None:
    el = Element("usr", {"a": "1 < 2 & \"q\" 'x'"}, "<&>\"'")
    text = serialize_folder(el)
    assert text == (
        '<usr a="1 &lt; 2 &amp; &quot;q&quot; &apos;x&apos;">&lt;&amp;&gt;&quot;&apos;</usr>'
    )
    assert parse_folder(text) == el
    assert parse_folder("<a>&#65;&#x42;&amp;</a>").text == "AB&"


@pytest.mark.parametrize(
    "text",
    [
        "",
        "   ",
        "text",
        "<a>",
        "<a></b>",
        "<a><b></a></b>",
        "<a>&unknown;</a>",
        "<a>&#0;</a>",
        "<a>&#xD800;</a>",
        "<a>&lt</a>",
        "<a x=1></a>",
        "<a x='1></a>",
        "<a x='1'y='2'></a>",
        "<a x='1' x='2'></a>",
        "<a></a><b></b>",
        "<a></a>junk",
        "<!DOCTYPE a [<!ENTITY x 'y'>]><a>&x;</a>",
        "<a/ >",
    ],
)
def test_malformed_folders_raise_rfh_format_error(text: str) -> None:
    with pytest.raises(WireError) as err:
        parse_folder(text)
    assert err.value.reason == Reason.RFH_FORMAT_ERROR


def test_greater_than_in_text_is_tolerated_as_in_xml() -> None:
    assert parse_folder("<a>x > y</a>").text == "x > y"


def test_depth_is_bounded_without_recursion() -> None:
    deep = "<a>" * (MAX_DEPTH + 1) + "</a>" * (MAX_DEPTH + 1)
    with pytest.raises(WireError) as err:
        parse_folder(deep)
    assert "deeper" in err.value.message
    ok = "<a>" * MAX_DEPTH + "x" + "</a>" * MAX_DEPTH
    assert parse_folder(ok).name == "a"
    node = Element("a")
    root = node
    for _ in range(MAX_DEPTH + 5):
        child = Element("a")
        node.children.append(child)
        node = child
    with pytest.raises(WireError):
        serialize_folder(root)


def test_serializer_refuses_bad_names() -> None:
    with pytest.raises(WireError) as err:
        serialize_folder(Element("bad name"))
    assert err.value.reason == Reason.RFH_FORMAT_ERROR


@pytest.mark.parametrize("nv_ccsid", [1200, 13488, 17584])
@pytest.mark.parametrize("encoding", [546, 273])
def test_utf16_folders_follow_the_header_byte_order(nv_ccsid: int, encoding: int) -> None:
    rfh2 = MQRFH2(name_value_ccsid=nv_ccsid)
    rfh2.add_folder("usr", {"Name": "Größe ✓"})
    data = encode_rfh2(rfh2, encoding)
    codec = "utf-16-le" if encoding == 546 else "utf-16-be"
    assert "<usr>".encode(codec) in data
    assert decode_rfh2(data, encoding)[0] == rfh2


def test_encode_folder_pads_utf16_with_utf16_blanks() -> None:
    data = encode_folder(Element("a"), 1200)  # "<a></a>" = 7 chars = 14 bytes -> 16
    assert len(data) == 16 and data.endswith(" ".encode("utf-16-le"))


def test_only_mq_name_value_ccsids_are_emitted() -> None:
    with pytest.raises(WireError) as err:
        encode_rfh2(MQRFH2(name_value_ccsid=819))
    assert err.value.reason == Reason.TARGET_CCSID_ERROR


def test_decoder_tolerates_other_supported_name_value_ccsids() -> None:
    folder = "<usr><a>é</a></usr> ".encode("latin-1")
    rfh2, _ = decode_rfh2(_frame(folder, nv_ccsid=819))
    assert rfh2.get("usr", "a") == "é"


@pytest.mark.parametrize(
    ("data", "reason", "offset"),
    [
        (_frame(b"<a></a> ")[:35], Reason.RFH_ERROR, 8),
        (_frame(b"<a></a> ")[:31], Reason.RFH_ERROR, 0),
        (_frame(b"<a></a> ", extra=2) + b"zz", Reason.RFH_ERROR, 48),
        (_frame(b"<a></a> ")[:36] + (99).to_bytes(4, "little") + b"<a></a> ", Reason.RFH_ERROR, 36),
        (
            _frame(b"<a></a> ")[:36] + (-4).to_bytes(4, "little", signed=True) + b"<a></a> ",
            Reason.RFH_ERROR,
            36,
        ),
        (_frame(b"<a></b> "), Reason.RFH_FORMAT_ERROR, 40),
        (_frame(b"<a>\xff</a>"), Reason.SOURCE_CCSID_ERROR, 43),
        (_frame(b"<a></a> ", nv_ccsid=4242), Reason.SOURCE_CCSID_ERROR, -1),
        (_frame(b"<a></a>  ", nv_ccsid=1200), Reason.RFH_FORMAT_ERROR, 40),
    ],
)
def test_framing_faults(data: bytes, reason: int, offset: int) -> None:
    with pytest.raises(WireError) as err:
        decode_rfh2(data)
    assert err.value.reason == reason
    assert err.value.offset == offset


def test_version_1_is_refused_by_the_v2_decoder() -> None:
    data = bytearray(_frame(b"<a></a> "))
    data[4] = 1
    with pytest.raises(WireError) as err:
        decode_rfh2(bytes(data))
    assert err.value.reason == Reason.RFH_ERROR and "MQRFH" in err.value.message


@pytest.mark.parametrize(
    "text",
    [
        "<a" + " b='c'" * 20000,
        "<a " + "x" * 200000,
        "<a>" + "&" * 100000 + "</a>",
        "<a " + 'b="' * 50000,
        "<a>" * 70 + "</a>" * 70,
    ],
)
def test_adversarial_folders_fail_cleanly(text: str) -> None:
    with pytest.raises(WireError) as err:
        parse_folder(text)
    assert err.value.reason == Reason.RFH_FORMAT_ERROR


def test_large_values_parse() -> None:
    big = "x" * 1_000_000
    assert parse_folder("<a>" * 60 + big + "</a>" * 60).find("/".join(["a"] * 59)).text == big  # type: ignore[union-attr]
