"""Runtime neighbour links: the gateway as one broker of a publish/subscribe network.

``config`` validates the configured neighbours, ``state`` keeps what is known about them
(durably, ``neighbours.db``), ``links`` talks to them with documented queued pub/sub
commands (join, stream negotiation, proxy subscriptions, clear), ``cli`` is
``mqgw neighbours``. The pure mapping rules live in :mod:`gateway.pubsub.neighbours`.
"""
