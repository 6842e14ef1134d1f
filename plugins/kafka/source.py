"""Inbound: consumed Kafka records to publications in the MQ publish/subscribe network.

Offsets are committed only after ``Publisher.publish`` returned, i.e. after the MQ unit
of work carrying the batch committed; that offset commit (a broker round trip) runs
while the next batch is polled and handed over, one commit at a time, in order. A
failed publish commits nothing and rewinds the consumer to the batch's first records,
so they are delivered again (at-least-once).

A record MQ can never take (refused for good: too big for the stream queue, a name MQ
cannot carry, no usable topic) is poison, not back-pressure: it goes to the dead-letter
topic (``inbound.dead_letter_topic``) with the reason, and its offset is committed with
the batch's, so it never blocks its partition. A full queue only pauses the source.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from aiokafka import ConsumerRecord, TopicPartition
from aiokafka.errors import CommitFailedError, KafkaError

from gateway.log_summary import SummarisedLog
from gateway.plugin_api import Envelope, PluginError, Publisher, PublishRefusedError
from plugins.kafka.clients import Consumer, Producer, new_consumer, new_producer
from plugins.kafka.config import KafkaPluginConfig
from plugins.kafka.errors import KafkaPluginError
from plugins.kafka.mapping import (
    CONTRACT_VERSION,
    NOT_AUTHORIZED_REASON,
    OWN_ORIGIN_REASON,
    InboundRoute,
    SkippedRecord,
    inbound_publication,
)
from plugins.kafka.sink import TopicCreator, producer_state_is_broken

log = logging.getLogger(__name__)
#: Records MQ refuses or that cannot be published: whoever writes the topic decides how
#: many, so one line per instance and reason a minute, then a count.
_REFUSED = SummarisedLog(log)


#: Turns one consumed record into the envelope handed on; None skips it (the instance's
#: own record), :class:`SkippedRecord` refuses it (dead-lettered). The default maps per
#: ``inbound.topics``; request/reply exchanges (plugins.kafka.exchange) pass their own.
RecordMapper = Callable[[ConsumerRecord[bytes, bytes]], Envelope | None]

#: Offset commits tried after a successful publish before moving on (never rewinding).
COMMIT_ATTEMPTS = 5


@dataclass(slots=True)
class SourceCounters:
    """Exported as metrics; no per-record logging."""

    consumed: int = 0
    published: int = 0
    skipped_own: int = 0
    skipped_invalid: int = 0
    publish_failures: int = 0
    commits: int = 0
    commit_failures: int = 0
    #: records written to the dead-letter topic (or, without one, dropped)
    dead_lettered: int = 0
    dead_letter_failures: int = 0
    #: records refused because their stream is outside the route's ``allowed_streams``
    #: (also in skipped_invalid; ``mqgw_authorisation_refused_total``)
    authorisation_refused: int = 0
    #: request/reply records of this gateway's own origin, refused (also in
    #: skipped_invalid and dead_lettered; plugins.kafka.exchange)
    own_origin_refused: int = 0


@dataclass(slots=True)
class _Refused:
    """A consumed record MQ can never take, on its way to the dead-letter topic."""

    record: ConsumerRecord[bytes, bytes]
    why: str
    #: MQ reason code (0: the record could not be mapped to a publication)
    reason: int = 0


def inbound_member_id(gateway_id: str, instance: str) -> str:
    """The inbound consumer's ``group.instance.id`` (KIP-345): one per node and plugin
    instance, the same in every instance of a multi-instance node (only the active one
    consumes), different for each gateway sharing a configured ``inbound.group_id``."""
    return f"mqgw.{gateway_id}.{instance}"


class KafkaSource:
    """Consumes the configured topics and publishes each batch in one MQ unit of work.

    The same loop (commit after the hand-over, dead-letter topic for refused records,
    rewind on failure) serves request/reply exchanges: they pass their own ``topics``,
    ``group_id``, ``mapper`` and a ``publisher`` that calls the exchange handler.
    """

    def __init__(
        self,
        config: KafkaPluginConfig,
        publisher: Publisher,
        *,
        instance: str,
        gateway_id: str,
        topics: Sequence[str] | None = None,
        group_id: str | None = None,
        mapper: RecordMapper | None = None,
        auto_offset_reset: str | None = None,
        handled_before_refusal: bool = False,
        group_instance_id: str | None = None,
    ) -> None:
        self.config = config
        #: set: a static group member (the group is this gateway's alone)
        self.group_instance_id = group_instance_id
        self.publisher = publisher
        self.instance = instance
        self.gateway_id = gateway_id
        self.routes = {t.kafka_topic: t.route() for t in config.inbound.topics}
        if topics is not None:
            self.routes = {topic: InboundRoute(topic) for topic in topics}
        self.group_id = group_id or config.inbound.group_id or f"mqgw.{gateway_id}.{instance}"
        self.mapper: RecordMapper = mapper or self._publication
        self.auto_offset_reset = auto_offset_reset or config.inbound.auto_offset_reset
        #: On PublishRefusedError the envelopes before ``.index`` count as handled (an
        #: exchange handler takes them one by one), not as rolled back with the batch.
        self.handled_before_refusal = handled_before_refusal
        self.counters = SourceCounters()
        self.consumer: Consumer | None = None
        self._dead_letter_producer: Producer | None = None
        self._task: asyncio.Task[None] | None = None
        #: the offset commit of the last batch handed over, while the next is polled
        self._committing: asyncio.Task[None] | None = None
        self._stop = asyncio.Event()
        self._failing = False

    @property
    def healthy(self) -> bool:
        return self._task is not None and not self._task.done() and not self._failing

    async def start(self) -> None:
        if not self.routes:
            return
        consumer = new_consumer(
            self.config,
            list(self.routes),
            f"mqgw.{self.gateway_id}.{self.instance}",
            group_id=self.group_id,
            auto_offset_reset=self.auto_offset_reset,
            group_instance_id=self.group_instance_id,
        )
        try:
            # A topic created after the consumer started would only be seen at the next
            # metadata refresh (minutes): create absent ones first.
            await TopicCreator(self.config, self.group_id, learn_limits=False).ensure(
                dict.fromkeys(self.routes, False)
            )
            await consumer.start()
        except KafkaError as exc:
            await consumer.stop()
            raise KafkaPluginError(
                f"kafka instance {self.instance!r}: cannot consume {sorted(self.routes)} from "
                f"{self.config.bootstrap_servers}: {exc}",
                retriable=True,
            ) from exc
        except BaseException:
            # cancelled (the gateway stops while this start waits on Kafka): close what
            # the start opened, or it is left behind ("Unclosed AIOKafkaConsumer")
            with contextlib.suppress(Exception):
                await asyncio.shield(consumer.stop())
            raise
        self.consumer = consumer
        self._stop.clear()
        self._task = asyncio.create_task(
            self._run(consumer), name=f"kafka-source:{self.instance}:{self.group_id}"
        )

    async def stop(self) -> None:
        """Finish the batch in progress (publish + commit), then leave the group."""
        self._stop.set()
        task, self._task = self._task, None
        if task is not None:
            # A publish stuck on an unreachable queue manager is abandoned (its
            # offsets are not committed, so nothing is lost).
            with contextlib.suppress(asyncio.CancelledError, TimeoutError):
                await asyncio.wait_for(task, timeout=self.config.send_timeout_s)
        consumer, self.consumer = self.consumer, None
        if consumer is not None:
            await consumer.stop()
        producer, self._dead_letter_producer = self._dead_letter_producer, None
        if producer is not None:
            with contextlib.suppress(KafkaError):
                await producer.stop()

    async def _run(self, consumer: Consumer) -> None:
        """Poll, hand each batch over to MQ, and commit its offsets while the next batch
        is polled and handed over (one offset commit at a time, in order)."""
        try:
            await self._serve(consumer)
        finally:
            await self._end_commit()

    async def _end_commit(self) -> None:
        """Wait for the offset commit in flight. It retries and logs its own failures;
        anything else is logged too: the batch is in MQ already, so nothing may rewind
        (its offsets are committed with the next batch's, or the batch comes again)."""
        committing, self._committing = self._committing, None
        if committing is None:
            return
        try:
            await committing
        except Exception:
            log.exception("kafka instance %r: offset commit failed", self.instance)

    async def _serve(self, consumer: Consumer) -> None:
        inbound = self.config.inbound
        delay = inbound.retry_initial_s
        while not self._stop.is_set():
            try:
                batches = await consumer.getmany(
                    timeout_ms=inbound.poll_timeout_ms, max_records=inbound.max_batch
                )
            except KafkaError as exc:
                log.error("kafka instance %r: poll failed: %s", self.instance, exc)
                await self._pause(delay)
                delay = min(inbound.retry_max_s, delay * 2)
                continue
            if not batches:
                continue
            try:
                offsets = await self._hand_over(batches)
            except Exception as exc:  # publish failed: rewind, retry later
                self.counters.publish_failures += 1
                if not self._failing:
                    log.error(
                        "kafka instance %r: publishing into MQ failed (%s); records will be "
                        "delivered again",
                        self.instance,
                        exc,
                    )
                self._failing = True
                for tp, records in batches.items():
                    with contextlib.suppress(Exception):
                        consumer.seek(tp, records[0].offset)
                await self._pause(delay * (0.5 + random.random()))
                delay = min(inbound.retry_max_s, delay * 2)
                continue
            if self._failing:
                log.warning("kafka instance %r: publishing into MQ again", self.instance)
            self._failing = False
            delay = inbound.retry_initial_s
            if offsets is None:
                continue  # stopping before its dead letters were written: not committed
            await self._end_commit()  # the batch before's offsets first, then these
            self._committing = asyncio.create_task(self._commit(consumer, offsets))

    async def _deliver(
        self,
        consumer: Consumer,
        batches: dict[TopicPartition, list[ConsumerRecord[bytes, bytes]]],
    ) -> None:
        """Hand ``batches`` over to MQ and commit their offsets."""
        offsets = await self._hand_over(batches)
        if offsets is not None:
            await self._commit(consumer, offsets)

    async def _hand_over(
        self,
        batches: dict[TopicPartition, list[ConsumerRecord[bytes, bytes]]],
    ) -> dict[TopicPartition, int] | None:
        """Publish ``batches`` into MQ (dead-lettering what MQ refuses); the offsets to
        commit, or None when stopped before the dead letters were written (the batch
        then comes again: at-least-once)."""
        pending: list[tuple[ConsumerRecord[bytes, bytes], Envelope]] = []
        refused: list[_Refused] = []
        offsets: dict[TopicPartition, int] = {}
        for tp, records in batches.items():
            pending.extend(self._map(records, refused))
            offsets[tp] = records[-1].offset + 1
        while pending:
            try:
                await self.publisher.publish([pub for _, pub in pending])
            except PublishRefusedError as exc:
                if not 0 <= exc.index < len(pending):
                    raise
                # This one can never be published: dead-letter it, publish the rest.
                rec, bad = pending.pop(exc.index)
                if self.handled_before_refusal:
                    self.counters.published += exc.index
                    del pending[: exc.index]
                self.counters.skipped_invalid += 1
                refused.append(_Refused(rec, str(exc), exc.reason))
                _REFUSED.log(
                    logging.WARNING, f"{self.instance} refused {exc.reason}",
                    "kafka instance %r: record %s[%d]@%d (%r/%r) refused by MQ: %s",
                    self.instance,
                    rec.topic,
                    rec.partition,
                    rec.offset,
                    bad.stream,
                    bad.topic,
                    exc,
                )
                continue
            self.counters.published += len(pending)
            break
        # The batch is in MQ now: from here on nothing may rewind the consumer, or the
        # batch would be published again. The dead letters and the commit are retried.
        if refused and not await self._dead_letter(refused):
            return None  # stopping: not committed, so the batch comes again
        return offsets

    async def _dead_letter(self, refused: Sequence[_Refused]) -> bool:
        """Write ``refused`` to the dead-letter topic (retrying, with backoff, while the
        target is down); False when stopped before that succeeded."""
        topic = self.config.inbound.dead_letter_topic
        if not topic:
            self.counters.dead_lettered += len(refused)
            return True
        inbound = self.config.inbound
        delay = inbound.retry_initial_s
        while True:
            try:
                producer = await self._dead_letter_target(topic)
                futures = [
                    await producer.send(
                        topic, r.record.value, key=r.record.key, headers=self._dlq_headers(r)
                    )
                    for r in refused
                ]
                await asyncio.gather(*futures)
            except (KafkaError, PluginError) as exc:
                # Whatever fails here (topic creation refused, a stuck producer), the
                # batch is already in MQ: retry the dead-letter write, never rewind.
                self.counters.dead_letter_failures += 1
                if producer_state_is_broken(exc) and self._dead_letter_producer is not None:
                    stale, self._dead_letter_producer = self._dead_letter_producer, None
                    with contextlib.suppress(Exception):
                        await asyncio.wait_for(stale.stop(), 5.0)
                log.error(
                    "kafka instance %r: cannot write %d record(s) to dead-letter topic %r: %s",
                    self.instance,
                    len(refused),
                    topic,
                    exc,
                )
                if self._stop.is_set():
                    return False
                await self._pause(delay)
                delay = min(inbound.retry_max_s, delay * 2)
                continue
            self.counters.dead_lettered += len(refused)
            return True

    async def _dead_letter_target(self, topic: str) -> Producer:
        producer = self._dead_letter_producer
        if producer is None:
            producer = new_producer(
                self.config, f"mqgw.{self.gateway_id}.{self.instance}.dlq", dead_letter=True
            )
            try:
                await producer.start()
                await TopicCreator(self.config, self.group_id, learn_limits=False).ensure(
                    {topic: False}
                )
            except BaseException:
                with contextlib.suppress(KafkaError):
                    await producer.stop()
                raise
            self._dead_letter_producer = producer
        return producer

    def _dlq_headers(self, refused: _Refused) -> list[tuple[str, bytes]]:
        """The record's own headers, then where it came from and why it was refused."""
        rec = refused.record
        return [
            *((k, bytes(v)) for k, v in rec.headers or ()),
            ("mq.contract", CONTRACT_VERSION),
            ("mq.origin", self.gateway_id.encode()),
            ("mq.dlh.reason", str(refused.reason).encode()),
            ("mqgw.error", refused.why.encode("utf-8", "replace")),
            ("kafka.topic", rec.topic.encode()),
            ("kafka.partition", str(rec.partition).encode()),
            ("kafka.offset", str(rec.offset).encode()),
        ]

    async def _commit(self, consumer: Consumer, offsets: dict[TopicPartition, int]) -> None:
        inbound = self.config.inbound
        delay = inbound.retry_initial_s
        for attempt in range(1, COMMIT_ATTEMPTS + 1):
            try:
                await consumer.commit(offsets)
            except CommitFailedError as exc:
                # A rebalance moved the partitions away after MQ committed: the new owner
                # re-delivers them (at-least-once; readers de-duplicate on mq.msgId).
                log.warning("kafka instance %r: offset commit failed: %s", self.instance, exc)
                return
            except KafkaError as exc:
                self.counters.commit_failures += 1
                if attempt == COMMIT_ATTEMPTS or self._stop.is_set():
                    # Moving on: the next successful commit covers these offsets; a
                    # restart before it re-delivers them (at-least-once).
                    log.warning(
                        "kafka instance %r: offset commit failed %d times, moving on: %s",
                        self.instance,
                        attempt,
                        exc,
                    )
                    return
                await self._pause(delay)
                delay = min(inbound.retry_max_s, delay * 2)
                continue
            self.counters.commits += 1
            return

    def _publication(self, rec: ConsumerRecord[bytes, bytes]) -> Envelope | None:
        """The default mapper: the record as a publication per its ``inbound.topics``."""
        return inbound_publication(
            self.routes.get(rec.topic) or InboundRoute(rec.topic),
            rec.key,
            rec.value,
            rec.headers,
            gateway_id=self.gateway_id,
            instance=self.instance,
        )

    def _map(
        self,
        records: Sequence[ConsumerRecord[bytes, bytes]],
        refused: list[_Refused],
    ) -> list[tuple[ConsumerRecord[bytes, bytes], Envelope]]:
        out: list[tuple[ConsumerRecord[bytes, bytes], Envelope]] = []
        for rec in records:
            self.counters.consumed += 1
            try:
                pub = self.mapper(rec)
            except SkippedRecord as exc:
                self.counters.skipped_invalid += 1
                if exc.reason == NOT_AUTHORIZED_REASON:
                    self.counters.authorisation_refused += 1
                elif exc.reason == OWN_ORIGIN_REASON:
                    self.counters.own_origin_refused += 1
                refused.append(_Refused(rec, exc.why, exc.reason))
                _REFUSED.log(
                    logging.WARNING, f"{self.instance} skipped {exc.reason}",
                    "kafka instance %r: record %s[%d]@%d not published: %s",
                    self.instance,
                    rec.topic,
                    rec.partition,
                    rec.offset,
                    exc.why,
                )
                continue
            if pub is None:
                self.counters.skipped_own += 1
                continue
            out.append((rec, pub))
        return out

    async def _pause(self, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stop.wait(), timeout=seconds)
