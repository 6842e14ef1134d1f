"""Reason codes: IBM values, names and the WireError that carries them."""

from __future__ import annotations

import pickle

import pytest

from gateway.wire.errors import WireError
from gateway.wire.reasons import Reason, reason_text

REQUIRED = [
    2001,
    2009,
    2016,
    2018,
    2019,
    2024,
    2027,
    2030,
    2033,
    2035,
    2042,
    2045,
    2046,
    2048,
    2051,
    2053,
    2059,
    2080,
    2082,
    2085,
    2087,
    2091,
    2092,
    2101,
    2110,
    2111,
    2161,
    2162,
    2189,
    2196,
    *range(2334, 2340),
    2527,
    2538,
    2543,
    3008,
    *range(3070, 3088),
    *range(3150, 3158),
]


@pytest.mark.parametrize("code", REQUIRED)
def test_required_codes_exist(code: int) -> None:
    assert Reason(code).value == code


@pytest.mark.parametrize(
    ("member", "value", "ibm"),
    [
        (Reason.NO_MSG_AVAILABLE, 2033, "MQRC_NO_MSG_AVAILABLE"),
        (Reason.UNKNOWN_OBJECT_NAME, 2085, "MQRC_UNKNOWN_OBJECT_NAME"),
        (Reason.Q_FULL, 2053, "MQRC_Q_FULL"),
        (Reason.RFH_COMMAND_ERROR, 2336, "MQRC_RFH_COMMAND_ERROR"),
        (Reason.RFH_RESTRICTED_FORMAT_ERR, 2527, "MQRC_RFH_RESTRICTED_FORMAT_ERR"),
        (Reason.STANDBY_Q_MGR, 2543, "MQRC_STANDBY_Q_MGR"),
        (Reason.CFH_TYPE_ERROR, 3001, "MQRCCF_CFH_TYPE_ERROR"),
        (Reason.CFH_LENGTH_ERROR, 3002, "MQRCCF_CFH_LENGTH_ERROR"),
        (Reason.CFH_VERSION_ERROR, 3003, "MQRCCF_CFH_VERSION_ERROR"),
        (Reason.CFH_PARM_COUNT_ERROR, 3006, "MQRCCF_CFH_PARM_COUNT_ERROR"),
        (Reason.CFIN_LENGTH_ERROR, 3009, "MQRCCF_CFIN_LENGTH_ERROR"),
        (Reason.CFST_LENGTH_ERROR, 3010, "MQRCCF_CFST_LENGTH_ERROR"),
        (Reason.CFST_STRING_LENGTH_ERR, 3011, "MQRCCF_CFST_STRING_LENGTH_ERR"),
        (Reason.STRUCTURE_TYPE_ERROR, 3013, "MQRCCF_STRUCTURE_TYPE_ERROR"),
        (Reason.MSG_LENGTH_ERROR, 3016, "MQRCCF_MSG_LENGTH_ERROR"),
        (Reason.CFSL_LENGTH_ERROR, 3024, "MQRCCF_CFSL_LENGTH_ERROR"),
        (Reason.CFSL_COUNT_ERROR, 3068, "MQRCCF_CFSL_COUNT_ERROR"),
        (Reason.CFSL_STRING_LENGTH_ERR, 3069, "MQRCCF_CFSL_STRING_LENGTH_ERR"),
        (Reason.TOPIC_ERROR, 3072, "MQRCCF_TOPIC_ERROR"),
        (Reason.CF_Q_MGR_NAME_ERROR, 3074, "MQRCCF_Q_MGR_NAME_ERROR"),
        (Reason.CF_NOT_AUTHORIZED, 3081, "MQRCCF_NOT_AUTHORIZED"),
        (Reason.ALREADY_JOINED, 3157, "MQRCCF_ALREADY_JOINED"),
        (Reason.NONE, 0, "MQRC_NONE"),
    ],
)
def test_values_and_ibm_names(member: Reason, value: int, ibm: str) -> None:
    assert member == value and member.ibm_name == ibm
    assert Reason.from_ibm_name(ibm) is member


def test_reason_text_for_unknown_codes() -> None:
    assert reason_text(2035) == "MQRC_NOT_AUTHORIZED" and reason_text(9999) == "MQRC_9999"
    with pytest.raises(KeyError):
        Reason.from_ibm_name("MQRC_NOPE")


def test_wire_error_carries_data_and_pickles() -> None:
    err = WireError(Reason.RFH_ERROR, "MQRFH StrucLength 7 is too short", 8)
    assert (err.reason, err.offset) == (2334, 8)
    assert str(err) == "MQRC_RFH_ERROR: MQRFH StrucLength 7 is too short at offset 8"
    again = pickle.loads(pickle.dumps(err))
    assert (again.reason, again.message, again.offset) == (2334, err.message, 8)
    assert "reason 1234" in str(WireError(1234, "x"))
