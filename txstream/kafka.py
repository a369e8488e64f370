"""Kafka connection settings and client construction, shared by every part of txstream.

Every producer, consumer and admin client is built here, so TLS/SASL options reach all of
them (the client library, the Spark source and sinks, the admin tools) the same way.
"""

from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from kafka import KafkaProducer

from txstream.errors import BrokerUnavailable, ConfigError

__all__ = ["KafkaSettings", "make_producer", "make_consumer", "make_admin", "wait_for_broker",
           "TopicTrackingProducer",
           "PATIENT_AFTER_S", "PATIENT_FETCH_WAIT_MS"]

log = logging.getLogger(__name__)

_SECURITY = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
# Readers of known ranges let the broker hold a fetch only ~5 ms (fast tails). A broker on slow
# storage (tansu on S3) answers such fetches empty while it is still reading, again and again:
# after this long without progress a reader is rebuilt with a patient fetch wait.
PATIENT_AFTER_S = 1.0
PATIENT_FETCH_WAIT_MS = 500


@dataclass(frozen=True)
class KafkaSettings:
    """Where the broker is and how to talk to it. Picklable: it travels to Spark workers."""

    bootstrap_servers: str = "127.0.0.1:9092"
    security_protocol: str = "PLAINTEXT"
    sasl_mechanism: str | None = None
    sasl_username: str | None = None
    sasl_password: str | None = None
    ssl_cafile: str | None = None
    ssl_certfile: str | None = None
    ssl_keyfile: str | None = None
    request_timeout_ms: int = 30_000
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.bootstrap_servers or not all(
            ":" in s for s in self.bootstrap_servers.split(",")
        ):
            raise ConfigError(
                "bootstrap servers must be HOST:PORT[,HOST:PORT...], "
                f"got {self.bootstrap_servers!r}"
            )
        if self.security_protocol not in _SECURITY:
            raise ConfigError(f"security protocol must be one of {', '.join(_SECURITY)}")
        if self.security_protocol.startswith("SASL") and not self.sasl_mechanism:
            raise ConfigError("a SASL security protocol needs --sasl-mechanism")

    @classmethod
    def from_option(cls, raw: str | None) -> KafkaSettings:
        """The ``kafka`` option of the Spark source and sink: JSON of :meth:`as_dict`."""
        if not raw:
            raise ConfigError("option kafka (JSON of KafkaSettings.as_dict()) is required")
        try:
            return cls(**json.loads(raw))
        except (ValueError, TypeError) as exc:
            raise ConfigError(f"option kafka is not KafkaSettings JSON: {exc}") from None

    @classmethod
    def from_env(cls, **overrides: Any) -> KafkaSettings:
        """Settings from ``TXSTREAM_*`` environment variables, then ``overrides``."""
        env = {
            "bootstrap_servers": os.environ.get("TXSTREAM_BOOTSTRAP_SERVERS"),
            "security_protocol": os.environ.get("TXSTREAM_SECURITY_PROTOCOL"),
            "sasl_mechanism": os.environ.get("TXSTREAM_SASL_MECHANISM"),
            "sasl_username": os.environ.get("TXSTREAM_SASL_USERNAME"),
            "sasl_password": os.environ.get("TXSTREAM_SASL_PASSWORD"),
            "ssl_cafile": os.environ.get("TXSTREAM_SSL_CAFILE"),
            "ssl_certfile": os.environ.get("TXSTREAM_SSL_CERTFILE"),
            "ssl_keyfile": os.environ.get("TXSTREAM_SSL_KEYFILE"),
        }
        values = {k: v for k, v in env.items() if v}
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)

    def client_kwargs(self) -> dict[str, Any]:
        """Keyword arguments common to kafka-python's producer, consumer and admin client."""
        kw: dict[str, Any] = {
            "bootstrap_servers": self.bootstrap_servers.split(","),
            "security_protocol": self.security_protocol,
            "request_timeout_ms": self.request_timeout_ms,
        }
        if self.sasl_mechanism:
            kw["sasl_mechanism"] = self.sasl_mechanism
            kw["sasl_plain_username"] = self.sasl_username
            kw["sasl_plain_password"] = self.sasl_password
        for name in ("ssl_cafile", "ssl_certfile", "ssl_keyfile"):
            if getattr(self, name):
                kw[name] = getattr(self, name)
        kw.update(self.extra)
        return kw

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _unreachable_errors() -> tuple[type[BaseException], ...]:
    # Only connection failures mean "broker unavailable"; a bad client option must surface as
    # what it is, not as an unreachable broker.
    from kafka.errors import MetadataEmptyBrokerList, RetriableError

    return (RetriableError, MetadataEmptyBrokerList, OSError)


_UNREACHABLE = _unreachable_errors()


class TopicTrackingProducer(KafkaProducer):  # type: ignore[misc]
    """kafka-python's producer, asking the broker about every topic it sends to.

    kafka-python's metadata requests name only the topics it tracks, and it starts tracking a
    topic only when it knows none of the topic's partitions. tansu answers the first metadata
    request of a fresh client, which names no topic, with every topic: such a producer knows
    the existing topics' partitions without tracking them. The first refresh for a tracked
    topic (a new topic's first record) then forgets them, and records for an untracked topic
    still in the accumulator wait for a leader that is never asked for, until the delivery
    timeout. Java's producer adds every topic it sends to; this one does the same. It reaches
    into two private attributes of the pinned kafka-python; tests/test_kafka_sink.py fails if
    they change.
    """

    def send(self, topic: str, *args: Any, **kwargs: Any) -> Any:
        if topic not in self._metadata._topics:
            self._sender.add_topic(topic)
        return super().send(topic, *args, **kwargs)


def make_producer(settings: KafkaSettings, **overrides: Any) -> Any:
    """An idempotent, acks=all producer: a send counts only once the broker stored it."""
    kw = settings.client_kwargs()
    kw.update(
        acks="all",
        enable_idempotence=True,
        linger_ms=5,
        max_request_size=8 * 1024 * 1024,
        retries=5,
    )
    kw.update(overrides)
    try:
        return TopicTrackingProducer(**kw)
    except _UNREACHABLE as exc:
        raise BrokerUnavailable(
            f"cannot reach Kafka at {settings.bootstrap_servers}: {exc}"
        ) from None


def make_consumer(settings: KafkaSettings, **overrides: Any) -> Any:
    """A consumer. Without ``group_id`` it is meant for ``assign()`` with our own offsets."""
    from kafka import KafkaConsumer

    kw = settings.client_kwargs()
    kw.update(
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        fetch_max_bytes=16 * 1024 * 1024,
        max_partition_fetch_bytes=8 * 1024 * 1024,
    )
    if overrides.get("group_id"):
        # tansu (and small clusters) join a group in half the session timeout: keep it short.
        kw.update(session_timeout_ms=6000, heartbeat_interval_ms=1000)
    kw.update(overrides)
    try:
        return KafkaConsumer(**kw)
    except _UNREACHABLE as exc:
        raise BrokerUnavailable(
            f"cannot reach Kafka at {settings.bootstrap_servers}: {exc}"
        ) from None


def make_admin(settings: KafkaSettings, **overrides: Any) -> Any:
    from kafka import KafkaAdminClient

    kw = settings.client_kwargs()
    kw.update(overrides)
    try:
        return KafkaAdminClient(**kw)
    except _UNREACHABLE as exc:
        raise BrokerUnavailable(
            f"cannot reach Kafka at {settings.bootstrap_servers}: {exc}"
        ) from None


def wait_for_broker(settings: KafkaSettings, timeout_s: float = 30.0) -> None:
    """Block until the broker answers a metadata request, with backoff; else raise.

    The error is one line (no stack trace wall): what was tried, for how long.
    """
    from kafka import KafkaConsumer

    deadline = time.monotonic() + timeout_s
    delay = 0.2
    last = "no answer"
    while True:
        try:
            consumer = KafkaConsumer(
                **settings.client_kwargs(), bootstrap_timeout_ms=2000
            )
            try:
                consumer.topics()
                return
            finally:
                consumer.close()
        except Exception as exc:
            last = f"{type(exc).__name__}: {exc}"
        if time.monotonic() + delay > deadline:
            raise BrokerUnavailable(
                f"Kafka broker at {settings.bootstrap_servers} unreachable after "
                f"{timeout_s:.0f}s ({last})"
            )
        log.info("broker %s not reachable yet (%s); retrying in %.1fs",
                 settings.bootstrap_servers, last, delay)
        time.sleep(delay)
        delay = min(delay * 2, 5.0)
