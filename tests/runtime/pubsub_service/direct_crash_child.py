"""Child process of the direct hand-over crash test: a gateway with a memory sink that
records to a file; six publications in one unit of work are handed to the sink
directly; once the sink acknowledged them, before the stream batch commits, prints
``acked`` and waits to be SIGKILLed.

Usage: direct_crash_child.py GATEWAY_DIR RECORD_FILE
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

from gateway.runtime.pubsub_service.sink_backlogs import SinkBacklogs
from tests.runtime.pubsub_service.test_sink_direct_handover import _gateway, _memory, _publish


async def main(path: str, record_file: str) -> None:
    settle = SinkBacklogs.settle

    async def settle_then_hang(self: SinkBacklogs, handovers: list[Any], *args: Any) -> Any:
        late = await settle(self, handovers, *args)
        if handovers and not late:
            print("acked", flush=True)
            await asyncio.sleep(3600)  # the commit never comes: SIGKILL
        return late

    SinkBacklogs.settle = settle_then_hang  # type: ignore[method-assign]
    gw = _gateway(Path(path))
    await gw.start(_memory("crash", Path(record_file)))
    await _publish(gw, [f"c{i}".encode() for i in range(6)])
    await asyncio.sleep(3600)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2]))
