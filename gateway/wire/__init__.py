"""mq-stream-gateway."""
