"""Partitions that cannot take a write now: no leader, or fewer in-sync replicas than the
topic's ``min.insync.replicas``.

txstream's producers write with ``acks=all``: below ``min.insync.replicas`` the broker refuses
every write to the partition (NOT_ENOUGH_REPLICAS), and without a leader nothing can be written
at all. Only a replicated cluster shows either (a leader's node lost, followers paused or
lagging); ``/healthz`` names such partitions with their topics
(``txstream.streaming.engine.health``).
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

from txstream.kafka.protocols import Admin
from txstream.kafka.settings import KafkaSettings

__all__ = ["PartitionTrouble", "partition_troubles", "min_insync_replicas", "troubles_of",
           "unless_held_before_ends",
           "unless_held"]

MIN_ISR = "min.insync.replicas"
_ASK_AGAIN_FOR_S = 5.0
# One admin client per process and cluster, kept: a new one pays a connection and a metadata
# round at every ask, and a fenced sink task's look asks four times (figures in
# docs/decisions/0032-transactions.md). kafka-python's clients are not thread-safe: one ask at
# a time.
_KEPT_LOCK = threading.Lock()


@dataclass(frozen=True)
class PartitionTrouble:
    """A partition that refuses writes, and why."""

    topic: str
    partition: int
    in_sync: int  # replicas in sync (0 with no leader)
    replicas: int
    min_in_sync: int
    leader: bool

    def __str__(self) -> str:
        where = f"{self.topic}-{self.partition}"
        if not self.leader:
            return f"{where} has no leader: writes to it wait"
        return (f"{where} has {self.in_sync} in-sync replica(s) of {self.replicas}, below "
                f"{MIN_ISR} {self.min_in_sync}: writes to it are refused")


def min_insync_replicas(admin: Admin, topics: Sequence[str]) -> dict[str, int]:
    """Each topic's ``min.insync.replicas`` (the broker's default included); a topic the broker
    does not tell it for is left out (taken as 1)."""
    from kafka.admin import ConfigResource, ConfigResourceType

    if not topics:
        return {}
    # Every config: tansu drops the connection when keys are named.
    answer = admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, t)
                                     for t in topics], config_filter="all")
    out: dict[str, int] = {}
    for topic, configs in answer.get("topic", {}).items():
        entry = configs.get(MIN_ISR) if isinstance(configs, Mapping) else None
        value = entry.get("value") if isinstance(entry, Mapping) else None
        if value is not None and str(value).strip().isdigit():
            out[topic] = int(value)
    return out


def partition_troubles(admin: Admin, topics: Sequence[str],
                       min_in_sync: Mapping[str, int] | None = None) -> list[PartitionTrouble]:
    """The partitions of ``topics`` that cannot take a write now, as the cluster's metadata
    says; a topic that does not exist has none. ``min_in_sync``: each topic's
    ``min.insync.replicas`` (:func:`min_insync_replicas`; missing: 1)."""
    if not topics:
        return []
    limits = min_in_sync or {}
    troubles = []
    for described in admin.describe_topics(list(topics)):
        if described.get("error_code", 0) != 0:
            continue
        topic = str(described["name"])
        for part in described.get("partitions", []):
            trouble = _trouble(topic, part, limits.get(topic, 1))
            if trouble is not None:
                troubles.append(trouble)
    return sorted(troubles, key=lambda t: (t.topic, t.partition))


def _trouble(topic: str, part: Mapping[str, Any], min_in_sync: int) -> PartitionTrouble | None:
    leader = int(part.get("leader_id", -1)) >= 0
    in_sync = len(part.get("isr_nodes") or []) if leader else 0
    replicas = len(part.get("replica_nodes") or [])
    if leader and in_sync >= min_in_sync:
        return None
    return PartitionTrouble(topic, int(part["partition_index"]), in_sync, replicas,
                            min_in_sync, leader)


def troubles_of(settings: KafkaSettings, topics: Sequence[str]
                ) -> dict[tuple[str, int], PartitionTrouble]:
    """:func:`partition_troubles` of ``topics``, asked with the process's kept admin client,
    by (topic, partition). A leader short of in-sync replicas also keeps its high watermark
    where it was (Kafka 4, KIP-966): a reader finds such a partition ending below records it
    read before, none of them lost."""
    from txstream.kafka.clients import ClientSlot, ask_while_refused, make_admin
    from txstream.kafka.provision import admin_errors

    slot = ClientSlot(lambda: make_admin(settings), kept_as=("partition-health", settings.key))

    def ask() -> dict[tuple[str, int], PartitionTrouble]:
        with _KEPT_LOCK:
            try:
                with admin_errors(settings):
                    admin = slot.get()
                    limits = min_insync_replicas(admin, topics)
                    return {(t.topic, t.partition): t
                            for t in partition_troubles(admin, topics, limits)}
            except BaseException:
                slot.drop()  # the next ask starts from a new client (another node, maybe)
                raise

    # A node of the cluster down refuses the connection: asked again, a new client goes to
    # another (as txstream's consumers do). A broker that does not answer is told at once.
    return cast(dict[tuple[str, int], PartitionTrouble],
                ask_while_refused(ask, _ASK_AGAIN_FOR_S, refused=_refused))


def _refused(exc: BaseException) -> bool:
    """A refused connection, also as provision's admin_client words it (BrokerUnavailable
    naming kafka-python's KafkaConnectionError)."""
    from txstream.errors import BrokerUnavailable
    from txstream.kafka.errors import KafkaConnectionError

    return isinstance(exc, KafkaConnectionError) or (
        isinstance(exc, BrokerUnavailable) and KafkaConnectionError.__name__ in str(exc))


def unless_held(settings: KafkaSettings, topic: str, looked_for: str) -> None:
    """Raises :class:`txstream.errors.SendFailed` (the batch runs again) if a partition of
    ``topic`` has no leader or too few replicas in sync: a look that did not find
    ``looked_for`` on it proves nothing then, for what such a leader acknowledged past its
    held high watermark is not handed out (docs/decisions/0021-bodies-read-back.md)."""
    from txstream.errors import SendFailed

    if held := troubles_of(settings, [topic]):
        raise SendFailed(f"cannot tell whether {looked_for} on {topic}: "
                         f"{'; '.join(map(str, held.values()))}; the batch runs again once "
                         f"its replicas are back")


def unless_held_before_ends(settings: KafkaSettings, topic: str, looked_for: str) -> None:
    """:func:`unless_held`, asked before a look takes ``topic``'s ends: ends taken while a
    leader holds its high watermark back, then a check made once it no longer does, would
    pass a look that never read what that leader had acknowledged past it."""
    unless_held(settings, topic, looked_for)
