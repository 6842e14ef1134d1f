"""Outbound side of the memory plugin: envelopes become :class:`Record` on the bus."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path

from gateway.plugin_api import DeliveryRefusedError, Envelope, PluginError
from plugins.memory.bus import MemoryBus
from plugins.memory.mapping import record_json, record_of

#: MQRC_MSG_TOO_BIG_FOR_Q: the reason a refused, too large envelope is dead-lettered with.
MSG_TOO_BIG = 2030


class MemorySink:
    def __init__(
        self, bus: MemoryBus, record_file: Path | None = None, refuse_larger_than: int | None = None
    ) -> None:
        self.bus = bus
        self.record_file = record_file
        self.refuse_larger_than = refuse_larger_than

    async def send(self, envelopes: Sequence[Envelope]) -> None:
        if self.bus.down:
            self.bus.refused_sends += 1
            raise PluginError(f"memory bus {self.bus.name!r} is down", retriable=True)
        limit = self.refuse_larger_than
        if limit is not None:
            # Checked before anything is recorded: a refused batch delivered nothing.
            for i, d in enumerate(envelopes):
                if len(d.payload) > limit:
                    raise DeliveryRefusedError(
                        f"payload of {len(d.payload)} bytes is over {limit}",
                        index=i,
                        reason=MSG_TOO_BIG,
                    )
        records = [record_of(d) for d in envelopes]
        if self.record_file is not None:
            lines = "".join(json.dumps(record_json(r)) + "\n" for r in records)
            try:
                with self.record_file.open("a", encoding="utf-8") as f:
                    f.write(lines)
                    f.flush()
                    os.fsync(f.fileno())
            except OSError as exc:
                raise PluginError(
                    f"cannot write {self.record_file}: {exc}", retriable=True
                ) from exc
        self.bus.record(records)
