"""The record of a migration (``mqgw migrate``): which legacy broker the gateway took
over and its stream set, fixed from then on.

The record is ``migration.json`` next to the pub/sub store. Why a file beside the store:
``load_config`` must refuse a configuration that adds or removes a stream without
opening a queue manager, and the record must outlive the configuration file. The stream
set is fixed as the seed's ``migmqbrk`` paragraph says: a configuration naming a stream
the migrated broker did not have is refused, and once every migrated stream has been
serviced (``mqgw streams check`` marks the migration complete) removing one is refused
too; ``mqgw migrate --restart`` discards the record to start a new migration.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path

from pydantic import BaseModel, ConfigDict, ValidationError

from gateway.pubsub.streams import DEFAULT_STREAM

__all__ = [
    "MIGRATION_FILE",
    "MigrationRecord",
    "migration_path",
    "read_migration",
    "stream_set_changes",
    "write_migration",
]

MIGRATION_FILE = "migration.json"


class MigrationRecord(BaseModel):
    """What was migrated (JSON boundary)."""

    model_config = ConfigDict(extra="forbid")

    #: the legacy broker's queue manager ("" when given as --from-streams)
    from_q_mgr: str
    streams: list[str]
    #: set by ``mqgw streams check`` once every migrated stream is serviced
    complete: bool = False
    #: retained publications copied from the legacy broker
    retained_copied: int = 0
    #: what could not be migrated, said to the operator
    notes: list[str] = []


def migration_path(store: Path) -> Path:
    """Where the record of the gateway whose pub/sub store is ``store`` lives."""
    return store.parent / MIGRATION_FILE


def read_migration(path: Path) -> MigrationRecord | None:
    """The record at ``path``; None when there is none. ValueError when unreadable."""
    try:
        text = path.read_text(encoding="utf-8")
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as exc:
        raise ValueError(f"cannot read {path}: {exc.strerror}") from None
    try:
        return MigrationRecord.model_validate(json.loads(text))
    except (ValueError, ValidationError) as exc:
        raise ValueError(f"{path} is not a migration record: {exc}") from None


def write_migration(path: Path, record: MigrationRecord) -> None:
    """Write the record atomically (a crash leaves the old one or the new one)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    with tmp.open("w", encoding="utf-8") as f:
        f.write(record.model_dump_json(indent=2) + "\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def stream_set_changes(
    record: MigrationRecord, configured: Iterable[str]
) -> tuple[list[str], list[str]]:
    """(added, removed): configured streams the migrated broker did not have, and, once
    the migration is complete, migrated streams the configuration no longer services."""
    migrated = set(record.streams) | {DEFAULT_STREAM}
    conf = set(configured) | {DEFAULT_STREAM}
    added = sorted(conf - migrated)
    removed = sorted(migrated - conf) if record.complete else []
    return added, removed
