"""mq-stream-gateway: an IBM MQ publish/subscribe broker node bridging streams to Kafka and MQTT.

Layers import one way only: wire -> pubsub -> mq/routing -> runtime; plugins use
``gateway.plugin_api`` and the public modules.
"""

__version__ = "0.1.0"
