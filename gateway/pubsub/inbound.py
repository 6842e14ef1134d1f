"""Decoding a command message: MQMD Format -> MQRFH or MQRFH2 -> :class:`Command`.

Why its own module: the engine must not care which header generation a command came
in, and every decode failure must become a :class:`CommandError` with the reason code
the broker reports (MQRC_RFH_ERROR for a broken header, MQRC_RFH_STRING_ERROR with
MQPSErrorPos for a bad NameValueString, ...; reference §5.6, §5.10).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gateway.pubsub.commands import Command, decode_psc_command, decode_rfh_command
from gateway.pubsub.errors import CommandError
from gateway.wire.chain import parse_message
from gateway.wire.errors import WireError
from gateway.wire.folder import Element, remember_usr_properties
from gateway.wire.formats import FMT_RF_HEADER, FMT_RF_HEADER_2
from gateway.wire.mqmd import MQMD
from gateway.wire.reasons import Reason
from gateway.wire.rfh import MQRFH, MQRFH_STRUC_LENGTH_FIXED
from gateway.wire.rfh2 import MQRFH2


@dataclass(slots=True)
class ParsedCommand:
    """A decoded command with the publication data that followed its header."""

    command: Command
    header: MQRFH | MQRFH2
    payload: bytes = b""
    payload_format: str = ""
    payload_encoding: int = 546
    payload_ccsid: int = 1208
    #: MQRFH2 folders other than psc (mcd, usr, jms...), serialized, passed through.
    extra_folders: list[str] = field(default_factory=list)
    psc: Element | None = None


#: Commands decoded from psc folders, by the folder's (element name, text) pairs: what
#: :func:`decode_psc_command` reads, so the same pairs always make the same command. A
#: stream's publishers repeat a few psc folders; decoding one again cost 2 us a
#: message. Bounded (the oldest entry goes first). A cached command is shared by the
#: messages that carried its folder: commands are read, never edited, once decoded.
_PSC_COMMANDS: dict[tuple[tuple[str, str], ...], Command] = {}
_PSC_COMMANDS_MAX = 256
#: Only small folders are cached (as the wire layer's folder cache): a big one
#: (long topics, StringData) would hold memory for little gain.
_PSC_COMMAND_MAX_CHARS = 512


def _psc_command(psc: Element) -> Command:
    key = tuple([(c.name, c.text) for c in psc.children])
    command = _PSC_COMMANDS.get(key)
    if command is None:
        command = decode_psc_command(key)
        if sum(len(name) + len(text) for name, text in key) <= _PSC_COMMAND_MAX_CHARS:
            if len(_PSC_COMMANDS) >= _PSC_COMMANDS_MAX:
                del _PSC_COMMANDS[next(iter(_PSC_COMMANDS))]
            _PSC_COMMANDS[key] = command
    return command


def decode_command_message(md: MQMD, body: bytes) -> ParsedCommand:
    """Decode the header named by ``md.format`` and the command inside it.

    Only the first header is the command's (:func:`gateway.wire.chain.parse_message`
    with ``depth=1``); whatever follows it, further headers included, is the
    publication data, passed through as it came. The folders of the MQRFH2 (the
    ParsedCommand's ``header`` and ``psc``) may be shared with the wire layer's parse
    cache: they are read, never edited.
    """
    fmt = md.format
    if fmt != FMT_RF_HEADER_2 and fmt != FMT_RF_HEADER:
        raise CommandError(
            Reason.RFH_ERROR, f"a command message needs Format MQHRF or MQHRF2, not {fmt!r}"
        )
    try:
        message = parse_message(md, body, depth=1, shared_folders=True)
        header = message.headers[0]
        if isinstance(header, MQRFH2):
            pscs = header.folders_named("psc")
            if not pscs:
                raise CommandError(
                    Reason.RFH_COMMAND_ERROR, "MQRFH2 without a psc folder", parm_id="psc"
                )
            if len(pscs) > 1:
                raise CommandError(
                    Reason.RFH_DUPLICATE_PARM, "more than one psc folder", parm_id="psc"
                )
            psc = pscs[0]
            try:
                command = _psc_command(psc)
            except CommandError as exc:
                exc.psc = psc
                raise
            extra: list[str] = []
            texts = header.folder_texts
            for i, f in enumerate(header.folders):
                if f.name not in ("psc", "pscr"):
                    # the decoder's serialization when it had one for free (a flat folder)
                    text = (texts[i] if texts else None) or f.to_xml()
                    if f.name == "usr":
                        # the sink envelope reads its properties from this text
                        remember_usr_properties(text, f)
                    extra.append(text)
            return ParsedCommand(
                command,
                header,
                message.payload,
                message.format,
                message.encoding,
                message.ccsid,
                extra,
                psc,
            )
        assert isinstance(header, MQRFH)  # the Format said so
        try:
            command = decode_rfh_command(header.name_values)
        except CommandError as exc:
            exc.name_values = header.name_values
            raise
        return ParsedCommand(
            command, header, message.payload, message.format, message.encoding, message.ccsid
        )
    except WireError as exc:
        pos = exc.offset - MQRFH_STRUC_LENGTH_FIXED if exc.reason == Reason.RFH_STRING_ERROR else -1
        raise CommandError(exc.reason, exc.message, error_pos=pos) from None
