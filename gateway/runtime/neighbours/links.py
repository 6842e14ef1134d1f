"""The links to neighbour brokers: join, stream negotiation, loop probe, proxy
subscriptions, clear (net13-spec.md; docs/neighbours.md).

Everything said to a neighbour is a documented queued pub/sub command put to its queue
manager (RegSub/DeregSub to its SYSTEM.BROKER.CONTROL.QUEUE, Publish to its
SYSTEM.BROKER.ADMIN.STREAM), so a legacy broker or an MQ V7+ queue manager can stand on
the other side. Answers come back to our SYSTEM.BROKER.INTER.BROKER.COMMUNICATIONS queue,
which this module defines (embedded queue manager) and services.

* **Join** (CLI request or configuration): RegSub at N on the admin stream topic
  ``MQ/<N>/StreamSupport``; its OK response (or N's StreamSupport publication) is N's
  answer. At the same time a *loop probe*: a RegSub at N on ``MQGW/Probe/<own>/<nonce>``
  and, during the probe window, that topic published at every other neighbour, active
  or still joining (two neighbours joined at once probe through each other). If it
  comes back through N, N is already reachable: the later of the two joins is refused
  (and its proxies withdrawn). A neighbour about to become active that was never probed
  through some active neighbour (its probe could not be put there) is probed again
  first. After the window N is *active* when it answered, *inactive* until it does.
* **Probe relay**: a probe subscription another neighbour X holds here is registered in
  turn at our other neighbours (identity: our queue manager, our admin stream queue),
  so a probe travels as far as the network reaches, as interest does.
* **Proxy sync** (after every committed unit of the broker service, see :meth:`wake`,
  at most once per ``MIN_SYNC_SPACING``, and every ``sync_interval``; last-heard is
  written on the ``HEARD_FLUSH_INTERVAL`` timer only): wanted = ``wanted_proxies`` over the engine's
  subscriptions, registered = the rows of :mod:`.state`; the difference becomes RegSub /
  DeregSub commands, the topics of one stream for one neighbour carried together
  (``proxy_batches``; one command of several topics the neighbour refuses is sent
  again topic by topic, so one bad topic blocks no other). Each command is written to
  the state (one row per topic, with its MsgId) before its put is committed and
  settled by the response that correlates on it; unanswered ones
  are sent again (at start too: RegSub and DeregSub are idempotent), so a SIGKILL
  neither registers twice nor leaks a proxy, but only as ``resend.py`` allows (backoff,
  never while a copy waits on the transmission queue). The diff runs only when the
  subscriptions, the active neighbours or the proxy rows changed.
* **Reading** the inter-broker queue: each message under syncpoint, handled or
  dead-lettered (junk; a StreamSupport refused by ``announced.py``), counted once its
  unit commits, logged through a SummarisedLog. One whose unit keeps failing (the
  dead-letter queue full or put-inhibited) is set aside at the queue's BOTHRESH: to its
  BOQNAME or the dead-letter queue, else discarded, so it never holds up the answers
  behind it.
* **StreamSupport**: our own retained ``MQ/<own>/StreamSupport`` (own serviced streams
  ∪ the streams shared with active neighbours) is published at start and whenever that
  union changes; a neighbour's narrows the common streams and counts as its answer.
  A legacy-profile broker (``fixed_streams``) supports only its own streams, as a V6
  broker does: it publishes those and shares no other stream with any neighbour.
* **Clear**: DeregSub every proxy and the admin subscription at N, drop N's proxy
  subscriptions here, forget N (only once they are put: a clear that cannot reach N is
  tried again).

Over 500 lines on purpose: join, probe, sync, StreamSupport and the reading of answers
share the in-memory joins (with the order and pairs the loop probes need), the active
set and the MsgIds awaiting answers; the pure
parts live beside it (``responses.py`` reads answers, ``stream_support.py`` the
administration publication, ``announced.py`` screens it, ``resend.py`` decides resends,
``transmission.py`` looks at the transmission queue, ``state.py`` keeps the durable
rows).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from gateway.log_summary import SummarisedLog
from gateway.mq.port import (
    Connection,
    GetOptions,
    Message,
    MQError,
    OpenOption,
    PutOptions,
    QueueAttr,
    QueueHandle,
    QueueManager,
)
from gateway.pubsub.admin_messages import admin_topic
from gateway.pubsub.neighbours import (
    PROBE_PREFIX,
    Neighbour,
    NeighbourRole,
    ProxyKey,
    admin_subscription,
    probe_publication,
    proxy_batch_command,
    proxy_batches,
    wanted_proxies,
)
from gateway.pubsub.outcome import OutboundMessage
from gateway.pubsub.records import Subscription
from gateway.pubsub.streams import ADMIN_STREAM, INTER_BROKER_QUEUE
from gateway.pubsub.topics import Scheme
from gateway.runtime.neighbours.announced import (
    ACCEPT_ALL,
    DEFAULT_MAX_STREAMS,
    screen_streams,
    stored_streams,
    valid_stream_name,
)
from gateway.runtime.neighbours.config import NeighbourConfig
from gateway.runtime.neighbours.resend import RETRY_PUT_AFTER, Resends
from gateway.runtime.neighbours.responses import Received, read_received
from gateway.runtime.neighbours.state import NeighbourRow, NeighbourState, ProxyRow
from gateway.runtime.neighbours.stream_support import (
    decode_stream_support,
    stream_support_command,
)
from gateway.runtime.neighbours.transmission import transmission_depth
from gateway.runtime.pubsub_service.dead_letter import dead_letter_queue_of
from gateway.wire.dlh import wrap_for_dlq
from gateway.wire.errors import WireError
from gateway.wire.reasons import Reason

__all__ = [
    "DEFAULT_BACKOUT_THRESHOLD",
    "HEARD_FLUSH_INTERVAL",
    "MIN_SYNC_SPACING",
    "READ_RETRY_MAX",
    "READ_RETRY_PAUSE",
    "LinkCounters",
    "NeighbourLinks",
    "Refusal",
]

log = logging.getLogger(__name__)

#: Syncs woken by the broker service run at least this far apart (seconds), and at
#: least SYNC_COST_FACTOR times the last round's duration (up to MAX_SYNC_SPACING).
MIN_SYNC_SPACING = 0.1
SYNC_COST_FACTOR = 9.0
MAX_SYNC_SPACING = 2.0
#: Last-heard is written to the state on this timer only (seconds).
HEARD_FLUSH_INTERVAL = 1.0
#: The inter-broker queue's backout threshold when it has no BOTHRESH (the broker's
#: ``default_backout_threshold`` when wired by ``attach.py``).
DEFAULT_BACKOUT_THRESHOLD = 5
#: After a failed unit of the reader: the pause (seconds), doubled per failure in a row
#: up to READ_RETRY_MAX; a message fails at most BOTHRESH times in a row.
READ_RETRY_PAUSE = 0.05
READ_RETRY_MAX = 1.0


@dataclass(slots=True)
class LinkCounters:
    """Commands per (neighbour, result): ``sent``, ``put_failed``, ``ok``, ``failed``;
    messages refused from the inter-broker queue per (neighbour, kind), the neighbour
    "" when it is none (a forger names what it likes: the labels stay bounded), each
    counted once, when what was done with it is committed (``backed_out`` and
    ``discarded``: set aside at BOTHRESH, see :meth:`NeighbourLinks._set_aside`)."""

    commands: Counter[tuple[str, str]] = field(default_factory=Counter)
    refused: Counter[tuple[str, str]] = field(default_factory=Counter)


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why a message from the inter-broker queue goes to the dead-letter queue."""

    reason: int
    kind: str
    text: str
    #: the known neighbour it names ("" when none), the label it is counted under
    q_mgr: str = ""


@dataclass(frozen=True, slots=True)
class _Note:
    """A count (and summarised log line) of the message being read, made once its unit
    of work commits: a message got again after a backout is not counted twice."""

    q_mgr: str
    kind: str
    n: int
    level: int
    msg: str
    args: tuple[object, ...]


@dataclass(slots=True)
class _Join:
    """A join in progress: the answer and the loop probe."""

    q_mgr: str
    support_msg_id: bytes
    probe_topic: str
    probe_msg_id: bytes
    deadline: float
    #: the neighbours the probe is published at (active or joining when it began)
    probed: tuple[str, ...] = ()
    answered: bool = False
    loop_via: str = ""
    #: order of the joins begun: of two joins that find the same loop, the later goes
    seq: int = 0
    #: neighbours the probe publication was put at (the pairs it checked)
    reached: set[str] = field(default_factory=set)
    #: later joins the probe may have come back through (refused if they activate)
    loop_through_later: set[str] = field(default_factory=set)


class NeighbourLinks:
    """The gateway's links to its neighbours (see module docstring).

    ``subscriptions`` returns the engine's subscriptions; ``set_neighbours`` is told the
    active neighbours (``engine.set_neighbours``) after each change;
    ``drop_subscriptions`` removes a cleared neighbour's proxy subscriptions here
    (``BrokerService.drop_neighbour_subscriptions``); ``configured`` are
    the neighbours of the configuration, joined at start unless already known;
    ``fixed_streams`` (legacy profile) are the only streams we support, instead of the
    union of our own and our neighbours'.
    """

    def __init__(
        self,
        qm: QueueManager,
        state: NeighbourState,
        *,
        subscriptions: Callable[[], Iterable[Subscription]],
        subscriptions_revision: Callable[[], int] | None = None,
        set_neighbours: Callable[[Mapping[str, Neighbour]], None] | None = None,
        drop_subscriptions: Callable[[str], Awaitable[int]] | None = None,
        configured: Sequence[NeighbourConfig] = (),
        own_streams: Collection[str] = (),
        fixed_streams: Collection[str] | None = None,
        clock: Callable[[], float] = time.time,
        sync_interval: float = 1.0,
        wait_ms: int = 200,
        dead_letter_queue: str = "SYSTEM.DEAD.LETTER.QUEUE",
        default_backout_threshold: int = DEFAULT_BACKOUT_THRESHOLD,
        log_interval: float = 60.0,
    ) -> None:
        self.qm = qm
        self.q_mgr = qm.name
        self.state = state
        self.counters = LinkCounters()
        self._subscriptions = subscriptions
        self._subscriptions_revision = subscriptions_revision
        #: what the last proxy diff saw (subscriptions, active neighbours, proxy rows):
        #: while it is the same, the diff is skipped
        self._diffed: tuple[object, ...] | None = None
        #: how long the last proxy diff took (seconds of the event loop: the pacing)
        self._diff_cost = 0.0
        self._set_neighbours = set_neighbours
        self._drop_subscriptions = drop_subscriptions
        self._configured = list(configured)
        self._own_streams = frozenset(own_streams)
        self._fixed = None if fixed_streams is None else frozenset(fixed_streams)
        #: the stream set of our last StreamSupport publication
        self._published: frozenset[str] | None = None
        self._clock = clock
        self._interval = sync_interval
        self._wait_ms = wait_ms
        #: where refused messages go when the queue manager names no DEADQ
        self._dead_letter_queue = dead_letter_queue
        #: the inter-broker queue's backout threshold when it has no BOTHRESH
        self._default_backout_threshold = default_backout_threshold
        #: junk and refused announcements: one line per kind per interval
        self._log = SummarisedLog(log, interval=log_interval)
        #: counts of the message being read, made once its unit commits
        self._notes: list[_Note] = []
        self._joins: dict[str, _Join] = {}
        self._join_seq = 0
        #: pairs of neighbours one of whose joins was probed through the other
        self._probed_pairs: set[frozenset[str]] = set()
        #: neighbours whose join could not be put: not begun again before this time
        self._join_after: dict[str, float] = {}
        #: admin-stream commands awaiting an answer: MsgId -> neighbour
        self._admin: dict[bytes, str] = {}
        #: proxy commands put and not answered yet, and when each neighbour was last
        #: heard from: when a command is put again (resend.py)
        self._resends = Resends()
        #: proxy commands of several topics the neighbour refused: each topic is sent
        #: again on its own at the next sync, so one bad topic blocks no other
        self._split: dict[bytes, None] = {}
        self._active: dict[str, Neighbour] = {}
        #: when each neighbour was last heard from, written to the state once a tick
        #: (never an fsync on the broker service's path)
        self._heard: dict[str, float] = {}
        self._wake = asyncio.Event()
        self._stop = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._send_conn: Connection | None = None
        self._lock = asyncio.Lock()

    # ------------------------------------------------------------- lifecycle -----

    @property
    def unanswered_commands(self) -> int:
        """Proxy commands sent that no response has settled yet."""
        return len(self._resends)

    @property
    def active(self) -> Mapping[str, Neighbour]:
        """The active neighbours, as the engine knows them."""
        return self._active

    async def start(self) -> None:
        """Define and open the inter-broker queue, apply the configuration, resend
        what was not answered before the last stop, and start serving."""
        define = getattr(self.qm, "run_mqsc", None)
        catalogue = getattr(self.qm, "catalogue", None)
        if (
            define is not None
            and catalogue is not None
            and INTER_BROKER_QUEUE not in (catalogue.queues)
        ):
            define(f"DEFINE QLOCAL('{INTER_BROKER_QUEUE}') DEFPSIST(YES)", stop_on_error=True)
        reader = await self.qm.connect()
        try:
            handle = await reader.open(
                INTER_BROKER_QUEUE, OpenOption.INPUT_SHARED | OpenOption.INQUIRE
            )
        except BaseException:
            await reader.disconnect()
            raise
        self._send_conn = await self.qm.connect()
        now = self._clock()
        for cfg in self._configured:
            row = self.state.neighbour(cfg.q_mgr)
            if row is None or not row.configured_as(cfg):
                self.state.request_join(cfg, now)
        self._screen_remembered()
        for row in self.state.neighbours():
            if row.state == "active":
                self._active[row.q_mgr] = self._shared(row)
            elif row.state == "inactive":
                self.state.set_state(row.q_mgr, "joining")
        self._publish_neighbours()
        self._stop.clear()
        self._tasks = [
            asyncio.create_task(self._read_loop(reader, handle), name="neighbours:read"),
            asyncio.create_task(self._tick_loop(), name="neighbours:tick"),
        ]

    def _screen_remembered(self) -> None:
        """Screen the stream lists ``neighbours.db`` remembers as a new announcement is
        (an older gateway kept whatever it was sent): what is not a valid, accepted name
        is forgotten, so it is neither shared nor advertised nor reported."""
        for row in self.state.neighbours():
            if row.learnt_streams is None:
                continue
            cfg = self._config_of(row.q_mgr)
            limit = cfg.max_streams if cfg is not None else DEFAULT_MAX_STREAMS
            allowed = stored_streams(
                row.learnt_streams,
                accept=cfg.accept_streams if cfg is not None else ACCEPT_ALL,
                max_streams=len(row.learnt_streams),
            )
            kept = allowed if len(allowed) <= limit else ()
            if kept == row.learnt_streams:
                continue
            self.state.set_learnt_streams(row.q_mgr, kept)
            if kept != allowed:
                # An upgrade from a gateway without the limit: say what to set.
                log.warning(
                    "neighbour %s: the %d remembered stream(s) it may share are more than "
                    "its max_streams (%d): forgotten, only the default stream is shared "
                    "with it (raise its max_streams, docs/operations.md \"Upgrading\")",
                    row.q_mgr, len(allowed), limit,
                )
            else:
                log.warning(
                    "neighbour %s: %d of the %d remembered stream(s) are not valid or not "
                    "accepted by its accept_streams: forgotten", row.q_mgr,
                    len(row.learnt_streams) - len(kept), len(row.learnt_streams),
                )

    async def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        tasks, self._tasks = self._tasks, []
        await asyncio.gather(*tasks, return_exceptions=True)
        conn, self._send_conn = self._send_conn, None
        if conn is not None:
            with contextlib.suppress(MQError):
                await conn.disconnect()

    def wake(self, heard: Collection[str] = ()) -> None:
        """Hook of the broker service after each committed unit: ``heard`` are the
        queue managers its messages came from (ReplyToQMgr). Syncs soon."""
        now = self._clock()
        for q_mgr in heard:
            if q_mgr in self._active or q_mgr in self._joins:
                self._heard[q_mgr] = now
                self._resends.heard(q_mgr, now)
        self._wake.set()

    def flush_heard(self) -> None:
        """Write when each neighbour was last heard from to the state (on the
        ``HEARD_FLUSH_INTERVAL`` timer: never an fsync per commit of the service)."""
        heard, self._heard = self._heard, {}
        for q_mgr, when in heard.items():
            self.state.heard(q_mgr, when)

    # ------------------------------------------------------------- the ticker ----

    async def _tick_loop(self) -> None:
        loop = asyncio.get_running_loop()
        next_flush = loop.time()
        while not self._stop.is_set():
            started = loop.time()
            self._wake.clear()
            flush = started >= next_flush
            if flush:
                next_flush = started + HEARD_FLUSH_INTERVAL
            try:
                await self.tick(flush_heard=flush)
            except MQError as exc:
                log.warning("neighbour links: %s (trying again)", exc)
            except Exception:
                log.exception("neighbour links: tick failed")
            timeout = min(self._interval, max(0.0, next_flush - loop.time()) + 0.001)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout=timeout)
            # Woken after every commit of a busy service: at most one sync per spacing,
            # and a long proxy diff (over many subscriptions) is followed by a pause
            # SYNC_COST_FACTOR times as long, so a flood of commands is not
            # answered by a full diff per commit (registering N proxies stays O(N)).
            cost = SYNC_COST_FACTOR * self._diff_cost
            spacing = min(max(MIN_SYNC_SPACING, cost), MAX_SYNC_SPACING)
            rest = spacing - (loop.time() - started)
            if rest > 0:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stop.wait(), timeout=rest)

    async def tick(self, *, flush_heard: bool = True) -> None:
        """One round: CLI requests, joins in progress, proxy sync (also for tests);
        last-heard written too when ``flush_heard`` (the timer's rounds)."""
        async with self._lock:
            if flush_heard:
                self.flush_heard()
            for row in self.state.neighbours():
                if row.clear_requested:
                    await self._clear(row)
                elif (
                    row.state == "joining"
                    and row.q_mgr not in self._joins
                    and self._join_after.get(row.q_mgr, 0.0) <= self._clock()
                ):
                    await self._begin_join(row)
            await self._progress_joins()
            await self._sync()
            await self._publish_stream_support()

    async def _begin_join(self, row: NeighbourRow) -> None:
        if row.q_mgr == self.q_mgr:
            # `join --data-dir` cannot know our queue manager: refused here.
            self._refuse(row.q_mgr, f"{row.q_mgr} is our own queue manager")
            return
        if row.role is NeighbourRole.PARENT:
            parents = [
                r.q_mgr
                for r in self.state.neighbours()
                if r.role is NeighbourRole.PARENT and r.q_mgr != row.q_mgr and r.state != "refused"
            ]
            if parents:
                self._refuse(row.q_mgr, f"a broker has one parent: {parents[0]} is the parent")
                return
        n = row.neighbour
        support_id, probe_id = os.urandom(24), os.urandom(24)
        probe_topic = f"{PROBE_PREFIX}{self.q_mgr}/{os.urandom(8).hex()}"
        # Probed through every other neighbour, active or still joining (finding: two
        # neighbours configured together must see each other).
        joining = {r.q_mgr for r in self.state.neighbours() if r.state == "joining"}
        others = tuple(sorted((set(self._active) | set(self._joins) | joining) - {row.q_mgr}))
        self._join_seq += 1
        join = _Join(
            row.q_mgr,
            support_id,
            probe_topic,
            probe_id,
            self._clock() + (row.probe_timeout if others else 0.0),
            others,
            seq=self._join_seq,
        )
        self._joins[row.q_mgr] = join
        self._admin[support_id] = row.q_mgr
        self._admin[probe_id] = row.q_mgr
        msgs = [self._admin_sub(n, admin_topic("StreamSupport", n.q_mgr), True, support_id)]
        if others:
            msgs.append(self._admin_sub(n, probe_topic, True, probe_id))
        log.info("joining neighbour %s (%s, %s)", row.q_mgr, row.kind, row.role)
        if await self._put(msgs):
            # Not sent: begun again after RETRY_PUT_AFTER.
            del self._joins[row.q_mgr]
            self._join_after[row.q_mgr] = self._clock() + RETRY_PUT_AFTER

    async def _progress_joins(self) -> None:
        now = self._clock()
        for q_mgr, join in list(self._joins.items()):
            if join.loop_via:
                # Refused (see _on_probe): withdraw what the join registered at N.
                del self._joins[q_mgr]
                await self._withdraw_probe(join)
                await self._withdraw_refused(q_mgr)
                continue
            if now < join.deadline:
                # Published on every tick of the window: the probe subscription needs
                # time to be relayed through the network (a hop per sync).
                targets = [m for m in join.probed if m in self._active or m in self._joins]
                failed = await self._put(
                    [probe_publication(m, join.probe_topic, self_q_mgr=self.q_mgr) for m in targets]
                )
                join.reached.update(m for m in targets if m not in failed)
                continue
            if join.probed:
                await self._withdraw_probe(join)
            row = self.state.neighbour(q_mgr)
            if row is None:
                del self._joins[q_mgr]
                continue
            if join.answered:
                self._probed_pairs.update(frozenset((q_mgr, m)) for m in join.reached)
                earlier = [
                    j.q_mgr
                    for j in self._joins.values()
                    if q_mgr in j.loop_through_later and j.seq < join.seq
                ]
                if earlier:
                    # An earlier join's probe came back through this one: a loop.
                    join.loop_via = earlier[0]
                    self._refuse(q_mgr, f"loop: {q_mgr} is already reachable through {earlier[0]}")
                    continue
                unprobed = tuple(
                    sorted(
                        m
                        for m in self._active
                        if m != q_mgr and frozenset((q_mgr, m)) not in self._probed_pairs
                    )
                )
                if unprobed:
                    await self._probe_again(row, join, unprobed)
                    continue
                del self._joins[q_mgr]
                self._activate(row)
            elif row.state != "inactive":
                self.state.set_state(q_mgr, "inactive")
                log.info("neighbour %s has not answered yet: inactive", q_mgr)

    async def _probe_again(self, row: NeighbourRow, join: _Join, through: tuple[str, ...]) -> None:
        """``row`` answered but was never probed through ``through`` (active now): a new
        probe window before it becomes active."""
        join.probe_topic = f"{PROBE_PREFIX}{self.q_mgr}/{os.urandom(8).hex()}"
        join.probe_msg_id = os.urandom(24)
        join.probed, join.reached = through, set()
        join.deadline = self._clock() + row.probe_timeout
        self._admin[join.probe_msg_id] = row.q_mgr
        log.info("probing %s again, through %s", row.q_mgr, ", ".join(through))
        if await self._put(
            [self._admin_sub(row.neighbour, join.probe_topic, True, join.probe_msg_id)]
        ):
            join.probed = ()  # not registered: tried again when the window ends

    async def _withdraw_refused(self, q_mgr: str) -> None:
        """A refused neighbour: DeregSub its admin subscription and every proxy
        registered there by an earlier join (rows dropped once put)."""
        row = self.state.neighbour(q_mgr)
        if row is None:
            return
        n = row.neighbour
        msgs = [self._admin_sub(n, admin_topic("StreamSupport", q_mgr), False)]
        msgs += self._withdrawals(n, self.state.proxies(q_mgr))
        if not await self._put(msgs):
            self.state.drop_proxies(q_mgr)

    async def _withdraw_probe(self, join: _Join) -> None:
        row = self.state.neighbour(join.q_mgr)
        if row is None or not join.probed:
            return
        await self._put([self._admin_sub(row.neighbour, join.probe_topic, False)])
        join.probed = ()

    def _activate(self, row: NeighbourRow) -> None:
        self.state.set_state(row.q_mgr, "active")
        fresh = self.state.neighbour(row.q_mgr)
        assert fresh is not None
        self._active[row.q_mgr] = self._shared(fresh)
        self._publish_neighbours()
        log.info(
            "neighbour %s is active; common streams %s",
            row.q_mgr,
            ", ".join(sorted(fresh.common_streams)),
        )

    def _refuse(self, q_mgr: str, text: str) -> None:
        self.state.set_state(q_mgr, "refused", text)
        self._active.pop(q_mgr, None)
        self._publish_neighbours()
        log.error("join of neighbour %s refused: %s", q_mgr, text)

    def _shared(self, row: NeighbourRow) -> Neighbour:
        """The neighbour as the engine sees it: its common streams, within our fixed
        streams when we have them (a legacy broker shares no stream it lacks)."""
        n = row.neighbour
        if any(c.q_mgr == n.q_mgr and c.publish == "all" for c in self._configured):
            n = dataclasses.replace(n, publish_all=True)
        if self._fixed is None:
            return n
        return dataclasses.replace(n, streams=n.streams & self._fixed)

    @property
    def supported_streams(self) -> frozenset[str]:
        """What we tell our neighbours we support: our own serviced streams and every
        stream we share with an active neighbour (the seed's stream union); the fixed
        streams of a legacy broker."""
        if self._fixed is not None:
            return self._fixed
        union = set(self._own_streams)
        for n in self._active.values():
            union |= n.streams
        return frozenset(union)

    async def _publish_stream_support(self) -> None:
        """Our retained StreamSupport, at start and whenever the union changes."""
        streams = self.supported_streams
        if streams == self._published:
            return
        msg = stream_support_command(self.q_mgr, streams, self._clock())
        conn = self._send_conn
        assert conn is not None
        await conn.put1(msg.queue, msg.md, msg.body)
        self._published = streams
        log.info("published StreamSupport: %s", ", ".join(sorted(streams)))

    def _publish_neighbours(self) -> None:
        if self._set_neighbours is not None:
            self._set_neighbours(dict(self._active))

    # ------------------------------------------------------------- proxy sync ----

    def wanted(
        self, neighbour: Neighbour, subs: Sequence[Subscription] | None = None
    ) -> Counter[ProxyKey]:
        """Proxy subscriptions wanted at ``neighbour``: local interest, plus the probe
        subscriptions other brokers hold here, to relay (module docstring); a probe
        comes from a broker that is joining and so is not a neighbour yet. ``subs``:
        the engine's subscriptions, read once per sync."""
        if subs is None:
            subs = list(self._subscriptions())
        want = wanted_proxies(subs, neighbour, self._active.keys())
        for s in subs:
            q = s.destination.q_mgr
            if (
                s.stream == ADMIN_STREAM
                and s.topic.startswith(PROBE_PREFIX)
                and q not in ("", self.q_mgr, neighbour.q_mgr)
            ):
                want[ProxyKey(ADMIN_STREAM, s.topic, int(Scheme.TOPIC))] += 1
        return want

    async def _sync(self) -> None:
        now = self._clock()
        msgs: list[OutboundMessage] = []
        intents: list[tuple[str, ProxyKey, bytes, bool]] = []
        seen = (
            None if self._subscriptions_revision is None else self._subscriptions_revision(),
            tuple(self._active.items()),
            self.state.proxies_revision,
        )
        unchanged = seen[0] is not None and seen == self._diffed
        diff_started = time.perf_counter()
        subs = list(self._subscriptions()) if self._active and not unchanged else []
        for q_mgr, n in self._active.items() if not unchanged else ():
            want = self.wanted(n, subs)
            have = self.state.proxy_map(q_mgr)
            register: list[ProxyKey] = []
            for key in sorted(want):
                p = have.get(key)
                if p is None or p.withdrawing:
                    register.append(key)
            withdraw = sorted(
                key for key, p in have.items() if key not in want and not p.withdrawing
            )
            # New proxies of one stream travel as few commands (proxy_batches).
            for batch in proxy_batches(register):
                msgs.append(self._proxy(n, batch, True, intents))
            for batch in proxy_batches(withdraw):
                msgs.append(self._proxy(n, batch, False, intents))
        if not unchanged:
            self._diff_cost = time.perf_counter() - diff_started
        msgs += self._split_refused(intents)
        # The intents are durable before the puts are committed (module docstring).
        self.state.intend_many(intents)
        self._diffed = (seen[0], seen[1], self.state.proxies_revision)
        fresh = {m.md.msg_id for m in msgs}
        depths: dict[str, int | None] = {}
        commands: dict[bytes, list[ProxyKey]] = {}
        for p in self.state.unsettled_proxies():
            n_ = self._active.get(p.q_mgr)
            if n_ is None or p.msg_id in fresh:
                continue
            if p.refused and not p.withdrawing and now < p.retry_at:
                continue  # refused: sent again after its backoff (state.py)
            commands.setdefault(p.msg_id, []).append(p.key)
        for msg_id in commands:
            first = self.state.command_rows(msg_id)
            if not first:
                continue
            q_mgr, withdrawing = first[0].q_mgr, first[0].withdrawing
            if not await self._resend_due(q_mgr, msg_id, now, depths):
                continue
            n_ = self._active.get(q_mgr)  # (the reader may have changed it meanwhile)
            if n_ is None:
                continue
            # Not answered (or never put: a crash, a failed put): send it again, with
            # every topic it carried still waiting.
            msgs.append(proxy_batch_command(
                n_, [r.key for r in first], register=not withdrawing,
                self_q_mgr=self.q_mgr, msg_id=msg_id,
            ))
        await self._put(msgs)
        # Only unanswered proxy commands are remembered (settled, cleared and admin
        # commands are dropped), so this does not grow with every command ever sent.
        if len(self._resends) > len(commands):
            waiting = {p.msg_id for p in self.state.unsettled_proxies()}
            if len(self._resends) > len(waiting):
                self._resends.keep_only(waiting)

    def _split_refused(
        self, intents: list[tuple[str, ProxyKey, bytes, bool]]
    ) -> list[OutboundMessage]:
        """A refused command of several topics, each topic again on its own (its own
        MsgId and intent): a topic the neighbour refuses is then refused alone, and a
        DeregSub's rows go only as their own answers say."""
        msgs: list[OutboundMessage] = []
        split, self._split = self._split, {}
        for msg_id in split:
            for row in self.state.command_rows(msg_id):
                n = self._active.get(row.q_mgr)
                if n is not None:
                    msgs.append(self._proxy(n, [row.key], not row.withdrawing, intents))
        return msgs

    async def _resend_due(
        self, q_mgr: str, msg_id: bytes, now: float, depths: dict[str, int | None]
    ) -> bool:
        """May the unanswered command ``msg_id`` to ``q_mgr`` be put again now
        (resend.py)? ``depths`` caches the transmission queue depths for one sync."""
        if not self._resends.looked_at(msg_id, now):
            return False
        if q_mgr not in depths:
            conn = self._send_conn
            depths[q_mgr] = (
                None if conn is None else await transmission_depth(self.qm, conn, q_mgr)
            )
        depth = depths[q_mgr]
        return self._resends.due(q_mgr, msg_id, now, None if depth is None else depth > 0)

    def _admin_sub(
        self, n: Neighbour, topic: str, register: bool, msg_id: bytes | None = None
    ) -> OutboundMessage:
        return admin_subscription(
            n, topic, register=register, self_q_mgr=self.q_mgr, msg_id=msg_id or os.urandom(24)
        )

    def _proxy(
        self,
        n: Neighbour,
        keys: Sequence[ProxyKey],
        register: bool,
        intents: list[tuple[str, ProxyKey, bytes, bool]],
    ) -> OutboundMessage:
        """A new command for ``keys`` (one batch); its intents are added to ``intents``
        (written before the put)."""
        msg_id = os.urandom(24)
        intents.extend((n.q_mgr, key, msg_id, register) for key in keys)
        return proxy_batch_command(
            n, keys, register=register, self_q_mgr=self.q_mgr, msg_id=msg_id
        )

    def _withdrawals(self, n: Neighbour, proxies: Iterable[ProxyRow]) -> list[OutboundMessage]:
        """DeregSubs of every one of ``proxies`` at ``n``, batched, no intents (clear)."""
        return [
            proxy_batch_command(
                n, batch, register=False, self_q_mgr=self.q_mgr, msg_id=os.urandom(24)
            )
            for batch in proxy_batches(p.key for p in proxies)
        ]

    async def _put(self, msgs: Sequence[OutboundMessage]) -> set[str]:
        """Put ``msgs``, one unit of work per neighbour, so one that cannot be reached
        (no route, transmission queue full) holds back only its own commands. Returns
        the neighbours whose unit failed (their commands are sent again later)."""
        conn = self._send_conn
        if conn is None:
            raise MQError(Reason.HCONN_ERROR, "neighbour links are not started")
        now = self._clock()
        failed: set[str] = set()
        units: dict[str, list[OutboundMessage]] = {}
        for m in msgs:
            units.setdefault(m.q_mgr, []).append(m)
        for q_mgr, unit in units.items():
            try:
                for m in unit:
                    await conn.put1(m.queue, m.md, m.body, PutOptions(syncpoint=True), m.q_mgr)
                await conn.commit()
            except MQError as exc:
                with contextlib.suppress(MQError):
                    await conn.backout()
                failed.add(q_mgr)
                text = f"cannot put to {q_mgr}: {exc}"
                log.warning("neighbour links: %s (trying again)", text)
                self.state.set_last_error(q_mgr, text)
                for m in unit:
                    # Tried again after its retry delay (doubling), not on every tick.
                    self._resends.put_failed(m.md.msg_id, now)
                    self.counters.commands[(q_mgr, "put_failed")] += 1
                continue
            for m in unit:
                self._resends.put(m.md.msg_id, now)
                self.counters.commands[(q_mgr, "sent")] += 1
        return failed

    # ------------------------------------------------------------- clear ---------

    async def _clear(self, row: NeighbourRow) -> None:
        """DeregSub every proxy and the admin subscription at ``row``, then forget it."""
        n = row.neighbour
        join = self._joins.pop(row.q_mgr, None)
        if join is not None:
            await self._withdraw_probe(join)
        proxies = self.state.proxies(row.q_mgr)
        msgs = self._withdrawals(n, proxies)
        msgs.append(self._admin_sub(n, admin_topic("StreamSupport", n.q_mgr), False))
        if await self._put(msgs):
            return  # cannot reach it now: the request stays, tried again next tick
        # Its proxies here go before it stops being a neighbour: left until its
        # DeregSubs came, each would be an ordinary subscription meanwhile, and two
        # brokers that cleared each other would pass each publication back and forth.
        dropped = 0
        if self._drop_subscriptions is not None:
            dropped = await self._drop_subscriptions(row.q_mgr)
        self.state.forget(row.q_mgr)
        self._active.pop(row.q_mgr, None)
        self._publish_neighbours()
        log.info(
            "neighbour %s cleared (%d proxy subscriptions withdrawn, %d of its dropped here)",
            row.q_mgr, len(proxies), dropped,
        )

    # ------------------------------------------------------------- reading -------

    async def _read_loop(self, conn: Connection, handle: QueueHandle) -> None:
        """Get each message under syncpoint: handled, or dead-lettered with the MQDLH
        reason :meth:`received` gives, then committed (nothing is dropped unless it can
        be put nowhere). A message whose unit fails (its dead-letter put or the commit)
        comes back with BackoutCount + 1, after a pause; at the queue's BOTHRESH it is
        set aside unread (:meth:`_set_aside`), so one message that cannot be
        dead-lettered holds up the answers behind it for a bounded time only."""
        dlq, _ = await dead_letter_queue_of(handle, self._dead_letter_queue)
        threshold, boq = await self._backout_settings(handle)
        failures = 0
        try:
            while not self._stop.is_set():
                try:
                    m = await handle.get(GetOptions(wait_ms=self._wait_ms, syncpoint=True))
                except MQError as exc:
                    if exc.reason != Reason.NO_MSG_AVAILABLE:
                        log.warning("reading %s: %s", INTER_BROKER_QUEUE, exc)
                        await asyncio.sleep(0.5)
                    continue
                if m.md.backout_count >= threshold:
                    done = await self._set_aside(conn, m, dlq, boq)
                else:
                    done = await self._take(conn, m, dlq)
                if done:
                    failures = 0
                    continue
                failures += 1
                pause = min(READ_RETRY_MAX, READ_RETRY_PAUSE * 2 ** min(failures - 1, 16))
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stop.wait(), timeout=pause)
        finally:
            self._log.flush()
            with contextlib.suppress(MQError):
                await handle.close()
            with contextlib.suppress(MQError):
                await conn.disconnect()

    async def _backout_settings(self, handle: QueueHandle) -> tuple[int, str]:
        """The inter-broker queue's BOTHRESH (the default when it has none) and
        BOQNAME, as the broker service reads its queues'."""
        threshold, boq = 0, ""
        try:
            attrs = await handle.inquire(QueueAttr.BACKOUT_THRESHOLD, QueueAttr.BACKOUT_REQ_Q_NAME)
            threshold = int(attrs.get(QueueAttr.BACKOUT_THRESHOLD, 0) or 0)
            boq = str(attrs.get(QueueAttr.BACKOUT_REQ_Q_NAME, "")).strip()
        except (MQError, ValueError, TypeError) as exc:
            log.warning(
                "cannot inquire BOTHRESH/BOQNAME of %s (%s): using defaults",
                INTER_BROKER_QUEUE, exc,
            )
        return (threshold if threshold > 0 else self._default_backout_threshold), boq

    async def _take(self, conn: Connection, m: Message, dlq: str) -> bool:
        """Handle ``m`` (:meth:`received`), dead-letter it when refused, commit; count
        it once committed. False when the unit failed (backed out: ``m`` comes back)."""
        self._notes.clear()
        try:
            refusal = self.received(m)
        except Exception as exc:  # a bug: the message is kept on the DLQ
            self._notes.clear()
            refusal = self._refuse_message(
                "", "unhandled", Reason.UNEXPECTED_ERROR,
                f"a message that could not be handled ({exc!r})",
            )
        try:
            if refusal is not None:
                dl_md, dl_body = wrap_for_dlq(
                    m.md, m.body, refusal.reason, INTER_BROKER_QUEUE,
                    self.q_mgr[:48], self.q_mgr[:28],
                )
                await conn.put1(
                    dlq, dl_md, dl_body, PutOptions(syncpoint=True, set_all_context=True)
                )
            await conn.commit()
        except MQError as exc:
            self._notes.clear()
            with contextlib.suppress(MQError):
                await conn.backout()
            if refusal is not None:
                self._log.log(
                    logging.ERROR, "dlq-failed",
                    "cannot dead-letter a refused message from %s on %s: %s (kept on %s, "
                    "tried again until backed out %d times)",
                    INTER_BROKER_QUEUE, dlq, exc, INTER_BROKER_QUEUE, m.md.backout_count + 1,
                )
            else:
                self._log.log(
                    logging.ERROR, "commit-failed",
                    "cannot commit a message taken from %s: %s (tried again)",
                    INTER_BROKER_QUEUE, exc,
                )
            return False
        notes, self._notes = self._notes, []
        for note in notes:
            self.counters.refused[(note.q_mgr, note.kind)] += note.n
            self._log.log(note.level, note.kind, note.msg, *note.args)
        return True

    async def _set_aside(self, conn: Connection, m: Message, dlq: str, boq: str) -> bool:
        """``m`` was backed out BOTHRESH times: not read again, but moved as is to the
        queue's BOQNAME, else (or when that put fails) to the dead-letter queue behind
        an MQDLH (MQRC_BACKED_OUT); when neither takes it (full, put-inhibited), it is
        discarded, so the queue moves on (a lost answer is sent for again:
        ``resend.py``). Counted (``backed_out``, ``discarded``) and logged in summary.
        False when even the commit failed (``m`` comes back)."""
        opts = PutOptions(syncpoint=True, set_all_context=True)
        moved_to, errors = "", []
        for target in dict.fromkeys(q for q in (boq, dlq) if q):
            try:
                if target == boq:
                    await conn.put1(target, m.md, m.body, opts)
                else:
                    dl_md, dl_body = wrap_for_dlq(
                        m.md, m.body, Reason.BACKED_OUT, INTER_BROKER_QUEUE,
                        self.q_mgr[:48], self.q_mgr[:28],
                    )
                    await conn.put1(target, dl_md, dl_body, opts)
            except MQError as exc:
                errors.append(f"{target}: {exc}")
                continue
            moved_to = target
            break
        try:
            await conn.commit()
        except MQError as exc:
            with contextlib.suppress(MQError):
                await conn.backout()
            self._log.log(
                logging.ERROR, "commit-failed",
                "cannot commit a message taken from %s: %s (tried again)",
                INTER_BROKER_QUEUE, exc,
            )
            return False
        if moved_to:
            self.counters.refused[("", "backed_out")] += 1
            self._log.log(
                logging.WARNING, "backed_out",
                "message on %s backed out %d times: moved to %s",
                INTER_BROKER_QUEUE, m.md.backout_count, moved_to,
            )
        else:
            self.counters.refused[("", "discarded")] += 1
            self._log.log(
                logging.ERROR, "discarded",
                "message on %s (MsgId %s) backed out %d times and no queue takes it "
                "(%s): discarded",
                INTER_BROKER_QUEUE, m.md.msg_id.hex(), m.md.backout_count, "; ".join(errors),
            )
        return True

    def received(self, m: Message) -> Refusal | None:
        """Handle one message from the inter-broker queue: a response to one of our
        commands, a probe that came back, an admin publication. Returns why it is
        refused (it goes to the dead-letter queue), None when it was taken. What it
        refuses is counted and logged once the read loop committed it (``_notes``)."""
        r = read_received(m.md, m.body)
        if r is None:
            return self._refuse_message(
                "", "not_pubsub", Reason.FORMAT_ERROR, "a message that is no pub/sub message"
            )
        refusal = None
        if r.is_response:
            self._on_response(m.md.correl_id, r)
        elif r.topic.startswith(PROBE_PREFIX):
            self._on_probe(r)
        elif r.topic.endswith("/StreamSupport"):
            try:
                support = decode_stream_support(m.md, m.body)
            except WireError as exc:
                refusal = self._refuse_message(
                    "", "bad_stream_support", exc.reason,
                    f"a StreamSupport publication that cannot be read ({exc})",
                )
            else:
                if support is not None:
                    refusal = self._on_stream_support(*support)
        if refusal is None and r.q_mgr and (r.q_mgr in self._active or r.q_mgr in self._joins):
            self._heard[r.q_mgr] = self._clock()
            self._resends.heard(r.q_mgr, self._heard[r.q_mgr])
        self._wake.set()
        return refusal

    def _refuse_message(self, q_mgr: str, kind: str, reason: int, what: str) -> Refusal:
        """A message refused from the inter-broker queue; the caller dead-letters it,
        and once that is committed it is counted and logged (summarised per kind).
        ``q_mgr``: the neighbour it names when that is a known one ("" otherwise: the
        counters' labels stay bounded)."""
        self._notes.append(
            _Note(
                q_mgr, kind, 1, logging.WARNING,
                "%s%s refused: %s; dead-lettered with reason %d",
                (INTER_BROKER_QUEUE, f" (neighbour {q_mgr})" if q_mgr else "", what, reason),
            )
        )
        return Refusal(reason, kind, what, q_mgr)

    def _on_response(self, correl_id: bytes, r: Received) -> None:
        q_mgr = self._admin.pop(correl_id, None)
        text = f"reason {r.reason} {r.reason_text}".strip()
        row = None
        if q_mgr is None:
            covered = self.state.command_rows(correl_id)
            if len(covered) > 1 and not r.ok:
                # Refused as a whole: each topic is sent again on its own (next sync).
                self._split[correl_id] = None
                self._resends.settled(correl_id)
                q_mgr = covered[0].q_mgr
                self.counters.commands[(q_mgr, "split")] += 1
                log.info(
                    "neighbour %s refused a proxy command of %d topics (%s): sending "
                    "each on its own", q_mgr, len(covered), text,
                )
                self._heard[q_mgr] = self._clock()
                self._resends.heard(q_mgr, self._heard[q_mgr])
                self._wake.set()
                return
            rows = self.state.settle_all(correl_id, r.ok, reason=text, now=self._clock())
            row = rows[0] if rows else None
        if row is not None:
            q_mgr = row.q_mgr
            self._resends.settled(correl_id)
        if q_mgr is None:
            return  # a late answer to a command we no longer wait for
        self._heard[q_mgr] = self._clock()
        self._resends.heard(q_mgr, self._heard[q_mgr])
        self.counters.commands[(q_mgr, "ok" if r.ok else "failed")] += 1
        join = self._joins.get(q_mgr)
        if not r.ok:
            what = f"proxy {row.key.stream} {row.key.topic!r}" if row else "admin"
            note = f"{what} command refused: {text}"
            if row is not None and not row.withdrawing and row.refused == text:
                # The same refusal again (after its backoff): logged once per change.
                log.debug("neighbour %s: %s (again)", q_mgr, note)
            else:
                log.warning("neighbour %s: %s", q_mgr, note)
            self.state.set_last_error(q_mgr, note)
            return
        if join is not None and correl_id == join.support_msg_id:
            join.answered = True
            self._wake.set()

    def _on_stream_support(self, q_mgr: str, announced: tuple[str, ...]) -> Refusal | None:
        """A neighbour said which streams it supports: screened (announced.py), they
        narrow (or, unconfigured, make) the common streams, and count as its answer to
        a join. One from a queue manager that is no neighbour, or a list with a name
        that is no MQ name or longer than the neighbour's ``max_streams``, is refused
        whole: nothing of it is kept, advertised or activated."""
        q_mgr = q_mgr.rstrip(" ")
        row = self.state.neighbour(q_mgr) if valid_stream_name(q_mgr) else None
        if row is None:
            return self._refuse_message(
                "", "unknown_broker", Reason.UNKNOWN_BROKER,
                "a StreamSupport publication of a queue manager that is no neighbour",
            )
        if row.state == "refused" or row.clear_requested:
            return None  # late (our subscription is withdrawn): taken, nothing kept
        cfg = self._config_of(q_mgr)
        screened = screen_streams(
            announced,
            accept=cfg.accept_streams if cfg is not None else ACCEPT_ALL,
            max_streams=cfg.max_streams if cfg is not None else DEFAULT_MAX_STREAMS,
        )
        if screened.refusal:
            reason = (
                Reason.CFSL_COUNT_ERROR if screened.refusal == "too_many" else Reason.STREAM_ERROR
            )
            return self._refuse_message(
                q_mgr, f"stream_support_{screened.refusal}", reason,
                f"a StreamSupport publication: {screened.detail}",
            )
        if screened.not_allowed:
            self._notes.append(
                _Note(
                    q_mgr, "stream_not_accepted", screened.not_allowed, logging.INFO,
                    "neighbour %s supports %d stream(s) its accept_streams do not take "
                    "(not shared)", (q_mgr, screened.not_allowed),
                )
            )
        streams = screened.streams
        if self._fixed is not None:  # what we can share of it (`list` shows this too)
            streams = tuple(s for s in streams if s in self._fixed)
        self.state.set_learnt_streams(q_mgr, streams)
        join = self._joins.get(q_mgr)
        if join is not None:
            join.answered = True
        row = self.state.neighbour(q_mgr)
        if row is not None and q_mgr in self._active:
            self._active[q_mgr] = self._shared(row)
            self._publish_neighbours()
        log.info("neighbour %s supports %s", q_mgr, ", ".join(streams) or "no stream")
        return None

    def _config_of(self, q_mgr: str) -> NeighbourConfig | None:
        return next((c for c in self._configured if c.q_mgr == q_mgr), None)

    def _on_probe(self, r: Received) -> None:
        """A probe came back: the join's neighbour is reachable another way. Refused
        unless every neighbour it may have come through is a later join (that one is
        refused instead, by its own probe or when it would become active)."""
        for join in self._joins.values():
            if r.topic != join.probe_topic or join.loop_via:
                continue
            through: list[str] = []
            later: set[str] = set()
            for m in join.probed:
                other = self._joins.get(m)
                if other is None:
                    if m in self._active:
                        through.append(m)
                elif other.loop_via:
                    continue
                elif other.seq > join.seq:
                    later.add(m)
                else:
                    through.append(m)
            if not through:
                # Only through later joins (or neighbours refused or cleared since).
                join.loop_through_later |= later
                return
            via = ", ".join(through)
            join.loop_via = via
            self._refuse(join.q_mgr, f"loop: {join.q_mgr} is already reachable through {via}")
            return
