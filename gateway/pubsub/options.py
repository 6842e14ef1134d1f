"""Registration, publication and delete options of queued publish/subscribe.

The wire carries options as keywords (``MQPSRegOpts InformIfRet`` in MQRFH, one
``<RegOpt>InformIfRet</RegOpt>`` per option in a ``psc`` folder); internally they are
bit sets with IBM's PCF values (MQREGO_*, MQPUBO_*, MQDELO_*; reference §5.2, §5.3) so
they can be stored as integers and tested cheaply.
"""

from __future__ import annotations

import enum


class RegOpt(enum.IntFlag):
    """MQREGO_* registration options."""

    NONE = 0
    CORREL_ID_AS_IDENTITY = 0x1
    ANONYMOUS = 0x2
    LOCAL = 0x4
    DIRECT_REQUESTS = 0x8
    NEW_PUBLICATIONS_ONLY = 0x10
    PUBLISH_ON_REQUEST_ONLY = 0x20
    DEREGISTER_ALL = 0x40
    INCLUDE_STREAM_NAME = 0x80
    INFORM_IF_RETAINED = 0x100
    DUPLICATES_OK = 0x200
    NON_PERSISTENT = 0x400
    PERSISTENT = 0x800
    PERSISTENT_AS_PUBLISH = 0x1000
    PERSISTENT_AS_Q = 0x2000
    ADD_NAME = 0x4000
    NO_ALTERATION = 0x8000
    FULL_RESPONSE = 0x10000
    JOIN_SHARED = 0x20000
    JOIN_EXCLUSIVE = 0x40000
    LEAVE_ONLY = 0x80000
    VARIABLE_USER_ID = 0x100000
    LOCKED = 0x200000


class PubOpt(enum.IntFlag):
    """MQPUBO_* publication options."""

    NONE = 0
    CORREL_ID_AS_IDENTITY = 0x1
    RETAIN_PUBLICATION = 0x2
    OTHER_SUBSCRIBERS_ONLY = 0x4
    NO_REGISTRATION = 0x8
    IS_RETAINED_PUBLICATION = 0x10


class DelOpt(enum.IntFlag):
    """MQDELO_* delete-publication options."""

    NONE = 0
    LOCAL = 0x4


#: Wire keyword -> MQREGO_* bit (exact spellings of reference §5.2).
REG_KEYWORDS: dict[str, RegOpt] = {
    "None": RegOpt.NONE,
    "CorrelAsId": RegOpt.CORREL_ID_AS_IDENTITY,
    "Anon": RegOpt.ANONYMOUS,
    "Local": RegOpt.LOCAL,
    "DirectReq": RegOpt.DIRECT_REQUESTS,
    "NewPubsOnly": RegOpt.NEW_PUBLICATIONS_ONLY,
    "PubOnReqOnly": RegOpt.PUBLISH_ON_REQUEST_ONLY,
    "DeregAll": RegOpt.DEREGISTER_ALL,
    "InclStreamName": RegOpt.INCLUDE_STREAM_NAME,
    "InformIfRet": RegOpt.INFORM_IF_RETAINED,
    "DupsOK": RegOpt.DUPLICATES_OK,
    "NonPers": RegOpt.NON_PERSISTENT,
    "Pers": RegOpt.PERSISTENT,
    "PersAsPub": RegOpt.PERSISTENT_AS_PUBLISH,
    "PersAsQueue": RegOpt.PERSISTENT_AS_Q,
    "AddName": RegOpt.ADD_NAME,
    "NoAlter": RegOpt.NO_ALTERATION,
    "FullResp": RegOpt.FULL_RESPONSE,
    "JoinShared": RegOpt.JOIN_SHARED,
    "JoinExcl": RegOpt.JOIN_EXCLUSIVE,
    "LeaveOnly": RegOpt.LEAVE_ONLY,
    "VariableUserId": RegOpt.VARIABLE_USER_ID,
    "Locked": RegOpt.LOCKED,
}

#: Wire keyword -> MQPUBO_* bit.
PUB_KEYWORDS: dict[str, PubOpt] = {
    "None": PubOpt.NONE,
    "CorrelAsId": PubOpt.CORREL_ID_AS_IDENTITY,
    "RetainPub": PubOpt.RETAIN_PUBLICATION,
    "OtherSubsOnly": PubOpt.OTHER_SUBSCRIBERS_ONLY,
    "NoReg": PubOpt.NO_REGISTRATION,
    "IsRetainedPub": PubOpt.IS_RETAINED_PUBLICATION,
}

#: Wire keyword -> MQDELO_* bit.
DEL_KEYWORDS: dict[str, DelOpt] = {"None": DelOpt.NONE, "Local": DelOpt.LOCAL}

#: Options the psc folder does not know (reference §5.5: no Anon, DirectReq,
#: InclStreamName, NoReg in the psc set).
RFH2_EXCLUDED_KEYWORDS = frozenset({"Anon", "DirectReq", "InclStreamName", "NoReg"})

#: Registration options each command accepts (reference §5.4).
REGSUB_ALLOWED = (
    RegOpt.ADD_NAME
    | RegOpt.ANONYMOUS
    | RegOpt.CORREL_ID_AS_IDENTITY
    | RegOpt.DUPLICATES_OK
    | RegOpt.FULL_RESPONSE
    | RegOpt.INCLUDE_STREAM_NAME
    | RegOpt.INFORM_IF_RETAINED
    | RegOpt.JOIN_EXCLUSIVE
    | RegOpt.JOIN_SHARED
    | RegOpt.LOCAL
    | RegOpt.LOCKED
    | RegOpt.NEW_PUBLICATIONS_ONLY
    | RegOpt.NO_ALTERATION
    | RegOpt.PERSISTENT
    | RegOpt.NON_PERSISTENT
    | RegOpt.PERSISTENT_AS_PUBLISH
    | RegOpt.PERSISTENT_AS_Q
    | RegOpt.PUBLISH_ON_REQUEST_ONLY
    | RegOpt.VARIABLE_USER_ID
)
DEREGSUB_ALLOWED = (
    RegOpt.CORREL_ID_AS_IDENTITY
    | RegOpt.DEREGISTER_ALL
    | RegOpt.FULL_RESPONSE
    | RegOpt.LEAVE_ONLY
    | RegOpt.VARIABLE_USER_ID
)
REGPUB_ALLOWED = (
    RegOpt.ANONYMOUS | RegOpt.CORREL_ID_AS_IDENTITY | RegOpt.DIRECT_REQUESTS | RegOpt.LOCAL
)
DEREGPUB_ALLOWED = RegOpt.CORREL_ID_AS_IDENTITY | RegOpt.DEREGISTER_ALL
REQUPDATE_ALLOWED = RegOpt.CORREL_ID_AS_IDENTITY | RegOpt.VARIABLE_USER_ID
PUBLISH_REG_ALLOWED = REGPUB_ALLOWED
PUBLISH_PUB_ALLOWED = (
    PubOpt.RETAIN_PUBLICATION
    | PubOpt.OTHER_SUBSCRIBERS_ONLY
    | PubOpt.CORREL_ID_AS_IDENTITY
    | PubOpt.NO_REGISTRATION
    | PubOpt.IS_RETAINED_PUBLICATION
)
#: Persistence choices of a subscription: at most one may be given.
PERSISTENCE_CHOICES = (
    RegOpt.PERSISTENT
    | RegOpt.NON_PERSISTENT
    | RegOpt.PERSISTENT_AS_PUBLISH
    | RegOpt.PERSISTENT_AS_Q
)


def keywords_of(
    value: int, table: dict[str, RegOpt] | dict[str, PubOpt] | dict[str, DelOpt]
) -> list[str]:
    """The wire keywords of the bits set in ``value`` (table order, ``None`` never listed)."""
    return [kw for kw, bit in table.items() if bit and value & int(bit)]
