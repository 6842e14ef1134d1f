"""The embedded queue manager: IBM MQ semantics on SQLite (docs/embedded-qm.md).

``qmgr`` (the queue manager and its store writes), ``connection`` (hconn, the unit of
work), ``handle`` (hobj: get, put, inquire) and ``definitions`` (what MQSC changes) are
one unit split into files by MQI object: they share the queue manager's private state on
purpose, as the MQI objects of one queue manager do. Everything outside this package uses
the port (``gateway.mq.port``) or ``EmbeddedQueueManager``'s public methods.
"""
