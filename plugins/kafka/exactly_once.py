"""Exactly-once MQ → Kafka: the record of which envelopes a Kafka transaction committed.

Each transaction of the sink writes, next to the records, one marker record per envelope
to a compacted topic of this instance (key: the envelope's identity, value ``1``). The
markers commit or abort with the records. At start-up the sink reads the markers
(read_committed), so an envelope MQ offers again after a crash between the Kafka commit
and the MQ commit is recognised and not written twice.
"""

from __future__ import annotations

import asyncio
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient

from gateway.plugin_api import Envelope
from plugins.kafka.errors import KafkaPluginError

#: UNKNOWN_TOPIC_OR_PARTITION: no marker topic yet, so nothing was ever committed.
_UNKNOWN_TOPIC = 3

#: Longest the start-up read of the marker topic may take.
LOAD_TIMEOUT_S = 60.0


def envelope_identity(envelope: Envelope) -> bytes | None:
    """What identifies one delivery of one publication (None: no MsgId to rely on)."""
    if not envelope.msg_id.strip(b"\x00"):
        return None
    parts = (
        envelope.msg_id.hex(),
        envelope.subscription_stream,
        envelope.subscription_filter,
        envelope.stream,
        envelope.topic,
        envelope.sequence_number,
        "R" if envelope.from_retained_store else "L",
        str(len(envelope.payload)),
    )
    return "\x1f".join(parts).encode("utf-8")


class CommittedLedger:
    """The envelope identities Kafka transactions of this instance committed."""

    def __init__(self, topic: str) -> None:
        self.topic = topic
        self._committed: set[bytes] = set()

    def __contains__(self, identity: bytes) -> bool:
        return identity in self._committed

    def add(self, identities: list[bytes]) -> None:
        self._committed.update(identities)

    async def load(self, client_args: dict[str, Any]) -> int:
        """Read every committed marker; returns how many identities are known."""
        admin = AIOKafkaAdminClient(**client_args)
        await admin.start()
        try:
            described = await admin.describe_topics([self.topic])
        finally:
            await admin.close()
        for t in described:
            code = t.get("error_code") if t.get("topic") == self.topic else 0
            if code and code != _UNKNOWN_TOPIC:
                # e.g. no leader while the broker recovers: reading nothing here would
                # forget what was committed and send it again. Fail; start is retried.
                raise KafkaPluginError(
                    f"cannot read the exactly-once markers of {self.topic!r} "
                    f"(Kafka error {code}); retrying",
                    retriable=True,
                )
        partitions = [
            int(p["partition"])
            for t in described
            if t.get("topic") == self.topic and not t.get("error_code")
            for p in t.get("partitions", [])
        ]
        if not partitions:
            return len(self._committed)
        consumer = AIOKafkaConsumer(
            **client_args,
            group_id=None,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            isolation_level="read_committed",
        )
        await consumer.start()
        try:
            async with asyncio.timeout(LOAD_TIMEOUT_S):
                tps = [TopicPartition(self.topic, p) for p in partitions]
                consumer.assign(tps)
                await consumer.seek_to_beginning(*tps)
                end = await consumer.end_offsets(tps)
                while [tp for tp in tps if await consumer.position(tp) < end[tp]]:
                    batches = await consumer.getmany(*tps, timeout_ms=500)
                    for records in batches.values():
                        self._committed.update(r.key for r in records if r.key and r.value)
        finally:
            await consumer.stop()
        return len(self._committed)
