"""Real local services for development and tests: Kafka (KRaft, from Maven jars), Mosquitto.

Public surface: ``KafkaBroker`` and ``MosquittoBroker`` (start/stop on free 127.0.0.1
ports in a work directory), ``spark_kafka_jars()`` and ``spark_session_conf()`` for
building a SparkSession with the Kafka source, ``kafka_broker_jars()``, and the errors.
``make setup`` (tools/setup.sh) installs what these need; see docs/devstack.md.
"""

from gateway.devstack.errors import (
    DevstackError,
    ExecutableNotFoundError,
    JarsMissingError,
    ServiceStartError,
    StateError,
)
from gateway.devstack.jars import kafka_broker_jars, spark_kafka_jars
from gateway.devstack.kafka import KafkaBroker, KafkaOptions, console_tool_command
from gateway.devstack.mosquitto import MosquittoBroker, MosquittoOptions
from gateway.devstack.spark import spark_session_conf

__all__ = [
    "DevstackError",
    "ExecutableNotFoundError",
    "JarsMissingError",
    "KafkaBroker",
    "KafkaOptions",
    "MosquittoBroker",
    "MosquittoOptions",
    "ServiceStartError",
    "StateError",
    "console_tool_command",
    "kafka_broker_jars",
    "spark_kafka_jars",
    "spark_session_conf",
]
