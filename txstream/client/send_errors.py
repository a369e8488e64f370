"""What a failed send raises: :class:`SendFailed` when the record was not stored,
:class:`SendInDoubt` when it may have been.

kafka-python fails a send's future with the broker's error for the partition, or with one of
its own (a timeout, a lost connection). Only some mean that the broker did not append the
record: those it answers after checking the request itself (its size, topic, authorisation,
record format), which a retry of the same record would have met too. A timeout or a lost
connection says nothing: the request may have been appended and its answer lost, and the
producer's own retries may still deliver it. An error raised by ``send()`` itself comes before
the record was handed to the I/O thread: nothing was sent.
"""

from __future__ import annotations

from txstream.errors import SendFailed, SendInDoubt
from txstream.kafka import errors as kafka_errors

__all__ = ["REFUSED", "PRODUCER_STATE", "refused_for_sure", "producer_state_reset",
           "not_sent", "send_failure"]

# The broker's answers that mean "not appended" (a produce request is checked for these before
# anything is written). OutOfOrderSequenceNumber, ProducerFenced and the like are left out: they
# can follow an earlier attempt of the same batch that was appended.
REFUSED: tuple[type[BaseException], ...] = (
    kafka_errors.MessageSizeTooLargeError,
    kafka_errors.RecordListTooLargeError,
    kafka_errors.InvalidTopicError,
    kafka_errors.TopicAuthorizationFailedError,
    kafka_errors.ClusterAuthorizationFailedError,
    kafka_errors.InvalidRecordError,
    kafka_errors.CorruptRecordError,
    kafka_errors.InvalidTimestampError,
    kafka_errors.UnsupportedForMessageFormatError,
    kafka_errors.InvalidRequiredAcksError,
    kafka_errors.UnsupportedVersionError,
)


# The broker's answers about the producer's own sequence: an earlier batch expired in doubt
# (its send timed out) and the next one no longer follows. kafka-python then starts a new
# producer epoch (KIP-360) and fails the batch that met the error; the same record sent again
# goes out under the new epoch. Sent twice, it reaches the coordinator as a duplicate.
PRODUCER_STATE: tuple[type[BaseException], ...] = (
    kafka_errors.OutOfOrderSequenceNumberError,
    kafka_errors.UnknownProducerIdError,
    kafka_errors.InvalidProducerEpochError,
)


def producer_state_reset(exc: BaseException) -> bool:
    """Whether ``exc`` failed a send because the producer's sequence was reset: worth one
    more send of the same record."""
    return isinstance(exc, PRODUCER_STATE)


def refused_for_sure(exc: BaseException) -> bool:
    """Whether ``exc``, failing a send's future, means the record was not stored."""
    return isinstance(exc, REFUSED)


def _reason(exc: BaseException) -> str:
    name, text = type(exc).__name__, str(exc)
    return text if name in text else f"{name}: {text}"  # kafka-python's errors name themselves


def _named(what: str, transaction_id: str | None) -> str:
    return f"{what} of {transaction_id}" if transaction_id else what


def not_sent(exc: BaseException, what: str, transaction_id: str | None = None) -> SendFailed:
    """``send()`` itself raised: the record never left the process."""
    return SendFailed(f"{_named(what, transaction_id)} not sent: {_reason(exc)}")


def send_failure(exc: BaseException, what: str, servers: str, timeout_s: float,
                 transaction_id: str | None = None, msg_id: str | None = None) -> SendFailed:
    """The error for a send whose future failed: refused for sure, or in doubt (with the
    transaction's id, so that its caller can answer a check for it)."""
    named = _named(what, transaction_id)
    if refused_for_sure(exc):
        return SendFailed(f"{named} refused by {servers}: {_reason(exc)}")
    return SendInDoubt(
        f"{named} not acknowledged by {servers} within {timeout_s:g}s; it may have been "
        f"stored: {_reason(exc)}",
        transaction_id=transaction_id, msg_id=msg_id,
    )
