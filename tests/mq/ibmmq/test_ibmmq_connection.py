"""The ibmmq adapter's connections and handles, driven through a stand-in MQI module
that records its calls (tests/support/mqi_standin.py)."""

from __future__ import annotations

import threading
from types import ModuleType

import pytest

from gateway.mq.ibmmq import IBMMQConfig, IBMMQQueueManager
from gateway.mq.port import GetOptions, MQError, OpenOption, PutOptions
from gateway.wire.mqmd import MQMD
from gateway.wire.reasons import Reason
from tests.support.mqi_standin import StandIn


def config(**kw: object) -> IBMMQConfig:
    return IBMMQConfig(q_mgr_name="STANDIN", **kw)  # type: ignore[arg-type]


async def test_client_connection_parameters(standin: StandIn) -> None:
    cfg = config(host="mq.example", port=1515, channel="APP.SVRCONN", user="app",
                 password="secret", tls_cipher_spec="ANY_TLS12_OR_HIGHER",
                 key_repository="/var/mqm/ssl/key")
    conn = await IBMMQQueueManager(cfg, mqi=standin.module).connect()
    await conn.disconnect()
    call = standin.calls[0]
    assert call.name == "connect_with_options" and call.args["name"] == "STANDIN"
    cd, sco = call.args["cd"], call.args["sco"]
    assert cd.ConnectionName == b"mq.example(1515)" and cd.ChannelName == b"APP.SVRCONN"
    assert cd.ChannelType == 6 and cd.TransportType == 2
    assert cd.SSLCipherSpec == b"ANY_TLS12_OR_HIGHER" and sco.KeyRepository == b"/var/mqm/ssl/key"
    assert call.args["user"] == "app" and call.args["password"] == "secret"
    assert "secret" not in repr(cfg)


async def test_no_tls_no_credentials_by_default(standin: StandIn) -> None:
    conn = await IBMMQQueueManager(config(), mqi=standin.module).connect()
    await conn.disconnect()
    assert set(standin.calls[0].args) == {"name", "cd"}


async def test_all_calls_of_a_connection_run_on_one_thread_off_the_loop(standin: StandIn) -> None:
    loop_thread = threading.get_ident()
    qm = IBMMQQueueManager(config(), mqi=standin.module)
    a = await qm.connect()
    b = await qm.connect()
    qa = await a.open("APP.Q", OpenOption.OUTPUT | OpenOption.INPUT_SHARED)
    qb = await b.open("APP.Q", OpenOption.INPUT_SHARED)
    await qa.put(MQMD(), b"x", PutOptions(syncpoint=True))
    await a.commit()
    assert (await qb.get(GetOptions(wait_ms=1000))).body == b"x"
    await a.disconnect()
    await b.disconnect()
    threads = {c.thread for c in standin.calls}
    assert loop_thread not in threads
    assert len(threads) == 2  # one per connection
    first = standin.calls[0].thread
    names_on_first = [c.name for c in standin.calls if c.thread == first]
    assert names_on_first[:3] == ["connect_with_options", "open", "put"]
    assert "commit" in names_on_first and "disconnect" in names_on_first


async def test_connect_retries_transient_reasons_with_backoff(standin: StandIn) -> None:
    waits: list[float] = []

    async def sleep(s: float) -> None:
        waits.append(s)

    standin.connect_failures = [2538, 2059, 2009]
    cfg = config(backoff_initial_s=0.5, backoff_max_s=2.0)
    conn = await IBMMQQueueManager(cfg, mqi=standin.module, sleep=sleep).connect()
    await conn.disconnect()
    assert len(waits) == 3
    assert 0.25 <= waits[0] <= 0.5 and 0.5 <= waits[1] <= 1.0 and 1.0 <= waits[2] <= 2.0
    assert [c.name for c in standin.calls].count("connect_with_options") == 4


async def test_connect_gives_up_after_attempts_and_not_on_auth_errors(standin: StandIn) -> None:
    async def sleep(s: float) -> None:
        return None

    standin.connect_failures = [2538] * 5
    with pytest.raises(MQError) as err:
        await IBMMQQueueManager(config(connect_attempts=3), mqi=standin.module,
                                sleep=sleep).connect()
    assert err.value.reason == 2538
    assert len(standin.calls) == 3
    standin.calls.clear()
    standin.connect_failures = [2035]
    with pytest.raises(MQError) as err:
        await IBMMQQueueManager(config(), mqi=standin.module, sleep=sleep).connect()
    assert err.value.reason == Reason.NOT_AUTHORIZED and not err.value.retriable
    assert len(standin.calls) == 1


async def test_broken_connection_raises_then_reconnects_and_reopens(standin: StandIn) -> None:
    async def sleep(s: float) -> None:
        return None

    conn = await IBMMQQueueManager(config(), mqi=standin.module, sleep=sleep).connect()
    q = await conn.open("APP.Q", OpenOption.OUTPUT | OpenOption.INPUT_SHARED)
    await q.put(MQMD(), b"in-uow", PutOptions(syncpoint=True))
    standin.break_next_call = 2009
    with pytest.raises(MQError) as err:
        await q.put(MQMD(), b"lost")
    assert err.value.reason == Reason.CONNECTION_BROKEN and err.value.retriable
    assert "backed out" in str(err.value)
    standin.calls.clear()
    await q.put(MQMD(), b"after")
    names = [c.name for c in standin.calls]
    assert names == ["connect_with_options", "open", "put"]
    assert (await q.get(GetOptions())).body == b"after"
    await conn.disconnect()


async def test_wrong_qmgr_name_is_reported(standin: StandIn) -> None:
    with pytest.raises(MQError) as err:
        await IBMMQQueueManager(IBMMQConfig(q_mgr_name="OTHER"), mqi=standin.module).connect()
    assert err.value.reason == Reason.Q_MGR_NAME_ERROR


async def test_the_mqi_module_is_imported_lazily_as_ibmmq(standin: StandIn) -> None:
    """Without ``mqi=``, the first use imports ``ibmmq`` (here: the stand-in in its place)."""
    asked: list[str] = []

    def import_module(name: str) -> ModuleType:
        asked.append(name)
        if name == "ibmmq":
            return standin.module
        raise ModuleNotFoundError(f"No module named {name!r}")

    qm = IBMMQQueueManager(config(), import_module=import_module)
    assert asked == []
    async with await qm.connect() as conn:
        await conn.put1("APP.Q", MQMD(format="MQSTR"), b"via-import")
        q = await conn.open("APP.Q", OpenOption.INPUT_SHARED)
        assert q.resolved_q_name == "APP.Q" and q.resolved_q_mgr_name == "STANDIN"
        assert (await q.get(GetOptions())).body == b"via-import"
    assert qm.mqi() is standin.module
    assert asked == ["ibmmq"]


async def test_string_format_survives_the_mqi_padding(standin: StandIn) -> None:
    """The stand-in packs Format as the MQI module does (NUL-padded) and refuses NULs, as
    MQ would not recognise such a format: the adapter's blank padding must reach it."""
    async with await IBMMQQueueManager(config(), mqi=standin.module).connect() as conn:
        q = await conn.open("APP.Q", OpenOption.OUTPUT | OpenOption.INPUT_SHARED)
        await q.put(MQMD(format="MQSTR"), b"text")
        await conn.put1("APP.Q", MQMD(format="MQHRF2"), b"x")
        assert (await q.get(GetOptions())).md.format == "MQSTR"
        assert (await q.get(GetOptions())).md.format == "MQHRF2"


async def test_disconnect_always_backs_out_first(standin: StandIn) -> None:
    conn = await IBMMQQueueManager(config(), mqi=standin.module).connect()
    q = await conn.open("APP.Q", OpenOption.OUTPUT | OpenOption.INPUT_SHARED)
    await q.put(MQMD(), b"plain")
    standin.calls.clear()
    await conn.disconnect()
    assert [c.name for c in standin.calls] == ["close", "backout", "disconnect"]


async def test_a_failed_first_syncpoint_call_reports_the_backed_out_unit(
    standin: StandIn,
) -> None:
    """The unit of work is marked before the call is submitted: a first syncpoint put
    whose answer is lost may have started one, and the caller must be told."""
    async def sleep(s: float) -> None:
        return None

    conn = await IBMMQQueueManager(config(), mqi=standin.module, sleep=sleep).connect()
    q = await conn.open("APP.Q", OpenOption.OUTPUT | OpenOption.INPUT_SHARED)
    standin.break_next_call = 2009
    with pytest.raises(MQError) as err:
        await q.put(MQMD(), b"first", PutOptions(syncpoint=True))
    assert err.value.reason == Reason.CONNECTION_BROKEN
    assert "backed out" in str(err.value)
    await conn.disconnect()
