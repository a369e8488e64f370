"""Exactly-once release across a replayed micro-batch: what did the crashed run already write?

Spark replays a micro-batch whose commit it did not record (the driver was killed, a write
failed) with the same input, the same state and the same batch time, so the operator emits the
same records under the same ids (``record_id``, also the ``TXSTREAM_RECORD_ID`` header; see
``txstream.record_ids.record_id``). Kafka cannot take back what the first run wrote
(tansu's transactions do not hide aborted records), so before writing a batch that may be a replay
the sink reads the tail of every partition it is about to write to and leaves out the records
whose id is already there.

Which batches may be replays, seen from a task (no driver round trip needed): the first batch
of a query run, since a restart replays the uncommitted batch before anything else, and any
task attempt after the first. The run and batch come from Spark's local properties
(``spark.jobGroup.id`` is the run id, ``streaming.sql.batchId`` the batch), so a query
restarted in the same process is a new run and checked again.

How far back to read: the replayed batch's first run wrote nothing before the batch started
(``batch_ms``), and every record an earlier batch wrote was acknowledged before it: each topic
is read back to there (:func:`txstream.kafka.read_back.read_back`, where a record of this
coordinator is one with its id tag). A miss can only cost a duplicate, never a loss: a record
is left out only when its very id was found on its topic, or, for a release, check request or
discard (one per transaction and call), a record of its transaction on its topic under another
number of the same call.

The same input and state give the same records unless the world the operator reads changed in
between: a half message's body that retention deleted after the crashed run read it. The
replay then emits other records for that transaction, and numbers the records after them
otherwise (:func:`written`).

Across checkpoints the ids differ (a new checkpoint numbers from its own batch times): a half
message a new checkpoint reads again is looked for by its transaction id instead, among the
records of this coordinator under ids the checkpoint did not give
(:mod:`txstream.readback.release_index`, docs/decisions/0029-releases-found.md).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping

from txstream.kafka import ConsumerRecord, EndProbe, KafkaSettings, PatientConsumer
from txstream.kafka.partition_health import unless_held, unless_held_before_ends
from txstream.kafka.read_back import READ_BACK_CHUNK, header_text, read_back
from txstream.record_ids import id_tag
from txstream.wire import H

__all__ = [
    "replay_suspected",
    "written_ids",
    "written_before",
    "written",
    "id_tag",
]

_READ_TIMEOUT_S = 30.0

_FIRST_BATCH: dict[str, int] = {}  # run id -> first batch this process wrote for it
_FIRST_LOCK = threading.Lock()


def replay_suspected() -> bool:
    """Whether the running task may be writing a batch that was (partly) written before."""
    from pyspark import TaskContext

    context = TaskContext.get()
    if context is None:
        return True  # not in a Spark task: nothing tells, so check
    if context.attemptNumber() > 0:
        return True
    run = context.getLocalProperty("spark.jobGroup.id")
    batch = context.getLocalProperty("streaming.sql.batchId")
    if not run or batch is None:
        return True
    with _FIRST_LOCK:
        # A worker process that joins later in a run checks its first batch too: harmless,
        # it finds nothing. The first batch of a run is checked by every process writing it.
        first = _FIRST_BATCH.setdefault(run, int(batch))
    return int(batch) == first


class _Sought:
    """What one topic is read back for: record ids, and transactions (a release's id header,
    a check request's or discard's key) under record ids that ``count``; what was found."""

    def __init__(self, ids: set[str], transactions: set[str],
                 count: Callable[[str], bool]) -> None:
        self.ids, self.transactions, self.count = ids, transactions, count
        self.found_ids: set[str] = set()
        self.found_transactions: set[str] = set()

    def missing(self) -> int:
        return len(self.ids - self.found_ids) + len(self.transactions - self.found_transactions)

    def take(self, rec: ConsumerRecord, rid: str) -> None:
        if rid in self.ids:
            self.found_ids.add(rid)
        if not self.transactions or not self.count(rid):
            return
        value = header_text(rec.headers, H.TRANSACTION_ID)
        if value is not None and value in self.transactions:
            self.found_transactions.add(value)
        elif rec.key is not None and (key := bytes(rec.key).decode(
                "utf-8", "replace")) in self.transactions:
            self.found_transactions.add(key)


def _scan_partition(consumers: PatientConsumer, topic: str, partition: int, end: int,
                    tag: str, since_ms: int, sought: _Sought) -> None:
    """Reads the partition back from ``end`` to ``since_ms`` into ``sought``, among the
    records of this coordinator (``tag``)."""
    def own(rec: ConsumerRecord) -> bool:
        rid = header_text(rec.headers, H.RECORD_ID)
        return rid is not None and id_tag(rid) == tag

    for chunk in read_back(consumers, topic, partition, end, since_ms, own, _READ_TIMEOUT_S):
        for rec in chunk:
            rid = header_text(rec.headers, H.RECORD_ID)
            if rid is not None and id_tag(rid) == tag:
                sought.take(rec, rid)
        if not sought.missing():
            break


def written_ids(
    settings: KafkaSettings, wanted: Mapping[str, set[str]], batch_ms: int
) -> set[str]:
    """Which of ``wanted`` ({topic: record ids}) are already on their topics."""
    return written(settings, wanted, {}, batch_ms, {})[0]


def written_before(
    settings: KafkaSettings, wanted: Mapping[str, set[str]], batch_ms: int, first_id: str
) -> set[str]:
    """Which of ``wanted`` ({topic: transaction ids}) a run of this batch wrote a record for
    already, on any of their topics, under an id of this batch's state key numbered from
    ``first_id`` on (the ids the key's call takes in this batch)."""
    prefix, first = first_id.rsplit(".", 1)
    found = written(settings, {}, wanted, batch_ms, {prefix: int(first)})[1]
    return set().union(*found.values())


def written(
    settings: KafkaSettings, ids: Mapping[str, set[str]], transactions: Mapping[str, set[str]],
    batch_ms: int, firsts: Mapping[str, int]
) -> tuple[set[str], dict[str, set[str]]]:
    """What a run of this batch wrote already, each topic read back once: which of ``ids``
    ({topic: record ids}) are on their topics, and by topic, which of ``transactions``
    ({topic: transaction ids}) have a record there (a release on its real topic, by its
    transaction id header; a check request or a discard, keyed by the transaction id) under
    an id of one of this batch's state keys, ``firsts`` ({id less its number: the first
    number its call takes in this batch}), numbered from there on, whatever its number.

    A replay that finds a body gone that its crashed run read emits other records for that
    transaction, and so numbers the records after them otherwise: a transaction's record on
    its topic under any of the call's numbers is the one the crashed run wrote."""
    def of_this_batch(rid: str) -> bool:
        head, _, number = rid.rpartition(".")
        return number.isdigit() and int(number) >= firsts.get(head, int(number) + 1)

    sought = {topic: _Sought(set(ids.get(topic, ())), set(transactions.get(topic, ())) if
                             firsts else set(), of_this_batch)
              for topic in {*ids, *transactions}}
    sought = {topic: s for topic, s in sought.items() if s.missing()}
    if not sought:
        return set(), {}
    some_id = next((i for found in ids.values() for i in found), None)
    _read_back_into(settings, sought, batch_ms, id_tag(some_id or next(iter(firsts))))
    return (set().union(*(s.found_ids for s in sought.values())),
            {topic: s.found_transactions for topic, s in sought.items()})


def _read_back_into(settings: KafkaSettings, sought: Mapping[str, _Sought], since_ms: int,
                    tag: str) -> None:
    """Each topic of ``sought`` read back to ``since_ms``, once."""
    # The process's clients, kept for the next task's check: making them costs a round trip
    # or three (~150 ms on Apache Kafka), more than most checks' reading.
    key = settings.key
    probe = EndProbe(settings, role="sink", kept_as=("replay-ends", key))
    consumers = PatientConsumer(settings, role="sink", max_poll_records=READ_BACK_CHUNK,
                                kept_as=("replay", key))
    found: set[str] = set()
    # An id is sought on two topics (its own, the dead letters'): the topic where fewer are
    # sought comes first, and one found there is no longer sought elsewhere.
    for topic, one in sorted(sought.items(), key=lambda item: item[1].missing()):
        one.ids -= found
        if not one.missing():
            continue
        # A topic that does not exist yet holds nothing (the sink's first write creates it).
        unless_held_before_ends(settings, topic, f"{one.missing()} record(s) were written")
        ends = probe.topic_ends([topic], {}, _READ_TIMEOUT_S)
        for (_, partition), end in sorted(ends.items()):
            _scan_partition(consumers, topic, partition, end, tag, since_ms, one)
        found |= one.found_ids
        if ends and one.missing():
            unless_held(settings, topic, f"{one.missing()} record(s) were written")
