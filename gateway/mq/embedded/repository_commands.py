"""Repository commands: the JSON messages full and partial repositories exchange on
SYSTEM.CLUSTER.COMMAND.QUEUE, encoded and decoded in one place.

Why apart from the manager: a command arrives from another process and must be checked
whole before anything acts on it (a bad one is dead-lettered with MQFB 280, never
retried forever), and the encoder sits beside that check so both sides agree.

``{"op": "update", "from": QM, "records": [record...], "answer": query-id?}`` and
``{"op": "query", "id": query-id, "from": QM, "cluster": name, "names": [name...]}``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from gateway.mq.embedded.repository import RepositoryRecord
from gateway.mq.port import MQError
from gateway.wire.constants import Feedback
from gateway.wire.reasons import Reason

_RECORD_FIELDS: dict[str, type] = {
    "kind": str, "cluster": str, "name": str, "q_mgr": str, "seq": int, "deleted": bool,
    "conname": str, "channel": str, "full": bool, "qtype": str, "q_mgr_alias": bool,
    "bind_not_fixed": bool,
}
_RECORD_REQUIRED = ("kind", "cluster", "name", "q_mgr", "seq")


class RepositoryCommandError(MQError):
    """A message on SYSTEM.CLUSTER.COMMAND.QUEUE that is not a repository command; it is
    dead-lettered with ``feedback`` MQFB_NOT_A_REPOSITORY_MSG (280)."""

    def __init__(self, message: str) -> None:
        self.feedback = int(Feedback.NOT_A_REPOSITORY_MSG)
        super().__init__(Reason.FORMAT_ERROR, message)


def decode_command(body: bytes) -> dict[str, Any]:
    """Decode and check one repository command, so nothing later fails on its shape."""
    try:
        cmd = json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise RepositoryCommandError(f"not JSON: {exc}") from exc
    if not isinstance(cmd, dict):
        raise RepositoryCommandError(f"a JSON {type(cmd).__name__}, not an object")
    op = cmd.get("op")
    if op not in ("query", "update"):
        raise RepositoryCommandError(f"unknown op {op!r}")
    if not isinstance(cmd.get("from", ""), str):
        raise RepositoryCommandError("'from' is not a string")
    if op == "query":
        names = cmd.get("names")
        if not isinstance(cmd.get("cluster"), str) or not isinstance(names, list) \
                or not all(isinstance(n, str) for n in names):
            raise RepositoryCommandError("a query needs 'cluster' and a list of 'names'")
        return cmd
    records = cmd.get("records")
    if not isinstance(records, list):
        raise RepositoryCommandError("an update needs a list of 'records'")
    for i, raw in enumerate(records):
        if not isinstance(raw, dict):
            raise RepositoryCommandError(f"record {i} is not an object")
        missing = [k for k in _RECORD_REQUIRED if k not in raw]
        if missing:
            raise RepositoryCommandError(f"record {i} lacks {', '.join(missing)}")
        for k, typ in _RECORD_FIELDS.items():
            v = raw.get(k)
            if k in raw and (not isinstance(v, typ) or (typ is int and isinstance(v, bool))):
                raise RepositoryCommandError(f"record {i}: {k} is not a {typ.__name__}")
    if cmd.get("answer") is not None and not isinstance(cmd["answer"], str):
        raise RepositoryCommandError("'answer' is not a string")
    return cmd


def update_command(
    records: Iterable[RepositoryRecord], sender: str, answer: Any = None
) -> dict[str, Any]:
    out: dict[str, Any] = {"op": "update", "from": sender,
                           "records": [r.to_json() for r in records]}
    if answer:
        out["answer"] = answer
    return out


def query_command(query_id: str, cluster: str, names: Iterable[str]) -> dict[str, Any]:
    """A partial repository's question about ``names`` (``from`` is added on sending)."""
    return {"op": "query", "id": query_id, "cluster": cluster, "names": list(names)}


def encode_command(cmd: dict[str, Any]) -> bytes:
    """The message body of a repository command."""
    return json.dumps(cmd).encode()
