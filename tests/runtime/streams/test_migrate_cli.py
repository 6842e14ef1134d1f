"""``mqgw migrate``: the migrated stream set is recorded and fixed afterwards."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gateway.runtime.cli import main
from tests.runtime.streams.streams_helpers import prepare, write_config

B, S, T = "BULLETIN.STREAM", "SPORTS.STREAM", "STOCK.STREAM"


def test_migrate_records_the_stream_set_then_it_is_fixed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = write_config(tmp_path, [T])
    code = main(
        ["migrate", "--config", str(cfg), "--from-streams", f"{T},{B}", "--from-broker", "OLDQM"]
    )
    out = capsys.readouterr().out
    assert code == 1  # incomplete: BULLETIN.STREAM is not serviced yet
    assert f"    - name: {B}" in out
    assert "durable subscriptions: not copied" in out and "AllIdentities" in out
    record = json.loads((tmp_path / "migration.json").read_text())
    assert (record["from_q_mgr"], record["streams"], record["complete"]) == (
        "OLDQM",
        [B, T],
        False,
    )

    # a second migration without --restart is refused
    assert main(["migrate", "--config", str(cfg), "--from-streams", S]) == 2
    assert "mqgw migrate --restart" in capsys.readouterr().err

    # adding a stream the migrated broker did not have is refused at config load
    write_config(tmp_path, [T, S])
    prepare(tmp_path, [T], {}, {})
    assert main(["streams", "check", "--config", str(cfg)]) == 2
    err = capsys.readouterr().err
    assert f"stream '{S}' was added after the migration from OLDQM" in err
    assert "mqgw migrate --restart" in err

    # streams check: incomplete until serviced, then complete
    write_config(tmp_path, [T])
    assert main(["streams", "check", "--config", str(cfg)]) == 1
    out = capsys.readouterr().out
    assert "migration from OLDQM: incomplete" in out and f"{B}" in out
    write_config(tmp_path, [T, B])
    assert main(["streams", "check", "--config", str(cfg), "--fix"]) == 0
    out = capsys.readouterr().out
    assert "migration from OLDQM complete: stream set fixed" in out

    # --restart starts a new migration
    assert (
        main(["migrate", "--config", str(cfg), "--restart", "--from-streams", f"{T},{B},{S}"]) == 1
    )
    assert json.loads((tmp_path / "migration.json").read_text())["streams"] == [B, S, T]


def test_migrate_usage(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = write_config(tmp_path, [T, B])
    assert main(["migrate", "--config", str(cfg)]) == 2
    assert main(["migrate", "--config", str(cfg), "--from-broker", "OLDQM"]) == 2
    err = capsys.readouterr().err  # asking the broker needs our listener for its answer
    assert "--listen PORT" in err and "--from-streams" in err
    # the configuration already services a stream the broker does not have
    assert main(["migrate", "--config", str(cfg), "--from-streams", T]) == 2
    assert f"services {B}" in capsys.readouterr().err
    assert main(["migrate", "--config", str(cfg), "--from-streams", "A/B"]) == 2
    assert not (tmp_path / "migration.json").exists()
    assert main(["migrate", "--config", str(cfg), "--from-streams", f"{T},{B}"]) == 0
