"""The binding to IBM's MQI module (``ibmmq``, else pymqi): its structures and calls.

Why one module: everything that knows the MQI module's shape lives here (loading it,
MQCD/MQSCO/MQOD/MQPMO/MQGMO/MQMD built from our port's types, MQI errors read back as
:class:`MQError`), so :mod:`gateway.mq.ibmmq.connection` deals only with threads,
reconnecting and handles. These functions block: call them on a connection's thread.

MQMD character fields are blank-padded to their MQCHARn length here: the MQI modules pad
short values with NULs, which MQ keeps (a Format of "MQSTR\\0\\0\\0" is not MQFMT_STRING).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import fields
from types import ModuleType
from typing import Any

from gateway.mq.ibmmq.config import IBMMQConfig
from gateway.mq.port import (
    PMO_ASYNC_RESPONSE,
    STAT_TYPE_ASYNC_ERROR,
    WAIT_UNLIMITED,
    AsyncPutStatus,
    Browse,
    GetOptions,
    MQError,
    PutOptions,
    QueueAttr,
)
from gateway.secrets import SecretError
from gateway.wire.mqmd import MQMD
from gateway.wire.reasons import Reason

__all__ = [
    "CONNECT_CAUSES",
    "MD_CHAR_LENGTHS",
    "RECONNECT_REASONS",
    "MQIUnavailableError",
    "async_status",
    "connect_client",
    "get_message",
    "get_options",
    "inquired_value",
    "load_mqi_module",
    "md_from_mqi",
    "md_to_mqi",
    "mq_error",
    "object_descriptor",
    "open_queue",
    "put_options",
    "text_of",
]

#: Reasons after which connecting again later can succeed.
RECONNECT_REASONS = frozenset({2009, 2059, 2161, 2162, 2538, 2543, 2548})

#: What an MQCONNX failure means for an operator, by reason (docs/ibmmq.md). Whether it is
#: retried is :data:`RECONNECT_REASONS`; the rest are fatal at connect: retrying cannot
#: help until someone changes the configuration, the key repository or the queue manager.
CONNECT_CAUSES: dict[int, str] = {
    2009: "the connection was broken while connecting (network or queue manager restart)",
    2035: "not authorized: wrong user or password, or a CHLAUTH/CONNAUTH rule blocks this "
          "user, channel or address (the queue manager's AMQERR01.LOG names the rule); not "
          "retried: repeating a wrong password can lock the account",
    2058: "no queue manager of this name listens there (check q_mgr_name)",
    2059: "queue manager not available: not running, listener down, or the channel was "
          "refused, for example a TLS handshake the queue manager rejected (cipher spec "
          "not matching the channel's SSLCIPH, certificate not trusted)",
    2161: "the queue manager is quiescing",
    2162: "the queue manager is shutting down",
    2393: "TLS initialization failed on this side: the key repository is missing or "
          "unreadable, its stash file is missing, or the certificate label is not in it "
          "(check key_repository and cert_label); not retried: nothing changes by waiting",
    2397: "TLS (JSSE) error: the handshake failed, e.g. the queue manager's certificate is "
          "not trusted or has expired; not retried: fix the key repository or certificates",
    2538: "host not available: nothing answers at host(port) (DNS, firewall, listener)",
    2543: "the channel is stopped or in use up to its limit",
    2548: "the MQ client's automatic reconnection (MQCNO_RECONNECT) gave up: no address "
          "of the connection list answered within its reconnect timeout",
}

# MQI constants (cmqc.h); passed as plain integers so any MQI module accepts them.
MQGMO_WAIT = 0x1
MQGMO_SYNCPOINT = 0x2
MQGMO_NO_SYNCPOINT = 0x4
MQGMO_BROWSE_FIRST = 0x10
MQGMO_BROWSE_NEXT = 0x20
MQGMO_ACCEPT_TRUNCATED_MSG = 0x40
MQGMO_FAIL_IF_QUIESCING = 0x2000
MQMO_NONE = 0
MQMO_MATCH_MSG_ID = 0x1
MQMO_MATCH_CORREL_ID = 0x2
MQPMO_SYNCPOINT = 0x2
MQPMO_NO_SYNCPOINT = 0x4
MQPMO_NEW_MSG_ID = 0x40
MQPMO_NEW_CORREL_ID = 0x80
MQPMO_SET_IDENTITY_CONTEXT = 0x400
MQPMO_SET_ALL_CONTEXT = 0x800
MQPMO_FAIL_IF_QUIESCING = 0x2000
MQPMO_ASYNC_RESPONSE = PMO_ASYNC_RESPONSE
MQSTAT_TYPE_ASYNC_ERROR = STAT_TYPE_ASYNC_ERROR
MQCHT_CLNTCONN = 6
#: MQCNO reconnect options (cmqc.h), by IBMMQConfig.reconnect
MQCNO_RECONNECT_OPTIONS = {"disabled": 0x02000000, "yes": 0x01000000, "qmgr": 0x04000000}
MQXPT_TCP = 2
MQMD_VERSION_2 = 2
MQGMO_VERSION_2 = 2
MQOD_VERSION_3 = 3
MQSCO_VERSION_5 = 5  # the first with CertificateLabel (MQ 8)
MQSCO_VERSION_6 = 6  # the first with KeyRepoPassword (MQ 9.3)
#: Selectors from here up name character attributes (MQCA_*), below integer ones (MQIA_*).
MQCA_FIRST = 2000

# (our MQMD attribute, MQI MD attribute, is a character field)
_MD_FIELDS: tuple[tuple[str, str, bool], ...] = (
    ("report", "Report", False),
    ("msg_type", "MsgType", False),
    ("expiry", "Expiry", False),
    ("feedback", "Feedback", False),
    ("encoding", "Encoding", False),
    ("coded_char_set_id", "CodedCharSetId", False),
    ("format", "Format", True),
    ("priority", "Priority", False),
    ("persistence", "Persistence", False),
    ("msg_id", "MsgId", False),
    ("correl_id", "CorrelId", False),
    ("backout_count", "BackoutCount", False),
    ("reply_to_q", "ReplyToQ", True),
    ("reply_to_q_mgr", "ReplyToQMgr", True),
    ("user_identifier", "UserIdentifier", True),
    ("accounting_token", "AccountingToken", False),
    ("appl_identity_data", "ApplIdentityData", True),
    ("put_appl_type", "PutApplType", False),
    ("put_appl_name", "PutApplName", True),
    ("put_date", "PutDate", True),
    ("put_time", "PutTime", True),
    ("appl_origin_data", "ApplOriginData", True),
    ("group_id", "GroupId", False),
    ("msg_seq_number", "MsgSeqNumber", False),
    ("offset", "Offset", False),
    ("msg_flags", "MsgFlags", False),
    ("original_length", "OriginalLength", False),
)
_MD_BYTE_FIELDS = frozenset({"msg_id", "correl_id", "accounting_token", "group_id"})

#: MQCHARn lengths of the MQMD character fields (IBM MQ reference, MQMD).
MD_CHAR_LENGTHS: dict[str, int] = {
    "Format": 8, "ReplyToQ": 48, "ReplyToQMgr": 48, "UserIdentifier": 12,
    "ApplIdentityData": 32, "PutApplName": 28, "PutDate": 8, "PutTime": 8,
    "ApplOriginData": 4,
}


class MQIUnavailableError(MQError):
    """Neither ``ibmmq`` nor ``pymqi`` could be imported."""

    def __init__(self, detail: str) -> None:
        super().__init__(
            Reason.ENVIRONMENT_ERROR,
            "IBM MQ support needs the 'mq' extra (pip install 'mq-stream-gateway[mq]') and "
            "IBM's MQ client libraries (the MQ redistributable client, with "
            f"LD_LIBRARY_PATH pointing at its lib64 directory): {detail}",
        )


def load_mqi_module(
    import_module: Callable[[str], ModuleType] = importlib.import_module,
) -> ModuleType:
    """Import ``ibmmq``, else ``pymqi``; a clear error when neither works.

    ``import_module`` is the seam a test uses to stand in for the import system.
    """
    problems = []
    for name in ("ibmmq", "pymqi"):
        try:
            return import_module(name)
        except ImportError as exc:  # also missing libmqic_r.so
            problems.append(f"{name}: {exc}")
    raise MQIUnavailableError("; ".join(problems))


def mq_error(exc: BaseException) -> MQError | None:
    """The MQI module's MQMIError as our MQError; None for any other exception."""
    reason = getattr(exc, "reason", None)
    comp = getattr(exc, "comp", None)
    if isinstance(reason, int) and isinstance(comp, int):
        return MQError(reason, str(exc), comp)
    return None


def _to_bytes(value: str) -> bytes:
    return value.encode("utf-8")


def text_of(value: Any) -> str:
    """An MQCHARn field as text: up to the first NUL, trailing blanks removed."""
    if isinstance(value, bytes | bytearray):
        value = bytes(value).split(b"\0", 1)[0].decode("utf-8", "replace")
    return str(value).rstrip(" ")


def _char_field(name: str, value: str) -> bytes:
    length = MD_CHAR_LENGTHS[name]
    raw = _to_bytes(value)
    if len(raw) > length or b"\0" in raw:
        raise MQError(Reason.MD_ERROR,
                      f"MQMD.{name} {value!r} is not valid (at most {length} bytes, no NULs)")
    return raw.ljust(length, b" ")


def md_to_mqi(mqi: ModuleType, md: MQMD) -> Any:
    """Our MQMD as the MQI module's MD (version 2), character fields blank-padded."""
    out = mqi.MD()
    out.Version = MQMD_VERSION_2
    for ours, theirs, is_char in _MD_FIELDS:
        value = getattr(md, ours)
        setattr(out, theirs, _char_field(theirs, value) if is_char else value)
    return out


def md_from_mqi(raw: Any) -> MQMD:
    """The MQI module's MD as our MQMD."""
    md = MQMD(version=2)
    for ours, theirs, is_char in _MD_FIELDS:
        value = getattr(raw, theirs)
        if is_char:
            setattr(md, ours, text_of(value))
        elif ours in _MD_BYTE_FIELDS:
            setattr(md, ours, bytes(value))
        else:
            setattr(md, ours, int(value))
    return md


def connect_client(mqi: ModuleType, cfg: IBMMQConfig) -> Any:
    """MQCONNX as a client: channel, ConnectionName, optional TLS and MQCSP user/password.

    ConnectionName is ``host(port)`` or a connection list ``host1(port),host2(port)``
    (the MQ client tries each in order); a ``reconnect`` other than ``default`` sets the
    MQCNO reconnect option (``opts``, which ``ibmmq`` and pymqi put into the MQCNO).

    TLS: MQCD.SSLCipherSpec (the MQI module raises the MQCD version it needs) and an MQSCO
    with KeyRepository, CertificateLabel (MQSCO version 5) and KeyRepoPassword (version 6,
    read from its Secret). User/password go as the
    ``user``/``password`` keywords, which ``ibmmq`` and pymqi put into an MQCSP with
    MQCSP_AUTH_USER_ID_AND_PWD. The password is read from its Secret here, on every
    connect; a :class:`SecretError` becomes an MQError naming the source only.
    """
    cd = mqi.CD()
    cd.ChannelName = _to_bytes(cfg.channel)
    cd.ConnectionName = _to_bytes(cfg.connection_name)
    cd.ChannelType = MQCHT_CLNTCONN
    cd.TransportType = MQXPT_TCP
    kwargs: dict[str, Any] = {"cd": cd}
    if cfg.tls_cipher_spec:
        cd.SSLCipherSpec = _to_bytes(cfg.tls_cipher_spec)
        sco = mqi.SCO()
        if cfg.key_repository:
            sco.KeyRepository = _to_bytes(cfg.key_repository)
        if cfg.key_repository_password is not None:
            try:
                sco.KeyRepoPassword = cfg.key_repository_password.reveal()
            except SecretError as exc:
                raise MQError(Reason.SSL_INITIALIZATION_ERROR,
                              f"the key repository password cannot be read: {exc}") from None
            sco.Version = max(int(getattr(sco, "Version", 0) or 0), MQSCO_VERSION_6)
        if cfg.cert_label:
            sco.CertificateLabel = _to_bytes(cfg.cert_label)
            sco.Version = max(int(getattr(sco, "Version", 0) or 0), MQSCO_VERSION_5)
        kwargs["sco"] = sco
    if cfg.user:
        try:
            password = cfg.password.reveal() if cfg.password is not None else ""
        except SecretError as exc:
            raise MQError(Reason.NOT_AUTHORIZED, f"the password cannot be read: {exc}") from None
        kwargs["user"] = cfg.user
        kwargs["password"] = password
    if cfg.reconnect != "default":
        kwargs["opts"] = MQCNO_RECONNECT_OPTIONS[cfg.reconnect]
    hconn = mqi.QueueManager(None)
    hconn.connect_with_options(cfg.q_mgr_name, **kwargs)
    return hconn


def object_descriptor(mqi: ModuleType, q_name: str, q_mgr_name: str) -> Any:
    """An MQOD (version 3, so MQOPEN returns ResolvedQName/ResolvedQMgrName)."""
    od = mqi.OD()
    od.Version = MQOD_VERSION_3
    od.ObjectName = _to_bytes(q_name)
    if q_mgr_name:
        od.ObjectQMgrName = _to_bytes(q_mgr_name)
    return od


def open_queue(
    mqi: ModuleType, hconn: Any, q_name: str, q_mgr_name: str, options: int
) -> tuple[Any, tuple[str, str]]:
    """MQOPEN: the object handle and the (queue, queue manager) names it resolved to."""
    od = object_descriptor(mqi, q_name, q_mgr_name)
    hobj = mqi.Queue(hconn, od, options)
    resolved = (text_of(getattr(od, "ResolvedQName", b"")),
                text_of(getattr(od, "ResolvedQMgrName", b"")))
    return hobj, resolved


def put_options(mqi: ModuleType, opts: PutOptions) -> Any:
    """Our PutOptions as an MQPMO."""
    pmo = mqi.PMO()
    flags = MQPMO_FAIL_IF_QUIESCING
    flags |= MQPMO_SYNCPOINT if opts.syncpoint else MQPMO_NO_SYNCPOINT
    if opts.new_msg_id:
        flags |= MQPMO_NEW_MSG_ID
    if opts.new_correl_id:
        flags |= MQPMO_NEW_CORREL_ID
    if opts.set_all_context:
        flags |= MQPMO_SET_ALL_CONTEXT
    elif opts.set_identity_context:
        flags |= MQPMO_SET_IDENTITY_CONTEXT
    if opts.async_response:
        flags |= MQPMO_ASYNC_RESPONSE
    pmo.Options = flags
    return pmo


def async_status(hconn: Any) -> AsyncPutStatus:
    """MQSTAT(MQSTAT_TYPE_ASYNC_ERROR) on ``hconn`` (pymqi/ibmmq ``QueueManager.stat``,
    an MQSTS) as our AsyncPutStatus."""
    sts = hconn.stat(MQSTAT_TYPE_ASYNC_ERROR)

    def num(name: str) -> int:
        return int(getattr(sts, name, 0) or 0)

    return AsyncPutStatus(
        comp_code=num("CompCode"), reason=num("Reason"),
        put_success_count=num("PutSuccessCount"), put_warning_count=num("PutWarningCount"),
        put_failure_count=num("PutFailureCount"),
        object_name=text_of(getattr(sts, "ObjectName", b"")),
        object_q_mgr_name=text_of(getattr(sts, "ObjectQMgrName", b"")),
        resolved_object_name=text_of(getattr(sts, "ResolvedObjectName", b"")),
        resolved_q_mgr_name=text_of(getattr(sts, "ResolvedQMgrName", b"")),
    )


def get_options(mqi: ModuleType, opts: GetOptions) -> tuple[Any, Any]:
    """Our GetOptions as (MQMD carrying the ids to match, MQGMO version 2)."""
    raw_md = mqi.MD()
    raw_md.Version = MQMD_VERSION_2
    gmo = mqi.GMO()
    flags = MQGMO_FAIL_IF_QUIESCING
    if opts.browse is Browse.FIRST:
        flags |= MQGMO_BROWSE_FIRST
    elif opts.browse is Browse.NEXT:
        flags |= MQGMO_BROWSE_NEXT
    flags |= MQGMO_SYNCPOINT if opts.syncpoint else MQGMO_NO_SYNCPOINT
    if opts.wait_ms != 0:
        flags |= MQGMO_WAIT
        gmo.WaitInterval = -1 if opts.wait_ms == WAIT_UNLIMITED else opts.wait_ms
    if opts.accept_truncated:
        flags |= MQGMO_ACCEPT_TRUNCATED_MSG
    match = MQMO_NONE
    if opts.match_msg_id is not None:
        match |= MQMO_MATCH_MSG_ID
        raw_md.MsgId = opts.match_msg_id
    if opts.match_correl_id is not None:
        match |= MQMO_MATCH_CORREL_ID
        raw_md.CorrelId = opts.match_correl_id
    gmo.Version = MQGMO_VERSION_2
    gmo.Options = flags
    gmo.MatchOptions = match
    return raw_md, gmo


def get_message(hobj: Any, max_length: int | None, raw_md: Any, gmo: Any) -> bytes:
    """MQGET; a truncated message accepted (MQCC_WARNING) returns the data it carried."""
    try:
        return bytes(hobj.get(max_length, raw_md, gmo))
    except Exception as exc:
        err = mq_error(exc)
        if err is not None and err.reason == Reason.TRUNCATED_MSG_ACCEPTED:
            # the MQI module carries the truncated data on the error
            return bytes(getattr(exc, "message", b"") or b"")
        raise


def inquired_value(selector: QueueAttr, value: Any) -> int | str:
    """An MQINQ answer as text (MQCA_* selectors) or an integer (MQIA_*)."""
    return text_of(value) if int(selector) >= MQCA_FIRST else int(value)


assert {f.name for f in fields(MQMD)} >= {ours for ours, _, _ in _MD_FIELDS}
