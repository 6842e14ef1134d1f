"""MQ constant families used in message headers (cmqc.h values).

Why a module of its own: MQMD, MQRFH, MQRFH2, MQXQH and MQDLH share these values, and
other layers (pub/sub engine, queue manager) need them without importing a codec.
Values: IBM MQ constants as listed in the gateway protocol reference §1–§6, checked
against pymqi ``CMQC.py`` (commit 16184a6).
"""

from __future__ import annotations

import enum

# --- Encoding (MQENC_*) --------------------------------------------------------------
ENC_INTEGER_MASK = 0x0000000F
ENC_INTEGER_UNDEFINED = 0
ENC_INTEGER_NORMAL = 1  # big-endian
ENC_INTEGER_REVERSED = 2  # little-endian
ENC_DECIMAL_MASK = 0x000000F0
ENC_FLOAT_MASK = 0x00000F00
ENC_NORMAL = 273  # 0x111: big-endian integers, IEEE normal floats
ENC_REVERSED = 546  # 0x222: little-endian integers, IEEE reversed floats
ENC_S390 = 785  # 0x311
ENC_TNS = 1041  # 0x411
ENC_AS_PUBLISHED = -1
#: MQENC_NATIVE of the platforms the gateway runs on (x86-64/arm64 Linux, Windows, macOS).
ENC_NATIVE = ENC_REVERSED

# --- CodedCharSetId special values (MQCCSI_*) -----------------------------------------
CCSI_Q_MGR = 0
CCSI_DEFAULT = 0
CCSI_UNDEFINED = 0
CCSI_EMBEDDED = -1
CCSI_INHERIT = -2
CCSI_APPL = -3
CCSI_AS_PUBLISHED = -4

# --- Priority / Expiry / OriginalLength ----------------------------------------------
PRI_PRIORITY_AS_Q_DEF = -1
PRI_PRIORITY_AS_PARENT = -2
PRI_PRIORITY_AS_PUBLISHED = -3
EI_UNLIMITED = -1
OL_UNDEFINED = -1


class MsgType(enum.IntEnum):
    """MQMT_*: MQMD.MsgType (1–65535 system range, 65536–999999999 application)."""

    REQUEST = 1
    REPLY = 2
    REPORT = 4
    DATAGRAM = 8


class Persistence(enum.IntEnum):
    """MQPER_*: MQMD.Persistence."""

    PERSISTENCE_AS_PARENT = -1
    NOT_PERSISTENT = 0
    PERSISTENT = 1
    PERSISTENCE_AS_Q_DEF = 2


class Report(enum.IntFlag):
    """MQRO_*: MQMD.Report option bits (the zero-valued defaults are aliases of NONE)."""

    NONE = 0
    PAN = 0x1
    NAN = 0x2
    ACTIVITY = 0x4
    PASS_CORREL_ID = 0x40
    PASS_MSG_ID = 0x80
    COA = 0x100
    COA_WITH_DATA = 0x300
    COA_WITH_FULL_DATA = 0x700
    COD = 0x800
    COD_WITH_DATA = 0x1800
    COD_WITH_FULL_DATA = 0x3800
    PASS_DISCARD_AND_EXPIRY = 0x4000
    EXPIRATION = 0x200000
    EXPIRATION_WITH_DATA = 0x600000
    EXPIRATION_WITH_FULL_DATA = 0xE00000
    EXCEPTION = 0x1000000
    EXCEPTION_WITH_DATA = 0x3000000
    EXCEPTION_WITH_FULL_DATA = 0x7000000
    DISCARD_MSG = 0x8000000


#: MQRO_ACCEPT_UNSUP_IF_XMIT_MASK: bits the queue manager clears in the separate MQMD of a
#: transmission-queue message so no COA/COD is generated for the xmitq hop.
RO_ACCEPT_UNSUP_IF_XMIT_MASK = 0x0003FF00
RO_REJECT_UNSUP_MASK = 0x101C0000
RO_ACCEPT_UNSUP_MASK = 0xEFE000FF


class Feedback(enum.IntEnum):
    """MQFB_*: MQMD.Feedback (exception reports carry an MQRC value here instead)."""

    NONE = 0
    QUIT = 256
    EXPIRATION = 258
    COA = 259
    COD = 260
    CHANNEL_COMPLETED = 262
    CHANNEL_FAIL_RETRY = 263
    CHANNEL_FAIL = 264
    APPL_CANNOT_BE_STARTED = 265
    TM_ERROR = 266
    APPL_TYPE_ERROR = 267
    STOPPED_BY_MSG_EXIT = 268
    ACTIVITY = 269
    XMIT_Q_MSG_ERROR = 271
    PAN = 275
    NAN = 276
    STOPPED_BY_CHAD_EXIT = 277
    NOT_A_REPOSITORY_MSG = 280
    BIND_OPEN_CLUSRCVR_DEL = 281
    PUBLICATIONS_ON_REQUEST = 501
    SUBSCRIBER_IS_PUBLISHER = 502


class PutApplType(enum.IntEnum):
    """MQAT_*: MQMD.PutApplType / MQDLH.PutApplType."""

    UNKNOWN = -1
    NO_CONTEXT = 0
    CICS = 1
    ZOS = 2
    IMS = 3
    OS2 = 4
    DOS = 5
    UNIX = 6
    QMGR = 7
    OS400 = 8
    WINDOWS = 9
    CICS_VSE = 10
    WINDOWS_NT = 11
    VMS = 12
    NSK = 13
    VOS = 14
    OPEN_TP1 = 15
    VM = 18
    IMS_BRIDGE = 19
    XCF = 20
    CICS_BRIDGE = 21
    NOTES_AGENT = 22
    TPF = 23
    USER = 25
    BROKER = 26
    JAVA = 28
    DQM = 29
    CHANNEL_INITIATOR = 30
    WLM = 31
    BATCH = 32
    RRS_BATCH = 33
    SIB = 34
    SYSTEM_EXTENSION = 35
    MCAST_PUBLISH = 36
    AMQP = 37

    # Aliases IBM defines with the same values.
    MVS = 2
    AIX = 6
    QMGR_PUBLISH = 26


class MsgFlags(enum.IntFlag):
    """MQMF_*: MQMD.MsgFlags (version-2 field)."""

    NONE = 0
    SEGMENTATION_ALLOWED = 0x1
    SEGMENT = 0x2
    LAST_SEGMENT = 0x4
    MSG_IN_GROUP = 0x8
    LAST_MSG_IN_GROUP = 0x10


# --- Identifier "none" values -------------------------------------------------------
MI_NONE = bytes(24)
CI_NONE = bytes(24)
GI_NONE = bytes(24)
ACT_NONE = bytes(32)

# --- Lengths (MQ_*_LENGTH) ----------------------------------------------------------
MSG_ID_LENGTH = 24
CORREL_ID_LENGTH = 24
GROUP_ID_LENGTH = 24
Q_NAME_LENGTH = 48
Q_MGR_NAME_LENGTH = 48
USER_ID_LENGTH = 12
ACCOUNTING_TOKEN_LENGTH = 32
APPL_IDENTITY_DATA_LENGTH = 32
PUT_APPL_NAME_LENGTH = 28
PUT_DATE_LENGTH = 8
PUT_TIME_LENGTH = 8
APPL_ORIGIN_DATA_LENGTH = 4
FORMAT_LENGTH = 8


class CompCode(enum.IntEnum):
    """MQCC_* completion codes: of an MQI call, and as carried in MQPSCompCode / pscr
    Completion of a publish/subscribe response."""

    OK = 0
    WARNING = 1
    FAILED = 2
