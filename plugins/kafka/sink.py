"""Outbound: MQ publications to Kafka records (idempotent producer, acks=all).

``send`` is awaited by the broker before the MQ unit of work commits, so it returns only
once Kafka acknowledged every record of the batch. A transient failure raises retriably
(the messages wait on their MQ queue and are offered again). A producer whose own state
Kafka no longer accepts (e.g. ``OutOfOrderSequenceNumber`` after the broker restarted)
is replaced by a new one before the retry, so a broker restart never wedges the stream.
A record Kafka can never accept raises :class:`DeliveryRefusedError` for its envelope
only, after every other envelope of the batch was delivered. :meth:`KafkaSink.deliver`
is the one way records reach Kafka: publications (:meth:`KafkaSink.send`) and
request/reply exchange records (plugins.kafka.exchange) alike.

Size (~770 lines, over the ~500 guide): the send/refusal/producer-replacement rules and
the exactly-once transaction share their state and are one unit; ``TopicCreator`` (also
used by the source) is what could move to a module of their own. The producer comes
from the configured backend (plugins.kafka.clients: aiokafka or librdkafka), which
raises aiokafka's error classes either way.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Iterable, Sequence

from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from aiokafka.errors import (
    InvalidProducerEpoch,
    InvalidProducerIdMapping,
    InvalidTopicError,
    KafkaError,
    KafkaTimeoutError,
    MessageSizeTooLargeError,
    OutOfOrderSequenceNumber,
    ProducerClosed,
    ProducerFenced,
    RecordTooLargeError,
    TopicAlreadyExistsError,
    TopicAuthorizationFailedError,
    TransactionCoordinatorFenced,
    UnknownProducerId,
)

from gateway.plugin_api import DeliveryRefusedError, Envelope
from plugins.kafka.clients import Producer, new_producer, outcome_seen, round_sender
from plugins.kafka.clients.aiokafka_client import PartitionBatch, batch_writer, client_args
from plugins.kafka.config import FALLBACK_BATCH_BYTES, KafkaPluginConfig
from plugins.kafka.errors import (
    MQRC_MSG_TOO_BIG_FOR_Q,
    MQRC_UNKNOWN_OBJECT_NAME,
    KafkaPluginError,
    KafkaSendError,
)
from plugins.kafka.exactly_once import CommittedLedger, envelope_identity
from plugins.kafka.mapping import (
    OutboundRecord,
    TopicRouter,
    is_from_origin,
    outbound_records,
)

log = logging.getLogger(__name__)

_TOPIC_ALREADY_EXISTS = 36
#: CreateTopics errors that asking again cannot cure: INVALID_TOPIC_EXCEPTION (17),
#: INVALID_CONFIG (40), POLICY_VIOLATION (44).
TOPIC_CREATE_REFUSALS = frozenset({17, 40, 44})
#: Kafka refuses these records whatever the retry: the envelope goes to the sink's
#: dead-letter destination (DeliveryRefusedError) with the MQ reason code of its kind.
_REFUSALS: dict[type[KafkaError], int] = {
    MessageSizeTooLargeError: MQRC_MSG_TOO_BIG_FOR_Q,
    RecordTooLargeError: MQRC_MSG_TOO_BIG_FOR_Q,
    InvalidTopicError: MQRC_UNKNOWN_OBJECT_NAME,
}
#: The target is there but will not take anything yet (an ACL being fixed): an outage
#: that holds the backlog, never a reason to dead-letter every publication meanwhile.
_NOT_YET = (TopicAuthorizationFailedError,)
_REFUSAL_TYPES = tuple(_REFUSALS)
#: The producer's id, epoch or sequence numbers no longer match the broker's (e.g. the
#: broker restarted while batches were in flight): no retry by this producer can
#: succeed, a new producer (new producer id) can.
_FATAL_PRODUCER_ERRORS = (
    OutOfOrderSequenceNumber,
    UnknownProducerId,
    InvalidProducerEpoch,
    InvalidProducerIdMapping,
    ProducerFenced,
    TransactionCoordinatorFenced,
    ProducerClosed,
)
#: Longest wait for a replaced producer to close (its broker may be the one that is down).
_CLOSE_TIMEOUT_S = 5.0
#: Attempts within one send when a broker-side refusal breaks the producer's sequence.
_REFUSAL_ROUNDS = 3
#: Envelopes remembered as delivered after a refusal, so a resend skips them.
_DELIVERED_MEMORY = 10_000
#: Longest wait to read the topics' max.message.bytes again after a batch was refused.
_LIMITS_READ_TIMEOUT_S = 5.0
#: Reads of a just-created topic's max.message.bytes until the broker can describe it.
_CREATED_DESCRIBE_TRIES = 10
_CREATED_DESCRIBE_PAUSE_S = 0.1


async def _outcomes(futures: list[asyncio.Future[object]]) -> list[object]:
    """Each future's result or exception, in order, once every one is done: what
    ``gather(*futures, return_exceptions=True)`` gives, without the callback gather puts
    on each future (one loop callback per record when the acks come: 1.2 us a record).
    A produce request acknowledges a whole batch of records at once, so this mostly
    waits (one callback) once per batch and finds the rest done (records of one batch
    may share a future). Cancelled (a timeout), it leaves the futures to end by
    themselves, their outcomes marked seen: cancelling one never stops its send, and a
    batch whose future was cancelled would fail later with nobody reading the error."""
    try:
        for future in futures:
            if not future.done():
                await asyncio.wait((future,))
    except asyncio.CancelledError:
        _give_up(futures)
        raise
    return [
        asyncio.CancelledError() if f.cancelled() else (f.exception() or f.result())
        for f in futures
    ]


def _give_up(futures: Iterable[asyncio.Future[object]]) -> None:
    """Acknowledgements nobody will await any more: each outcome is read when it comes
    (once per future; records of one batch share theirs)."""
    for future in {id(f): f for f in futures}.values():
        future.add_done_callback(outcome_seen)


class _Suspects(dict[int, BaseException]):
    """Size refusals of records sent with others in one round (envelope index -> the
    refusal): the broker may have refused their batch, not them. ``batch_bytes``: the
    batch size of the producer that sent them."""

    batch_bytes: int = 0


def refusal_reason(exc: BaseException) -> int | None:
    """The MQ reason code for a record Kafka can never accept; None if ``exc`` is not one."""
    for kind, reason in _REFUSALS.items():
        if isinstance(exc, kind):
            return reason
    return None


def producer_state_is_broken(exc: BaseException) -> bool:
    """True when only a new producer can send again (fatal for this producer's state)."""
    if isinstance(exc, _FATAL_PRODUCER_ERRORS):
        return True
    if isinstance(exc, (KafkaTimeoutError, *_NOT_YET)):
        return False  # an outage (no answer in time, no permission yet): the producer is sound
    return isinstance(exc, KafkaError) and not exc.retriable and refusal_reason(exc) is None


class TopicCreator:
    """Creates absent topics once (retained ones compacted); remembers what exists."""

    def __init__(
        self, config: KafkaPluginConfig, client_id: str, *, learn_limits: bool = True
    ) -> None:
        self._config = config
        self._client_id = client_id
        self._known: set[str] = set()
        self._lock = asyncio.Lock()
        self._learn_limits = learn_limits
        #: max.message.bytes of the topics ensured (the broker refuses a record batch
        #: above it as a whole); a topic whose configs were never read is absent.
        self.limits: dict[str, int] = {}
        #: Bumped whenever :attr:`limits` may have changed.
        self.limits_read = 0

    async def ensure(self, topics: dict[str, bool]) -> None:
        """Make sure every topic exists (``topics`` maps name -> compacted) and learn
        its max.message.bytes."""
        missing = {t: c for t, c in topics.items() if t not in self._known}
        if not missing:
            return
        if not self._config.create_topics:
            if self._learn_limits:
                await self.read_limits(list(missing))
            self._known.update(missing)
            return
        async with self._lock:
            admin = self._admin()
            await admin.start()
            try:
                existing = set(await admin.list_topics())
                new = [
                    NewTopic(
                        name,
                        self._config.partitions,
                        self._config.replication_factor,
                        topic_configs={
                            **self._config.topic_configs,
                            "cleanup.policy": "compact" if compacted else "delete",
                        },
                    )
                    for name, compacted in missing.items()
                    if name not in existing
                ]
                if new:
                    await self._create(admin, new)
                await self._describe(
                    admin,
                    list(missing) if self._learn_limits else [],
                    [t for t, c in missing.items() if c and t in existing],
                )
                if self._learn_limits:
                    await self._await_limits(admin, [t.name for t in new])
            finally:
                await admin.close()
            self._known.update(missing)

    async def read_limits(self, topics: list[str]) -> None:
        """Read (again) the max.message.bytes of ``topics`` into :attr:`limits`; a
        topic that cannot be described (no DescribeConfigs permission, broker away) keeps
        what was read before, if anything."""
        try:
            admin = self._admin()
            await admin.start()
        except (KafkaError, OSError) as exc:
            log.debug("cannot read max.message.bytes of %s: %s", topics, exc)
            return
        try:
            await self._describe(admin, topics, [])
        finally:
            await admin.close()

    async def _await_limits(self, admin: AIOKafkaAdminClient, created: list[str]) -> None:
        """A topic just created may not be described yet (its metadata has not reached
        the broker's config view): ask again briefly, so the first batches already fit
        (otherwise the first one over the limit is refused and sent again)."""
        for _ in range(_CREATED_DESCRIBE_TRIES):
            unseen = [t for t in created if t not in self.limits]
            if not unseen:
                return
            log.debug("max.message.bytes of new topics %s not readable yet", unseen)
            await asyncio.sleep(_CREATED_DESCRIBE_PAUSE_S)
            await self._describe(admin, unseen, [])

    def _admin(self) -> AIOKafkaAdminClient:
        return AIOKafkaAdminClient(**client_args(self._config, self._client_id + "-admin"))

    async def _describe(
        self, admin: AIOKafkaAdminClient, limited: list[str], retained: list[str]
    ) -> None:
        """One DescribeConfigs: the max.message.bytes of ``limited`` into :attr:`limits`,
        and a warning for each existing retained topic of ``retained`` that is not
        compacted (it would grow without bound and readers would see every old retained
        publication)."""
        topics = list(dict.fromkeys(limited + retained))
        if not topics:
            return
        wanted = {"cleanup.policy": None, "max.message.bytes": None}
        resources = [ConfigResource(ConfigResourceType.TOPIC, t, configs=wanted) for t in topics]
        try:
            for response in await admin.describe_configs(resources):
                for code, _msg, _type, name, entries in response.resources:
                    for entry in entries if code == 0 else []:
                        if entry[0] == "max.message.bytes" and name in limited:
                            self.limits[name] = int(entry[1])
                        elif (entry[0] == "cleanup.policy" and name in retained
                              and "compact" not in str(entry[1])):
                            log.warning(
                                "Kafka topic %s holds retained publications but its "
                                "cleanup.policy is %s, not compact",
                                name,
                                entry[1],
                            )
        except (KafkaError, ValueError, TypeError, AttributeError) as exc:
            log.debug("cannot read the configs of %s: %s", topics, exc)
        finally:
            self.limits_read += 1

    async def _create(self, admin: AIOKafkaAdminClient, new: list[NewTopic]) -> None:
        try:
            response = await admin.create_topics(new)
        except TopicAlreadyExistsError:
            return
        for name, code, *rest in getattr(response, "topic_errors", []):
            if code not in (0, _TOPIC_ALREADY_EXISTS):
                message = rest[0] if rest else ""
                raise KafkaPluginError(
                    f"cannot create Kafka topic {name!r}: error {code} {message}".rstrip(),
                    retriable=code not in TOPIC_CREATE_REFUSALS,
                )
        log.info("created Kafka topics %s", ", ".join(t.name for t in new))


class KafkaSink:
    """Produces the records of each MQ unit of work and waits for their acks."""

    def __init__(
        self,
        config: KafkaPluginConfig,
        router: TopicRouter | None,
        *,
        instance: str,
        gateway_id: str,
    ) -> None:
        """``router`` None: no outbound routes, the producer only serves
        :meth:`deliver` (request/reply exchanges)."""
        self.config = config
        self.router = router
        self.instance = instance
        self.gateway_id = gateway_id
        self.topics = TopicCreator(config, f"mqgw.{gateway_id}.{instance}")
        self.producer: Producer | None = None
        #: Exactly-once: what earlier transactions committed (None: at-least-once).
        self.ledger: CommittedLedger | None = (
            CommittedLedger(config.exactly_once_topic(gateway_id, instance))
            if config.delivery == "exactly_once"
            else None
        )
        #: Exactly-once: envelopes offered again that a transaction had already committed.
        self.already_committed = 0
        self.sent = 0
        self.failed_batches = 0
        #: Producers replaced after a fatal producer error.
        self.producers_replaced = 0
        #: Envelopes refused for good (DeliveryRefusedError raised for them).
        self.refused = 0
        self._healthy = False
        self._started = False
        self._replace = False
        #: The producer's batch size: the config's, capped by the topics' limits.
        self.batch_bytes = config.producer_batch_bytes()
        #: The producer is replaced only for a smaller batch size (no error).
        self._resized_only = False
        self._limits_seen = -1
        #: What the current producer was built with (batch_bytes may be lower already).
        self._producer_batch_bytes = self.batch_bytes
        #: One replacement at a time: request/reply exchanges share this sink.
        self._replacing = asyncio.Lock()
        self._delivered: set[bytes] = set()
        self._round_keys: dict[int, bytes] = {}
        self._delivered_order: deque[bytes] = deque()

    @property
    def healthy(self) -> bool:
        return self.producer is not None and self._healthy

    def _new_producer(self) -> Producer:
        self._producer_batch_bytes = self.batch_bytes
        return new_producer(
            self.config,
            f"mqgw.{self.gateway_id}.{self.instance}",
            transactional_id=(
                f"mqgw.{self.gateway_id}.{self.instance}" if self.ledger is not None else None
            ),
            batch_bytes=self.batch_bytes,
        )

    def _cap_batches(self, unknown_refused: bool = False) -> bool:
        """Lower the producer's batch size to the smallest max.message.bytes of the
        topics written (a new producer at the next send); with ``unknown_refused`` (a
        batch was refused and some limit could not be read), to FALLBACK_BATCH_BYTES at
        most. True when it was lowered."""
        limits = self.topics.limits
        topic = min(limits, key=limits.__getitem__, default=None)
        limit = self.batch_bytes if topic is None else limits[topic]
        why = f"the max.message.bytes of topic {topic}"
        if unknown_refused and limit > FALLBACK_BATCH_BYTES:
            limit = FALLBACK_BATCH_BYTES
            why = "a batch was refused as too large and a topic's max.message.bytes cannot be read"
        if limit >= self.batch_bytes:
            return False
        log.log(
            logging.WARNING if unknown_refused else logging.INFO,
            "kafka instance %r: producer batches lowered from %d to %d bytes: %s",
            self.instance,
            self.batch_bytes,
            limit,
            why,
        )
        self.batch_bytes = limit
        self._resized_only = not self._replace
        self._replace = True
        return True

    async def start(self) -> None:
        producer = self._new_producer()
        try:
            await producer.start()
            if self.router is not None:
                await self.topics.ensure(self.router.static_topics())
            if self.ledger is not None:
                await self.topics.ensure({self.ledger.topic: True})
                known = await self.ledger.load(
                    client_args(self.config, f"mqgw.{self.gateway_id}.{self.instance}-eos")
                )
                log.info("kafka instance %r: %d committed envelopes known", self.instance, known)
        except KafkaError as exc:
            await producer.stop()
            raise KafkaPluginError(
                f"kafka instance {self.instance!r}: cannot reach {self.config.bootstrap_servers}: "
                f"{exc}",
                retriable=True,
            ) from exc
        except BaseException:
            # E.g. topic creation refused (KafkaPluginError): never leak a started
            # producer (its sockets and background tasks).
            await producer.stop()
            raise
        self.producer = producer
        self._started = True
        self._healthy = True

    async def _replace_producer(self) -> Producer:
        """Close the broken producer (bounded wait) and start a new one."""
        old, self.producer = self.producer, None
        if old is not None:
            try:
                await asyncio.wait_for(old.stop(), _CLOSE_TIMEOUT_S)
            except (KafkaError, TimeoutError, OSError) as exc:
                log.debug("kafka instance %r: old producer did not close: %r", self.instance, exc)
        producer = self._new_producer()
        try:
            await producer.start()
        except BaseException as exc:  # a timeout cancels start(): close it all the same
            with contextlib.suppress(Exception):
                await asyncio.wait_for(producer.stop(), _CLOSE_TIMEOUT_S)
            if not isinstance(exc, KafkaError):
                raise
            raise KafkaSendError(
                f"kafka instance {self.instance!r}: cannot start a new producer: {exc!r}"
            ) from exc
        self.producer = producer
        self._replace = False
        if self._resized_only:
            log.info("kafka instance %r: producer restarted with batches of at most %d bytes",
                     self.instance, self.batch_bytes)
        else:
            self.producers_replaced += 1
            log.warning("kafka instance %r: producer replaced after a fatal error", self.instance)
        self._resized_only = False
        return producer

    async def send(self, envelopes: Sequence[Envelope]) -> None:
        """Produce every record of ``envelopes`` in order; return once all are acked.

        Raises :class:`DeliveryRefusedError` for the first envelope Kafka can never
        accept, after every other envelope was acknowledged; those are remembered, so a
        resend of the batch (or of its rest) does not produce them again.
        """
        if not self._started:
            raise KafkaSendError(f"kafka instance {self.instance!r} is not started")
        if self.router is None:
            raise KafkaSendError(f"kafka instance {self.instance!r} has no outbound routes")
        records: list[tuple[int, OutboundRecord]] = []
        # an envelope's identity is needed only to skip what was delivered before a
        # refusal or committed by a transaction (not made when neither can apply)
        check = bool(self._delivered) or self.ledger is not None
        for index, d in enumerate(envelopes):
            if is_from_origin(d, self.instance):
                continue  # came in from this instance's Kafka: never echo it back
            if check:
                key = envelope_identity(d)
                if key is not None and key in self._delivered:
                    continue  # delivered before a refusal in the same batch
                if key is not None and self.ledger is not None and key in self.ledger:
                    self.already_committed += 1
                    continue  # a transaction committed it before MQ could commit
            records.extend((index, r) for r in outbound_records(d, self.router, self.gateway_id))
        await self.deliver(envelopes, records, remember=True)

    async def deliver(
        self,
        envelopes: Sequence[Envelope],
        records: list[tuple[int, OutboundRecord]],
        *,
        remember: bool = False,
    ) -> None:
        """Produce ``records`` ((index in ``envelopes``, record)) and wait for every ack,
        with :meth:`send`'s producer replacement and refusal rules: the one home of both
        publication records and request/reply exchange records (plugins.kafka.exchange).
        ``remember``: keep what was delivered before a refusal for :meth:`send`'s resend
        (publications only; exchange callers de-duplicate themselves)."""
        if not self._started:
            raise KafkaSendError(f"kafka instance {self.instance!r} is not started")
        if not records:
            return
        refused: dict[int, BaseException] = {}
        # the committed markers of a transaction (only then: _produce_in_transaction)
        self._round_keys = {} if self.ledger is None else {
            i: k for i, d in enumerate(envelopes) if (k := envelope_identity(d)) is not None
        }
        todo = records
        for _round in range(_REFUSAL_ROUNDS):
            suspects = _Suspects()
            errors = await self._produce(todo, refused, suspects)
            if suspects and not await self._batches_were_too_large(todo, suspects):
                # the batches fit the topics' limits: each was refused for its own size
                for index, exc in suspects.items():
                    refused.setdefault(index, exc)
                errors = [(i, e) for i, e in errors if i not in suspects]
                suspects.clear()
            if not errors:
                break
            if not (refused or suspects) or _round == _REFUSAL_ROUNDS - 1:
                self._fail(errors[0][1])
                raise KafkaSendError(
                    f"kafka instance {self.instance!r}: {len(errors)} of {len(records)} "
                    f"records not acknowledged: {errors[0][1]!r}",
                    failed=len(errors),
                ) from errors[0][1]
            # A record the broker refused used up a sequence number of the idempotent
            # producer: what followed it on that partition fails OutOfOrderSequence.
            # Resend those (only those) with a new producer; after a batch refused as too
            # large, one whose batches fit the topics' limits.
            failed = {index for index, _ in errors}
            todo = [(i, r) for i, r in todo if i in failed and i not in refused]
        if not self._healthy:
            log.warning("kafka instance %r: sending again", self.instance)
        self._healthy = True
        self.sent += sum(1 for index, _ in records if index not in refused)
        if refused:
            if remember:
                self._remember_delivered(envelopes, refused)
            first = min(refused)
            cause = refused[first]
            reason = refusal_reason(cause) or MQRC_MSG_TOO_BIG_FOR_Q
            self.refused += 1
            raise DeliveryRefusedError(
                f"kafka instance {self.instance!r}: Kafka refuses the publication on "
                f"{envelopes[first].stream}/{envelopes[first].topic} ({cause!r}); raise "
                "max_request_size and the topic's max.message.bytes to accept it",
                index=first,
                reason=reason,
            ) from cause
        if remember:
            self._forget_delivered()

    async def _batches_were_too_large(
        self, records: list[tuple[int, OutboundRecord]], suspects: _Suspects
    ) -> bool:
        """After size refusals of records sent together (``suspects``): read their
        topics' max.message.bytes again and lower the batch size to it. True when the
        batches they went in may have been too large (send them again with smaller
        ones), False when those batches fit (each record was refused for its own size).
        The read is bounded (_LIMITS_READ_TIMEOUT_S): a send stays about as long as
        ``send_timeout_s`` allows."""
        topics = sorted({r.topic for i, r in records if i in suspects})
        try:
            async with asyncio.timeout(_LIMITS_READ_TIMEOUT_S):
                await self.topics.read_limits(topics)
        except TimeoutError:
            log.debug("kafka instance %r: reading max.message.bytes timed out", self.instance)
        unknown = any(t not in self.topics.limits for t in topics)
        self._cap_batches(unknown_refused=unknown)
        return self.batch_bytes < suspects.batch_bytes

    async def _produce(
        self,
        records: list[tuple[int, OutboundRecord]],
        refused: dict[int, BaseException],
        suspects: _Suspects,
    ) -> list[tuple[int, BaseException]]:
        """Send ``records`` (envelope index, record) and wait for every ack.

        Adds the envelopes Kafka refuses for good to ``refused``; returns the other
        failures per record. Raises KafkaSendError when the batch as a whole fails.
        A size refusal of one of several records sent together is not final yet (the
        broker judges the producer's batch, not the record): the record is returned as
        a failure and added to ``suspects`` (index -> the refusal).
        """
        try:
            async with asyncio.timeout(self.config.send_timeout_s):
                await self.topics.ensure({r.topic: r.compacted for _, r in records})
                if self._limits_seen != self.topics.limits_read:
                    self._limits_seen = self.topics.limits_read
                    self._cap_batches()
                async with self._replacing:
                    producer = self.producer
                    if self._replace or producer is None:
                        producer = await self._replace_producer()
                suspects.batch_bytes = self._producer_batch_bytes
                if self.ledger is not None:
                    return await self._produce_in_transaction(
                        producer, records, refused, suspects
                    )
                sent, lone = await self._send_each(producer, records, refused, suspects)
                results = await _outcomes([f for _, f in sent])
        except (KafkaError, TimeoutError) as exc:
            self._fail(exc)
            raise KafkaSendError(
                f"kafka instance {self.instance!r}: batch of {len(records)} records not "
                f"acknowledged: {exc!r}",
                failed=len(records),
            ) from exc
        errors: list[tuple[int, BaseException]] = []
        for (index, future), result in zip(sent, results, strict=True):
            if isinstance(result, BaseException) and self._to_retry(
                index, result, len(sent) > 1 and id(future) not in lone, refused, suspects
            ):
                errors.append((index, result))
        return errors

    async def _send_each(
        self,
        producer: Producer,
        records: list[tuple[int, OutboundRecord]],
        refused: dict[int, BaseException],
        suspects: _Suspects,
    ) -> tuple[list[tuple[int, asyncio.Future[object]]], set[int]]:
        """Hand each record not refused yet to the producer: (envelope index, ack future)
        in order, and the id() of the futures of records that went alone in their batch.
        A record the client refuses before sending goes to ``refused``.

        An aiokafka producer is given whole record batches (``BatchWriter``): the records
        of one batch share its future, and a batch of one record is known to be alone.
        A producer with ``send_round`` (librdkafka) gets the round's records in one call,
        others a record at a time; there a record at least as big as the batch size is
        the one known to go alone.
        """
        sent: list[tuple[int, asyncio.Future[object]]] = []
        lone: set[int] = set()
        writer = batch_writer(producer)
        if writer is not None:
            batches: list[tuple[int, PartitionBatch]] = []
            try:
                for index, r in records:
                    if index in refused:
                        continue
                    try:
                        checked = writer.check(r.topic, r.value, r.key, r.headers)
                    except _REFUSAL_TYPES as exc:  # refused before sending, as send does
                        refused[index] = exc
                        continue
                    batches.append((index, await writer.add(checked)))
                await writer.flush()
            except BaseException:
                writer.abandon()
                raise
            for index, batch in batches:
                assert batch.future is not None  # set by flush
                sent.append((index, batch.future))
                if batch.count == 1:
                    lone.add(id(batch.future))
            return sent, lone
        send_round = round_sender(producer)
        if send_round is not None:
            todo = [(i, r) for i, r in records if i not in refused]
            while todo:
                try:
                    futures, error = await send_round(
                        [(r.topic, r.value, r.key, r.headers) for _, r in todo]
                    )
                except BaseException:
                    _give_up(f for _, f in sent)
                    raise
                for (index, r), ack in zip(todo, futures, strict=False):
                    sent.append((index, ack))
                    if len(r.value or b"") >= suspects.batch_bytes:
                        lone.add(id(ack))
                if error is None:
                    break
                index = todo[len(futures)][0]
                if not isinstance(error, _REFUSAL_TYPES):
                    _give_up(f for _, f in sent)
                    raise error
                refused[index] = error  # checked by the client before sending
                todo = [(i, r) for i, r in todo[len(futures) + 1:] if i not in refused]
            return sent, lone
        for index, r in records:
            if index in refused:
                continue
            try:
                future = await producer.send(r.topic, r.value, key=r.key, headers=r.headers)
            except _REFUSAL_TYPES as exc:  # checked by the client before sending
                refused[index] = exc
                continue
            sent.append((index, future))
            if len(r.value or b"") >= suspects.batch_bytes:
                lone.add(id(future))
        return sent, lone

    def _to_retry(
        self,
        index: int,
        failure: BaseException,
        in_shared_batch: bool,
        refused: dict[int, BaseException],
        suspects: _Suspects,
    ) -> bool:
        """Sort one failed record: a refusal is final (into ``refused``) unless it is a
        size refusal of a record that shared its batch (into ``suspects``, to be sent
        again); True for what is to be sent again (any other failure, a suspect)."""
        reason = refusal_reason(failure)
        if reason is None:
            return True
        # The broker refused it after the producer gave it a sequence number.
        self._replace = True
        if reason == MQRC_MSG_TOO_BIG_FOR_Q and in_shared_batch:
            suspects.setdefault(index, failure)
            return True
        refused.setdefault(index, failure)
        return False

    async def _produce_in_transaction(
        self,
        producer: Producer,
        records: list[tuple[int, OutboundRecord]],
        refused: dict[int, BaseException],
        suspects: _Suspects,
    ) -> list[tuple[int, BaseException]]:
        """One Kafka transaction: the records plus a committed-marker per envelope.

        A refusal or failure aborts it; every envelope not refused is then reported
        as failed so the caller sends them again (in a new transaction).
        """
        assert self.ledger is not None
        keys = self._round_keys
        await producer.begin_transaction()
        marked: list[bytes] = []
        sent: list[tuple[int, asyncio.Future[object]]] = []
        try:
            sent, lone = await self._send_each(producer, records, refused, suspects)
            for index in sorted({i for i, _ in records} - set(refused)):
                key = keys.get(index)
                if key is not None:
                    marked.append(key)
                    sent.append((index, await producer.send(self.ledger.topic, b"1", key=key)))
            futures = [f for _, f in sent]
            aborted = False
            if futures:
                _, pending = await asyncio.wait(futures, return_when=asyncio.FIRST_EXCEPTION)
                if pending:
                    # One record failed, so the transaction has; librdkafka settles the
                    # records behind it only once the transaction is aborted (aiokafka
                    # settles them first either way).
                    await producer.abort_transaction()
                    aborted = True
            results = await _outcomes(futures)
            failures = [
                (i, f, r)
                for (i, f), r in zip(sent, results, strict=True)
                if isinstance(r, BaseException)
            ]
            if failures:
                if not aborted:
                    await producer.abort_transaction()
            else:
                await producer.commit_transaction()
                self.ledger.add(marked)
                return []
        except BaseException:
            self._replace = True  # the transaction's state is unknown: a new producer
            _give_up(f for _, f in sent)
            raise
        errors: list[tuple[int, BaseException]] = []
        for index, future, result in failures:
            self._to_retry(index, result, len(sent) > 1 and id(future) not in lone, refused,
                           suspects)  # everything not refused is sent again (aborted)
        first_error = next(
            (r for _, _, r in failures if refusal_reason(r) is None), failures[0][2]
        )
        for index in sorted({i for i, _ in records} - set(refused)):
            errors.append((index, first_error))  # aborted with the transaction
        return errors

    def _remember_delivered(
        self, envelopes: Sequence[Envelope], refused: dict[int, BaseException]
    ) -> None:
        first = min(refused)
        for index, d in enumerate(envelopes):
            if index == first:
                continue  # the runtime dead-letters it; any later refusal raises then
            if index in refused:
                continue  # refused too: raised for when the rest is sent again
            key = envelope_identity(d)
            if key is not None and key not in self._delivered:
                self._delivered.add(key)
                self._delivered_order.append(key)
        while len(self._delivered_order) > _DELIVERED_MEMORY:
            self._delivered.discard(self._delivered_order.popleft())

    def _forget_delivered(self) -> None:
        if self._delivered:
            self._delivered.clear()
            self._delivered_order.clear()

    def _fail(self, exc: BaseException) -> None:
        self.failed_batches += 1
        if producer_state_is_broken(exc):
            self._replace = True  # the next attempt starts with a new producer
        if self._healthy:
            log.error("kafka instance %r: sends failing; MQ units of work back out", self.instance)
        self._healthy = False

    async def flush(self) -> None:
        if self.producer is not None:
            await self.producer.flush()

    async def stop(self) -> None:
        producer, self.producer = self.producer, None
        self._healthy = False
        self._started = False
        if producer is not None:
            await producer.stop()  # flushes what is pending
