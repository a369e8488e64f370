"""kafka-python's errors that txstream tells apart, for every module outside txstream/kafka/:
kafka-python is imported only inside txstream/kafka/ (tests/project/test_layers.py).

They are kafka-python's own classes, so ``except`` and ``isinstance`` meet what its clients
raise; kafka-python ships no types, so mypy knows them as exception classes.
"""

from __future__ import annotations

from kafka import errors as _errors

__all__ = [
    "KafkaError",
    "KafkaTimeoutError",
    "KafkaConnectionError",
    "IllegalStateError",
    "NoError",
    "UnknownTopicOrPartitionError",
    "TopicAlreadyExistsError",
    "OffsetOutOfRangeError",
    "NoOffsetForPartitionError",
    "CorruptRecordError",
    "UnsupportedCodecError",
    "MessageSizeTooLargeError",
    "RecordListTooLargeError",
    "InvalidTopicError",
    "InvalidRecordError",
    "InvalidTimestampError",
    "TopicAuthorizationFailedError",
    "ClusterAuthorizationFailedError",
    "UnsupportedForMessageFormatError",
    "InvalidRequiredAcksError",
    "UnsupportedVersionError",
    "ProducerFencedError",
    "InvalidProducerEpochError",
    "OutOfOrderSequenceNumberError",
    "UnknownProducerIdError",
    "TransactionAbortedError",
    "for_code",
]

ErrorClass = type[Exception]

KafkaError: ErrorClass = _errors.KafkaError
KafkaTimeoutError: ErrorClass = _errors.KafkaTimeoutError
KafkaConnectionError: ErrorClass = _errors.KafkaConnectionError
IllegalStateError: ErrorClass = _errors.IllegalStateError
# The broker's error codes (``for_code``): NoError is code 0.
NoError: ErrorClass = _errors.NoError
UnknownTopicOrPartitionError: ErrorClass = _errors.UnknownTopicOrPartitionError
TopicAlreadyExistsError: ErrorClass = _errors.TopicAlreadyExistsError
OffsetOutOfRangeError: ErrorClass = _errors.OffsetOutOfRangeError
NoOffsetForPartitionError: ErrorClass = _errors.NoOffsetForPartitionError
# A record kafka-python cannot parse (a bad CRC, a codec it has no library for).
CorruptRecordError: ErrorClass = _errors.CorruptRecordError
UnsupportedCodecError: ErrorClass = _errors.UnsupportedCodecError
# A produce request refused for what it is (txstream.client.send_errors, sinks.delivery).
MessageSizeTooLargeError: ErrorClass = _errors.MessageSizeTooLargeError
RecordListTooLargeError: ErrorClass = _errors.RecordListTooLargeError
InvalidTopicError: ErrorClass = _errors.InvalidTopicError
InvalidRecordError: ErrorClass = _errors.InvalidRecordError
InvalidTimestampError: ErrorClass = _errors.InvalidTimestampError
TopicAuthorizationFailedError: ErrorClass = _errors.TopicAuthorizationFailedError
ClusterAuthorizationFailedError: ErrorClass = _errors.ClusterAuthorizationFailedError
UnsupportedForMessageFormatError: ErrorClass = _errors.UnsupportedForMessageFormatError
InvalidRequiredAcksError: ErrorClass = _errors.InvalidRequiredAcksError
UnsupportedVersionError: ErrorClass = _errors.UnsupportedVersionError
# A transactional producer whose id a newer producer took (txstream.kafka.transactions).
ProducerFencedError: ErrorClass = _errors.ProducerFencedError
InvalidProducerEpochError: ErrorClass = _errors.InvalidProducerEpochError
# An idempotent producer's sequence the broker does not follow (after a batch that expired in
# doubt): kafka-python bumps its epoch and fails that batch (txstream.client.send_errors).
OutOfOrderSequenceNumberError: ErrorClass = _errors.OutOfOrderSequenceNumberError
UnknownProducerIdError: ErrorClass = _errors.UnknownProducerIdError
TransactionAbortedError: ErrorClass = _errors.TransactionAbortedError


def for_code(code: int) -> ErrorClass:
    """The error class of a broker's error code (:data:`NoError` for 0)."""
    found: ErrorClass = _errors.for_code(code)
    return found
