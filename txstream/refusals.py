"""Why a record went to the dead-letter topic: stable codes, in its ``DLQ_CODE`` header.

The text of ``DLQ_REASON`` is for people and may change; these codes are part of the wire
contract (docs/wire-format.md) for programs that act on dead letters.
"""

from __future__ import annotations

__all__ = ["Code"]


class Code:
    """The values of the ``DLQ_CODE`` header."""

    UNREADABLE = "UNREADABLE"  # the Kafka client could not parse the record (CRC, header name)
    MALFORMED_KEY = "MALFORMED_KEY"  # no transaction id, or not UTF-8
    MALFORMED_HEADERS = "MALFORMED_HEADERS"  # a header that is not UTF-8 text
    UNKNOWN_EVENT = "UNKNOWN_EVENT"  # neither a half message nor an end event
    MISSING_HEADER = "MISSING_HEADER"  # a required header is absent or empty
    INVALID_HEADER = "INVALID_HEADER"  # a header's value is not what it must be
    BODY_TOO_LARGE = "BODY_TOO_LARGE"  # over the body limit (RocketMQ's maxMessageSize)
    OUTPUTS_TOO_LARGE = "OUTPUTS_TOO_LARGE"  # what the coordinator would write would not fit
    WRONG_GROUP = "WRONG_GROUP"  # an end event from another producer group
    CONTRADICTS_OUTCOME = "CONTRADICTS_OUTCOME"  # e.g. a rollback after the commit
    NO_HALF_MESSAGE = "NO_HALF_MESSAGE"  # an end event whose half message never came
    REFUSED_BY_BROKER = "REFUSED_BY_BROKER"  # the broker refused a record the coordinator wrote
    MISSING_TOPIC = "MISSING_TOPIC"  # its topic does not exist, and the broker creates none
    # the half message of a record to write is no longer in the half topic (retention)
    HALF_MESSAGE_LOST = "HALF_MESSAGE_LOST"
    UNDECODABLE = "UNDECODABLE"  # txstream could not decode it (a bug): kept, not lost

    ALL = (UNREADABLE, MALFORMED_KEY, MALFORMED_HEADERS, UNKNOWN_EVENT, MISSING_HEADER,
           INVALID_HEADER, BODY_TOO_LARGE, OUTPUTS_TOO_LARGE, WRONG_GROUP, CONTRADICTS_OUTCOME,
           NO_HALF_MESSAGE, REFUSED_BY_BROKER, MISSING_TOPIC, HALF_MESSAGE_LOST, UNDECODABLE)
