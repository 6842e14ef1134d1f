"""MQ queued publish/subscribe broker semantics, sans-I/O (see docs/pubsub.md).

``PubSubEngine.handle(InboundMessage)`` -> ``Outcome`` (deliveries, response, dead-letter
action, store mutations); ``gateway.runtime.broker.BrokerService`` does the I/O. Stores:
``MemoryStore`` (store.py) and ``SqliteStore`` (sqlite_store.py).
"""
