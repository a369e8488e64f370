"""The one message model of txstream: messages, end events and the local transaction states.

Used unchanged by the producer/consumer library, the Kafka source and sinks and the pure
transaction core. How these travel on Kafka lives in :mod:`txstream.wire`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

__all__ = [
    "MAX_BODY_BYTES",
    "CHECK_IMMUNITY_PROPERTY",
    "immunity_seconds",
    "Decision",
    "Message",
    "EndEvent",
    "RawRecord",
]

MAX_BODY_BYTES = 4 * 1024 * 1024  # RocketMQ's default maxMessageSize
# RocketMQ's MessageConst.PROPERTY_CHECK_IMMUNITY_TIME_IN_SECONDS.
CHECK_IMMUNITY_PROPERTY = "CHECK_IMMUNITY_TIME_IN_SECONDS"


def immunity_seconds(value: object) -> int:
    """A check immunity time given as RocketMQ's property text ("30", "-1")."""
    text = value.strip() if isinstance(value, str) else None
    if text is None or not (text.isascii() and text.lstrip("-").isdigit()):
        raise ValueError(f"{CHECK_IMMUNITY_PROPERTY} must be a whole number of seconds or -1, "
                         f"got {value!r}")
    return int(text)


class Decision(str, Enum):
    """RocketMQ's ``LocalTransactionState``: the outcome of a local transaction."""

    COMMIT_MESSAGE = "COMMIT_MESSAGE"
    ROLLBACK_MESSAGE = "ROLLBACK_MESSAGE"
    UNKNOW = "UNKNOW"  # RocketMQ's spelling, kept so the wire value matches its documentation
    UNKNOWN = "UNKNOW"  # alias: the same member as UNKNOW

    @property
    def is_final(self) -> bool:
        return self is not Decision.UNKNOW


@dataclass(slots=True)
class Message:
    """A message: what a producer sends and what consumers and check listeners receive.

    ``topic`` is always the real (visible) topic. The coordinator fills in ``transaction_id``,
    ``msg_id``, ``producer_group`` and ``born_timestamp`` (milliseconds) at send time.
    """

    topic: str
    body: bytes
    tags: str | None = None
    keys: str | None = None
    properties: dict[str, str] = field(default_factory=dict)
    transaction_id: str | None = None
    msg_id: str | None = None
    producer_group: str | None = None
    born_timestamp: int | None = None
    check_immunity_time_s: int | None = None
    # Where a received message lay, and how often it was redelivered (consumers only).
    queue_id: int | None = None
    queue_offset: int | None = None
    reconsume_times: int = 0
    # When the broker stored it (its record timestamp): the coordinator's check on the
    # producer's clock (state.timing).
    stored_timestamp: int | None = None

    def set_check_immunity_time(self, seconds: int) -> None:
        """RocketMQ's ``PROPERTY_CHECK_IMMUNITY_TIME_IN_SECONDS``: no back-check before then;
        -1 (RocketMQ's "not set") means the transaction timeout."""
        if not isinstance(seconds, int) or seconds < -1:
            raise ValueError("check immunity time must be a number of seconds, or -1")
        self.check_immunity_time_s = seconds

    def get_property(self, name: str) -> str | None:
        return self.properties.get(name)

    def put_user_property(self, name: str, value: str) -> None:
        """A user property; RocketMQ's check immunity property, which Java users set this way,
        sets :meth:`set_check_immunity_time`."""
        if name == CHECK_IMMUNITY_PROPERTY:
            self.set_check_immunity_time(immunity_seconds(value))
            return
        self.properties[name] = value

    @property
    def body_text(self) -> str:
        return self.body.decode("utf-8", errors="replace")


@dataclass(frozen=True, slots=True)
class RawRecord:
    """A record as it was read from the end topic, for a dead letter byte for byte: where it
    lay, its key, its value and its headers (packed, ``txstream.headers.pack_headers``)."""

    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: bytes | None


@dataclass(frozen=True, slots=True)
class EndEvent:
    """The end of a transaction's first phase or the answer to a back-check.

    ``check_times`` is the number of the check this answers (``None`` when it is the producer's
    own end event); ``operator`` names the admin who resolved it by hand (an empty name is no
    admin: a blank column or header must not bypass the producer-group check).
    """

    transaction_id: str
    producer_group: str
    decision: Decision
    from_check: bool = False
    check_times: int | None = None
    operator: str | None = None
    remark: str | None = None
    born_timestamp: int | None = None
    # The record it was decoded from, if it was read from Kafka: a refused end event goes to
    # the dead-letter topic as it came, even one held in the state for a while.
    raw: RawRecord | None = field(default=None, compare=False, repr=False)

    @property
    def by_admin(self) -> bool:
        return bool(self.operator)
