"""Names of the Kafka topics txstream reads and writes (RocketMQ's names where it has one)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache

from txstream.errors import ConfigError

__all__ = [
    "HALF_TOPIC",
    "END_TOPIC",
    "CHECK_TOPIC_PREFIX",
    "DISCARD_TOPIC",
    "DEAD_LETTER_TOPIC",
    "HISTORY_TOPIC",
    "RETRY_PREFIX",
    "DLQ_PREFIX",
    "Topics",
    "validate_group",
    "validate_topic",
]

HALF_TOPIC = "RMQ_SYS_TRANS_HALF_TOPIC"
END_TOPIC = "RMQ_SYS_TRANS_OP_HALF_TOPIC"
CHECK_TOPIC_PREFIX = "RMQ_SYS_TRANS_CHECK_"
DISCARD_TOPIC = "TRANS_CHECK_MAX_TIME_TOPIC"
DEAD_LETTER_TOPIC = "TXSTREAM_DEAD_LETTER"
HISTORY_TOPIC = "TXSTREAM_HISTORY"
# A push consumer group's own topics (RocketMQ's %RETRY%<group> and %DLQ%<group>).
RETRY_PREFIX = "TXSTREAM_RETRY_"
DLQ_PREFIX = "TXSTREAM_DLQ_"

# Kafka's legal topic characters; RocketMQ's group charset is a subset except '%' and '|'.
_NAME = re.compile(r"^[A-Za-z0-9._-]+$")
_MAX_GROUP = 200  # leaves room for the check-topic prefix within Kafka's 249 characters


def validate_group(group: str) -> str:
    """Return ``group`` if it can name a producer group (and thus a check topic)."""
    if not isinstance(group, str) or not group:
        raise ConfigError("producer group must be a non-empty string")
    if not _legal_group(group):
        raise ConfigError(
            f"producer group {group!r} must be 1-{_MAX_GROUP} characters of [A-Za-z0-9._-]"
        )
    return group


def validate_topic(topic: str) -> str:
    """Return ``topic`` if Kafka accepts it as a topic name."""
    if not isinstance(topic, str) or not topic:
        raise ConfigError("topic must be a non-empty string")
    if not _legal_topic(topic):
        raise ConfigError(f"topic {topic!r} must be 1-249 characters of [A-Za-z0-9._-]")
    return topic


# Every record the coordinator reads or writes names a topic and a group, and few distinct
# names exist: remembering the answer saves a regular expression per record.
@lru_cache(maxsize=4096)
def _legal_group(group: str) -> bool:
    return len(group) <= _MAX_GROUP and bool(_NAME.match(group))


@lru_cache(maxsize=4096)
def _legal_topic(topic: str) -> bool:
    return len(topic) <= 249 and bool(_NAME.match(topic)) and topic not in (".", "..")


@dataclass(frozen=True)
class Topics:
    """The system topics of one coordinator; a prefix keeps several apart on one broker."""

    half: str = HALF_TOPIC
    end: str = END_TOPIC
    check_prefix: str = CHECK_TOPIC_PREFIX
    discard: str = DISCARD_TOPIC
    dead_letter: str = DEAD_LETTER_TOPIC
    history: str = HISTORY_TOPIC
    prefix: str = ""  # what with_prefix put before every name

    @classmethod
    def with_prefix(cls, prefix: str) -> Topics:
        """All system topics renamed ``prefix + name`` (tests and side-by-side deployments)."""
        if not prefix:
            return cls()
        validate_topic(prefix)
        return cls(
            half=prefix + HALF_TOPIC,
            end=prefix + END_TOPIC,
            check_prefix=prefix + CHECK_TOPIC_PREFIX,
            discard=prefix + DISCARD_TOPIC,
            dead_letter=prefix + DEAD_LETTER_TOPIC,
            history=prefix + HISTORY_TOPIC,
            prefix=prefix,
        )

    def check(self, group: str) -> str:
        """The check-request topic of one producer group."""
        return self.check_prefix + validate_group(group)

    def system(self) -> tuple[str, ...]:
        return (self.half, self.end, self.discard, self.dead_letter, self.history)
