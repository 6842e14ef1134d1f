"""``mqgw completion bash|zsh``: the script is valid bash and completes in a real bash."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from gateway.runtime.cli import build_parser
from gateway.runtime.completion import collect, zsh_script


def _script(shell: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "gateway.runtime.cli", "completion", shell],
        capture_output=True, text=True, timeout=60, check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.fixture(scope="module")
def bash_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("completion") / "mqgw.bash"
    path.write_text(_script("bash"), encoding="utf-8")
    return path


def _bash() -> str:
    bash = shutil.which("bash")
    assert bash is not None, "bash is needed for the completion tests"
    return bash


def _complete(script: Path, line: str) -> list[str]:
    """What bash's ``_mqgw`` offers for ``line`` (cursor at its end)."""
    words = line.split(" ")
    program = (
        'source "$1"; shift; COMP_WORDS=("$@"); COMP_CWORD=$(( $# - 1 )); '
        'COMP_LINE="${*}"; _mqgw; printf "%s\\n" "${COMPREPLY[@]}"'
    )
    done = subprocess.run(
        [_bash(), "-c", program, "bash", str(script), *words],
        capture_output=True, text=True, timeout=30, check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    return [w for w in done.stdout.splitlines() if w]


def test_bash_script_is_valid_bash(bash_file: Path) -> None:
    done = subprocess.run([_bash(), "-n", str(bash_file)], capture_output=True, text=True,
                          timeout=30, check=False)
    assert done.returncode == 0, done.stderr
    assert "complete -o default -F _mqgw mqgw" in bash_file.read_text(encoding="utf-8")


def test_top_level_prefix_offers_qm(bash_file: Path) -> None:
    assert _complete(bash_file, "mqgw q") == ["qm"]


def test_top_level_offers_every_registered_command(bash_file: Path) -> None:
    offered = set(_complete(bash_file, "mqgw "))
    expected = set(collect(build_parser())[0].subcommands)
    assert {"qm", "completion", "run", "streams"} <= expected
    assert offered == expected


def test_qm_offers_its_subcommands(bash_file: Path) -> None:
    assert _complete(bash_file, "mqgw qm ") == ["mqsc", "put", "get", "browse", "dlq"]


def test_options_of_a_nested_command(bash_file: Path) -> None:
    offered = _complete(bash_file, "mqgw qm dlq --")
    assert {"--rules", "--once", "--dry-run", "--data-dir", "--config"} <= set(offered)
    # an option's value is skipped: options are still those of `qm dlq`
    assert _complete(bash_file, "mqgw -v qm dlq --rules rules.txt --dr") == ["--dry-run"]


def test_positional_choices_and_value_positions(bash_file: Path) -> None:
    assert _complete(bash_file, "mqgw completion ") == ["bash", "zsh"]
    assert _complete(bash_file, "mqgw completion z") == ["zsh"]
    # the value of --rules is a file: nothing offered, bash falls back to files
    assert _complete(bash_file, "mqgw qm dlq --rules ") == []


def test_zsh_script_uses_bashcompinit_with_the_same_function(bash_file: Path) -> None:
    zsh = _script("zsh")
    assert zsh == zsh_script(build_parser())
    assert "bashcompinit" in zsh
    bash_body = bash_file.read_text(encoding="utf-8").split("\n", 1)[1]
    assert zsh.endswith(bash_body)


def test_unknown_shell_is_a_usage_error() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "gateway.runtime.cli", "completion", "fish"],
        capture_output=True, text=True, timeout=60, check=False,
    )
    assert done.returncode == 2
    assert "invalid choice" in done.stderr


def test_network_offers_check_and_its_options(bash_file: Path) -> None:
    """``check`` is parsed by ``mqgw network`` itself (after the topology runner's
    words), and still completed as a sub-command with its own options."""
    assert "check" in _complete(bash_file, "mqgw network ")
    offered = _complete(bash_file, "mqgw network check --")
    assert {"--json", "--token-file", "--cafile"} <= set(offered), offered
