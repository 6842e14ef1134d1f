"""What arrives on the inter-broker queue, read: a response to one of our commands
(MQRFH ``MQPSCompCode``/``MQPSReason``, or an MQRFH2 ``pscr`` folder) or a publication
forwarded to one of our admin-stream subscriptions (``MQPSCommand Publish`` / ``psc``).

Pure: bytes in, :class:`Received` out; None for anything that is no pub/sub message.
"""

from __future__ import annotations

from dataclasses import dataclass

from gateway.pubsub.streams import split_topic
from gateway.wire.constants import CompCode
from gateway.wire.errors import WireError
from gateway.wire.formats import FMT_RF_HEADER, FMT_RF_HEADER_2
from gateway.wire.mqmd import MQMD
from gateway.wire.reasons import reason_text
from gateway.wire.rfh import decode_rfh
from gateway.wire.rfh2 import decode_rfh2

__all__ = ["Received", "read_received"]


@dataclass(frozen=True, slots=True)
class Received:
    """A message from a neighbour; ``q_mgr`` is who sent it (blank when unknown)."""

    q_mgr: str
    is_response: bool
    ok: bool = True
    reason: int = 0
    reason_text: str = ""
    topic: str = ""
    stream: str = ""


def read_received(md: MQMD, body: bytes) -> Received | None:
    sender = md.reply_to_q_mgr.strip()
    fmt = md.format.strip()
    try:
        if fmt == FMT_RF_HEADER.strip():
            rfh, _ = decode_rfh(body, md.encoding, ccsid=md.coded_char_set_id)
            comp = rfh.get("MQPSCompCode")
            if comp is not None:
                reason = int(rfh.get("MQPSReason") or 0)
                return Received(
                    sender,
                    True,
                    int(comp) != CompCode.FAILED,
                    reason,
                    rfh.get("MQPSReasonText") or (reason_text(reason) if reason else ""),
                )
            if rfh.get("MQPSCommand") == "Publish":
                return Received(
                    (rfh.get("MQPSQMgrName") or sender).strip(),
                    False,
                    topic=rfh.get("MQPSTopic") or "",
                    stream=rfh.get("MQPSStreamName") or "",
                )
            return None
        if fmt == FMT_RF_HEADER_2.strip():
            rfh2, _ = decode_rfh2(body, md.encoding, ccsid=md.coded_char_set_id)
            completion = rfh2.get("pscr", "Completion")
            if completion is not None:
                reason = int(rfh2.get("pscr", "Response/Reason") or 0)
                return Received(
                    sender,
                    True,
                    completion != "error",
                    reason,
                    reason_text(reason) if reason else "",
                )
            if rfh2.get("psc", "Command") == "Publish":
                # MQRFH2 topics carry the stream as $SYS/STREAM/<stream>/ (streams.py).
                st = split_topic(rfh2.get("psc", "Topic") or "")
                return Received(sender, False, topic=st.topic, stream=st.stream)
            return None
    except (WireError, ValueError):
        return None
    return None
