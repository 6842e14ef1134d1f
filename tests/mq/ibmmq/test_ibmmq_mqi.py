"""The MQI binding: loading the MQI module, and MQMD fields as MQ wants them."""

from __future__ import annotations

from types import ModuleType

import pytest

from gateway.mq.ibmmq import MD_CHAR_LENGTHS, MQIUnavailableError, load_mqi_module, md_to_mqi
from gateway.mq.port import MQError
from gateway.wire.mqmd import MQMD
from gateway.wire.reasons import Reason
from tests.support.mqi_standin import StandIn


def test_missing_mqi_module_names_the_extra() -> None:
    asked: list[str] = []

    def import_module(name: str) -> ModuleType:
        asked.append(name)
        raise ModuleNotFoundError(f"No module named {name!r}")

    with pytest.raises(MQIUnavailableError) as err:
        load_mqi_module(import_module)
    assert asked == ["ibmmq", "pymqi"]
    text = str(err.value)
    assert "[mq]" in text and "client libraries" in text and "pymqi" in text


def test_pymqi_is_used_when_ibmmq_is_missing(standin: StandIn) -> None:
    def import_module(name: str) -> ModuleType:
        if name == "pymqi":
            return standin.module
        raise ModuleNotFoundError(f"No module named {name!r}")

    assert load_mqi_module(import_module) is standin.module


def test_md_character_fields_are_blank_padded_to_mq_lengths(standin: StandIn) -> None:
    md = MQMD(format="MQSTR", reply_to_q="R.Q", reply_to_q_mgr="QM", user_identifier="app",
              appl_identity_data="id", put_appl_name="prog", put_date="20260101",
              put_time="1200", appl_origin_data="o")
    raw = md_to_mqi(standin.module, md)
    for name, length in MD_CHAR_LENGTHS.items():
        value = getattr(raw, name)
        assert isinstance(value, bytes) and len(value) == length, name
        assert b"\0" not in value, name
    assert raw.Format == b"MQSTR   " and raw.ReplyToQ == b"R.Q".ljust(48)
    assert raw.ApplOriginData == b"o   "
    with pytest.raises(MQError) as err:
        md_to_mqi(standin.module, MQMD(format="TOOLONGFMT"))
    assert err.value.reason == Reason.MD_ERROR
