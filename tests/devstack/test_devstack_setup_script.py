"""tools/setup.sh: prerequisite errors are clear, and a second run changes nothing.

These run the real script. The idempotence check shadows ``mvn`` and ``apt-get`` with
programs that record being called, so "already set up" must mean "nothing fetched".
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SETUP = ROOT / "tools" / "setup.sh"
BASH = shutil.which("bash") or "/bin/bash"


def _exe(path: Path, body: str) -> None:
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


def _run(env_path: str, **extra: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "JAVA_HOME"}
    env.update(PATH=env_path, **extra)
    return subprocess.run(
        [BASH, str(SETUP)], capture_output=True, text=True, env=env, timeout=120, check=False
    )


def test_old_java_is_refused_with_a_clear_message(tmp_path: Path) -> None:
    _exe(tmp_path / "java", "echo 'openjdk version \"11.0.22\" 2024-01-16' >&2")
    result = _run(f"{tmp_path}:{os.environ['PATH']}")
    assert result.returncode == 1
    assert "Java 11 found" in result.stderr
    assert "need Java 17 or newer" in result.stderr


def test_missing_java_is_refused_with_a_clear_message(tmp_path: Path) -> None:
    # only bash's own essentials: no java anywhere on PATH
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("dirname", "cat", "sha256sum", "cut", "head", "sed"):
        real = subprocess.run(
            ["bash", "-c", f"command -v {tool}"], capture_output=True, text=True, check=True
        ).stdout.strip()
        (bin_dir / tool).symlink_to(real)
    result = _run(str(bin_dir))
    assert result.returncode == 1
    assert "java not found on PATH" in result.stderr


def test_second_run_is_a_no_op(tmp_path: Path) -> None:
    """After `make setup` (which `make test` runs first) nothing is installed or resolved."""
    calls = tmp_path / "calls"
    for tool in ("mvn", "apt-get"):
        _exe(tmp_path / tool, f'echo "{tool} $*" >> {calls}; exit 99')
    result = _run(f"{tmp_path}:{os.environ['PATH']}")
    assert result.returncode == 0, (
        "setup is not complete (run `make setup` first)\n" + result.stdout + result.stderr
    )
    assert not calls.exists(), calls.read_text()
    lines = result.stdout.splitlines()
    assert "setup: .venv up to date" in lines
    assert any(line.startswith("setup: mosquitto present") for line in lines)
    assert "setup: kafka jars up to date (.cache/jvm/kafka/lib)" in lines
    assert "setup: spark-kafka jars up to date (.cache/jvm/spark-kafka/lib)" in lines
    assert lines[-1] == "setup: done"
