"""The ``confluent`` backend: librdkafka through confluent-kafka (the ``rdkafka`` extra).

librdkafka is callback based and its calls may block, so the event loop never calls a
blocking one: a producer's delivery reports are served by a poll thread, which hands
each poll's reports to the loop in one ``call_soon_threadsafe`` (not one wake-up per
record); a sink round's records (``send_round``) are settled together when the last of
their reports came (one hand-over per round), a failed one at once; a consumer's
``consume``, ``commit`` and ``close`` run on a single worker thread of that consumer.
What the rest of the plugin sees is aiokafka's shape and aiokafka's error classes
(``translate``): the sink's refusal and producer-replacement rules and the source's
commit rules hold unchanged for this backend.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any, TypeVar

from aiokafka import ConsumerRecord, TopicPartition
from aiokafka.errors import (
    CommitFailedError,
    KafkaConnectionError,
    KafkaTimeoutError,
    ProducerFenced,
    for_code,
)
from aiokafka.errors import KafkaError as AioKafkaError

from plugins.kafka.clients import outcome_seen
from plugins.kafka.config import KafkaPluginConfig
from plugins.kafka.errors import KafkaPluginError
from plugins.kafka.security import librdkafka_security

try:
    import confluent_kafka
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise KafkaPluginError(
        "kafka backend 'confluent' needs the confluent-kafka package: install the "
        "gateway with the rdkafka extra (pip install 'mq-stream-gateway[rdkafka]')",
        retriable=False,
    ) from exc

log = logging.getLogger(__name__)
#: librdkafka's own log lines and client errors: under ``kafka``, so the runtime's
#: third-party limiter (gateway.runtime.logs) de-duplicates and rate-limits them during
#: an outage as it does aiokafka's (librdkafka would otherwise write to stderr).
rdkafka_log = logging.getLogger("kafka.librdkafka")

_T = TypeVar("_T")
_CK = confluent_kafka.KafkaError
#: librdkafka's own (negative) codes that mean "no answer in time".
_TIMEOUTS = frozenset({_CK._MSG_TIMED_OUT, _CK._TIMED_OUT, getattr(_CK, "_TIMED_OUT_QUEUE", 1)})
#: librdkafka's codes for a connection that is down (retriable outages).
_OUTAGES = frozenset({_CK._TRANSPORT, _CK._ALL_BROKERS_DOWN, _CK._RESOLVE, _CK._DESTROY})
#: Broker answers to an offset commit from a member the group moved on from.
_REBALANCED = frozenset({22, 25, 27})  # ILLEGAL_GENERATION, UNKNOWN_MEMBER_ID, REBALANCE_...
#: How long the poll thread waits for delivery reports in one call (s).
_POLL_S = 0.05
#: Longest wait for the broker's metadata when a client starts (reachability check).
_CONNECT_TIMEOUT_S = 10.0


class RdKafkaError(AioKafkaError):  # type: ignore[misc]
    """A librdkafka error with no aiokafka class of its own; ``retriable`` as librdkafka
    says (a fatal error is never retriable: the producer must be replaced)."""

    def __init__(self, message: str, *, retriable: bool) -> None:
        super().__init__(message)
        self.retriable = retriable


def translate(err: Any) -> AioKafkaError:
    """The aiokafka error for a confluent_kafka ``KafkaError`` (or KafkaException)."""
    if isinstance(err, confluent_kafka.KafkaException):
        err = err.args[0] if err.args else None
    if not isinstance(err, confluent_kafka.KafkaError):
        return RdKafkaError(repr(err), retriable=True)
    code = err.code()
    text = f"{err.name()}: {err.str()}"
    # ``produce()`` on a producer in librdkafka's fatal state raises ``_FATAL`` with
    # ``fatal()`` false: fatal all the same (only a new producer can send again).
    if err.fatal() or code == _CK._FATAL:
        if code == _CK._FENCED:
            return ProducerFenced()
        return RdKafkaError(f"fatal: {text}", retriable=False)
    if code >= 0:
        return for_code(code)(text)
    if code in _TIMEOUTS:
        return KafkaTimeoutError(text)
    if code in _OUTAGES:
        return KafkaConnectionError(text)
    return RdKafkaError(text, retriable=err.retriable() or code not in (_CK._INVALID_ARG,))


def _common(config: KafkaPluginConfig, client_id: str) -> dict[str, Any]:
    servers = config.bootstrap_servers
    props: dict[str, Any] = {
        "bootstrap.servers": servers if isinstance(servers, str) else ",".join(servers),
        "client.id": config.client_id or client_id,
        "socket.timeout.ms": config.request_timeout_ms,
        "error_cb": _log_error,
        "logger": rdkafka_log,
    }
    props.update(config.client_options)
    props.update(librdkafka_security(config.security, client_id))
    return props


def _log_error(err: Any) -> None:
    """librdkafka's client-level errors (a broker down, a failed login): logged once
    each, at the level aiokafka's equivalents are (the runtime's limiter caps floods)."""
    rdkafka_log.warning("%s", err)


def _check_reachable(client: Any) -> None:
    try:
        client.list_topics(timeout=_CONNECT_TIMEOUT_S)
    except confluent_kafka.KafkaException as exc:
        raise translate(exc) from None


class ConfluentProducer:
    """aiokafka's producer shape on a librdkafka producer (idempotent, acks=all)."""

    def __init__(
        self,
        config: KafkaPluginConfig,
        client_id: str,
        *,
        transactional_id: str | None = None,
        dead_letter: bool = False,
        batch_bytes: int | None = None,
    ) -> None:
        props = _common(config, client_id)
        props.update(
            {
                "acks": "all",
                "enable.idempotence": True,
                "message.max.bytes": config.max_request_size,
                "request.timeout.ms": config.request_timeout_ms,
                # A batch the sink gave up on (send_timeout_s) must not linger on.
                "message.timeout.ms": int(config.send_timeout_s * 1000),
            }
        )
        if not dead_letter:
            props["linger.ms"] = config.linger_ms
            props["batch.size"] = batch_bytes or config.producer_batch_bytes()
            if config.compression_type is not None:
                props["compression.type"] = config.compression_type
        if transactional_id is not None:
            props["transactional.id"] = transactional_id
            props["transaction.timeout.ms"] = max(60_000, props["message.timeout.ms"])
        self._props = props
        self._transactional = transactional_id is not None
        self._producer: Any = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()
        #: delivery reports the poll thread served, settled on the loop after each poll;
        #: only the poll thread appends (reports served on another thread, e.g. inside
        #: librdkafka's commit_transaction/abort_transaction flush, are settled directly)
        self._reports: list[tuple[asyncio.Future[Any], Any, Any]] = []
        #: batches (``send_round``) whose last report the poll thread served
        self._batches: list[AckBatch] = []
        self._poll_ident: int | None = None
        #: the fatal error poll raised (then every send raises it: a new producer is due)
        self._fatal: AioKafkaError | None = None

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        try:
            self._producer = confluent_kafka.Producer(self._props)
        except confluent_kafka.KafkaException as exc:
            raise translate(exc) from None
        self._stopping.clear()
        self._thread = threading.Thread(
            target=self._poll_forever, name="rdkafka-producer-poll", daemon=True
        )
        self._thread.start()
        try:
            await asyncio.to_thread(_check_reachable, self._producer)
            if self._transactional:
                await self._call(self._producer.init_transactions, _CONNECT_TIMEOUT_S * 3)
        except BaseException:
            await self.stop()
            raise

    def _poll_forever(self) -> None:
        producer, loop = self._producer, self._loop
        assert loop is not None
        self._poll_ident = threading.get_ident()
        while not self._stopping.is_set():
            try:
                producer.poll(_POLL_S)
            except confluent_kafka.KafkaException as exc:
                # librdkafka's fatal error, raised by poll: this thread must go on
                # serving (the purged records' reports, the log) and the sink must
                # replace the producer, which every later send tells it.
                error = translate(exc)
                if not error.retriable and self._fatal is None:
                    self._fatal = error
                    log.error("librdkafka producer: %r: it is replaced at the next send", error)
                else:  # anything more: through the runtime's limiter for client logs
                    rdkafka_log.warning("poll: %r", error)
            reports, self._reports = self._reports, []
            batches, self._batches = self._batches, []
            if reports or batches:
                try:
                    loop.call_soon_threadsafe(_settle_all, reports, batches)
                except RuntimeError:  # the loop closed under us
                    return

    def hand_over(self, future: asyncio.Future[Any], err: Any, msg: Any) -> None:
        """One delivery report, from whatever thread librdkafka served it on."""
        if threading.get_ident() == self._poll_ident:
            self._reports.append((future, err, msg))  # settled after this poll
        else:  # a flush inside commit/abort_transaction, or stop() on the loop
            assert self._loop is not None
            _settle_on(self._loop, [(future, err, msg)])

    def hand_over_batch(self, batch: AckBatch) -> None:
        """A batch whose every record was reported, from whatever thread served the last."""
        if threading.get_ident() == self._poll_ident:
            self._batches.append(batch)
        else:
            assert self._loop is not None
            _settle_on(self._loop, [], [batch])

    async def _call(self, fn: Callable[..., _T], *args: Any) -> _T:
        try:
            return await asyncio.to_thread(fn, *args)
        except confluent_kafka.KafkaException as exc:
            raise translate(exc) from None

    async def send(
        self,
        topic: str,
        value: bytes | None = None,
        key: bytes | None = None,
        partition: int | None = None,
        timestamp_ms: int | None = None,
        headers: Sequence[tuple[str, bytes]] | None = None,
    ) -> asyncio.Future[Any]:
        producer, loop = self._producer, self._loop
        if producer is None or loop is None:
            raise RdKafkaError("producer is not started", retriable=True)
        if self._fatal is not None:
            raise self._fatal
        future: asyncio.Future[Any] = loop.create_future()
        delivered = partial(self.hand_over, future)
        extra: dict[str, Any] = {}
        if partition is not None:
            extra["partition"] = partition
        if timestamp_ms is not None:
            extra["timestamp"] = timestamp_ms
        while True:
            try:
                producer.produce(
                    topic, value, key, headers=headers or None, on_delivery=delivered, **extra
                )
                return future
            except BufferError:
                # librdkafka's queue is full: wait for acks to drain it (never block here).
                await asyncio.sleep(0.005)
            except confluent_kafka.KafkaException as exc:
                raise translate(exc) from None

    async def send_round(
        self, records: Sequence[tuple[str, bytes | None, bytes | None, Sequence[tuple[str, bytes]]]]
    ) -> tuple[list[asyncio.Future[None]], AioKafkaError | None]:
        """Produce ``records`` ((topic, value, key, headers)) in order, until librdkafka
        refuses one: the ack future of each record produced, and the (translated) error
        of the refused one (None: every record was produced).

        Why not ``send`` per record: one coroutine, closure and settle each; here a
        record costs its ``produce`` call, a future and one small call on the poll
        thread per report. The futures are settled together when the last record's
        report came (:class:`AckBatch`, one hand-over to the loop), a failed record's at
        once (a transaction waits for its first failure), each with its own outcome.
        A result is None (the delivered message is not kept)."""
        producer, loop = self._producer, self._loop
        if producer is None or loop is None:
            raise RdKafkaError("producer is not started", retriable=True)
        if self._fatal is not None:
            raise self._fatal
        batch = AckBatch(self)
        futures = batch.futures
        produce, report, create_future = producer.produce, batch.report, loop.create_future
        refused: AioKafkaError | None = None
        try:
            for topic, value, key, headers in records:
                future: asyncio.Future[None] = create_future()
                while True:
                    try:
                        produce(topic, value, key, headers=headers or None,
                                on_delivery=partial(report, future))
                        break
                    except BufferError:
                        # librdkafka's queue is full: wait for acks to drain it.
                        await asyncio.sleep(0.005)
                futures.append(future)
        except confluent_kafka.KafkaException as exc:
            refused = translate(exc)
        except BaseException:  # cancelled while the queue was full
            for done in futures:
                done.add_done_callback(outcome_seen)  # nobody awaits them now
            raise
        finally:
            batch.seal()  # cancelled mid-way too: the records produced still settle
        return futures, refused

    async def flush(self, timeout_s: float = 30.0) -> None:
        """Wait until every produced record is acknowledged (or failed). The poll thread
        alone serves delivery reports, so this waits for it instead of calling
        librdkafka's flush (which would serve them on a second thread)."""
        producer = self._producer
        if producer is None:
            return
        deadline = asyncio.get_running_loop().time() + timeout_s
        while len(producer) > 0 and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.005)

    async def begin_transaction(self) -> None:
        try:
            self._producer.begin_transaction()
        except confluent_kafka.KafkaException as exc:
            raise translate(exc) from None

    async def commit_transaction(self) -> None:
        await self._call(self._producer.commit_transaction)

    async def abort_transaction(self) -> None:
        await self._call(self._producer.abort_transaction)

    async def stop(self) -> None:
        if self._producer is None:
            return
        await self.flush(5.0)
        producer, self._producer = self._producer, None
        self._stopping.set()
        thread, self._thread = self._thread, None
        if thread is not None:
            await asyncio.to_thread(thread.join, 5.0)
        # Purge what is still queued so nothing is delivered after stop (at-least-once:
        # its MQ unit of work did not commit and the messages come again).
        with contextlib.suppress(Exception):
            producer.purge()
        if thread is not None and thread.is_alive():
            return  # it still polls: it serves and settles the purged reports itself
        left, self._reports = self._reports, []
        done, self._batches = self._batches, []
        _settle_all(left, done)
        # The poll thread is gone: this (loop) thread serves what is left, settled
        # directly by ``delivered`` (not the poll thread).
        with contextlib.suppress(Exception):
            producer.poll(0)


class AckBatch:
    """The records of one :meth:`ConfluentProducer.send_round`: settled together once
    every one was reported, each with its own outcome.

    librdkafka serves one delivery report per record, on the poll thread (or, in a
    transaction's commit/abort, on the thread that called it): :meth:`report` counts it;
    the report that completes a sealed batch (or the seal that comes after the last
    report) hands the batch to the loop once, and every record still unsettled then was
    delivered. A failure is handed over at once, as ``send``'s are (a transaction waits
    for its first failed record, and librdkafka reports the records behind it only after
    the abort): its hand-over is made before it is counted, so it reaches the loop before
    the batch's (same poll: reports first; another thread: an earlier call_soon)."""

    __slots__ = ("_lock", "_owner", "_reported", "_sealed", "futures")

    def __init__(self, owner: ConfluentProducer) -> None:
        self._owner = owner
        self._lock = threading.Lock()
        self._reported = 0
        self._sealed = False
        #: each produced record's future, in the order produced
        self.futures: list[asyncio.Future[None]] = []

    def report(self, future: asyncio.Future[None], err: Any, msg: Any) -> None:
        """librdkafka's delivery report of the record of ``future`` (any thread)."""
        if err is not None:
            self._owner.hand_over(future, err, msg)
        with self._lock:
            self._reported += 1
            complete = self._sealed and self._reported == len(self.futures)
        if complete:
            self._owner.hand_over_batch(self)

    def seal(self) -> None:
        """No more records (on the loop, after the last ``produce``)."""
        with self._lock:
            self._sealed = True
            complete = self._reported == len(self.futures)
        if complete:
            self._owner.hand_over_batch(self)

    def settle(self) -> None:
        """Every record reported: the futures not settled yet were delivered (on the loop)."""
        for future in self.futures:
            if not future.done():  # else failed and settled already, or given up on
                future.set_result(None)


def _settle_on(
    loop: asyncio.AbstractEventLoop,
    reports: list[tuple[asyncio.Future[Any], Any, Any]],
    batches: Sequence[AckBatch] = (),
) -> None:
    """Settle ``reports`` and ``batches`` on ``loop`` from any thread (now, when this is
    its thread)."""
    try:
        running = asyncio.get_running_loop()
    except RuntimeError:
        running = None
    if running is loop:
        _settle_all(reports, batches)
        return
    with contextlib.suppress(RuntimeError):  # the loop closed under us
        loop.call_soon_threadsafe(_settle_all, reports, batches)


def _settle_all(
    reports: list[tuple[asyncio.Future[Any], Any, Any]], batches: Sequence[AckBatch]
) -> None:
    """Single reports first (a batch's failed records among them), then whole batches."""
    _settle(reports)
    for batch in batches:
        batch.settle()


def _settle(reports: list[tuple[asyncio.Future[Any], Any, Any]]) -> None:
    """Resolve each (future, error, message) delivery report (on the event loop)."""
    for future, err, msg in reports:
        if future.done():
            continue  # its send was given up on (timeout, cancelled)
        if err is None:
            future.set_result(msg)
        else:
            future.set_exception(translate(err))


class ConfluentConsumer:
    """aiokafka's consumer shape on a librdkafka consumer; every blocking call runs on
    this consumer's one worker thread, so the event loop never waits in librdkafka."""

    def __init__(
        self,
        config: KafkaPluginConfig,
        topics: Sequence[str],
        client_id: str,
        *,
        group_id: str,
        auto_offset_reset: str,
        group_instance_id: str | None = None,
    ) -> None:
        props = _common(config, client_id)
        if group_instance_id is not None:
            props["group.instance.id"] = group_instance_id
        props.update(
            {
                "group.id": group_id,
                "enable.auto.commit": False,
                "enable.auto.offset.store": False,
                "auto.offset.reset": auto_offset_reset,
                "isolation.level": "read_committed",
            }
        )
        self._props = props
        self._topics = list(topics)
        self._consumer: Any = None
        self._worker = ThreadPoolExecutor(1, thread_name_prefix="rdkafka-consumer")
        self._inflight: asyncio.Future[Any] | None = None

    async def _call(self, fn: Callable[..., _T], *args: Any, **kwargs: Any) -> _T:
        loop = asyncio.get_running_loop()
        inflight = loop.run_in_executor(self._worker, lambda: fn(*args, **kwargs))
        self._inflight = inflight
        try:
            # Shielded: a cancelled caller must not leave librdkafka mid-call while
            # stop() closes the consumer (stop waits for this call first).
            return await asyncio.shield(inflight)
        except confluent_kafka.KafkaException as exc:
            raise translate(exc) from None

    async def start(self) -> None:
        try:
            self._consumer = confluent_kafka.Consumer(self._props)
        except confluent_kafka.KafkaException as exc:
            raise translate(exc) from None
        try:
            await self._call(_check_reachable, self._consumer)
            await self._call(self._consumer.subscribe, self._topics)
        except BaseException:
            await self.stop()
            raise

    async def getmany(
        self, *partitions: TopicPartition, timeout_ms: int = 0, max_records: int | None = None
    ) -> dict[TopicPartition, list[ConsumerRecord[bytes, bytes]]]:
        consumer = self._consumer
        if consumer is None:
            raise RdKafkaError("consumer is not started", retriable=True)
        messages = await self._call(consumer.consume, max_records or 500, timeout_ms / 1000)
        out: dict[TopicPartition, list[ConsumerRecord[bytes, bytes]]] = {}
        for m in messages:
            err = m.error()
            if err is not None:
                if err.fatal():
                    raise translate(err)
                log.debug("librdkafka consumer: %s", err)
                continue
            tp = TopicPartition(m.topic(), m.partition())
            key, value = m.key(), m.value()
            ts_type, ts = m.timestamp()
            batch = out.get(tp)
            if batch is None:
                batch = out[tp] = []
            batch.append(
                ConsumerRecord(
                    m.topic(),
                    m.partition(),
                    m.offset(),
                    ts if ts_type else -1,
                    max(ts_type - 1, 0),
                    key,
                    value,
                    None,
                    len(key) if key is not None else -1,
                    len(value) if value is not None else -1,
                    m.headers() or (),
                )
            )
        return out

    def seek(self, partition: TopicPartition, offset: int) -> None:
        consumer = self._consumer
        if consumer is None:
            return
        try:
            consumer.seek(
                confluent_kafka.TopicPartition(partition.topic, partition.partition, offset)
            )
        except confluent_kafka.KafkaException as exc:
            raise translate(exc) from None

    async def commit(self, offsets: Mapping[TopicPartition, int] | None = None) -> None:
        consumer = self._consumer
        if consumer is None:
            raise RdKafkaError("consumer is not started", retriable=True)
        if not offsets:
            return
        wanted = [
            confluent_kafka.TopicPartition(tp.topic, tp.partition, off)
            for tp, off in offsets.items()
        ]
        try:
            done = await self._call(consumer.commit, offsets=wanted, asynchronous=False)
        except AioKafkaError as exc:
            if getattr(exc, "errno", None) in _REBALANCED:
                raise CommitFailedError() from exc
            raise
        for tp in done or ():
            if tp.error is not None:
                if tp.error.code() in _REBALANCED:
                    raise CommitFailedError()
                raise translate(tp.error)

    async def stop(self) -> None:
        consumer, self._consumer = self._consumer, None
        inflight = self._inflight
        try:
            if inflight is not None:
                # A poll still in librdkafka returns first (its own timeout bounds it).
                # Its error does not matter now; a cancellation of this stop does: a
                # caller's timeout must end the stop, not be swallowed here.
                with contextlib.suppress(Exception):
                    await asyncio.shield(inflight)
            if consumer is not None:
                closing = asyncio.get_running_loop().run_in_executor(self._worker, consumer.close)
                consumer = None
                with contextlib.suppress(Exception):
                    await closing
        finally:
            if consumer is not None:  # cancelled first: closed after the poll, unawaited
                with contextlib.suppress(RuntimeError):
                    self._worker.submit(consumer.close)
            self._worker.shutdown(wait=False)
