"""``mqgw`` as users type it: flags where they put them, defaults, a closed pipe."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from gateway.pubsub.sqlite_store import SqliteStore
from gateway.runtime.cli import build_parser

REPO = Path(__file__).resolve().parents[2]


def _mqgw(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.run(
        [sys.executable, "-m", "gateway.runtime.cli", *args],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=60,
    )


def test_verbose_is_accepted_after_the_command() -> None:
    parser = build_parser()
    assert parser.parse_args(["run", "-v", "--config", "x.yaml"]).verbose == 1
    assert parser.parse_args(["run", "-vv"]).verbose == 2
    assert parser.parse_args(["-v", "run"]).verbose == 1
    assert parser.parse_args(["run"]).verbose == 0
    assert parser.parse_args(["streams", "check", "--verbose"]).verbose == 1


def test_verbose_is_accepted_after_network_check(tmp_path: Path) -> None:
    """``network check`` has its own parser behind ``mqgw network``; ``-v`` after it
    counts as before the command, and the check runs as without it."""
    parser = build_parser()
    assert parser.parse_args(["network", "check", "-v", "http://127.0.0.1:1"]).verbose == 1
    assert parser.parse_args(["network", "check", "--json", "-vv"]).verbose == 2
    assert parser.parse_args(["-v", "network", "check"]).verbose == 1
    assert parser.parse_args(["network", "check"]).verbose == 0
    after = _mqgw("network", "check", "-v", "http://127.0.0.1:1", cwd=tmp_path)
    before = _mqgw("-v", "network", "check", "http://127.0.0.1:1", cwd=tmp_path)
    assert after.returncode == before.returncode == 1, after.stderr
    assert after.stdout == before.stdout
    assert "[node-unreadable] http://127.0.0.1:1/network" in after.stdout, after.stdout


def test_a_command_that_gives_v_its_own_meaning_keeps_it() -> None:
    args = build_parser().parse_args(["qm", "browse", "-v", "--data-dir", "d", "Q"])
    assert args.qm_verbose is True
    assert args.verbose == 0


def test_subscriptions_reads_gateway_yaml_by_default(tmp_path: Path) -> None:
    (tmp_path / "gateway.yaml").write_text("broker:\n  store: subs.db\n")
    SqliteStore(tmp_path / "subs.db").close()
    done = _mqgw("subscriptions", "--json", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout == ""


def test_a_reader_that_goes_away_ends_the_command_quietly(tmp_path: Path) -> None:
    """``mqgw completion bash | head -c 0``: no traceback, the shell's SIGPIPE status."""
    env = dict(os.environ, PYTHONPATH=str(REPO))
    child = subprocess.Popen(
        [sys.executable, "-m", "gateway.runtime.cli", "completion", "bash"],
        cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )
    assert child.stdout is not None and child.stderr is not None
    child.stdout.close()  # before the child has imported anything: its writes fail
    err = child.stderr.read().decode()
    assert child.wait(timeout=60) == 141, err
    assert "Traceback" not in err and "BrokenPipe" not in err, err
