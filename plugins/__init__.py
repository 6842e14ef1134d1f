"""Plugins shipped with mq-stream-gateway (kafka, mqtt, memory).

The gateway finds them through the ``mqgw.plugins`` entry points in pyproject.toml, as
it finds third-party plugins; nothing here registers anything on import.
"""
