"""MQRFH2: rules and formatting header 2, with folders (``psc``, ``pscr``, ``mcd``, ``usr``).

Why: queued publish/subscribe in WebSphere MQ V7+/Message Broker, JMS and message
properties travel in this header; the gateway reads commands from ``psc``, answers in
``pscr`` and maps ``usr`` properties to Kafka/MQTT headers.
Reference: IBM MQ "MQRFH2 - Rules and formatting header 2" (q099240, q099245),
NameValueCCSID (q099310), NameValueLength (q099330), NameValueData (q099320);
protocol reference §4.

Framing is by lengths first (StrucLength, then each NameValueLength) so a malformed
folder never confuses the framing; each folder is then parsed by :mod:`gateway.wire.folder`.
NameValueData is in ``name_value_ccsid`` (UTF-16 in this header's integer byte order);
every other field follows the preceding structure's Encoding/CCSID.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from gateway.wire.ccsid import (
    NAME_VALUE_CCSIDS,
    UTF16_CCSIDS,
    CcsidAlias,
    decode_text,
    encode_text,
    structure_ccsid,
)
from gateway.wire.constants import CCSI_INHERIT, ENC_NATIVE
from gateway.wire.encoding import BIG, byte_order
from gateway.wire.errors import WireError
from gateway.wire.folder import (
    Element,
    clone_element,
    parse_flat_canonical,
    parse_folder,
    serialize_folder,
)
from gateway.wire.formats import FMT_NONE
from gateway.wire.reasons import Reason
from gateway.wire.rfh import MQRFH_STRUC_ID, RFHFixed, decode_rfh_fixed, encode_rfh_fixed

MQRFH_VERSION_2 = 2
MQRFH_STRUC_LENGTH_FIXED_2 = 36
MQRFH_NONE = 0
#: Flags bits reserved for MQ itself (0x80000000 marks an MQ-internal RFH2).
MQRFH_FLAGS_RESTRICTED_MASK = 0xFFFF0000

#: Folder is an alias of Element: a folder is simply the root element of one NameValueData.
Folder = Element

_INT = {o: struct.Struct(o + "i") for o in "<>"}


@dataclass(slots=True)
class MQRFH2(CcsidAlias):
    """MQRFH2 header; ``encoding``/``coded_char_set_id``/``format`` describe the data after it."""

    folders: list[Element] = field(default_factory=list)
    encoding: int = ENC_NATIVE
    coded_char_set_id: int = CCSI_INHERIT
    format: str = FMT_NONE
    flags: int = MQRFH_NONE
    name_value_ccsid: int = 1208
    struc_id: str = MQRFH_STRUC_ID
    version: int = MQRFH_VERSION_2
    #: As decoded; recomputed by :func:`encode_rfh2`.
    struc_length: int = field(default=0, compare=False)
    #: Decoded with ``shared_folders`` (folders read, never edited): each folder's
    #: serialization (``Element.to_xml``) where the decoder had it for free (a flat
    #: folder needing no escapes is its own text), else None. Empty otherwise.
    folder_texts: list[str | None] = field(default_factory=list, compare=False, repr=False)

    def folder(self, name: str) -> Element | None:
        """The first folder called ``name`` (``rfh2.folder('psc')``), or None."""
        return next((f for f in self.folders if f.name == name), None)

    def folders_named(self, name: str) -> list[Element]:
        """Every folder called ``name`` (an error ``pscr`` response repeats ``psc``)."""
        return [f for f in self.folders if f.name == name]

    def get(self, folder: str, path: str, default: str | None = None) -> str | None:
        """Text at ``path`` inside ``folder`` (``rfh2.get('usr', 'Colour')``)."""
        f = self.folder(folder)
        return default if f is None else f.get(path, default)

    def get_all(self, folder: str, path: str) -> list[str]:
        """Texts of every element at ``path`` in ``folder`` (e.g. repeated ``Topic``)."""
        f = self.folder(folder)
        return [] if f is None else f.get_all(path)

    def ensure_folder(self, name: str) -> Element:
        """The folder called ``name``, appended empty if absent."""
        f = self.folder(name)
        if f is None:
            f = Element(name)
            self.folders.append(f)
        return f

    def set(self, folder: str, path: str, value: object, *, dt: str | None = None) -> Element:
        """Set ``path`` in ``folder`` (both created if missing); returns the element."""
        return self.ensure_folder(folder).set(path, value, dt=dt)

    def add_folder(
        self,
        name: str,
        pairs: Mapping[str, object] | Iterable[tuple[str, object]] = (),
        **attributes: str,
    ) -> Element:
        """Append a folder built with :meth:`Element.from_pairs`."""
        f = Element.from_pairs(name, pairs, attributes=attributes)
        self.folders.append(f)
        return f


#: Parsed folders (with their serialization when free, see ``MQRFH2.folder_texts``) by
#: their bytes (a stream's publishers repeat the same few folders): bounded, small
#: folders only; a hit is handed out as a copy (callers may edit folders), or as the
#: cached tree itself to a caller that only reads (``shared_folders``).
_FOLDER_CACHE: dict[tuple[bytes, int, bool], tuple[Element, str | None]] = {}
_FOLDER_CACHE_MAX = 512
_FOLDER_CACHE_MAX_BYTES = 512

#: Validated fixed parts (the first 36 bytes, with the preceding structure's encoding
#: and CCSID): a stream's messages repeat a few. Value: the fixed part, NameValueCCSID.
#: Bounded; only StrucLength against the bytes available is checked again per message.
_FIXED_CACHE: dict[tuple[bytes, int, int], tuple[RFHFixed, int]] = {}
_FIXED_CACHE_MAX = 64


def _decode_name_value(
    data: bytes, ccsid: int, big_endian: bool, offset: int, index: int
) -> tuple[Element, str | None]:
    if len(data) <= _FOLDER_CACHE_MAX_BYTES:
        key = (data, ccsid, big_endian)
        cached = _FOLDER_CACHE.get(key)
        if cached is None:
            cached = _parse_name_value(data, ccsid, big_endian, offset, index)
            if len(_FOLDER_CACHE) >= _FOLDER_CACHE_MAX:
                del _FOLDER_CACHE[next(iter(_FOLDER_CACHE))]
            _FOLDER_CACHE[key] = cached
        return cached
    return _parse_name_value(data, ccsid, big_endian, offset, index)


def _parse_name_value(
    data: bytes, ccsid: int, big_endian: bool, offset: int, index: int
) -> tuple[Element, str | None]:
    if ccsid in UTF16_CCSIDS and len(data) % 2:
        raise WireError(
            Reason.RFH_FORMAT_ERROR,
            f"MQRFH2 NameValueData {index} has odd length {len(data)} for UTF-16 CCSID {ccsid}",
            offset,
        )
    text = decode_text(
        data, ccsid, big_endian=big_endian, field=f"MQRFH2 NameValueData {index}", offset=offset
    )
    if text[:1] == "<":
        flat = parse_flat_canonical(text)
        if flat is not None:
            return flat
    return parse_folder(text, offset=offset), None


def decode_rfh2(
    buf: bytes | bytearray | memoryview,
    encoding: int = ENC_NATIVE,
    *,
    ccsid: int = 0,
    shared_folders: bool = False,
) -> tuple[MQRFH2, int]:
    """Decode an MQRFH2 at the start of ``buf``; returns it and StrucLength consumed.

    ``encoding``/``ccsid`` are the preceding structure's. Any NameValueCCSID this package
    supports is accepted on decode (MQ itself allows 1208 and the UTF-16 CCSIDs).
    ``shared_folders``: the caller never edits the folders, so a folder met before may
    be the parse cache's own tree rather than a copy (a copy costs a microsecond per
    folder on the broker's hot path).
    """
    fixed_key = (bytes(buf[:MQRFH_STRUC_LENGTH_FIXED_2]), encoding, ccsid)
    known = _FIXED_CACHE.get(fixed_key)
    if known is not None and known[0].struc_length <= len(buf):
        fixed, nv_ccsid = known
    else:
        fixed = decode_rfh_fixed(buf, encoding, ccsid, what="MQRFH2")
        if fixed.version != MQRFH_VERSION_2:
            raise WireError(
                Reason.RFH_ERROR,
                f"MQRFH2 Version is {fixed.version}; version 2 expected (1 is MQRFH)",
                4,
            )
        if fixed.struc_length < MQRFH_STRUC_LENGTH_FIXED_2:
            raise WireError(
                Reason.RFH_ERROR,
                f"MQRFH2 StrucLength {fixed.struc_length} is shorter than the fixed part (36)",
                8,
            )
        nv_ccsid = _INT[byte_order(encoding)].unpack_from(buf, 32)[0]
        if known is None:
            if len(_FIXED_CACHE) >= _FIXED_CACHE_MAX:
                del _FIXED_CACHE[next(iter(_FIXED_CACHE))]
            _FIXED_CACHE[fixed_key] = (fixed, nv_ccsid)
    order = byte_order(encoding)
    integer = _INT[order]
    big = order == BIG
    folders: list[Element] = []
    texts: list[str | None] = []
    cursor = MQRFH_STRUC_LENGTH_FIXED_2
    end = fixed.struc_length
    view = memoryview(buf)
    while cursor < end:
        if end - cursor < 4:
            raise WireError(
                Reason.RFH_ERROR,
                f"MQRFH2 has {end - cursor} stray bytes before StrucLength {end}",
                cursor,
            )
        length = integer.unpack_from(view, cursor)[0]
        if length < 0 or length > end - cursor - 4:
            raise WireError(
                Reason.RFH_ERROR,
                f"MQRFH2 NameValueLength {length} overruns StrucLength {end}",
                cursor,
            )
        start = cursor + 4
        if length:
            data = bytes(view[start : start + length])
            folder, text = _decode_name_value(data, nv_ccsid, big, start, len(folders))
            folders.append(folder if shared_folders else clone_element(folder))
            texts.append(text)
        cursor = start + length
    rfh2 = MQRFH2(
        folders=folders,
        encoding=fixed.encoding,
        coded_char_set_id=fixed.coded_char_set_id,
        format=fixed.format,
        flags=fixed.flags,
        name_value_ccsid=nv_ccsid,
        struc_length=end,
        folder_texts=texts if shared_folders else [],
    )
    return rfh2, end


def encode_folder(
    folder: Element, name_value_ccsid: int = 1208, *, big_endian: bool = False
) -> bytes:
    """One NameValueData: the serialized folder in ``name_value_ccsid``, blank padded to 4."""
    data = encode_text(
        serialize_folder(folder), name_value_ccsid, big_endian=big_endian, field="MQRFH2 folder"
    )
    pad = -len(data) % 4
    if pad:
        unit = encode_text(" ", name_value_ccsid, big_endian=big_endian)
        data += unit * (pad // len(unit))
    return data


def encode_rfh2(rfh2: MQRFH2, encoding: int = ENC_NATIVE, *, ccsid: int = 0) -> bytes:
    """Encode ``rfh2``: integers in ``encoding``, fixed text in ``ccsid``.

    Folders are written in NameValueCCSID (UTF-16 in ``encoding``'s byte order).

    Each NameValueData is blank padded to a multiple of 4, so StrucLength is one too.
    Only NameValueCCSIDs MQ accepts (1208, 1200, 13488, 17584) are emitted.
    """
    if rfh2.name_value_ccsid not in NAME_VALUE_CCSIDS:
        raise WireError(
            Reason.TARGET_CCSID_ERROR,
            f"MQRFH2 NameValueCCSID {rfh2.name_value_ccsid} is not one MQ accepts "
            f"({sorted(NAME_VALUE_CCSIDS)})",
        )
    order = byte_order(encoding, field="MQRFH2 target encoding", decoding=False)
    integer = _INT[order]
    text_ccsid = structure_ccsid(ccsid)
    parts: list[bytes] = []
    for folder in rfh2.folders:
        data = encode_folder(folder, rfh2.name_value_ccsid, big_endian=order == BIG)
        parts.append(integer.pack(len(data)))
        parts.append(data)
    body = b"".join(parts)
    length = MQRFH_STRUC_LENGTH_FIXED_2 + len(body)
    head = encode_rfh_fixed(
        version=MQRFH_VERSION_2,
        struc_length=length,
        encoding=rfh2.encoding,
        coded_char_set_id=rfh2.coded_char_set_id,
        format=rfh2.format,
        flags=rfh2.flags,
        target_encoding=encoding,
        text_ccsid=text_ccsid,
        what="MQRFH2",
    )
    return head + integer.pack(rfh2.name_value_ccsid) + body
