"""Redelivery for push consumers: the retry and dead-letter topics of a consumer group.

RocketMQ sends a message its listener did not consume to ``%RETRY%group`` with a growing delay
and, after ``maxReconsumeTimes``, to ``%DLQ%group``. Kafka topic names cannot hold ``%``, so
here they are ``TXSTREAM_RETRY_<group>`` and ``TXSTREAM_DLQ_<group>``. A retry record is the
original record (key, body, headers) plus when it is due and how often it was retried; the
count travels with the record, so a restarted consumer still knows it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from txstream.errors import ConfigError
from txstream.wire import H, Headers, Record

__all__ = [
    "ROCKETMQ_DELAYS_S",
    "RetryHeaders",
    "Subscription",
    "retry_record",
    "dead_letter_record",
    "retry_delay_s",
    "retry_delays",
    "due_ms",
]


# RocketMQ's delay levels 3..18, the ones its 16 reconsume attempts use.
ROCKETMQ_DELAYS_S: tuple[float, ...] = (
    10, 30, 60, 120, 180, 240, 300, 360, 420, 480, 540, 600, 1200, 1800, 3600, 7200,
)


class RetryHeaders:
    """Header names (RocketMQ's property names where it has one)."""

    ORIGIN_TOPIC = "RETRY_TOPIC"
    RECONSUME_TIMES = "RECONSUME_TIME"
    DUE_MS = "TXSTREAM_RETRY_DUE_MS"

    ALL = frozenset({ORIGIN_TOPIC, RECONSUME_TIMES, DUE_MS})


@dataclass(frozen=True)
class Subscription:
    """A topic and RocketMQ's tag expression: ``*`` (everything) or ``TagA || TagB``."""

    topic: str
    expression: str = "*"

    @property
    def tags(self) -> frozenset[str] | None:
        """The accepted tags, or None for all messages."""
        expr = (self.expression or "*").strip()
        if expr == "*":
            return None
        tags = frozenset(t.strip() for t in expr.split("||") if t.strip())
        return tags or None

    def matches(self, tags: str | None) -> bool:
        accepted = self.tags
        return accepted is None or (tags is not None and tags in accepted)


def retry_delay_s(delays: Sequence[float], reconsume_times: int) -> float:
    """The delay before attempt ``reconsume_times`` (1 = the first redelivery)."""
    return float(delays[min(max(reconsume_times, 1), len(delays)) - 1])


def retry_delays(retry_delay_s: float | Sequence[float] | None) -> tuple[float, ...]:
    """The consumer's ``retry_delay_s`` option as one delay per attempt (the last repeats)."""
    if retry_delay_s is None:
        return ROCKETMQ_DELAYS_S
    if isinstance(retry_delay_s, (int, float)):
        delays: tuple[float, ...] = (float(retry_delay_s),)
    else:
        delays = tuple(float(d) for d in retry_delay_s)
    if not delays or any(d < 0 for d in delays):
        raise ConfigError("retry delays must be non-negative seconds")
    return delays


def due_ms(headers: Mapping[str, str]) -> int:
    """When a retry record (its decoded headers) is due, epoch ms; 0 (now) if it does not
    say: a record that cannot wait is delivered, never held for ever."""
    try:
        return int(headers.get(RetryHeaders.DUE_MS) or 0)
    except ValueError:
        return 0


def _strip(headers: Iterable[tuple[str, bytes | None]]) -> list[tuple[str, bytes]]:
    return [(k, v or b"") for k, v in headers if k not in RetryHeaders.ALL]


def retry_record(
    topic: str,
    key: bytes | None,
    value: bytes | None,
    headers: Iterable[tuple[str, bytes | None]],
    origin_topic: str,
    reconsume_times: int,
    due_ms: int,
) -> Record:
    extra: Headers = (
        (RetryHeaders.ORIGIN_TOPIC, origin_topic.encode()),
        (RetryHeaders.RECONSUME_TIMES, str(reconsume_times).encode()),
        (RetryHeaders.DUE_MS, str(due_ms).encode()),
    )
    return Record(topic, key, value, tuple(_strip(headers)) + extra)


def dead_letter_record(
    topic: str,
    key: bytes | None,
    value: bytes | None,
    headers: Iterable[tuple[str, bytes | None]],
    origin_topic: str,
    partition: int,
    offset: int,
    reconsume_times: int,
    reason: str,
) -> Record:
    """The record as it was delivered, plus why it was given up and where it came from."""
    extra: Headers = (
        (RetryHeaders.RECONSUME_TIMES, str(reconsume_times).encode()),
        (H.DLQ_REASON, reason.encode()),
        (H.DLQ_ORIGIN_TOPIC, origin_topic.encode()),
        (H.DLQ_ORIGIN_PARTITION, str(partition).encode()),
        (H.DLQ_ORIGIN_OFFSET, str(offset).encode()),
    )
    return Record(topic, key, value, tuple(_strip(headers)) + extra)
