"""IBM MQ deployments with a multi-instance or native-HA queue manager: the adapter
passes a connection list to the MQ client as the MQCD ConnectionName and the MQCNO
reconnect option it is given, and the runtime's YAML section validates both
(docs/operations.md, "High availability"; driven through the stand-in MQI module)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal

import pytest

from gateway.mq.ibmmq import IBMMQConfig, IBMMQQueueManager
from gateway.mq.ibmmq.mqi import RECONNECT_REASONS
from gateway.runtime.config import load_config
from gateway.runtime.registry import PluginRegistry
from gateway.wire.reasons import Reason
from tests.support.mqi_standin import StandIn


async def test_the_connection_list_and_reconnect_option_reach_the_client(
        standin: StandIn) -> None:
    cfg = IBMMQConfig(q_mgr_name="STANDIN", conname=" mqa.example(1414), mqb.example ",
                      reconnect="qmgr")
    assert cfg.connection_name == "mqa.example(1414),mqb.example(1414)"
    conn = await IBMMQQueueManager(cfg, mqi=standin.module).connect()
    await conn.disconnect()
    call = standin.calls[0]
    assert call.args["cd"].ConnectionName == b"mqa.example(1414),mqb.example(1414)"
    assert call.args["opts"] == 0x04000000  # MQCNO_RECONNECT_Q_MGR
    options: dict[Literal["yes", "disabled"], int] = {"yes": 0x01000000, "disabled": 0x02000000}
    for option, value in options.items():
        standin.calls.clear()
        conn = await IBMMQQueueManager(IBMMQConfig(q_mgr_name="STANDIN", reconnect=option),
                                       mqi=standin.module).connect()
        await conn.disconnect()
        assert standin.calls[0].args["opts"] == value
    # MQCNO_RECONNECT gave up (2548): the adapter connects again through the list itself
    assert Reason.RECONNECT_FAILED in RECONNECT_REASONS


def test_malformed_lists_are_refused_with_the_reason() -> None:
    for bad, says in {"a(1),,b(2)": "address 2 is empty", "a(1),": "address 2 is empty",
                      "a(99999)": "not 1-65535", "a(1)b": "not host(port)",
                      ",".join(f"h{i}" for i in range(9)): "at most 8"}.items():
        with pytest.raises(ValueError, match=re.escape(says)):
            IBMMQConfig(q_mgr_name="QM1", conname=bad)
    with pytest.raises(ValueError, match=r"conname .* or host, not both"):
        IBMMQConfig(q_mgr_name="QM1", conname="a(1)", host="b")
    with pytest.raises(ValueError, match="reconnect"):
        IBMMQConfig(q_mgr_name="QM1", reconnect="always")  # type: ignore[arg-type]


def test_the_yaml_section_takes_and_checks_a_connection_list(tmp_path: Path) -> None:
    good = tmp_path / "good.yaml"
    good.write_text("queue_manager:\n  type: ibmmq\n  name: QM1\n"
                    "  conname: mqa(1414),mqb(1414)\n  reconnect: qmgr\n")
    qmc = load_config(good, PluginRegistry()).gateway.queue_manager
    assert (qmc.conname, qmc.reconnect) == ("mqa(1414),mqb(1414)", "qmgr")  # type: ignore[union-attr]
    for text, says in {"  conname: 'mqa(1414),'\n": "address 2 is empty",
                       "  conname: mqa(1414)\n  port: 1415\n": "or port, not both"}.items():
        bad = tmp_path / "bad.yaml"
        bad.write_text("queue_manager:\n  type: ibmmq\n  name: QM1\n" + text)
        with pytest.raises(Exception, match=says) as info:
            load_config(bad, PluginRegistry())
        assert "conname" in str(info.value) or "port" in str(info.value)
