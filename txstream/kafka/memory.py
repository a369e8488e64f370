"""An in-memory Kafka broker for deterministic simulations, behind txstream's own client seam.

``KafkaSettings(bootstrap_servers="memory://NAME")`` makes :mod:`txstream.kafka.clients` hand out
the fake clients of :mod:`txstream.kafka.memory_clients`, talking to the :class:`MemoryBroker`
registered under NAME. txstream's I/O code (``read_range``, ``fetch_ends``, the sink's
``Delivery``, the source's reader, the provisioning admin calls) then runs unchanged, with no
broker process, no threads, no sockets, no wall clock and no sleeps: the broker's time is the
simulation's ``clock()`` (ms), and every choice is drawn from one seeded ``random.Random``, so
a schedule replays exactly.

Scope: the subset of Kafka txstream uses, answered in kafka-python 3.0.12's shapes. Topics of
partitions (:mod:`txstream.kafka.memory_log`); per partition a log of records (offset, key,
value, headers, timestamp and its type), a log start offset and an end (the high watermark: one
replica). Idempotent acks=all producers, ``assign()`` consumers, the admin calls of
:mod:`txstream.kafka.provision`, and Kafka transactions as Apache Kafka has them, not tansu
(:mod:`txstream.kafka.memory_transactions`): a transactional producer fences the id's earlier
one and aborts what it left open; COMMIT and ABORT markers take offsets; ``read_committed``
consumers read below the last stable offset and skip aborted records, their ``highwater()``
the last stable offset (as txstream's ``CommittedEndConsumer``). Not here: consumer groups
(refused by name), ACLs, quotas, replication (the metadata shows ``replicas``, one copy is
kept), record batches (a record is its own batch), a
broker-side ``max.message.bytes`` (the producer's ``max_request_size`` check is kept).
ListOffsets (a reset to ``latest``, ``end_offsets``) answers right, as tansu's does not.

Kafka or tansu (the broker the tests run): :meth:`MemoryBroker.like_tansu` answers as tansu
does where the two differ: a ``LogAppendTime`` topic keeps the producer's timestamp; a fetch
past the end is empty, not out of range; the broker's configs are not told; auto-created
topics get 4 partitions. tests/kafka/test_memory_kafka_contract.py holds it to tansu and Kafka.

Done when the simulation says so: :meth:`MemoryBroker.apply_retention` (drops records older
than the topic's ``retention.ms``), :meth:`MemoryBroker.delete_records` and
:meth:`MemoryBroker.compact` (the last record per key, below the last stable offset, aborted
records dropped; offsets keep their gaps). A transaction open past its timeout is aborted as
soon as the broker is next asked or written to.

Faults the simulation switches: ``down`` (no answer to anything: polls bring nothing new,
sends are not acknowledged and their records expire with kafka-python's ``KafkaTimeoutError``,
new clients cannot bootstrap); :meth:`MemoryBroker.refuse_appends` (one partition takes no
writes for a while, the others do: Kafka acknowledges each partition on its own);
:meth:`MemoryBroker.hold_high_watermark` (a partition's leader short of in-sync replicas keeps
its high watermark back, KIP-966: what it acknowledged past it is stored, not handed out; the
metadata shows one replica of ``replicas`` in sync);
:meth:`MemoryBroker.in_doubt_next` (a send that is stored but whose acknowledgement is lost:
the future fails, the record is there); ``on_append`` (called before each append a client
makes, not before a marker: raising there, e.g. to kill a simulated process mid-write, leaves
that record and those after it unwritten and the broker consistent).

For a simulation: txstream keeps clients per process (``cached_client``; the sink's
``Delivery`` also remembers topics per bootstrap string): a simulated process that dies must
drop them (``drop_cached_client`` of every key), or its successor inherits what it held.
txstream's readers bound their waits with their consumer's clock (``Consumer.monotonic``): the
wall clock, unless the broker is given ``wait``, which moves its own clock on by each poll's
timeout (a simulation's schedules then never depend on the machine's speed).
``wait_for_broker`` does not wait for a memory broker: it answers now or raises.

kafka-python's consumer quirks, reproduced because real defects live in them (how:
:mod:`txstream.kafka.memory_consumer`):

1. ``assign()`` of the same partitions keeps each one's position and high watermark; a new set
   keeps the state of the partitions it shares with the old one; ``assign([])`` forgets all.
   Why: a reader that keeps its client between reads (the source's, the sink's body reader)
   sees the last read's high watermark before its own fetch is back, and may stop short.
2. ``seek()`` moves the position only: the high watermark stays what the last fetch said.
   Why: the same stale end, after a seek.
3. A fetch may still be in flight when ``poll()`` returns: the poll returns nothing and
   updates nothing (``in_flight_probability``). Why: a reader that takes an empty poll for
   the end of the log ends early; ``fetch_ends`` must wait for every partition's answer.
4. After a poll, kafka-python sends the next fetch at once. Its answer is the log as it was
   then; a later poll accepts it (records and high watermark) whenever the position is the
   one it was sent at, even across a re-``assign`` and ``seek`` (``stale_fetch_probability``:
   how often the answer is that old one rather than the log at the later poll). Why: an end
   read with a kept client can be older than the log (the health sampler makes a new client
   for each sample because of it).
5. A fetch below the log start (or, on Kafka, past the end) is out of range: the position is
   reset by ``auto_offset_reset``. A partition that does not exist (a deleted topic, fewer
   partitions) has no leader and is never fetched: polls bring nothing for it, and a reader's
   metadata request re-creates a deleted topic where the broker auto-creates. Metadata is
   cached per client: a re-created topic's partitions show after ``topics()`` or
   ``metadata_max_age_ms``. Why: retention, a half topic re-created under a checkpoint, lost
   records: readers get other records than they asked for, or none, and must tell.
6. ``max_poll_records`` and ``poll(max_records=)`` bound a poll; the rest of a fetch is kept
   for the next polls, and only a fully drained partition is fetched again. Why: records of
   an old fetch come back after a seek to where they continue.
"""

from __future__ import annotations

import random
import re
import uuid
from collections.abc import Callable, Iterable, Mapping
from types import TracebackType
from typing import Any

from txstream.errors import ConfigError, TxStreamError
from txstream.kafka.memory_faults import PartitionFaults
from txstream.kafka.memory_log import (
    CREATE_TIME,
    DEFAULT_RETENTION_MS,
    LOG_APPEND_TIME,
    FetchAnswer,
    Headers,
    PartitionLog,
    StoredRecord,
    Topic,
)
from txstream.kafka.memory_metadata import ClientMetadata
from txstream.kafka.memory_registry import MEMORY_SCHEME, register, unregister
from txstream.kafka.memory_transactions import (
    PartitionTransactions,
    ProducerToken,
    TransactionCoordinator,
)
from txstream.kafka.settings import KafkaSettings

__all__ = [
    "CREATE_TIME",
    "LOG_APPEND_TIME",
    "DEFAULT_RETENTION_MS",
    "MemoryBroker",
    "ClientMetadata",
    "StoredRecord",
    "FetchAnswer",
    "UnsupportedByMemoryBroker",
]

_NAME = re.compile(r"^[A-Za-z0-9._-]+$")
Clock = Callable[[], int]


class UnsupportedByMemoryBroker(TxStreamError, NotImplementedError):
    """A client call the in-memory broker does not implement (consumer groups)."""


class MemoryBroker(PartitionFaults):
    """One in-memory Kafka broker, registered under ``name`` while used as a context manager
    (or between :func:`txstream.kafka.memory_registry.register` and ``unregister``).

    ``clock()``: the broker's time in ms. ``rng``: every random choice (default: seeded 0).
    ``auto_create``: topics are created on first produce or metadata request naming them,
    with ``default_partitions``. ``honours_log_append_time``: a ``LogAppendTime`` topic gets
    the broker's time. ``out_of_range_above_end``: a fetch past the end is out of range.
    ``tells_broker_configs``: ``describe_configs`` of the broker answers
    ``auto.create.topics.enable``. See the module for the two consumer probabilities.
    ``wait(ms)``: moves ``clock()`` on while a client waits (a poll that brings nothing waits
    its timeout), so readers bound their waits on the broker's time; None: they wait on the
    wall clock.
    """

    def __init__(self, name: str, clock: Clock, rng: random.Random | None = None, *,
                 auto_create: bool = True, default_partitions: int = 1,
                 honours_log_append_time: bool = True, out_of_range_above_end: bool = True,
                 tells_broker_configs: bool = True, in_flight_probability: float = 0.1,
                 stale_fetch_probability: float = 0.5, replicas: int = 2,
                 wait: Callable[[int], None] | None = None) -> None:
        if not _NAME.match(name):
            raise ConfigError(f"a memory broker's name must be [A-Za-z0-9._-]+, got {name!r}")
        self.name = name
        self.clock = clock
        self.wait = wait
        self.rng = rng if rng is not None else random.Random(0)
        self.auto_create = auto_create
        self.default_partitions = default_partitions
        self.honours_log_append_time = honours_log_append_time
        self.out_of_range_above_end = out_of_range_above_end
        self.tells_broker_configs = tells_broker_configs
        # Replicas per partition, as the metadata shows them, with ``min.insync.replicas``
        # as many (one replica: tansu's, no such setting told); a partition's records are
        # kept once all the same.
        self.replicas = replicas
        self.in_flight_probability = in_flight_probability
        self.stale_fetch_probability = stale_fetch_probability
        self.down = False
        self.on_append: Callable[[str, int, StoredRecord], None] | None = None
        # Producers' clocks by client id (the simulation skews them); default: the broker's.
        self.client_clocks: dict[str, Clock] = {}
        self._init_faults()
        self._topics: dict[str, Topic] = {}
        self.transactions = TransactionCoordinator(clock)

    @classmethod
    def like_tansu(cls, name: str, clock: Clock, rng: random.Random | None = None,
                   **options: Any) -> MemoryBroker:
        """A broker that answers as tansu does where tansu and Kafka differ."""
        defaults = {"auto_create": True, "default_partitions": 4,
                    "honours_log_append_time": False, "out_of_range_above_end": False,
                    "tells_broker_configs": False, "replicas": 1}
        return cls(name, clock, rng, **{**defaults, **options})

    @property
    def settings(self) -> KafkaSettings:
        """The settings to hand to txstream code: its clients then talk to this broker."""
        return KafkaSettings(bootstrap_servers=f"{MEMORY_SCHEME}{self.name}")

    def __enter__(self) -> MemoryBroker:
        register(self)
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        unregister(self.name)

    # --- topics ------------------------------------------------------------------------------

    def create_topic(self, name: str, partitions: int, configs: Mapping[str, str] | None = None
                     ) -> None:
        if name in self._topics:
            raise ValueError(f"topic {name} exists")
        if partitions < 1:
            raise ValueError("a topic needs at least one partition")
        topic_id = str(uuid.UUID(int=self.rng.getrandbits(128), version=4))
        self._topics[name] = Topic(name, partitions, configs or {}, topic_id)

    def delete_topic(self, name: str) -> None:
        """Delete ``name`` with its records; a topic created later under the name starts again
        at offset 0."""
        self._topic(name)
        del self._topics[name]

    def topic_names(self) -> list[str]:
        return sorted(self._topics)

    def partition_count(self, topic: str) -> int | None:
        found = self._topics.get(topic)
        return len(found.logs) if found else None

    def topic_configs(self, topic: str) -> dict[str, str]:
        return dict(self._topic(topic).configs)

    def topic_id(self, topic: str) -> str:
        return self._topic(topic).topic_id

    def _topic(self, name: str) -> Topic:
        found = self._topics.get(name)
        if found is None:
            raise KeyError(f"no topic {name} on memory broker {self.name}")
        return found

    def _log(self, topic: str, partition: int) -> PartitionLog:
        logs = self._topic(topic).logs
        if not 0 <= partition < len(logs):
            raise KeyError(f"topic {topic} has no partition {partition}")
        return logs[partition]

    def maybe_auto_create(self, topic: str) -> bool:
        """Create ``topic`` as a metadata request naming it would; whether it exists after."""
        if topic not in self._topics and self.auto_create:
            self.create_topic(topic, self.default_partitions)
        return topic in self._topics

    # --- records -----------------------------------------------------------------------------

    def choose_partition(self, topic: str, key: bytes | None, partitions: int) -> int:
        """kafka-python's default partitioner: murmur2 of a key; a keyless record: the rng."""
        from kafka.partitioner import murmur2

        if key is not None:
            return int(murmur2(key) & 0x7FFFFFFF) % partitions
        return self.rng.randrange(partitions)

    def append(self, topic: str, key: bytes | None, value: bytes | None,
               headers: Iterable[tuple[str, bytes]] = (), partition: int | None = None,
               timestamp: int | None = None) -> tuple[int, int]:
        """Append one record as the simulation's own producer would (auto-creating the topic
        if the broker does); returns (partition, offset). No faults apply."""
        if not self.maybe_auto_create(topic):
            raise KeyError(f"no topic {topic} on memory broker {self.name}")
        if partition is None:
            partition = self.choose_partition(topic, key, len(self._topics[topic].logs))
        stamp = self.clock() if timestamp is None else timestamp
        record = self.stamp(topic, partition, key, value, tuple(headers), stamp)
        return partition, self._log(topic, partition).append(*record[1:]).offset

    def stamp(self, topic: str, partition: int, key: bytes | None, value: bytes | None,
              headers: Headers, timestamp: int) -> StoredRecord:
        """The record as it would be appended now (its offset the partition's end)."""
        log = self._log(topic, partition)
        append_time = self._topic(topic).config("message.timestamp.type", "CreateTime")
        if append_time == "LogAppendTime" and self.honours_log_append_time:
            return StoredRecord(log.end, key, value, headers, self.clock(), LOG_APPEND_TIME)
        return StoredRecord(log.end, key, value, headers, timestamp, CREATE_TIME)

    def client_append(self, topic: str, partition: int, record: StoredRecord,
                      producer: ProducerToken | None = None) -> bool:
        """Append a client's record (``producer``: in its transaction, which must have the
        partition): ``on_append`` first (raising there appends nothing). Returns False when
        its acknowledgement is lost (:meth:`in_doubt_next`)."""
        log = self._log(topic, partition)
        if producer is not None:
            self.transactions.check(producer)  # a fenced producer's record is refused
        if self.on_append is not None:
            self.on_append(topic, partition, record)
        log.append(*record[1:])
        if producer is not None:
            log.txn.wrote(producer.producer_id, record.offset)
        return not self._take_in_doubt()

    def join_transaction(self, producer: ProducerToken, topic: str, partition: int) -> None:
        """AddPartitionsToTxn (ProducerFencedError for a fenced producer)."""
        self.transactions.add_partition(producer, self._log(topic, partition))

    def records(self, topic: str, partition: int) -> list[StoredRecord]:
        """The partition's records (no markers: they hold none), aborted ones too."""
        self.transactions.expire()
        return list(self._log(topic, partition).records)

    def transactions_of(self, topic: str, partition: int) -> PartitionTransactions:
        self.transactions.expire()
        return self._log(topic, partition).txn

    def start_offset(self, topic: str, partition: int) -> int:
        return self._log(topic, partition).start

    def end_offset(self, topic: str, partition: int) -> int:
        self.transactions.expire()
        return self._log(topic, partition).end

    def last_stable_offset(self, topic: str, partition: int, held: bool = True) -> int:
        """``held=False``: of what is stored, past a high watermark held back."""
        self.transactions.expire()
        self.release_holds()
        log = self._log(topic, partition)
        return log.last_stable if held else log.stable_end

    def fetch(self, topic: str, partition: int, offset: int, max_bytes: int,
              at_least_one: bool = True, committed: bool = False) -> FetchAnswer:
        """The answer to a fetch of one partition at ``offset``, ``read_committed`` or not
        (see :meth:`PartitionLog.read`)."""
        self.transactions.expire()
        self.release_holds()
        found = self._topics.get(topic)
        if found is None or not 0 <= partition < len(found.logs):
            return FetchAnswer("unknown", -1, -1, (), -1, offset)
        return found.logs[partition].read(offset, max_bytes, self.out_of_range_above_end,
                                          at_least_one, committed)

    def list_offset(self, topic: str, partition: int, earliest: bool, committed: bool = False
                    ) -> int | None:
        """The log start (earliest) or end (``committed``: the last stable offset), or None
        for a partition that does not exist."""
        self.transactions.expire()
        self.release_holds()
        found = self._topics.get(topic)
        if found is None or not 0 <= partition < len(found.logs):
            return None
        log = found.logs[partition]
        return log.start if earliest else log.last_stable if committed else log.high_watermark

    # --- retention and compaction ------------------------------------------------------------

    def apply_retention(self) -> int:
        """Drop, per partition, the records from the log start on that are older than the
        topic's ``retention.ms`` (-1: forever) by timestamp, as Kafka deletes old segments
        from the front; returns how many. Topics whose ``cleanup.policy`` lacks ``delete``
        keep theirs."""
        dropped = 0
        for topic in self._topics.values():
            retention = int(topic.config("retention.ms", str(DEFAULT_RETENTION_MS)))
            if retention >= 0 and "delete" in topic.policy():
                dropped += sum(log.expire(self.clock() - retention) for log in topic.logs)
        return dropped

    def delete_records(self, topic: str, partition: int, before_offset: int) -> int:
        """Kafka's DeleteRecords: the log start moves to ``before_offset``; returns how many
        records went."""
        log = self._log(topic, partition)
        if not 0 <= before_offset <= log.end:
            raise ValueError(f"offset {before_offset} is past the end ({log.end}) of "
                             f"{topic}/{partition}")
        return log.truncate_before(before_offset)

    def compact(self, topic: str) -> int:
        """Keep the last record per key of a topic whose ``cleanup.policy`` has ``compact``
        (keyless records stay; tombstones stay as the last record of their key); returns how
        many went. Offsets keep their gaps; the last record of a log is always kept."""
        found = self._topic(topic)
        return sum(log.compact() for log in found.logs) if "compact" in found.policy() else 0

    def check_up(self, what: str = "answer") -> None:
        """Raise kafka-python's timeout when the broker is down."""
        from kafka.errors import KafkaTimeoutError

        if self.down:
            raise KafkaTimeoutError(f"Failed to get {what}: memory broker {self.name} is down")
