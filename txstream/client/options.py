"""Turning a client's keyword options into :class:`KafkaSettings` and :class:`Topics`.

Both clients accept either a ready ``kafka=KafkaSettings(...)`` or its pieces
(``security_protocol=``, ``sasl_username=``, ...), a properties file (``kafka_config=``) and
Kafka client properties (``kafka_properties={"linger.ms": 10}``); unset pieces come from the
``TXSTREAM_*`` environment variables, as for every other part of txstream.
"""

from __future__ import annotations

import dataclasses
import os
import time
from typing import Any

from txstream.errors import ConfigError
from txstream.kafka import KafkaSettings
from txstream.topics import Topics

__all__ = [
    "check_counts",
    "resolve_settings",
    "resolve_topics",
    "producer_options",
    "new_message_id",
    "now_ms",
    "timeout_ms",
]

_KAFKA_FIELDS = frozenset(f.name for f in dataclasses.fields(KafkaSettings)) - {"properties"}


def resolve_settings(
    bootstrap_servers: str | None, kafka: KafkaSettings | None, pieces: dict[str, Any]
) -> KafkaSettings:
    """A client's Kafka settings, setting by setting: ``kafka=`` (else the ``TXSTREAM_*``
    variables and ``TXSTREAM_KAFKA_CONFIG``'s file) < ``kafka_config=`` (a properties file)
    < ``kafka_properties=`` (Kafka's names) < the other pieces < ``bootstrap_servers``."""
    pieces = dict(pieces)
    config = pieces.pop("kafka_config", None)
    properties = pieces.pop("kafka_properties", None)
    unknown = sorted(set(pieces) - _KAFKA_FIELDS)
    if unknown:
        raise ConfigError(
            f"unknown option(s) {', '.join(unknown)}; Kafka options are kafka_config, "
            f"kafka_properties, {', '.join(sorted(_KAFKA_FIELDS))}"
        )
    changes = {k: v for k, v in pieces.items() if v is not None}
    if bootstrap_servers:
        changes["bootstrap_servers"] = bootstrap_servers
    if kafka is not None:
        if config is None and properties is None:
            return dataclasses.replace(kafka, **changes)
        return kafka.with_properties(properties, file=config, **changes)
    return KafkaSettings.from_properties(properties, file=config, env=True, **changes)


def resolve_topics(topics: Topics | None, topic_prefix: str | None) -> Topics:
    if topics is not None and topic_prefix:
        raise ConfigError("give either topics= or topic_prefix=, not both")
    if topics is not None:
        return topics
    return Topics.with_prefix(topic_prefix or "")


def new_message_id() -> str:
    """A message id that is also the transaction id: 32 upper-case hex digits like RocketMQ's
    ``UNIQ_KEY``, and a UUIDv7 (RFC 9562): the millisecond it was made in, then 74 random bits.

    Random, so producers on many hosts need no coordination; timed, because the coordinator
    keys its state by that time (:mod:`txstream.state.keys`) and so holds each key only briefly.
    """
    ms = time.time_ns() // 1_000_000
    rand = int.from_bytes(os.urandom(10), "big")
    value = (ms & _MS_MASK) << 80 | 0x7 << 76 | (rand >> 62 & 0xFFF) << 64 | 0b10 << 62 \
        | rand & _RAND_B_MASK
    return f"{value:032X}"


_MS_MASK = (1 << 48) - 1
_RAND_B_MASK = (1 << 62) - 1


def now_ms() -> int:
    return int(time.time() * 1000)


def timeout_ms(seconds: float, name: str) -> int:
    if not seconds or seconds <= 0:
        raise ConfigError(f"{name} must be a positive number of seconds")
    return max(1, int(seconds * 1000))


def producer_options(settings: KafkaSettings, send_timeout_ms: int, connect_timeout_ms: int
                     ) -> dict[str, Any]:
    """Overrides for :func:`make_producer` so that every wait ends within the send timeout."""
    return {
        "bootstrap_timeout_ms": connect_timeout_ms,
        "max_block_ms": send_timeout_ms,  # waiting for metadata, i.e. for a broker
        "request_timeout_ms": min(settings.request_timeout_ms, send_timeout_ms),
        "delivery_timeout_ms": send_timeout_ms,  # the producer's own retries stop here too
        "linger_ms": 0,  # every send is waited for: batching would only add latency
    }


def check_counts(**counts: tuple[int, int]) -> None:
    """Each ``name=(value, least)`` an integer of at least ``least``; ConfigError if not."""
    for name, (value, least) in counts.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            floor = "consume_thread_min" if name == "consume_thread_max" else least
            raise ConfigError(f"{name} must be an integer >= {floor}, got {value!r}")
