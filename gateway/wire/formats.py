"""MQFMT_* format names: what the next bytes of a message are.

Stored without the blank padding (the 8-byte wire form is blank padded by the codecs),
so ``md.format == FMT_STRING`` compares naturally. Values: cmqc.h via the gateway
protocol reference §1.3.
"""

from __future__ import annotations

FMT_NONE = ""
FMT_STRING = "MQSTR"
FMT_RF_HEADER = "MQHRF"
FMT_RF_HEADER_1 = "MQHRF"
FMT_RF_HEADER_2 = "MQHRF2"
FMT_XMIT_Q_HEADER = "MQXMIT"
FMT_DEAD_LETTER_HEADER = "MQDEAD"
FMT_MD_EXTENSION = "MQHMDE"
FMT_ADMIN = "MQADMIN"
FMT_PCF = "MQPCF"
FMT_EVENT = "MQEVENT"
FMT_DIST_HEADER = "MQHDIST"
FMT_REF_MSG_HEADER = "MQHREF"
FMT_TRIGGER = "MQTRIG"
FMT_EMBEDDED_PCF = "MQHEPCF"

#: Formats this package can decode as a header and chain through.
HEADER_FORMATS = frozenset(
    {FMT_RF_HEADER, FMT_RF_HEADER_2, FMT_XMIT_Q_HEADER, FMT_DEAD_LETTER_HEADER, FMT_MD_EXTENSION}
)
