"""gateway/secrets.py: a secret comes from env, file or a literal, and is never shown."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import BaseModel, ValidationError

from gateway.secrets import Secret, SecretError


class _Holder(BaseModel):
    password: Secret


def test_literal_env_and_file_sources(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MQGW_TEST_SECRET", "from-env")
    f = tmp_path / "pw"
    f.write_text("from-file\n")
    assert _Holder.model_validate({"password": "inline-pw"}).password.reveal() == "inline-pw"
    assert _Holder.model_validate(
        {"password": {"env": "MQGW_TEST_SECRET"}}).password.reveal() == "from-env"
    assert _Holder.model_validate({"password": {"file": str(f)}}).password.reveal() == "from-file"


def test_file_is_read_at_use_so_rotation_takes_effect(tmp_path: Path) -> None:
    f = tmp_path / "pw"
    f.write_text("one")
    secret = Secret.model_validate({"file": str(f)})
    assert secret.reveal() == "one"
    f.write_text("two\n")
    assert secret.reveal() == "two"


@pytest.mark.parametrize("bad", [{}, {"env": "A", "value": "b"}, {"file": "x", "env": "A"},
                                 {"nope": "x"}])
def test_exactly_one_source(bad: dict[str, str]) -> None:
    with pytest.raises(ValidationError):
        Secret.model_validate(bad)


def test_value_never_shown(monkeypatch: pytest.MonkeyPatch) -> None:
    holder = _Holder.model_validate({"password": "hunter2-xyz"})
    shown = [repr(holder), str(holder), repr(holder.password), str(holder.password),
             holder.model_dump_json(), str(holder.model_dump())]
    assert not [s for s in shown if "hunter2-xyz" in s], shown
    assert holder.password.source == "inline"


def test_unreadable_sources_name_the_source_not_a_value(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("MQGW_TEST_UNSET", raising=False)
    with pytest.raises(SecretError, match="env MQGW_TEST_UNSET"):
        Secret.model_validate({"env": "MQGW_TEST_UNSET"}).reveal()
    with pytest.raises(SecretError, match="missing"):
        Secret.model_validate({"file": str(tmp_path / "missing")}).reveal()
    empty = tmp_path / "empty"
    empty.write_text("\n")
    with pytest.raises(SecretError, match="empty"):
        Secret.model_validate({"file": str(empty)}).reveal()
