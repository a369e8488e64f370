"""Kafka client construction, shared by every part of txstream.

Every producer, consumer and admin client is built here, so TLS/SASL options reach all of
them (the client library, the Spark source and sinks, the admin tools) the same way. The
clients are kafka-python's, unless a :class:`ClientFactory` is plugged in for the scheme the
bootstrap servers start with (:func:`plug_clients`): the in-memory broker plugs its own for
``memory://`` (:mod:`txstream.kafka.memory_registry`, :mod:`txstream.testing`). A scheme, not
an object: the settings travel to Spark's workers as JSON and are made again there.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Hashable
from typing import Any, Generic, Protocol, TypeVar, cast

from kafka import KafkaConsumer, KafkaProducer

from txstream.errors import BrokerUnavailable
from txstream.kafka.protocols import Admin, Consumer, KafkaClient, Producer
from txstream.kafka.settings import KafkaSettings

__all__ = ["make_producer", "make_consumer", "make_admin", "wait_for_broker", "client_id",
           "ClientFactory", "plug_clients", "unplug_clients",
           "TopicTrackingProducer", "CommittedEndConsumer", "cached_client",
           "drop_cached_client", "clear_cached_clients",
           "close_quietly", "ClientSlot", "ask_while_refused",
           "PATIENT_AFTER_S", "PATIENT_FETCH_WAIT_MS"]

C = TypeVar("C", bound=KafkaClient)

log = logging.getLogger(__name__)

# Readers of known ranges let the broker hold a fetch only ~5 ms (fast tails). A broker on slow
# storage (tansu on S3) answers such fetches empty while it is still reading, again and again:
# after this long without progress a reader is rebuilt with a patient fetch wait.
PATIENT_AFTER_S = 1.0
PATIENT_FETCH_WAIT_MS = 500


def _unreachable_errors() -> tuple[type[BaseException], ...]:
    # Only connection failures mean "broker unavailable"; a bad client option must surface as
    # what it is, not as an unreachable broker.
    from kafka.errors import MetadataEmptyBrokerList, RetriableError

    return (RetriableError, MetadataEmptyBrokerList, OSError)


_UNREACHABLE = _unreachable_errors()


class TopicTrackingProducer(KafkaProducer):  # type: ignore[misc]  # kafka-python is untyped
    """kafka-python's producer, asking the broker about every topic it sends to: the
    :class:`~txstream.kafka.protocols.Producer` every txstream producer on Kafka is.

    kafka-python's metadata requests name only the topics it tracks, and it starts tracking a
    topic only when it knows none of the topic's partitions. tansu answers the first metadata
    request of a fresh client, which names no topic, with every topic: such a producer knows
    the existing topics' partitions without tracking them. The first refresh for a tracked
    topic (a new topic's first record) then forgets them, and records for an untracked topic
    still in the accumulator wait for a leader that is never asked for, until the delivery
    timeout. Java's producer adds every topic it sends to; this one does the same. It reaches
    into two private attributes of the pinned kafka-python; tests/sinks/test_kafka_sink.py fails if
    they change.
    """

    def send(self, topic: str, *args: Any, **kwargs: Any) -> Any:
        if topic not in self._metadata._topics:
            self._sender.add_topic(topic)
        return super().send(topic, *args, **kwargs)


# Between metadata requests sent again after a node refused the connection, and for how long
# (kafka-python backs off from a refusing node: the next request goes to another).
_METADATA_RETRY_S, _METADATA_RETRY_FOR_S = 0.2, 5.0


class CommittedEndConsumer(KafkaConsumer):  # type: ignore[misc]  # kafka-python is untyped
    """kafka-python's consumer whose ``highwater()`` is where a ``read_committed`` reader can
    read to: the last stable offset, below the high watermark while a transaction is open.

    Every txstream reader reads a partition to the end ``highwater()`` gave (txstream.kafka.
    reading); past the last stable offset a read_committed fetch returns nothing until the
    transaction ends, so such a read would wait for it. kafka-python keeps only the high
    watermark of a fetch answer: its parse step is wrapped to keep the lower of the two. It
    reaches into the pinned kafka-python's fetcher (tests/kafka/test_kafka_boundary.py).
    """

    def __init__(self, **configs: Any) -> None:
        super().__init__(**configs)
        if self.config["isolation_level"] == "read_committed":
            self._fetcher._parse_fetched_data = _capped_at_stable(
                self._fetcher._parse_fetched_data, self._subscription)

    def monotonic(self) -> float:
        return time.monotonic()

    # kafka-python sends a metadata request to one node and raises when that node refuses
    # the connection: with one node of a cluster down, any metadata question failed now and
    # then (a body read-back, the lag watch). Asked again, it goes to a live node.
    def topics(self) -> set[str]:
        return cast(set[str], _asking_live_nodes(super().topics,
                                                 self.config["request_timeout_ms"]))

    def partitions_for_topic(self, topic: str) -> set[int] | None:
        return cast(set[int] | None, _asking_live_nodes(
            lambda: super(CommittedEndConsumer, self).partitions_for_topic(topic),
            self.config["request_timeout_ms"]))


def _asking_live_nodes(ask: Callable[[], Any], timeout_ms: int) -> Any:
    return ask_while_refused(ask, min(timeout_ms / 1000, _METADATA_RETRY_FOR_S))


def ask_while_refused(ask: Callable[[], Any], for_s: float = _METADATA_RETRY_FOR_S,
                      refused: Callable[[BaseException], bool] | None = None) -> Any:
    """``ask()``, again while the node it went to refuses connections (a node of the cluster
    down; asked again, the client goes to another), for up to ``for_s``. Any other error,
    a broker that does not answer at all included, is raised at once. ``refused``: whether
    an error is a refused connection (default: kafka-python's KafkaConnectionError)."""
    from kafka.errors import KafkaConnectionError

    def connection_refused(exc: BaseException) -> bool:
        return isinstance(exc, KafkaConnectionError)

    is_refused = refused or connection_refused
    deadline = time.monotonic() + for_s
    while True:
        try:
            return ask()
        except Exception as exc:
            if not is_refused(exc) or time.monotonic() > deadline:
                raise
            time.sleep(_METADATA_RETRY_S)


def _capped_at_stable(parse: Callable[[Any], Any], subscription: Any) -> Callable[[Any], Any]:
    def parse_capped(completed_fetch: Any) -> Any:
        parsed = parse(completed_fetch)
        stable = getattr(completed_fetch.partition_data, "last_stable_offset", -1)
        tp = completed_fetch.topic_partition
        if stable is not None and stable >= 0 and subscription.is_assigned(tp):
            state = subscription.assignment[tp]
            if state.highwater is not None and stable < state.highwater:
                state.highwater = stable
        return parsed
    return parse_capped


# txstream's own defaults: the settings' properties beat them, the caller's overrides beat
# both (a reader's fetch sizes, the sink's one request in flight, the client library's
# timeouts). Values that would break a guarantee are refused with the settings
# (txstream.kafka.properties), so acks=all and idempotence always hold.
_PRODUCER_DEFAULTS: dict[str, Any] = {
    "acks": "all", "enable_idempotence": True, "linger_ms": 5,
    "max_request_size": 8 * 1024 * 1024, "retries": 5,
}
_CONSUMER_DEFAULTS: dict[str, Any] = {
    # A record of a failed transactional batch is never read (docs/decisions/0032-
    # transactions.md); on records written without transactions it changes nothing.
    "isolation_level": "read_committed",
    "enable_auto_commit": False, "auto_offset_reset": "earliest",
    "fetch_max_bytes": 16 * 1024 * 1024, "max_partition_fetch_bytes": 8 * 1024 * 1024,
}
_GROUP_DEFAULTS: dict[str, Any] = {
    # tansu (and small clusters) join a group in half the session timeout: keep it short.
    "session_timeout_ms": 6000, "heartbeat_interval_ms": 1000,
    # A member subscribed to a topic that Apache Kafka creates on that very request learns
    # its partitions at the next metadata refresh: kafka-python's default is 5 minutes, in
    # which the group had none (half of the joins on a new topic).
    "metadata_max_age_ms": 5000,
}


def client_id(settings: KafkaSettings, role: str | None, kind: str) -> str:
    """``<prefix>-<role>``: the prefix is the user's ``client.id`` property, else
    ``txstream``; the role is the caller's (``source``, ``producer-<group>``, ...), else the
    settings' ``client_role``, else the kind of client."""
    prefix = str(settings.properties.get("client.id") or "txstream").strip()
    return f"{prefix}-{role or settings.role or kind}"


def _kwargs(settings: KafkaSettings, kind: str, role: str | None, defaults: dict[str, Any],
            overrides: dict[str, Any]) -> dict[str, Any]:
    kw = {"client_id": client_id(settings, role, kind), **defaults}
    kw.update(settings.client_kwargs(kind))
    kw.update(overrides)
    return kw


class ClientFactory(Protocol):
    """Clients of another kind than kafka-python's, for the settings of one scheme; each made
    with kafka-python's keyword arguments, as :func:`make_producer` and the others built them."""

    def producer(self, settings: KafkaSettings, kwargs: dict[str, Any]) -> Producer: ...

    def consumer(self, settings: KafkaSettings, kwargs: dict[str, Any]) -> Consumer: ...

    def admin(self, settings: KafkaSettings, kwargs: dict[str, Any]) -> Admin: ...

    def wait(self, settings: KafkaSettings) -> None:
        """:func:`wait_for_broker`: return once the broker answers, else raise
        BrokerUnavailable."""


_PLUGGED: dict[str, ClientFactory] = {}


def plug_clients(scheme: str, factory: ClientFactory) -> None:
    """Settings whose bootstrap servers start with ``scheme`` (``memory://``) get
    ``factory``'s clients from now on, in this process."""
    _PLUGGED[scheme] = factory


def unplug_clients(scheme: str) -> None:
    _PLUGGED.pop(scheme, None)


def _plugged(settings: KafkaSettings) -> ClientFactory | None:
    for scheme, factory in _PLUGGED.items():
        if settings.bootstrap_servers.startswith(scheme):
            return factory
    return None


def make_producer(settings: KafkaSettings, *, role: str | None = None,
                  **overrides: Any) -> Producer:
    """An idempotent, acks=all producer: a send counts only once the broker stored it.
    ``role`` names it in its client id (see :func:`client_id`)."""
    kw = _kwargs(settings, "producer", role, _PRODUCER_DEFAULTS, overrides)
    try:
        plugged = _plugged(settings)
        if plugged is not None:
            return plugged.producer(settings, kw)
        producer: Producer = TopicTrackingProducer(**kw)
        return producer
    except _UNREACHABLE as exc:
        raise BrokerUnavailable(
            f"cannot reach Kafka at {settings.bootstrap_servers}: {exc}"
        ) from None


def make_consumer(settings: KafkaSettings, *, role: str | None = None,
                  **overrides: Any) -> Consumer:
    """A consumer. Without ``group_id`` it is meant for ``assign()`` with our own offsets.
    It reads committed records only (``isolation_level`` read_committed, unless overridden)."""
    defaults = dict(_CONSUMER_DEFAULTS)
    if overrides.get("group_id"):
        defaults.update(_GROUP_DEFAULTS)
    kw = _kwargs(settings, "consumer", role, defaults, overrides)
    try:
        plugged = _plugged(settings)
        if plugged is not None:
            return plugged.consumer(settings, kw)
        consumer: Consumer = CommittedEndConsumer(**kw)
        return consumer
    except _UNREACHABLE as exc:
        raise BrokerUnavailable(
            f"cannot reach Kafka at {settings.bootstrap_servers}: {exc}"
        ) from None


def make_admin(settings: KafkaSettings, *, role: str | None = None, **overrides: Any) -> Admin:
    from kafka import KafkaAdminClient

    kw = _kwargs(settings, "admin", role, {}, overrides)
    try:
        plugged = _plugged(settings)
        if plugged is not None:
            return plugged.admin(settings, kw)
        admin: Admin = KafkaAdminClient(**kw)
        return admin
    except _UNREACHABLE as exc:
        raise BrokerUnavailable(
            f"cannot reach Kafka at {settings.bootstrap_servers}: {exc}"
        ) from None


def wait_for_broker(settings: KafkaSettings, timeout_s: float = 30.0) -> None:
    """Block until the broker answers a metadata request, with backoff; else raise.

    The error is one line (no stack trace wall): what was tried, for how long. A memory
    broker is not waited for (its time is the simulation's): it answers now or raises.
    """
    from kafka import KafkaConsumer

    plugged = _plugged(settings)
    if plugged is not None:
        plugged.wait(settings)
        return

    deadline = time.monotonic() + timeout_s
    delay = 0.2
    last = "no answer"
    while True:
        try:
            consumer = KafkaConsumer(**_kwargs(settings, "consumer", None, {},
                                               {"bootstrap_timeout_ms": 2000}))
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


def close_quietly(client: KafkaClient) -> None:
    """Close a client that may be broken; never raises.

    A producer is closed without waiting: kafka-python's ``close()`` flushes first and, when
    records are still pending, gives up and leaves its I/O thread retrying until
    ``delivery_timeout_ms`` (2 min). Whoever closes a broken producer sends its records again.
    """
    try:
        if hasattr(client, "send"):  # a producer (the Protocols are not runtime-checkable)
            cast(Producer, client).close(timeout=0)
        else:
            client.close()
    except Exception:
        sender = getattr(client, "_sender", None)
        if sender is not None:
            sender.force_close()


# Clients kept for the life of a process, one per key: Spark reuses its Python workers
# (spark.python.worker.reuse), and connecting (for an idempotent producer, also getting a
# producer id) costs more than a micro-batch's reads or writes.
_CACHED: dict[Hashable, KafkaClient] = {}
_CACHED_LOCK = threading.Lock()


def cached_client(key: Hashable, make: Callable[[], C]) -> C:
    """This process's client for ``key``, made by ``make`` the first time."""
    with _CACHED_LOCK:
        client = _CACHED.get(key)
        if client is None:
            client = _CACHED[key] = make()
        return cast(C, client)  # a key's client is always made by the same kind of ``make``


def drop_cached_client(key: Hashable) -> None:
    """Forget (and close) the client for ``key`` after an error: the next use makes a new one,
    as a client may be left in a state it does not recover from (a fatal idempotent producer,
    a consumer spinning on a parsed fetch)."""
    with _CACHED_LOCK:
        client = _CACHED.pop(key, None)
    if client is not None:
        close_quietly(client)


def clear_cached_clients() -> None:
    """Forget (and close) every kept client, as a process that starts again has none (a
    simulated process restart)."""
    with _CACHED_LOCK:
        clients = list(_CACHED.values())
        _CACHED.clear()
    for client in clients:
        close_quietly(client)


class ClientSlot(Generic[C]):
    """One client, made by ``make`` when first wanted: the slot's own, closed by
    :meth:`close`, or with ``kept_as`` the process's (:func:`cached_client`), which outlives
    the slot."""

    def __init__(self, make: Callable[[], C], kept_as: Hashable | None = None) -> None:
        self._make, self.key = make, kept_as
        self._own: C | None = None

    def get(self) -> C:
        if self.key is not None:
            return cached_client(self.key, self._make)
        if self._own is None:
            self._own = self._make()
        return self._own

    def drop(self) -> None:
        """Forget (and close) the client, after an error: the next :meth:`get` makes anew."""
        if self.key is not None:
            drop_cached_client(self.key)
        elif self._own is not None:
            own, self._own = self._own, None
            close_quietly(own)

    def close(self) -> None:
        if self.key is None:
            self.drop()
