"""The faults a simulation switches on an in-memory broker's partitions (a part of
:class:`txstream.kafka.memory.MemoryBroker`): a send stored whose acknowledgement is lost, a
partition that refuses appends while the others take them (Kafka acknowledges each partition
on its own), and a leader short of in-sync replicas that holds its high watermark back
(Kafka 4, KIP-966)."""

from __future__ import annotations

from collections.abc import Callable

from txstream.kafka.memory_log import PartitionLog, Topic

__all__ = ["PartitionFaults"]


class PartitionFaults:
    """The broker's fault switches; the broker gives its clock, replicas, topics and logs."""

    clock: Callable[[], int]
    replicas: int
    _topics: dict[str, Topic]
    _log: Callable[[str, int], PartitionLog]  # a partition's log (created if need be)

    def _init_faults(self) -> None:
        self._in_doubt = 0
        self._refusing: dict[tuple[str, int], int] = {}  # partition -> refuses until (ms)
        self._holding: dict[tuple[str, int], int] = {}  # partition -> holds its HW until (ms)

    def _take_in_doubt(self) -> bool:
        """Whether the append being made is one whose acknowledgement is lost."""
        if self._in_doubt > 0:
            self._in_doubt -= 1
            return True
        return False

    def in_doubt_next(self, count: int = 1) -> None:
        """The next ``count`` records clients append are stored, but their acknowledgement is
        lost: the send fails with a timeout although the record is there."""
        self._in_doubt += count

    def refuse_appends(self, topic: str, partition: int, until_ms: int) -> None:
        """Clients' appends to one partition are not taken until ``until_ms`` (the broker's
        clock), while every other partition takes them: a partition whose leader is being
        elected, or with fewer in-sync replicas than ``min.insync.replicas``. A producer keeps
        such a record waiting, and it expires as any undelivered record does."""
        self._refusing[(topic, partition)] = until_ms

    def refuses(self, topic: str, partition: int) -> bool:
        """Whether clients' appends to the partition are refused now."""
        until = self._refusing.get((topic, partition))
        return until is not None and self.clock() < until

    def hold_high_watermark(self, topic: str, partition: int, at: int, until_ms: int) -> None:
        """Until ``until_ms``, one partition's leader has fewer in-sync replicas than
        ``min.insync.replicas`` and keeps its high watermark at ``at`` (Kafka 4, KIP-966: a
        leader elected from the last replica in sync learnt it a fetch late): records it
        acknowledged past ``at`` are stored, not handed out; appends are refused; the
        metadata shows one replica of two in sync (``in_sync``)."""
        self._log(topic, partition).held = at
        self._holding[(topic, partition)] = until_ms
        self.refuse_appends(topic, partition, until_ms)

    def in_sync(self, topic: str, partition: int) -> int:
        """How many of the partition's ``replicas`` are in sync now."""
        self.release_holds()
        return 1 if (topic, partition) in self._holding else self.replicas

    def release_holds(self) -> None:
        """Partitions whose replicas are back in sync hand out all they acknowledged."""
        now = self.clock()
        for (topic, partition), until in list(self._holding.items()):
            if now >= until:
                del self._holding[(topic, partition)]
                found = self._topics.get(topic)
                if found is not None and partition < len(found.logs):
                    found.logs[partition].held = None
