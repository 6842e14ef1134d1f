"""Request/reply across MQ and the plugins' brokers: the pure core (no asyncio).

Routes (config), correlation entries and their durable store, and reply addressing (how
request, reply and report MQMDs are built). The runtime's
``gateway.runtime.request_reply`` does the I/O. docs/request-reply.md.
"""

from gateway.routing.addressing import (
    ERROR_KINDS,
    REPORT_BITS,
    ReplyKind,
    classify,
    correlation_key,
    error_envelope,
    reply_envelope,
    reply_md,
    report_md,
    request_md,
    wants_report,
)
from gateway.routing.correlation import (
    TOKEN_LENGTH,
    PendingRequest,
    PendingService,
    Side,
    State,
    request_token,
    source_id,
)
from gateway.routing.correlation_store import (
    SCHEMA_VERSION,
    CorrelationStore,
    CorrelationStoreError,
    SchemaVersionError,
    StoreInUseError,
)
from gateway.routing.routes import (
    RequestReplyConfig,
    RequestRoute,
    ServiceRoute,
    split_destination,
)

__all__ = [
    "ERROR_KINDS",
    "REPORT_BITS",
    "SCHEMA_VERSION",
    "TOKEN_LENGTH",
    "CorrelationStore",
    "CorrelationStoreError",
    "PendingRequest",
    "PendingService",
    "ReplyKind",
    "RequestReplyConfig",
    "RequestRoute",
    "SchemaVersionError",
    "ServiceRoute",
    "Side",
    "State",
    "StoreInUseError",
    "classify",
    "correlation_key",
    "error_envelope",
    "reply_envelope",
    "reply_md",
    "report_md",
    "request_md",
    "request_token",
    "source_id",
    "split_destination",
    "wants_report",
]
