"""The queue-manager port over IBM MQ, through IBM's ``ibmmq`` package or pymqi.

Three modules, read in this order: :mod:`~gateway.mq.ibmmq.config` (how to reach the
queue manager: host/port/channel, TLS cipher spec + key repository, user/password, the
reconnect backoff), :mod:`~gateway.mq.ibmmq.mqi` (the binding: loading the MQI module,
MQI structures from the port's types and back, MQI errors as ``MQError``) and
:mod:`~gateway.mq.ibmmq.connection` (the port itself: a thread per connection, reconnect
and handle reopening). The MQI module is imported lazily (``ibmmq`` first, then
``pymqi``; both expose the same classes); a test can pass a stand-in module instead.
"""

from gateway.mq.ibmmq.config import IBMMQConfig, backoff_delays
from gateway.mq.ibmmq.connection import IBMMQConnection, IBMMQQueueHandle, IBMMQQueueManager
from gateway.mq.ibmmq.mqi import (
    MD_CHAR_LENGTHS,
    RECONNECT_REASONS,
    MQIUnavailableError,
    load_mqi_module,
    md_from_mqi,
    md_to_mqi,
)

__all__ = [
    "MD_CHAR_LENGTHS",
    "RECONNECT_REASONS",
    "IBMMQConfig",
    "IBMMQConnection",
    "IBMMQQueueHandle",
    "IBMMQQueueManager",
    "MQIUnavailableError",
    "backoff_delays",
    "load_mqi_module",
    "md_from_mqi",
    "md_to_mqi",
]
