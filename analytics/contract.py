"""The Kafka record contract (docs/kafka-contract.md, version 1) as plain Python data.

Kept free of PySpark so the CLI, the docs and tests can use it without a JVM. The topic
escape is the contract's reversible one: ``A-Z a-z 0-9 . -`` stand for themselves, every
other character (``_`` included) becomes ``_`` plus two upper-case hex digits per UTF-8 byte.
"""

from __future__ import annotations

from dataclasses import dataclass

from analytics import AnalyticsError

CONTRACT_VERSION = "1"
DEFAULT_STREAM = "SYSTEM.BROKER.DEFAULT.STREAM"
PUBLICATION_PREFIX = "mqgw."
RETAINED_PREFIX = "mqgw-retained."
DEADLETTER_TOPIC = "mqgw-deadletter"
ID_LENGTH = 24  # MQBYTE24: MQMD MsgId / CorrelId

# Header names (section "Headers" of the contract).
H_CONTRACT = "mq.contract"
H_STREAM = "mq.stream"
H_TOPIC = "mq.topic"
H_MSG_ID = "mq.msgId"
H_CORREL_ID = "mq.correlId"
H_PUT_TIME = "mq.putTime"
H_USER_ID = "mq.userId"
H_FORMAT = "mq.format"
H_ENCODING = "mq.encoding"
H_CCSID = "mq.ccsid"
H_PERSISTENCE = "mq.persistence"
H_PUB_HEADER = "mq.pubHeader"
H_RETAIN = "mq.retain"
H_SEQ_NUM = "mq.seqNum"
H_PUB_TIME = "mq.pubTime"
H_ORIGIN = "mq.origin"
H_DLH_REASON = "mq.dlh.reason"
H_DLH_DEST_Q = "mq.dlh.destQ"
H_DLH_DEST_Q_MGR = "mq.dlh.destQMgr"
USR_PREFIX = "usr."
USR_TYPE_PREFIX = "mq.usrType."
NV_PREFIX = "mq.nv."

PUB_HEADERS = ("MQRFH", "MQRFH2")

_PLAIN = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789.-")
_HEX = frozenset("0123456789ABCDEF")
KAFKA_TOPIC_MAX = 249


class TopicNameError(AnalyticsError):
    """A Kafka topic name that is not a valid escaped MQ name; ``offset`` is where it breaks."""

    def __init__(self, message: str, *, name: str, offset: int) -> None:
        super().__init__(f"{message} in {name!r} at offset {offset}")
        self.name = name
        self.offset = offset


def escape_name(name: str) -> str:
    """Map an MQ stream or topic name into Kafka's topic alphabet (reversibly)."""
    out: list[str] = []
    for ch in name:
        if ch in _PLAIN:
            out.append(ch)
        else:
            out.extend(f"_{b:02X}" for b in ch.encode("utf-8"))
    return "".join(out)


def unescape_name(escaped: str) -> str:
    """Invert :func:`escape_name`; raises :class:`TopicNameError` on a malformed escape."""
    raw = bytearray()
    i = 0
    while i < len(escaped):
        ch = escaped[i]
        if ch == "_":
            pair = escaped[i + 1 : i + 3]
            if len(pair) != 2 or not set(pair) <= _HEX:
                raise TopicNameError("'_' not followed by two upper-case hex digits",
                                     name=escaped, offset=i)
            raw.append(int(pair, 16))
            i += 3
        elif ch in _PLAIN:
            raw.extend(ch.encode("ascii"))
            i += 1
        else:
            raise TopicNameError(f"character {ch!r} outside Kafka's alphabet",
                                 name=escaped, offset=i)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise TopicNameError("escape is not UTF-8", name=escaped, offset=exc.start) from exc


def publication_topic(stream: str) -> str:
    """Default Kafka topic of the publications on ``stream`` (``mqgw.{stream}``)."""
    return PUBLICATION_PREFIX + escape_name(stream)


def retained_topic(stream: str) -> str:
    """Default compacted Kafka topic of the retained publications on ``stream``."""
    return RETAINED_PREFIX + escape_name(stream)


@dataclass(frozen=True, slots=True)
class ContractRule:
    """One check the quality job applies to every record; ``name`` is what it reports."""

    name: str
    description: str


# The checks of the quality job, in the order they are reported. Headers marked "not on
# tombstones" in the contract are only required when the record has a value.
CONTRACT_RULES: tuple[ContractRule, ...] = (
    ContractRule("contract_version", f"header {H_CONTRACT} missing or not {CONTRACT_VERSION!r}"),
    ContractRule("stream_missing", f"header {H_STREAM} missing or empty"),
    ContractRule("topic_missing", f"header {H_TOPIC} missing"),
    ContractRule("key_mismatch", f"record key differs from header {H_TOPIC}"),
    ContractRule("origin_missing", f"header {H_ORIGIN} missing or empty"),
    ContractRule("msg_id_invalid", f"header {H_MSG_ID} missing or not {ID_LENGTH} bytes"),
    ContractRule("correl_id_invalid", f"header {H_CORREL_ID} missing or not {ID_LENGTH} bytes"),
    ContractRule("put_time_invalid", f"header {H_PUT_TIME} missing or not a decimal number"),
    ContractRule("format_missing", f"header {H_FORMAT} missing"),
    ContractRule("encoding_invalid", f"header {H_ENCODING} missing or not a decimal number"),
    ContractRule("ccsid_invalid", f"header {H_CCSID} missing or not a decimal number"),
    ContractRule("persistence_invalid", f"header {H_PERSISTENCE} missing or not 0/1"),
    ContractRule("pub_header_invalid", f"header {H_PUB_HEADER} missing or not MQRFH/MQRFH2"),
    ContractRule("duplicate_header", "a contract header (mq.*) appears more than once"),
)
