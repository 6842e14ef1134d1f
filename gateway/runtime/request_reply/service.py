"""The request/reply service of one gateway process (docs/request-reply.md).

Requester routes: requests consumed from a plugin become MQ REQUESTs put through the
queue manager's own name resolution; replies/reports on ``reply_queue`` go back to the
requester. Service routes: MQ requests got from a hosted queue are produced to a plugin
topic; the responder's replies become MQ REPLYs to the request's ReplyToQ@ReplyToQMgr.
Every hop is acknowledged only after the next one has the message, in the order the
once/in-order table of docs/request-reply.md fixes; the correlation store
(gateway.routing.correlation_store) filters what a crash makes arrive twice.

The MQ loops (reply reader, service-queue readers, sweeper) live in ``readers.py``; this
module holds the service object, the plugin-side handlers and the shared MQ helpers.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Coroutine, Sequence
from typing import Any

from gateway.log_summary import SummarisedLog
from gateway.mq.port import (
    Connection,
    MQError,
    PutOptions,
    QueueHandle,
    QueueManager,
    output_options,
)
from gateway.plugin_api import (
    DeliveryRefusedError,
    Envelope,
    ExchangeHandler,
    Exchanges,
    OwnsTopics,
    PluginError,
    PublishRefusedError,
)
from gateway.pubsub.authorisation import Authoriser, Decision, Policy, Principal, PrincipalKind
from gateway.pubsub.destinations import OwnQueues, QueueUse, ResolvedQueue
from gateway.routing.addressing import (
    error_envelope,
    reply_md,
)
from gateway.routing.correlation import (
    TOKEN_LENGTH,
    PendingRequest,
    State,
)
from gateway.routing.correlation_store import CorrelationStore
from gateway.routing.routes import (
    RequestReplyConfig,
    RequestRoute,
    ServiceRoute,
    split_destination,
)
from gateway.runtime.request_reply.errors import (
    DESTINATION_REASONS,
    DeadLetterRefusedError,
    DestinationBusyError,
)
from gateway.runtime.request_reply.request_batches import (
    plan_request,
    reply_topic_of,
    send_requests_together,
)
from gateway.wire.dlh import wrap_for_dlq
from gateway.wire.mqmd import MQMD
from gateway.wire.reasons import Reason

__all__ = ["DEFAULT_DEAD_LETTER_QUEUE", "RequestReplyService"]

log = logging.getLogger(__name__)

#: The gateway QM's dead-letter queue when the config names no other.
DEFAULT_DEAD_LETTER_QUEUE = "SYSTEM.DEAD.LETTER.QUEUE"
#: MQFB_APPL_FIRST + 1: the reason of a reply no pending request waits for.
_NO_PENDING_REQUEST = 65537
#: Backoff bounds (seconds) of restarting an MQ loop that failed unexpectedly.
_RESTART_MIN = 0.1
_RESTART_MAX = 10.0


class RequestReplyService:
    """One per gateway process: see the module docstring."""

    def __init__(
        self,
        qm: QueueManager,
        config: RequestReplyConfig,
        store: CorrelationStore,
        *,
        clock: Callable[[], float] = time.time,
        dead_letter_queue: str = DEFAULT_DEAD_LETTER_QUEUE,
        wait_ms: int = 200,
        reply_retry: float = 10.0,
        authoriser: Authoriser | None = None,
        own_topic: Callable[[str, str], str] | None = None,
    ) -> None:
        self.qm = qm
        self.config = config
        self.store = store
        self.clock = clock
        self.dead_letter_queue = dead_letter_queue
        self.wait_ms = wait_ms
        #: Seconds a route's replies keep failing before one backed out BOTHRESH times
        #: is dead-lettered (a plugin restart is shorter: nothing is dead-lettered).
        self.reply_retry = reply_retry
        #: requester route -> when its replies started failing retriably (reply reader)
        self.reply_failing_since: dict[str, float] = {}
        self.requests = {r.name: r for r in config.requests}
        self.services = {s.name: s for s in config.services}
        self._instances: dict[str, Exchanges] = {}
        #: Decides which queues and topics outsiders may have the gateway write to
        #: (docs/security.md, "Destinations named from outside"): the running gateway's,
        #: or one that knows only this service's own queues, by name.
        self.authoriser = authoriser or _own_authoriser(qm.name, config)
        #: (plugin instance, topic) -> why the topic is a plugin's own: the running
        #: gateway asks every instance of that plugin (another Kafka instance may write
        #: the same cluster); without it, the attached instance is asked.
        self.own_topic = own_topic or self._attached_own_topic
        #: (route, event) -> count; events named in docs/request-reply.md "Metrics"
        self.events: Counter[tuple[str, str]] = Counter()
        self._tasks: list[asyncio.Task[None]] = []
        #: MQ loop name -> its last unexpected failure, until it works again
        self._failing: dict[str, str] = {}
        self._locks: dict[bytes, tuple[asyncio.Lock, int]] = {}
        self.running = False
        #: Lines about what outsiders can repeat at will (junk on the reply queue, a
        #: reply topic or ReplyToQ that refuses, an unparsable request): one line per
        #: kind per minute, then a count (gateway.log_summary.SummarisedLog).
        self.summarised = SummarisedLog(log)

    # ---------------------------------------------------------------- lifecycle -----

    async def start(self) -> None:
        """Reply-queue reader, one reader per service route, and the sweeper."""
        from gateway.runtime.request_reply.readers import (
            TASK_REPLIES,
            TASK_SERVICE,
            TASK_SWEEPER,
            read_replies,
            read_service_queue,
            sweep,
        )

        self.running = True
        if self.requests:
            self._spawn(self._supervise(lambda: read_replies(self), TASK_REPLIES), TASK_REPLIES)
        for route in self.services.values():
            name = f"{TASK_SERVICE}{route.name}"
            loop = functools.partial(read_service_queue, self, route)
            self._spawn(self._supervise(loop, name), name)
        self._spawn(self._supervise(lambda: sweep(self), TASK_SWEEPER), TASK_SWEEPER)

    def attach(self, instance_name: str, exchanges: Exchanges) -> None:
        """Called after every successful start of plugin instance ``instance_name``:
        consume each of its routes' sources and use it for produce(). After
        :meth:`stop` it does nothing: a plugin whose start ends during the gateway's
        shutdown must not get consumers that nobody stops."""
        if not self.running:
            return
        self._instances[instance_name] = exchanges
        for req in self.requests.values():
            if req.plugin == instance_name:
                self._spawn(
                    exchanges.consume(req.name, [req.source], self._requests_handler(req)),
                    f"rr:consume:{req.name}",
                )
        for svc in self.services.values():
            if svc.plugin == instance_name:
                self._spawn(
                    exchanges.consume(svc.name, [svc.replies], self._replies_handler(svc)),
                    f"rr:consume:{svc.name}",
                )

    def detach(self, instance_name: str) -> None:
        """The instance stopped: produce() to it fails retriably until attached again."""
        self._instances.pop(instance_name, None)

    async def stop(self) -> None:
        self.running = False
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._tasks.clear()
        self.summarised.flush()

    async def _supervise(
        self, loop: Callable[[], Coroutine[Any, Any, None]], name: str
    ) -> None:
        """Run an MQ loop; restart it with backoff after an unexpected exception (a
        correlation-store error, a bug), which stays visible in :meth:`failing_tasks`
        until the loop reports progress again (:meth:`task_ok`)."""
        delay = _RESTART_MIN
        while self.running:
            try:
                await loop()
                return
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self._failing[name] = f"{type(exc).__name__}: {exc}"
                log.error("request/reply task %s failed; restarting in %.1f s", name, delay,
                          exc_info=exc)
                await asyncio.sleep(delay)
                delay = min(_RESTART_MAX, delay * 2)

    def task_ok(self, name: str) -> None:
        """Loop ``name`` made progress: no longer failing."""
        if self._failing:
            self._failing.pop(name, None)

    def failing_tasks(self) -> dict[str, str]:
        """MQ loops that failed and have not worked since: name -> last error."""
        return dict(self._failing)

    @property
    def healthy(self) -> bool:
        """Every MQ loop is working."""
        return not self._failing

    @contextlib.asynccontextmanager
    async def entry_lock(self, key: bytes) -> AsyncIterator[None]:
        """Serialises the reply reader and the sweeper on one requester entry, so only
        the one that finishes it produces to the requester."""
        lock, users = self._locks.get(key) or (asyncio.Lock(), 0)
        self._locks[key] = (lock, users + 1)
        try:
            async with lock:
                yield
        finally:
            lock, users = self._locks[key]
            if users <= 1:
                del self._locks[key]
            else:
                self._locks[key] = (lock, users - 1)

    def _spawn(self, coro: Coroutine[Any, Any, None], name: str) -> None:
        task = asyncio.create_task(coro, name=name)
        task.add_done_callback(_log_failure)
        self._tasks.append(task)

    # ---------------------------------------------------------------- counters ------

    def count(self, route: str, event: str, n: int = 1) -> None:
        self.events[(route, event)] += n

    def stats(self) -> dict[str, int]:
        """Totals per event over all routes, plus the open-entry gauges of the store."""
        out: dict[str, int] = {}
        for (_, event), n in self.events.items():
            out[event] = out.get(event, 0) + n
        for name, n in self.store.counts().items():
            out[name] = n
        out["tasks_failing"] = len(self._failing)
        return out

    # ---------------------------------------------------------------- plugin side ---

    async def produce(self, instance_name: str, envelopes: Sequence[Envelope]) -> None:
        """Produce through ``instance_name``; retriable PluginError while it is not
        started (the caller keeps its MQ message and tries again)."""
        inst = self._instances.get(instance_name)
        if inst is None:
            raise PluginError(f"plugin instance {instance_name} is not started", retriable=True)
        await inst.produce(envelopes)

    def _requests_handler(self, route: RequestRoute) -> ExchangeHandler:
        async def handle(batch: Sequence[Envelope]) -> None:
            await self.on_requests(route, batch)

        return handle

    def _replies_handler(self, route: ServiceRoute) -> ExchangeHandler:
        async def handle(batch: Sequence[Envelope]) -> None:
            await self.on_responder_replies(route, batch)

        return handle

    async def on_requests(self, route: RequestRoute, batch: Sequence[Envelope]) -> None:
        """Incoming requests → MQ REQUESTs: add_request → put+commit → mark_sent, then
        the plugin acknowledges the batch (we return). A batch goes in units of work of
        many requests (``request_batches.py``); from a unit that cannot go whole (backed
        out), one request per unit of work."""
        conn = await self._connect()
        try:
            first = await send_requests_together(self, conn, route, batch) if len(batch) > 1 else 0
            for index in range(first, len(batch)):
                try:
                    await self._send_request(conn, route, batch[index])
                except PublishRefusedError as exc:
                    raise PublishRefusedError(str(exc), index=index, reason=exc.reason) from exc
        finally:
            with contextlib.suppress(MQError):
                await conn.disconnect()

    async def _send_request(self, conn: Connection, route: RequestRoute, env: Envelope) -> None:
        plan = plan_request(self, route, env, self.clock())
        if plan is None:
            self.count(route.name, "duplicates_filtered")
            return
        self.check_reply_topic(route, reply_topic_of(route, env))  # refused: never sent
        key, md, body = plan.key, plan.md, plan.body
        if plan.entry is not None:
            await asyncio.to_thread(self.store.add_request, plan.entry)
        q, q_mgr = split_destination(route.destination)
        try:
            await self.put_checked(conn, route.name, q, q_mgr, QueueUse.DESTINATION, md, body)
            await conn.commit()
        except MQError as exc:
            with contextlib.suppress(MQError):
                await conn.backout()
            if exc.retriable:
                raise PluginError(f"route {route.name}: put to {route.destination}: {exc}",
                                  retriable=True) from exc
            pending = self.store.request(key)
            assert pending is not None
            self.summarised.log(
                logging.WARNING, f"request refused {route.name}",
                "route %s: request refused by %s: %s", route.name, route.destination, exc,
            )
            delivered = await self.error_reply_or_give_up(
                route,
                pending,
                error_envelope(pending, "refused", feedback=exc.reason, text=str(exc)),
            )
            self.store.finish_request(key, "refused", self.clock())
            if not delivered:
                # nobody can be told: the request record goes to the dead-letter topic
                raise PublishRefusedError(
                    f"route {route.name}: request refused by {route.destination} ({exc}) "
                    "and its error reply refused by the plugin",
                    reason=exc.reason,
                ) from exc
            self.count(route.name, "error_replies.refused")
            return
        self.store.mark_sent(key)  # no flush of its own: quick on the loop
        self.count(route.name, "requests_sent")

    async def on_responder_replies(self, route: ServiceRoute, batch: Sequence[Envelope]) -> None:
        """Responder replies → MQ REPLYs: put+commit → finish_service, then the plugin
        acknowledges (we return). Unresolvable ReplyToQ/QMgr → the DLQ."""
        conn = await self._connect()
        try:
            for index, env in enumerate(batch):
                try:
                    await self._send_reply(conn, route, env)
                except PublishRefusedError as exc:
                    raise PublishRefusedError(str(exc), index=index, reason=exc.reason) from exc
        finally:
            with contextlib.suppress(MQError):
                await conn.disconnect()

    async def _send_reply(self, conn: Connection, route: ServiceRoute, env: Envelope) -> None:
        """One responder reply. Raises PublishRefusedError (the plugin dead-letters the
        record) for a reply no open request of this route waits for, and for one that
        can be neither put nor dead-lettered on MQ."""
        token = env.correlation_data
        pending = self.store.service(token) if len(token) == TOKEN_LENGTH else None
        if pending is None or pending.route != route.name:
            self.count(route.name, "replies_unmatched")
            raise PublishRefusedError(
                f"route {route.name}: reply with unknown correlation data {token.hex()[:48]}",
                reason=_NO_PENDING_REQUEST,
            )
        if pending.state is State.DONE and pending.outcome in ("reply", "dead-lettered"):
            # the same reply offered again (a crash before the plugin's ack)
            self.count(route.name, "duplicates_filtered")
            return
        if pending.state is State.DONE:
            self.count(route.name, "replies_late")
            raise PublishRefusedError(
                f"route {route.name}: reply to a request already finished "
                f"({pending.outcome})",
                reason=_NO_PENDING_REQUEST,
            )
        md = reply_md(pending, env, now=self.clock())
        try:
            outcome = await self.put_or_dead_letter(
                conn, route.name, pending.reply_to_q, pending.reply_to_q_mgr, md, env.payload
            )
        except DeadLetterRefusedError as exc:
            self.store.finish_service(token, "refused", self.clock())
            self.count(route.name, "replies_refused")
            raise PublishRefusedError(
                f"route {route.name}: reply can be neither put nor dead-lettered: {exc}",
                reason=exc.reason,
            ) from exc
        self.store.finish_service(token, outcome, self.clock())
        self.count(route.name, "service_replies" if outcome == "reply" else "replies_dead_lettered")

    async def error_reply_or_give_up(
        self, route: RequestRoute, pending: PendingRequest, env: Envelope
    ) -> bool:
        """Produce an error reply; False (logged, counted) when the plugin refuses it
        for good. A retriable failure raises as produce() does."""
        try:
            refused = self.reply_topic_refusal(route, pending.reply_topic)
            if refused is not None:
                raise refused
            await self.produce(route.plugin, [env])
        except DeliveryRefusedError as exc:
            self.summarised.log(
                logging.ERROR, f"error reply refused {route.name}",
                "route %s: error reply to %r refused by the plugin: %s",
                route.name, pending.reply_topic, exc,
            )
            self.count(route.name, "error_replies_undeliverable")
            return False
        return True

    # ---------------------------------------------------------------- destinations --

    def refuse(self, route: str, decision: Decision) -> None:
        """Count and report a destination refused on ``route`` (metrics, summarised log)."""
        self.authoriser.count(f"request_reply:{route}", decision, Reason.NOT_AUTHORIZED)
        self.count(route, "destinations_refused")

    def reply_topic_decision(self, route: RequestRoute, topic: str) -> Decision:
        """May a requester on ``route`` have its reply written to ``topic``? Never to a
        topic the plugin instance or one of its routes keeps for itself; within the
        route's ``reply_topics`` when it lists any."""
        own = self.own_topic(route.plugin, topic) or self.config.route_topic(topic)
        who = Principal(PrincipalKind.PLUGIN, route.plugin)
        return self.authoriser.may_use_topic(who, topic, own, route.reply_topics)

    def reply_topic_refused(self, route: RequestRoute, topic: str) -> str:
        """Why a reply to ``topic`` is refused (counted and reported), or "": at intake
        the request itself is then refused (PublishRefusedError: the plugin dead-letters
        it with MQRC_NOT_AUTHORIZED and nothing is written to that topic); at produce
        time (the configuration may have changed since) the reply is refused as if the
        plugin had (DeliveryRefusedError)."""
        decision = self.reply_topic_decision(route, topic)
        if decision.allowed:
            return ""
        self.refuse(route.name, decision)
        return f"route {route.name}: {decision.detail}"

    def _attached_own_topic(self, instance: str, topic: str) -> str:
        inst = self._instances.get(instance)
        return inst.own_topic(topic) if isinstance(inst, OwnsTopics) else ""

    def check_reply_topic(self, route: RequestRoute, topic: str) -> None:
        """:meth:`reply_topic_refused` at intake: raises PublishRefusedError."""
        why = self.reply_topic_refused(route, topic)
        if why:
            raise PublishRefusedError(why, reason=Reason.NOT_AUTHORIZED)

    def reply_topic_refusal(self, route: RequestRoute, topic: str) -> DeliveryRefusedError | None:
        """:meth:`reply_topic_refused` at produce time: the refusal to raise, or None."""
        why = self.reply_topic_refused(route, topic)
        return DeliveryRefusedError(why, index=0, reason=Reason.NOT_AUTHORIZED) if why else None

    async def open_destination(
        self,
        conn: Connection,
        route: str,
        q: str,
        q_mgr: str,
        use: QueueUse,
        options: PutOptions,
    ) -> QueueHandle:
        """MQOPEN ``q`` at ``q_mgr`` for output and check where MQ resolved it: one of the
        gateway's own queues (an alias of a stream queue, a queue-manager alias of this
        queue manager, a backlog queue...) is refused with MQRC_NOT_AUTHORIZED (2035),
        counted and reported. (Who may name which queue was decided when the name came
        in; this is the check that nothing changed the resolution since.)"""
        handle = await conn.open(q, output_options(options), q_mgr)
        resolved = ResolvedQueue(handle.resolved_q_mgr_name, handle.resolved_q_name)
        decision = self.authoriser.may_use_queue(_GATEWAY, q_mgr, q, use, resolved)
        if not decision.allowed:
            with contextlib.suppress(MQError):
                await handle.close()
            self.refuse(route, decision)
            raise MQError(Reason.NOT_AUTHORIZED, decision.detail)
        return handle

    async def put_checked(
        self,
        conn: Connection,
        route: str,
        q: str,
        q_mgr: str,
        use: QueueUse,
        md: MQMD,
        body: bytes,
    ) -> None:
        """Put one message under syncpoint where MQ resolves ``q``@``q_mgr``, refused
        (MQRC_NOT_AUTHORIZED) when that is one of the gateway's own queues. Where the
        gateway's resolver knows the queue manager's definitions (the embedded queue
        manager) it checks first and puts with MQPUT1; elsewhere (IBM MQ) it opens the
        queue (:meth:`open_destination`: MQOPEN's resolved names), puts, closes."""
        opts = PutOptions(syncpoint=True)
        if self.authoriser.own_queues.resolves_names:
            decision = self.authoriser.may_use_queue(_GATEWAY, q_mgr, q, use)
            if not decision.allowed:
                self.refuse(route, decision)
                raise MQError(Reason.NOT_AUTHORIZED, decision.detail)
            await conn.put1(q, md, body, opts, q_mgr_name=q_mgr)
            return
        handle = await self.open_destination(conn, route, q, q_mgr, use, opts)
        try:
            await handle.put(md, body, opts)
        finally:
            with contextlib.suppress(MQError):
                await handle.close()

    # ---------------------------------------------------------------- MQ helpers ----

    async def _connect(self) -> Connection:
        try:
            return await self.qm.connect()
        except MQError as exc:
            raise PluginError(f"queue manager unavailable: {exc}", retriable=True) from exc

    async def put_or_dead_letter(
        self, conn: Connection, route: str, q: str, q_mgr: str, md: MQMD, body: bytes
    ) -> str:
        """Put ``md``/``body`` to ``q``@``q_mgr`` and commit: "reply". A put MQ refuses
        for good goes to the DLQ with an MQDLH naming ``q``/``q_mgr``: "dead-lettered".
        A retriable failure raises PluginError(retriable) (nothing committed): a
        DestinationBusyError when it is about ``q`` (full, put-inhibited)."""
        try:
            await self.put_checked(conn, route, q, q_mgr, QueueUse.REPLY, md, body)
            await conn.commit()
            return "reply"
        except MQError as exc:
            with contextlib.suppress(MQError):
                await conn.backout()
            if exc.retriable and exc.reason in DESTINATION_REASONS:
                raise DestinationBusyError(f"route {route}: put to {q}@{q_mgr}: {exc}",
                                           reason=exc.reason) from exc
            if exc.retriable:
                raise PluginError(f"route {route}: put to {q}@{q_mgr}: {exc}",
                                  retriable=True) from exc
            self.summarised.log(
                logging.WARNING, f"reply dead-lettered {route}",
                "route %s: reply to %s@%s cannot be delivered (MQRC %d): dead-lettered",
                route, q, q_mgr, exc.reason,
            )
            await self.dead_letter(conn, md, body, exc.reason, q, q_mgr)
            await conn.commit()
            return "dead-lettered"

    async def dead_letter(
        self, conn: Connection, md: MQMD, body: bytes, reason: int, q: str, q_mgr: str
    ) -> None:
        """Put ``md``/``body`` behind an MQDLH on the gateway QM's DLQ (under syncpoint;
        the caller commits)."""
        dl_md, dl_body = wrap_for_dlq(md, body, reason, q[:48], q_mgr[:48], "mqgw")
        try:
            await conn.put1(
                self.dead_letter_queue,
                dl_md,
                dl_body,
                PutOptions(syncpoint=True, set_all_context=True),
            )
        except MQError as exc:
            message = f"cannot put to the dead-letter queue {self.dead_letter_queue}: {exc}"
            if exc.retriable:
                raise PluginError(message, retriable=True) from exc
            raise DeadLetterRefusedError(message, reason=exc.reason) from exc


#: The principal of the gateway's own puts: only the gateway's-own-queues rule applies.
_GATEWAY = Principal(PrincipalKind.BROKER, "mqgw")


def _own_authoriser(q_mgr_name: str, config: RequestReplyConfig) -> Authoriser:
    """An authoriser for a service built without the running gateway's: the default
    policy, with this service's own queues kept (by name; MQOPEN resolves)."""
    kept = {s.queue for s in config.services} | {config.reply_queue}
    return Authoriser(Policy(), q_mgr_name, own_queues=OwnQueues(q_mgr_name, kept))


def _log_failure(task: asyncio.Task[None]) -> None:
    if task.cancelled():
        return
    exc = task.exception()
    if exc is not None:
        log.error("task %s failed", task.get_name(), exc_info=exc)
