"""What the source does when the broker's offsets go back, or a topic is created again under a
batch to replay (in-memory broker, the source's own planner)."""

from __future__ import annotations

import random
from collections.abc import Iterator

import pytest
from pyspark.sql.streaming.datasource import ReadAllAvailable
from pyspark.sql.types import StructType

from tests.support.memory_helpers import Clock
from txstream.kafka.memory import MemoryBroker
from txstream.sources.kafka_io import SourceOptions, SourceReadError
from txstream.sources.kafka_source import KafkaEventReader
from txstream.sources.offsets import records_of
from txstream.topics import Topics

TOPICS = Topics.with_prefix("s_")


@pytest.fixture
def clock() -> Clock:
    return Clock(1_700_000_000_000)


@pytest.fixture
def broker(clock: Clock) -> Iterator[MemoryBroker]:
    with MemoryBroker(f"source-{random.getrandbits(32)}", clock,
                      in_flight_probability=0.0, stale_fetch_probability=0.0) as made:
        made.create_topic(TOPICS.half, 1)
        made.create_topic(TOPICS.end, 1)
        yield made


def _reader(broker: MemoryBroker, clock: Clock, **options: object) -> KafkaEventReader:
    return KafkaEventReader(SourceOptions(kafka=broker.settings, half_topic=TOPICS.half,
                                          end_topic=TOPICS.end, **options),  # type: ignore[arg-type]
                            StructType(), clock=clock)


def _fill(broker: MemoryBroker, count: int) -> None:
    for i in range(count):
        broker.append(TOPICS.half, f"tx-{i}".encode(), b"not a half message, to the source")


def test_a_partition_that_ends_below_the_checkpoint_for_a_moment_is_waited_for(
        broker: MemoryBroker, clock: Clock) -> None:
    """A new leader's high watermark may lag the old one's just after an election: a partition
    found below the checkpoint is not read meanwhile, and counts as lost only if it stays."""
    _fill(broker, 5)
    reader = _reader(broker, clock)
    start = reader.initialOffset()
    read = reader.latestOffset(start, ReadAllAvailable())
    assert records_of(read)[TOPICS.half] == {"0": 5}
    ahead = {**read, TOPICS.half: {"0": 8}}  # the checkpoint read 8: the broker says 5 now
    again = reader.latestOffset(ahead, ReadAllAvailable())
    assert records_of(again)[TOPICS.half] == {"0": 8}  # not read, not lost yet
    _fill(broker, 4)  # the high watermark catches up (and passes): nothing was lost
    assert records_of(reader.latestOffset(ahead, ReadAllAvailable()))[TOPICS.half] == {"0": 9}
    broker.delete_records(TOPICS.half, 0, 0)
    behind = {**read, TOPICS.half: {"0": 20}}
    reader.latestOffset(behind, ReadAllAvailable())
    clock.now += 29_000
    reader.latestOffset(behind, ReadAllAvailable())
    clock.now += 1_000  # below for 30 s: records lost
    with pytest.raises(SourceReadError, match="ends at 9, below the checkpoint's 20"):
        reader.latestOffset(behind, ReadAllAvailable())


def test_a_batch_is_not_read_again_from_a_topic_created_again_since_it_was_planned(
        broker: MemoryBroker, clock: Clock) -> None:
    """Spark replays the batch a crash left uncommitted from its logged offsets: from a half
    topic deleted and created again meanwhile they are other records, and the replay would
    write them under the ids of what its first run wrote."""
    _fill(broker, 3)
    first_run = _reader(broker, clock)
    start = first_run.initialOffset()
    planned = first_run.latestOffset(start, ReadAllAvailable())
    assert first_run.partitions(start, planned)
    broker.delete_topic(TOPICS.half)
    broker.create_topic(TOPICS.half, 1)
    _fill(broker, 3)  # the same offsets, other records
    replay = _reader(broker, clock)  # the restarted driver's planner
    with pytest.raises(SourceReadError, match="deleted and created again since this "
                                              "micro-batch was planned"):
        replay.partitions(start, planned)
