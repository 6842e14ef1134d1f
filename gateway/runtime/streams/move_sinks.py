"""The broker commands step ``sinks`` of ``mqgw streams move`` sends (pure: the caller
puts and gets).

Why MQ's own pub/sub commands: a sink subscription lives in its gateway's pub/sub
store, which only that gateway's broker changes. A RegSub or DeregSub put on its
``SYSTEM.BROKER.CONTROL.QUEUE`` whose subscriber queue (``QMgrName``/``QName``) is a
registered sink's backlog queue makes or removes that sink's subscription; the broker
takes it only sealed with its backlog key (:mod:`gateway.runtime.sink_command_seal`,
docs/security.md), which the caller adds. Both are idempotent as the move
needs them: a RegSub of an existing subscription replaces it, and a DeregSub's
MQRCCF_NOT_REGISTERED (it was removed by a run before a crash) counts as done. The new
owner's subscription is NewPubsOnly: its sink's target has the retained publications
already (the old instance sent them).
"""

from __future__ import annotations

from gateway.pubsub.streams import prefixed_topic
from gateway.pubsub.topics import Scheme
from gateway.runtime.backlog_format import backlog_queue_name
from gateway.runtime.streams.move_plan import MovedSink
from gateway.wire.constants import ENC_NATIVE, MsgType, Persistence
from gateway.wire.errors import WireError
from gateway.wire.folder import Element
from gateway.wire.formats import FMT_RF_HEADER, FMT_RF_HEADER_2
from gateway.wire.mqmd import MQMD
from gateway.wire.reasons import Reason
from gateway.wire.rfh import MQRFH, decode_rfh, encode_rfh
from gateway.wire.rfh2 import MQRFH2, decode_rfh2, encode_rfh2

__all__ = ["COMMAND_EXPIRY_S", "command_outcome", "refused", "sink_command"]

#: Seconds a command may wait on its way (MQMD Expiry): a stuck one must not apply later.
COMMAND_EXPIRY_S = 60


def sink_command(
    sub: MovedSink, stream: str, *, register: bool, q_mgr: str, reply_q: str, msg_id: bytes
) -> tuple[MQMD, bytes]:
    """The RegSub (NewPubsOnly) or DeregSub of ``sub``'s sink and pattern of
    ``stream`` at ``q_mgr``, naming the sink's backlog queue: MQRFH2 for a topic
    pattern, MQRFH (with the stream) for a character pattern, as it was made."""
    command = "RegSub" if register else "DeregSub"
    queue = backlog_queue_name(sub.sink)
    rfh2 = sub.scheme == int(Scheme.TOPIC)
    if rfh2:
        psc = Element("psc")
        psc.add("Command", command)
        if register:
            psc.add("RegOpt", "NewPubsOnly")
        psc.add("Topic", prefixed_topic(stream, sub.topic))
        psc.add("QMgrName", q_mgr)
        psc.add("QName", queue)
        body = encode_rfh2(MQRFH2(folders=[psc]), ENC_NATIVE, ccsid=1208)
    else:
        pairs = [("MQPSCommand", command)]
        if register:
            pairs.append(("MQPSRegOpts", "NewPubsOnly"))
        pairs += [("MQPSStreamName", stream), ("MQPSTopic", sub.topic),
                  ("MQPSQMgrName", q_mgr), ("MQPSQName", queue)]
        body = encode_rfh(MQRFH(name_values=pairs), ENC_NATIVE, ccsid=1208)
    md = MQMD(
        msg_type=MsgType.REQUEST,
        format=FMT_RF_HEADER_2 if rfh2 else FMT_RF_HEADER,
        encoding=ENC_NATIVE,
        coded_char_set_id=1208,
        persistence=Persistence.NOT_PERSISTENT,
        expiry=COMMAND_EXPIRY_S * 10,
        msg_id=msg_id,
        reply_to_q=reply_q,
        reply_to_q_mgr=q_mgr,
    )
    return md, body


def command_outcome(md: MQMD, body: bytes) -> tuple[str, int] | None:
    """(completion ``ok``/``warning``/``error``, reason) of a broker response, None
    when the message is none."""
    try:
        if md.format == FMT_RF_HEADER_2:
            rfh2, _ = decode_rfh2(body, md.encoding, ccsid=md.coded_char_set_id)
            pscr = next((f for f in rfh2.folders if f.name == "pscr"), None)
            if pscr is None:
                return None
            return pscr.get("Completion") or "", int(pscr.get("Response/Reason") or 0)
        if md.format == FMT_RF_HEADER:
            rfh, _ = decode_rfh(body, md.encoding, ccsid=md.coded_char_set_id)
            comp = rfh.get("MQPSCompCode")
            if comp is None:
                return None
            completion = {"0": "ok", "1": "warning"}.get(comp, "error")
            return completion, int(rfh.get("MQPSReason") or 0)
    except (WireError, ValueError):
        return None
    return None


def refused(outcome: tuple[str, int], *, register: bool) -> bool:
    """Whether a response refuses the command: a DeregSub of a subscription that is
    gone already is done (MQRCCF_NOT_REGISTERED)."""
    completion, reason = outcome
    if completion != "error":
        return False
    return register or reason != Reason.NOT_REGISTERED
