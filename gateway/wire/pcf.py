"""PCF (Programmable Command Format): MQCFH plus MQCFIN / MQCFST / MQCFSL parameters.

Why: the brokers of a WebSphere MQ Publish/Subscribe network tell each other which
streams they support, who their parent and children are, and which streams or brokers
were deleted, with *broker administration publications*: Publish messages in PCF
(MQMD.Format ``MQADMIN``) on ``SYSTEM.BROKER.ADMIN.STREAM``. The gateway joins those
networks, so it must read and write these structures byte for byte.

References: IBM MQ "MQCFH - PCF header" (q049400; MQCFH_* constants), "MQCFIN - PCF
integer parameter", "MQCFST - PCF string parameter" (q088680), "MQCFSL - PCF string
list parameter", "Structures for commands and responses" (q088570); constant values
from cmqcfc.h (MQCFT_*, MQCFC_*, MQCMD_*, MQCACF_*, MQIACF_*, MQRCCF_*).

Layouts (every field an MQLONG unless said otherwise; offsets in bytes):

* MQCFH, 36 bytes (MQCFH_STRUC_LENGTH): 0 Type, 4 StrucLength, 8 Version, 12 Command,
  16 MsgSeqNumber, 20 Control, 24 CompCode, 28 Reason, 32 ParameterCount.
* MQCFIN, 16 bytes (MQCFIN_STRUC_LENGTH): 0 Type (3), 4 StrucLength, 8 Parameter,
  12 Value.
* MQCFST, 20 + string (MQCFST_STRUC_LENGTH_FIXED): 0 Type (4), 4 StrucLength,
  8 Parameter, 12 CodedCharSetId, 16 StringLength, 20 String (StringLength bytes, then
  padding up to StrucLength, which is a multiple of 4; the padding is not significant).
* MQCFSL, 24 + strings (MQCFSL_STRUC_LENGTH_FIXED): 0 Type (6), 4 StrucLength,
  8 Parameter, 12 CodedCharSetId, 16 Count, 20 StringLength (of *each* string),
  24 Strings (Count strings of StringLength bytes, no gaps), padding to StrucLength.

Integers are in the byte order of the governing Encoding (the MQMD's, or the preceding
header's): MQENC_NATIVE little-endian or MQENC_NORMAL big-endian, as everywhere in this
package. A CodedCharSetId of 0 (MQCCSI_DEFAULT) means "the governing CCSID".

Decoding choices: an MQCFST value is returned exactly (StringLength bytes, blanks and
NULs kept: the reference says a NUL is normal data in responses); MQCFSL values lose
trailing blanks, because the format pads every string to one common length. StrucLength
must hold the data and fit in the message; a StrucLength that is not a multiple of 4 is
accepted (lenient, like :mod:`gateway.wire.rfh`). The message must end exactly after the
ParameterCount-th parameter. Parameter structures other than MQCFIN/MQCFST/MQCFSL
(MQCFIL, MQCFBS, MQCFGR, filters) are refused with MQRCCF_STRUCTURE_TYPE_ERROR: the
broker administration publications never carry them. Faults are WireError with the
MQRCCF reason a command server would give and the byte offset of the faulty field.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass, field

from gateway.wire.ccsid import DEFAULT_STRUCTURE_CCSID, decode_text, encode_text
from gateway.wire.constants import ENC_NATIVE
from gateway.wire.encoding import BIG, byte_order
from gateway.wire.errors import WireError
from gateway.wire.reasons import Reason

# --- Structure types (MQCFT_*) ---------------------------------------------------------
MQCFT_NONE = 0
MQCFT_COMMAND = 1
MQCFT_RESPONSE = 2
MQCFT_INTEGER = 3
MQCFT_STRING = 4
MQCFT_INTEGER_LIST = 5
MQCFT_STRING_LIST = 6
MQCFT_EVENT = 7
MQCFT_USER = 8
MQCFT_BYTE_STRING = 9
MQCFT_TRACE_ROUTE = 10
MQCFT_REPORT = 12
MQCFT_INTEGER_FILTER = 13
MQCFT_STRING_FILTER = 14
MQCFT_BYTE_STRING_FILTER = 15
MQCFT_COMMAND_XR = 16
MQCFT_XR_MSG = 17
MQCFT_XR_ITEM = 18
MQCFT_XR_SUMMARY = 19
MQCFT_GROUP = 20
MQCFT_STATISTICS = 21
MQCFT_ACCOUNTING = 22
MQCFT_INTEGER64 = 23
MQCFT_INTEGER64_LIST = 25
MQCFT_APP_ACTIVITY = 26

#: Type values that describe a whole message (an MQCFH), not a parameter.
HEADER_TYPES = frozenset(
    {
        MQCFT_COMMAND,
        MQCFT_RESPONSE,
        MQCFT_EVENT,
        MQCFT_USER,
        MQCFT_TRACE_ROUTE,
        MQCFT_REPORT,
        MQCFT_COMMAND_XR,
        MQCFT_XR_MSG,
        MQCFT_XR_ITEM,
        MQCFT_XR_SUMMARY,
        MQCFT_STATISTICS,
        MQCFT_ACCOUNTING,
        MQCFT_APP_ACTIVITY,
    }
)

# --- Structure lengths and versions ---------------------------------------------------
MQCFH_STRUC_LENGTH = 36
MQCFH_VERSION_1 = 1
MQCFH_VERSION_2 = 2
MQCFH_VERSION_3 = 3
_VERSIONS = (MQCFH_VERSION_1, MQCFH_VERSION_2, MQCFH_VERSION_3)
MQCFIN_STRUC_LENGTH = 16
MQCFST_STRUC_LENGTH_FIXED = 20
MQCFSL_STRUC_LENGTH_FIXED = 24

# --- Control options (MQCFC_*) ----------------------------------------------------------
MQCFC_NOT_LAST = 0
MQCFC_LAST = 1

# --- Publish/subscribe command identifiers (MQCMD_*, the PCF form of the commands) ------
MQCMD_DELETE_PUBLICATION = 60
MQCMD_DEREGISTER_PUBLISHER = 61
MQCMD_DEREGISTER_SUBSCRIBER = 62
MQCMD_PUBLISH = 63
MQCMD_REGISTER_PUBLISHER = 64
MQCMD_REGISTER_SUBSCRIBER = 65
MQCMD_REQUEST_UPDATE = 66
MQCMD_BROKER_INTERNAL = 67

# --- Parameter identifiers used by the broker publications (cmqc.h / cmqcfc.h) ---------
MQCA_Q_MGR_NAME = 2015
MQIACF_PUBLICATION_OPTIONS = 1082
MQCACF_STREAM_NAME = 3030
MQCACF_TOPIC = 3031
MQCACF_PARENT_Q_MGR_NAME = 3032
MQCACF_PUBLISH_TIMESTAMP = 3034
MQCACF_SUPPORTED_STREAM_NAME = 3036
MQCACF_REG_TOPIC = 3037
MQCACF_CHILD_Q_MGR_NAME = 3040
MQCACF_REG_STREAM_NAME = 3041
MQCACF_REG_Q_MGR_NAME = 3042

#: Most zero-length strings an MQCFSL may list (non-empty ones are bounded by the bytes
#: present); a corrupt Count must not make the decoder loop for minutes.
MAX_EMPTY_LIST_COUNT = 65536

_CFH = {o: struct.Struct(o + "9i") for o in "<>"}
_CFIN = {o: struct.Struct(o + "4i") for o in "<>"}
_CFST = {o: struct.Struct(o + "5i") for o in "<>"}
_CFSL = {o: struct.Struct(o + "6i") for o in "<>"}
_HEAD = {o: struct.Struct(o + "2i") for o in "<>"}  # Type, StrucLength of any parameter
assert _CFH["<"].size == MQCFH_STRUC_LENGTH and _CFIN["<"].size == MQCFIN_STRUC_LENGTH
assert _CFST["<"].size == MQCFST_STRUC_LENGTH_FIXED
assert _CFSL["<"].size == MQCFSL_STRUC_LENGTH_FIXED


@dataclass(slots=True)
class PCFHeader:
    """MQCFH. ``parameter_count`` is as decoded; :func:`encode_pcf` writes the number
    of parameters it is given, so it takes no part in equality."""

    type: int = MQCFT_COMMAND
    command: int = 0
    msg_seq_number: int = 1
    control: int = MQCFC_LAST
    comp_code: int = 0
    reason: int = 0
    version: int = MQCFH_VERSION_1
    parameter_count: int = field(default=0, compare=False)


@dataclass(frozen=True, slots=True)
class IntParam:
    """MQCFIN: one integer parameter."""

    parameter: int
    value: int


@dataclass(frozen=True, slots=True)
class StringParam:
    """MQCFST: one string parameter; ``ccsid`` 0 means the governing CCSID."""

    parameter: int
    value: str
    ccsid: int = 0


@dataclass(frozen=True, slots=True)
class StringListParam:
    """MQCFSL: strings of one common length (shorter ones blank padded on encode, so
    trailing blanks do not survive a round trip)."""

    parameter: int
    values: list[str]
    ccsid: int = 0


PCFParam = IntParam | StringParam | StringListParam


def _text_ccsid(param_ccsid: int, governing: int) -> int:
    """CCSID of a parameter's text: its own unless 0 (MQCCSI_DEFAULT), then the
    governing one; special values (0, negative) mean ISO-8859-1 as for structures."""
    ccsid = param_ccsid if param_ccsid > 0 else governing
    return ccsid if ccsid > 0 else DEFAULT_STRUCTURE_CCSID


def _padded(length: int) -> int:
    return length + (-length % 4)


def _pack(layout: struct.Struct, what: str, *values: int) -> bytes:
    try:
        return layout.pack(*values)
    except struct.error as exc:
        raise WireError(Reason.PCF_ERROR, f"{what} integer field out of range: {exc}") from None


def encode_pcf(
    header: PCFHeader,
    params: Sequence[PCFParam],
    encoding: int = ENC_NATIVE,
    *,
    ccsid: int = 0,
) -> bytes:
    """The MQCFH and its parameters, integers in ``encoding``.

    ``ccsid`` is the governing CCSID (the MQMD's): strings of parameters with
    ``ccsid`` 0 are encoded in it (0 itself meaning ISO-8859-1). ParameterCount is
    ``len(params)``; every structure is padded with NULs to a multiple of 4.
    """
    order = byte_order(encoding, field="PCF target encoding", decoding=False)
    big = order == BIG
    if header.type not in HEADER_TYPES or header.version not in _VERSIONS:
        raise WireError(
            Reason.CFH_TYPE_ERROR,
            f"MQCFH Type {header.type} / Version {header.version} cannot start a message",
        )
    parts = [
        _pack(
            _CFH[order],
            "MQCFH",
            header.type,
            MQCFH_STRUC_LENGTH,
            header.version,
            header.command,
            header.msg_seq_number,
            header.control,
            header.comp_code,
            header.reason,
            len(params),
        )
    ]
    for param in params:
        if isinstance(param, IntParam):
            parts.append(
                _pack(
                    _CFIN[order],
                    "MQCFIN",
                    MQCFT_INTEGER,
                    MQCFIN_STRUC_LENGTH,
                    param.parameter,
                    param.value,
                )
            )
        elif isinstance(param, StringParam):
            text_ccsid = _text_ccsid(param.ccsid, ccsid)
            data = encode_text(
                param.value, text_ccsid, big_endian=big, field=f"MQCFST {param.parameter}"
            )
            length = _padded(MQCFST_STRUC_LENGTH_FIXED + len(data))
            parts.append(
                _pack(
                    _CFST[order],
                    "MQCFST",
                    MQCFT_STRING,
                    length,
                    param.parameter,
                    param.ccsid,
                    len(data),
                )
            )
            parts.append(data + bytes(length - MQCFST_STRUC_LENGTH_FIXED - len(data)))
        else:
            parts.append(_encode_string_list(param, order, ccsid))
    return b"".join(parts)


def _encode_string_list(param: StringListParam, order: str, governing: int) -> bytes:
    text_ccsid = _text_ccsid(param.ccsid, governing)
    big = order == BIG
    what = f"MQCFSL {param.parameter}"
    encoded = [encode_text(v, text_ccsid, big_endian=big, field=what) for v in param.values]
    blank = encode_text(" ", text_ccsid, big_endian=big)
    width = max((len(e) for e in encoded), default=0)
    width += -width % len(blank)  # whole characters (UTF-16: an even length)
    strings = b"".join(e + blank * ((width - len(e)) // len(blank)) for e in encoded)
    length = _padded(MQCFSL_STRUC_LENGTH_FIXED + len(strings))
    head = _pack(
        _CFSL[order],
        "MQCFSL",
        MQCFT_STRING_LIST,
        length,
        param.parameter,
        param.ccsid,
        len(param.values),
        width,
    )
    return head + strings + bytes(length - MQCFSL_STRUC_LENGTH_FIXED - len(strings))


def decode_pcf(
    data: bytes | bytearray | memoryview,
    encoding: int = ENC_NATIVE,
    *,
    ccsid: int = 0,
) -> tuple[PCFHeader, list[PCFParam]]:
    """Decode a whole PCF message body (MQCFH then ParameterCount parameters).

    ``encoding``/``ccsid`` are the governing ones (the MQMD's Encoding and
    CodedCharSetId). Raises WireError on anything malformed (see the module docstring).
    """
    buf = bytes(data)
    order = byte_order(encoding, field="PCF governing encoding")
    if len(buf) < MQCFH_STRUC_LENGTH:
        raise WireError(
            Reason.CFH_LENGTH_ERROR,
            f"MQCFH needs {MQCFH_STRUC_LENGTH} bytes, {len(buf)} available",
            0,
        )
    typ, length, version, command, seq, control, comp, reason, count = _CFH[order].unpack_from(
        buf, 0
    )
    if typ not in HEADER_TYPES:
        raise WireError(Reason.CFH_TYPE_ERROR, f"MQCFH Type {typ} is not a message type", 0)
    if length != MQCFH_STRUC_LENGTH:
        raise WireError(
            Reason.CFH_LENGTH_ERROR, f"MQCFH StrucLength {length} is not {MQCFH_STRUC_LENGTH}", 4
        )
    if version not in _VERSIONS:
        raise WireError(Reason.CFH_VERSION_ERROR, f"MQCFH Version {version} is not 1, 2 or 3", 8)
    if count < 0:
        raise WireError(
            Reason.CFH_PARM_COUNT_ERROR, f"MQCFH ParameterCount {count} is negative", 32
        )
    header = PCFHeader(
        type=typ,
        command=command,
        msg_seq_number=seq,
        control=control,
        comp_code=comp,
        reason=reason,
        version=version,
        parameter_count=count,
    )
    params: list[PCFParam] = []
    offset = MQCFH_STRUC_LENGTH
    for index in range(count):
        param, offset = _decode_param(buf, offset, order, ccsid, index)
        params.append(param)
    if offset != len(buf):
        raise WireError(
            Reason.MSG_LENGTH_ERROR,
            f"{len(buf) - offset} bytes follow the last of {count} PCF parameters",
            offset,
        )
    return header, params


def _decode_param(
    buf: bytes, offset: int, order: str, governing: int, index: int
) -> tuple[PCFParam, int]:
    """The parameter structure at ``offset`` and the offset after it."""
    left = len(buf) - offset
    if left < 8:
        raise WireError(
            Reason.MSG_LENGTH_ERROR,
            f"PCF parameter {index + 1} needs at least 8 bytes, {left} available",
            offset,
        )
    typ, length = _HEAD[order].unpack_from(buf, offset)
    if typ == MQCFT_INTEGER:
        if length != MQCFIN_STRUC_LENGTH:
            raise WireError(
                Reason.CFIN_LENGTH_ERROR,
                f"MQCFIN StrucLength {length} is not {MQCFIN_STRUC_LENGTH}",
                offset + 4,
            )
        _check_fits(buf, offset, length, Reason.CFIN_LENGTH_ERROR, "MQCFIN")
        _, _, parameter, value = _CFIN[order].unpack_from(buf, offset)
        return IntParam(parameter, value), offset + length
    if typ == MQCFT_STRING:
        return _decode_string(buf, offset, length, order, governing)
    if typ == MQCFT_STRING_LIST:
        return _decode_string_list(buf, offset, length, order, governing)
    raise WireError(
        Reason.STRUCTURE_TYPE_ERROR,
        f"PCF parameter {index + 1} has Type {typ}; supported: MQCFIN, MQCFST, MQCFSL",
        offset,
    )


def _check_fits(buf: bytes, offset: int, length: int, reason: int, what: str) -> None:
    if offset + length > len(buf):
        raise WireError(
            reason,
            f"{what} StrucLength {length} runs past the end of the message "
            f"({len(buf) - offset} bytes left)",
            offset + 4,
        )


def _decode_string(
    buf: bytes, offset: int, length: int, order: str, governing: int
) -> tuple[StringParam, int]:
    if length < MQCFST_STRUC_LENGTH_FIXED:
        raise WireError(
            Reason.CFST_LENGTH_ERROR,
            f"MQCFST StrucLength {length} is below {MQCFST_STRUC_LENGTH_FIXED}",
            offset + 4,
        )
    _check_fits(buf, offset, length, Reason.CFST_LENGTH_ERROR, "MQCFST")
    _, _, parameter, cc, string_length = _CFST[order].unpack_from(buf, offset)
    if string_length < 0 or MQCFST_STRUC_LENGTH_FIXED + string_length > length:
        raise WireError(
            Reason.CFST_STRING_LENGTH_ERR,
            f"MQCFST StringLength {string_length} does not fit StrucLength {length}",
            offset + 16,
        )
    start = offset + MQCFST_STRUC_LENGTH_FIXED
    value = decode_text(
        buf[start : start + string_length],
        _text_ccsid(cc, governing),
        big_endian=order == BIG,
        field=f"MQCFST {parameter}",
        offset=start,
    )
    return StringParam(parameter, value, cc), offset + length


def _decode_string_list(
    buf: bytes, offset: int, length: int, order: str, governing: int
) -> tuple[StringListParam, int]:
    if length < MQCFSL_STRUC_LENGTH_FIXED:
        raise WireError(
            Reason.CFSL_LENGTH_ERROR,
            f"MQCFSL StrucLength {length} is below {MQCFSL_STRUC_LENGTH_FIXED}",
            offset + 4,
        )
    _check_fits(buf, offset, length, Reason.CFSL_LENGTH_ERROR, "MQCFSL")
    _, _, parameter, cc, count, string_length = _CFSL[order].unpack_from(buf, offset)
    if count < 0 or (string_length == 0 and count > MAX_EMPTY_LIST_COUNT):
        raise WireError(
            Reason.CFSL_COUNT_ERROR, f"MQCFSL Count {count} is not plausible", offset + 16
        )
    if string_length < 0 or MQCFSL_STRUC_LENGTH_FIXED + count * string_length > length:
        raise WireError(
            Reason.CFSL_STRING_LENGTH_ERR,
            f"MQCFSL Count {count} x StringLength {string_length} does not fit "
            f"StrucLength {length}",
            offset + 20,
        )
    text_ccsid = _text_ccsid(cc, governing)
    values = []
    start = offset + MQCFSL_STRUC_LENGTH_FIXED
    for _ in range(count):
        text = decode_text(
            buf[start : start + string_length],
            text_ccsid,
            big_endian=order == BIG,
            field=f"MQCFSL {parameter}",
            offset=start,
        )
        values.append(text.rstrip(" "))
        start += string_length
    return StringListParam(parameter, values, cc), offset + length
