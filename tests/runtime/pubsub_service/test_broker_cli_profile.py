"""``mqgw broker --profile legacy --supported-streams``: the stream set handed to the
engine and the stream queues serviced (the legacy stand-in of issue 13)."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from gateway.mq.embedded.qmgr import EmbeddedQueueManager
from gateway.runtime.pubsub_service.cli import (
    ADMIN_STREAM,
    INTER_BROKER_QUEUE,
    add_arguments,
    config_from_args,
    legacy_queues,
    main,
    supported_streams,
)

DEFAULT = "SYSTEM.BROKER.DEFAULT.STREAM"


def _args(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    add_arguments(p)
    return p.parse_args(["--qmgr", "QM", "--qmgr-path", "qm", "--store", "s.db", *argv])


def test_legacy_profile_supports_the_named_streams_plus_default_and_admin() -> None:
    args = _args("--profile", "legacy", "--supported-streams", "STOCK.STREAM, BULLETIN.STREAM")
    assert supported_streams(args) == frozenset(
        {"STOCK.STREAM", "BULLETIN.STREAM", DEFAULT, ADMIN_STREAM})
    serviced = [s.name for s in config_from_args(args).streams]
    assert sorted(serviced) == sorted([ADMIN_STREAM, "BULLETIN.STREAM", "STOCK.STREAM"])


def test_gateway_profile_supports_every_stream() -> None:
    args = _args("--stream", "X.STREAM")
    assert supported_streams(args) is None
    assert [s.name for s in config_from_args(args).streams] == ["X.STREAM"]


def test_explicit_stream_flags_are_kept_in_the_legacy_profile() -> None:
    args = _args("--profile", "legacy", "--supported-streams", "S1", "--stream", "S1:noimplicit")
    streams = {s.name: s.implicit_stream_naming for s in config_from_args(args).streams}
    assert streams == {"S1": False, ADMIN_STREAM: True}


def test_supported_streams_need_the_legacy_profile(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rc = main(["--qmgr", "QM", "--qmgr-path", str(tmp_path / "qm"), "--store",
               str(tmp_path / "s.db"), "--supported-streams", "S1"])
    assert rc == 2
    assert "--supported-streams needs --profile legacy" in capsys.readouterr().err


async def test_legacy_queues_are_defined(tmp_path: Path) -> None:
    args = _args("--profile", "legacy", "--supported-streams", "SPORTS.STREAM")
    qm = EmbeddedQueueManager("QM", tmp_path / "qm")
    try:
        legacy_queues(config_from_args(args))(qm)
        for name in ("SYSTEM.BROKER.CONTROL.QUEUE", DEFAULT, ADMIN_STREAM,
                     INTER_BROKER_QUEUE, "SPORTS.STREAM"):
            assert name in qm.catalogue.queues, name
        legacy_queues(config_from_args(args))(qm)  # idempotent at the next start
    finally:
        await qm.close()


def test_bad_listen_port_and_mqsc_errors_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base = ["--qmgr", "QM", "--qmgr-path", str(tmp_path / "qm"), "--store",
            str(tmp_path / "s.db")]
    assert main([*base, "--listen", "70000"]) == 2
    assert "--listen 70000" in capsys.readouterr().err
    bad = tmp_path / "bad.mqsc"
    bad.write_text("DEFINE QLOCAL(OK) REPLACE\nDEFINE QLOCAL(X) COLOUR(RED)\n")
    assert main([*base, "--mqsc", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "bad.mqsc" in err and "line 2" in err, err
    assert main([*base, "--mqsc", str(tmp_path / "missing.mqsc")]) == 2
    assert "missing.mqsc" in capsys.readouterr().err


@pytest.mark.subprocess
def test_a_running_stand_in_is_reachable_by_mqgw_qm(tmp_path: Path) -> None:
    """``mqgw qm`` reaches a running ``mqgw broker`` over its local socket, as it reaches
    ``mqgw run``: MQSC and a put/get while the stand-in holds its data directory."""
    import os
    import subprocess
    import sys

    repo = Path(__file__).resolve().parents[3]
    env = dict(os.environ, PYTHONPATH=str(repo))
    qm_dir = tmp_path / "qm"
    broker = subprocess.Popen(
        [sys.executable, "-m", "gateway.runtime.cli", "broker", "--qmgr", "STANDIN",
         "--qmgr-path", str(qm_dir), "--store", str(tmp_path / "s.db")],
        cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        assert broker.stdout is not None
        line = broker.stdout.readline()  # READY once serving (or EOF when it failed)
        err = broker.stderr.read() if broker.stderr and not line else ""
        assert line.startswith("READY STANDIN"), (line, err)

        def qm(*args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
            return subprocess.run(
                [sys.executable, "-m", "gateway.runtime.cli", "qm", *args,
                 "--data-dir", str(qm_dir), "-v"],
                cwd=tmp_path, env=env, input=stdin, capture_output=True, text=True, timeout=60,
            )

        mqsc = qm("mqsc", stdin="DEFINE QLOCAL(APP.IN)\n")
        assert mqsc.returncode == 0, mqsc.stderr
        assert "running" in (mqsc.stdout + mqsc.stderr).lower(), mqsc.stderr
        assert qm("put", "APP.IN", stdin="hello\n").returncode == 0
        got = qm("get", "APP.IN")
        assert got.returncode == 0 and "hello" in got.stdout, got
    finally:
        broker.terminate()
        assert broker.wait(timeout=60) == 0
