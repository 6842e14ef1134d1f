"""MQ queued publish/subscribe broker semantics, sans-I/O (see docs/pubsub.md).

``PubSubEngine.handle(InboundMessage)`` -> ``Outcome`` (deliveries, response, dead-letter
action, store mutations); the runtime does the I/O. Inside: ``inbound`` decodes a
command, ``handlers`` give each command its meaning, ``working_set`` holds the state of
the unit of work, ``fanout`` matches and builds deliveries. Stores: ``MemoryStore``
(store.py) and ``SqliteStore`` (sqlite_store.py).
"""
