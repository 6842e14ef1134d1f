"""What the demo exercises: its queues, streams and topics, the bridge paths, and what
each path sent and received.

Why one module: every part of the demo (the legacy MQ apps, the Kafka and MQTT clients,
the summary) counts into the same :class:`PathStats` rows by these names.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

STOCK = "STOCK.STREAM"
BULLETIN = "BULLETIN.STREAM"
RFH_SUB_Q = "DEMO.RFH.SUBSCRIBER"
RFH2_SUB_Q = "DEMO.RFH2.SUBSCRIBER"
OHLC_RFH_Q = "DEMO.OHLC.RFH"
OHLC_RFH2_Q = "DEMO.OHLC.RFH2"
REPLY_Q = "DEMO.REPLY"
KAFKA_IN = "demo.to-mq"
MQTT_IN = "demo/to-mq"
TICKS_TOPIC = f"mqgw.{STOCK}"
BARS_TOPIC = "mqgw-analytics.ohlc"
SYMBOLS = ("IBM", "HPQ")
#: MQRFH user name/value pairs the tick feed adds, so viewers can match ticks.
SEQ_PAIR, SENT_PAIR = "DemoSeq", "DemoSent"

PATHS = (
    "MQRFH ticks -> Kafka",
    "MQRFH2 publisher -> Kafka",
    "MQRFH ticks -> MQTT",
    "MQRFH2 publisher -> MQTT",
    "Kafka -> MQRFH subscriber",
    "Kafka -> MQRFH2 subscriber",
    "MQTT -> MQRFH subscriber",
    "MQTT -> MQRFH2 subscriber",
)
OHLC_PATHS = {
    "ohlc bars -> MQ (MQRFH sub)": OHLC_RFH_Q,
    "ohlc bars -> MQ (MQRFH2 sub)": OHLC_RFH2_Q,
}
#: The short label of each path on the live progress line.
SHORT_NAMES = {
    PATHS[0]: "RFH>K",
    PATHS[1]: "RFH2>K",
    PATHS[2]: "RFH>M",
    PATHS[3]: "RFH2>M",
    PATHS[4]: "K>RFH",
    PATHS[5]: "K>RFH2",
    PATHS[6]: "M>RFH",
    PATHS[7]: "M>RFH2",
    "ohlc bars -> MQ (MQRFH sub)": "bars>RFH",
    "ohlc bars -> MQ (MQRFH2 sub)": "bars>RFH2",
}

#: The first record/message each viewer saw, shown to the user.
SAMPLES: dict[str, str] = {}


@dataclass
class PathStats:
    """What one path sent and received, and the latency of each message received."""

    sent: int = 0
    received: int = 0
    latencies: list[float] = field(default_factory=list)
    #: Why the path was not exercised ("" when it was).
    skipped: str = ""

    def add(self, sent_at: float) -> None:
        self.received += 1
        self.latencies.append(max(0.0, time.time() - sent_at))

    @property
    def complete(self) -> bool:
        return bool(self.skipped) or (self.sent > 0 and self.received == self.sent)


def percentile(values: Sequence[float], q: float) -> float:
    """The nearest-rank percentile ``q`` (0..100) of ``values``; NaN when empty."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    k = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[k]


def path_body(path_id: str, seq: int) -> bytes:
    """What the JSON-bodied paths send: the path, a sequence number and the send time."""
    return json.dumps({"path": path_id, "seq": seq, "sent": time.time()}).encode()


def parse_path_body(payload: bytes) -> dict[str, Any] | None:
    """A :func:`path_body` read back; None for anything else (ticks, bars)."""
    try:
        data = json.loads(payload)
    except (ValueError, UnicodeDecodeError):
        return None
    return data if isinstance(data, dict) and "path" in data else None
