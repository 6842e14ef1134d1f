"""Plugins shipped with mq-stream-gateway (kafka, mqtt, memory), found via the ``mqgw.plugins`` entry points."""
