"""The retained publications a move of a stream copies from the old owner to the new
one (``mqgw streams move``, step ``retained``). Pure: the caller reads the old owner's
pub/sub store and puts the messages.

Why a copy: after the move, publishers' publications are taken by the new owner, which
keeps the retained ones its broker took itself, plus copies of the old owner's that a
proxy subscription brought it (a topic one of its subscribers matched). A topic only
the old owner held would be missing there: a new subscriber at the new owner would not
get it, and a neighbour's new proxy would not either.

Why as the old owner's forwarded publications (docs/neighbours.md): each copy is the
Publish command the old owner sends a neighbour gateway's proxy for a retained
publication — its ``QMgrName``, ``RetainPub``, the MsgId the publication was first put
with. The new owner keeps it retained, never sends it back to the old owner, and takes
one it already holds (same MsgId and data) for a replay and delivers it to nobody once
the unit of work that stored it has committed; so a copy put twice (a move run again
after a crash) is kept once and delivered once (again only if the new owner crashed
between its store's commit and its MQ commit: at least once, never lost). Put on the
new owner's stream queue after the drain and before the held publications are released
there, the copies come before any later publication of the same topic.
"""

from __future__ import annotations

import time
from collections.abc import Iterable

from gateway.pubsub.deliveries import build_delivery
from gateway.pubsub.options import RegOpt
from gateway.pubsub.records import Destination, RetainedPublication, SubFormat, Subscription
from gateway.pubsub.topics import Scheme
from gateway.wire.mqmd import MQMD

__all__ = ["retained_copies"]


def retained_copies(
    retained: Iterable[RetainedPublication],
    stream: str,
    *,
    from_q_mgr: str,
    to_q_mgr: str,
    now: float | None = None,
) -> list[tuple[MQMD, bytes]]:
    """The old owner's forwarded Publish (MQRFH2, as between gateway neighbours) of each
    retained publication of ``stream`` that may leave it (not published Local, not
    expired), in topic order: MQMD and body to put on ``to_q_mgr``'s stream queue."""
    at = time.time() if now is None else now
    proxy = Subscription(
        stream=stream, topic="#", scheme=Scheme.TOPIC,
        destination=Destination(q_mgr=to_q_mgr, queue=stream), fmt=SubFormat.RFH2,
        reg_opts=int(RegOpt.PERSISTENT_AS_PUBLISH),
    )
    out: list[tuple[MQMD, bytes]] = []
    for ret in sorted(retained, key=lambda r: r.topic):
        pub = ret.publication
        if ret.stream != stream or pub.local:
            continue
        held = max(0.0, at - ret.stored_at)
        if pub.expiry > 0 and held * 10 >= pub.expiry:
            continue  # expired while held
        out.append(build_delivery(pub, proxy, ret.topic, retained=True,
                                  broker_q_mgr=from_q_mgr, now=at, held_for=held,
                                  forward_as=SubFormat.RFH2))
    return out
