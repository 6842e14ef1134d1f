"""Hypothesis strategies for wire structures (shared by the property tests)."""

from __future__ import annotations

from hypothesis import strategies as st

from gateway.wire.dlh import MQDLH
from gateway.wire.folder import Element
from gateway.wire.mqmd import MQMD
from gateway.wire.mqmde import MQMDE
from gateway.wire.rfh import MQRFH
from gateway.wire.rfh2 import MQRFH2
from gateway.wire.xqh import MQXQH

INT32 = st.integers(min_value=-(2**31), max_value=2**31 - 1)
ENCODINGS = st.sampled_from([546, 273, 785, 1041, 0x12, 0x21])
#: Structure CCSIDs and the alphabet their fixed fields can hold.
STRUCT_CCSIDS = st.sampled_from([0, 819, 1208, 437, 850, 500, 37, 1140])
_ASCII_PRINTABLE = "".join(chr(c) for c in range(0x21, 0x7F))


def char_field(width: int) -> st.SearchStrategy[str]:
    """Text that survives a blank-padded CHARn field in every supported CCSID."""
    return st.text(alphabet=_ASCII_PRINTABLE + " ", max_size=width).map(lambda s: s.rstrip(" "))


def id_bytes(size: int) -> st.SearchStrategy[bytes]:
    return st.binary(min_size=size, max_size=size)


@st.composite
def mqmds(draw: st.DrawFn, version: int | None = None) -> MQMD:
    v = draw(st.sampled_from([1, 2])) if version is None else version
    md = MQMD(
        version=v,
        report=draw(INT32),
        msg_type=draw(INT32),
        expiry=draw(INT32),
        feedback=draw(INT32),
        encoding=draw(INT32),
        coded_char_set_id=draw(INT32),
        format=draw(char_field(8)),
        priority=draw(INT32),
        persistence=draw(INT32),
        msg_id=draw(id_bytes(24)),
        correl_id=draw(id_bytes(24)),
        backout_count=draw(INT32),
        reply_to_q=draw(char_field(48)),
        reply_to_q_mgr=draw(char_field(48)),
        user_identifier=draw(char_field(12)),
        accounting_token=draw(id_bytes(32)),
        appl_identity_data=draw(char_field(32)),
        put_appl_type=draw(INT32),
        put_appl_name=draw(char_field(28)),
        put_date=draw(char_field(8)),
        put_time=draw(char_field(8)),
        appl_origin_data=draw(char_field(4)),
    )
    if v == 2:
        md.group_id = draw(id_bytes(24))
        md.msg_seq_number = draw(INT32)
        md.offset = draw(INT32)
        md.msg_flags = draw(INT32)
        md.original_length = draw(INT32)
    return md


#: NameValueString tokens: anything but NUL (quotes and blanks included).
nv_token = st.text(alphabet=st.characters(exclude_characters="\x00", max_codepoint=0xFF))


@st.composite
def rfhs(draw: st.DrawFn) -> MQRFH:
    return MQRFH(
        name_values=draw(st.lists(st.tuples(nv_token, nv_token), max_size=8)),
        encoding=draw(INT32),
        coded_char_set_id=draw(INT32),
        format=draw(char_field(8)),
        flags=draw(INT32),
    )


xml_name = st.from_regex(r"[A-Za-z_][A-Za-z0-9_.\-]{0,12}", fullmatch=True)
xml_text = st.text(max_size=40)


def elements(max_leaves: int = 12) -> st.SearchStrategy[Element]:
    leaf = st.builds(
        Element,
        name=xml_name,
        attributes=st.dictionaries(xml_name, xml_text, max_size=2),
        text=xml_text,
    )

    def extend(children: st.SearchStrategy[Element]) -> st.SearchStrategy[Element]:
        return st.builds(
            Element,
            name=xml_name,
            attributes=st.dictionaries(xml_name, xml_text, max_size=2),
            text=st.just(""),
            children=st.lists(children, min_size=1, max_size=4),
        )

    return st.recursive(leaf, extend, max_leaves=max_leaves)


@st.composite
def rfh2s(draw: st.DrawFn) -> MQRFH2:
    return MQRFH2(
        folders=draw(st.lists(elements(), max_size=4)),
        encoding=draw(INT32),
        coded_char_set_id=draw(INT32),
        format=draw(char_field(8)),
        flags=draw(INT32),
        name_value_ccsid=draw(st.sampled_from([1208, 1200, 13488, 17584])),
    )


@st.composite
def dlhs(draw: st.DrawFn) -> MQDLH:
    return MQDLH(
        reason=draw(INT32),
        dest_q_name=draw(char_field(48)),
        dest_q_mgr_name=draw(char_field(48)),
        encoding=draw(INT32),
        coded_char_set_id=draw(INT32),
        format=draw(char_field(8)),
        put_appl_type=draw(INT32),
        put_appl_name=draw(char_field(28)),
        put_date=draw(char_field(8)),
        put_time=draw(char_field(8)),
    )


@st.composite
def mqmdes(draw: st.DrawFn) -> MQMDE:
    return MQMDE(
        encoding=draw(INT32),
        coded_char_set_id=draw(INT32),
        format=draw(char_field(8)),
        flags=draw(INT32),
        group_id=draw(id_bytes(24)),
        msg_seq_number=draw(INT32),
        offset=draw(INT32),
        msg_flags=draw(INT32),
        original_length=draw(INT32),
    )


@st.composite
def xqhs(draw: st.DrawFn) -> MQXQH:
    return MQXQH(
        remote_q_name=draw(char_field(48)),
        remote_q_mgr_name=draw(char_field(48)),
        msg_desc=draw(mqmds(version=1)),
    )
