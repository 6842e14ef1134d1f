"""``mqgw neighbours``: requests written for the running links, list (text and JSON),
exit codes, the MQSC for an MQ V7+ neighbour."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gateway.pubsub.neighbours import ProxyKey
from gateway.runtime.cli import main
from gateway.runtime.neighbours.state import NeighbourState


def test_joining_our_own_queue_manager_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "data").mkdir()
    config = tmp_path / "gateway.yaml"
    config.write_text(
        "queue_manager:\n  name: GW\nbroker:\n  store: data/pubsub.db\n", encoding="utf-8"
    )
    code, _, err = run(capsys, "join", "GW", "--config", str(config))
    assert code == 2 and "own queue manager" in err
    assert run(capsys, "join", "A", "--config", str(config))[0] == 0
    state = NeighbourState(tmp_path / "data" / "neighbours.db")
    assert [r.q_mgr for r in state.neighbours()] == ["A"]
    state.close()


def test_clear_help_says_a_configured_neighbour_comes_back(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit):
        main(["neighbours", "clear", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "only until the next start" in out


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["neighbours", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_join_list_clear(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    d = str(tmp_path)
    code, out, _ = run(
        capsys,
        "join",
        "BROKERA",
        "--kind",
        "mqv7",
        "--streams",
        "STOCK.STREAM,BULLETIN.STREAM",
        "--data-dir",
        d,
    )
    assert code == 0 and "BROKERA" in out
    state = NeighbourState(tmp_path / "neighbours.db")
    state.set_state("BROKERA", "active")
    state.heard("BROKERA", 1.0)
    state.intend("BROKERA", ProxyKey("STOCK.STREAM", "ibm", 2), b"m" * 24, register=True)
    state.close()

    code, out, _ = run(capsys, "list", "--data-dir", d)
    assert code == 0
    line = out.splitlines()[0]
    assert line.split()[:4] == ["BROKERA", "active", "mqv7", "child"]
    assert "proxies 1" in line
    assert "BULLETIN.STREAM, STOCK.STREAM, SYSTEM.BROKER.DEFAULT.STREAM" in line
    assert "s ago" in line
    assert out.splitlines()[-1] == "1 neighbour(s)"

    code, out, _ = run(capsys, "list", "--json", "--data-dir", d)
    row = json.loads(out)
    assert row["state"] == "active" and row["last_heard"] == 1.0
    assert row["common_streams"] == [
        "BULLETIN.STREAM",
        "STOCK.STREAM",
        "SYSTEM.BROKER.DEFAULT.STREAM",
    ]
    assert row["proxy_subscriptions"] == 1

    code, _, _ = run(capsys, "clear", "BROKERA", "--data-dir", d)
    assert code == 0
    state = NeighbourState(tmp_path / "neighbours.db")
    row_ = state.neighbour("BROKERA")
    assert row_ is not None and row_.clear_requested
    state.close()


def test_refusal_and_last_error_are_listed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run(capsys, "join", "B", "--data-dir", str(tmp_path))[0] == 0
    state = NeighbourState(tmp_path / "neighbours.db")
    state.set_state("B", "refused", "loop: B is already reachable through A")
    state.set_last_error("B", "proxy command refused: reason 3071 MQRCCF_STREAM_ERROR")
    state.close()
    code, out, _ = run(capsys, "list", "--data-dir", str(tmp_path))
    assert code == 0
    assert "refused" in out.splitlines()[0]
    assert "loop: B is already reachable through A" in out
    assert "reason 3071" in out


def test_refused_proxies_are_listed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import time

    assert run(capsys, "join", "B", "--data-dir", str(tmp_path))[0] == 0
    state = NeighbourState(tmp_path / "neighbours.db")
    state.intend("B", ProxyKey("SPORTS.STREAM", "football", 2), b"R" * 24, register=True)
    state.settle(b"R" * 24, ok=False, reason="reason 3071 MQRCCF_STREAM_ERROR", now=time.time())
    state.close()
    code, out, _ = run(capsys, "list", "--data-dir", str(tmp_path))
    assert code == 0
    assert "proxy SPORTS.STREAM 'football' refused (reason 3071 MQRCCF_STREAM_ERROR)" in out
    code, out, _ = run(capsys, "list", "--json", "--data-dir", str(tmp_path))
    (item,) = [json.loads(line) for line in out.splitlines()]
    (refused,) = item["refused_proxies"]
    assert refused["reason"] == "reason 3071 MQRCCF_STREAM_ERROR"
    assert 55.0 < refused["retry_in"] <= 60.0


def test_exit_codes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    d = str(tmp_path)
    code, _, err = run(capsys, "clear", "NOPE", "--data-dir", d)
    assert code == 1 and "no neighbour NOPE" in err
    code, _, err = run(capsys, "mqsc", "NOPE", "--data-dir", d, "--self-qmgr", "GW")
    assert code == 1
    code, _, err = run(capsys, "join", "BAD NAME", "--data-dir", d)
    assert code == 2 and "q_mgr" in err
    code, _, err = run(capsys, "list", "--data-dir", str(tmp_path / "missing"))
    assert code == 2 and "no data directory" in err
    with pytest.raises(SystemExit) as exc:
        main(["neighbours", "join", "A", "--kind", "mqtt", "--data-dir", d])
    assert exc.value.code == 2


def test_mqsc_for_an_mqv7_neighbour(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    d = str(tmp_path)
    run(capsys, "join", "QMV7", "--kind", "mqv7", "--streams", "SPORTS.STREAM", "--data-dir", d)
    code, out, _ = run(
        capsys,
        "mqsc",
        "QMV7",
        "--data-dir",
        d,
        "--self-qmgr",
        "GW",
        "--conname",
        "gw.example(1415)",
    )
    assert code == 0
    lines = out.splitlines()
    assert "ALTER QMGR PSMODE(ENABLED)" in lines
    assert "DEFINE QLOCAL('SPORTS.STREAM') DEFPSIST(YES) REPLACE" in lines
    assert "DEFINE TOPIC('SPORTS.STREAM') TOPICSTR('SPORTS.STREAM') REPLACE" in lines
    assert (
        "  NAMES(SYSTEM.BROKER.DEFAULT.STREAM, SYSTEM.BROKER.ADMIN.STREAM, SPORTS.STREAM)" in lines
    )
    assert "DEFINE QLOCAL('GW') USAGE(XMITQ) REPLACE" in lines
    assert "  CONNAME('gw.example(1415)') XMITQ('GW') REPLACE" in lines
    assert not any(line.startswith("ALTER QMGR PARENT") for line in lines)


def test_mqsc_for_a_multi_instance_node_takes_a_connection_list(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    d = str(tmp_path)
    run(capsys, "join", "QMV7", "--kind", "mqv7", "--data-dir", d)
    code, out, _ = run(capsys, "mqsc", "QMV7", "--data-dir", d, "--self-qmgr", "GW",
                       "--conname", "gwa.example(1415), gwb.example(1415)",
                       "--neighbour-conname", "mqa(1414),mqb(1414)")
    assert code == 0
    assert "  CONNAME('gwa.example(1415),gwb.example(1415)') XMITQ('GW') REPLACE" in (
        out.splitlines())
    assert "CONNAME('mqa(1414),mqb(1414)') XMITQ('QMV7')" in out
    for bad, says in {"gwa(1415),": "address 2 is empty", "gwa": "not host(port)"}.items():
        with pytest.raises(SystemExit) as exc:
            main(["neighbours", "mqsc", "QMV7", "--data-dir", d, "--conname", bad])
        assert exc.value.code == 2
        assert says in capsys.readouterr().err
