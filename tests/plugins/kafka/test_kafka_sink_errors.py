"""Which Kafka errors replace the producer and which refuse an envelope for good
(no broker needed)."""

from __future__ import annotations

import pytest
from aiokafka.errors import (
    InvalidProducerEpoch,
    InvalidTopicError,
    KafkaConnectionError,
    KafkaTimeoutError,
    MessageSizeTooLargeError,
    NotLeaderForPartitionError,
    OutOfOrderSequenceNumber,
    ProducerFenced,
    RecordTooLargeError,
    TopicAuthorizationFailedError,
    UnknownProducerId,
)

from plugins.kafka.errors import MQRC_MSG_TOO_BIG_FOR_Q, MQRC_UNKNOWN_OBJECT_NAME
from plugins.kafka.sink import producer_state_is_broken, refusal_reason


@pytest.mark.parametrize(
    "exc",
    [OutOfOrderSequenceNumber(), UnknownProducerId(), InvalidProducerEpoch(), ProducerFenced()],
)
def test_fatal_producer_errors_replace_the_producer(exc: Exception) -> None:
    assert producer_state_is_broken(exc)
    assert refusal_reason(exc) is None


@pytest.mark.parametrize(
    "exc",
    [
        KafkaConnectionError(),
        KafkaTimeoutError(),
        NotLeaderForPartitionError(),
        # No permission yet (an ACL being fixed): an outage, never a dead-letter of
        # every publication meanwhile.
        TopicAuthorizationFailedError(),
    ],
)
def test_transient_errors_keep_the_producer(exc: Exception) -> None:
    assert not producer_state_is_broken(exc)
    assert refusal_reason(exc) is None


def test_refusals_carry_an_mq_reason_and_keep_the_producer() -> None:
    assert refusal_reason(MessageSizeTooLargeError()) == MQRC_MSG_TOO_BIG_FOR_Q
    assert refusal_reason(RecordTooLargeError()) == MQRC_MSG_TOO_BIG_FOR_Q
    assert refusal_reason(InvalidTopicError()) == MQRC_UNKNOWN_OBJECT_NAME
    assert not producer_state_is_broken(MessageSizeTooLargeError())
