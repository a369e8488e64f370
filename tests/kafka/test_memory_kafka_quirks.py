"""kafka-python 3.0.12's consumer quirks, as the in-memory broker's consumer reproduces them
(txstream.kafka.memory lists them and why): each test drives one with the broker's
probabilities set to 0 or 1, and a schedule with all of them on replays with its seed."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from kafka import TopicPartition

from tests.support.memory_helpers import Clock, assigned, fill, new_broker, offsets, trace_schedule
from txstream.kafka import make_consumer
from txstream.kafka.memory import MemoryBroker


def _read_to_end(consumer: Any, tp: TopicPartition, polls: int = 20) -> list[int]:
    out: list[int] = []
    for _ in range(polls):
        out += offsets(consumer.poll(timeout_ms=10), tp)
        hw = consumer.highwater(tp)
        if hw is not None and consumer.position(tp) >= hw:
            return out
    raise AssertionError(f"not at the end after {polls} polls: {out}")


def test_assign_keeps_the_state_of_partitions_it_keeps(mem: MemoryBroker) -> None:
    from kafka.errors import IllegalStateError

    fill(mem, "t", 5, partitions=2)
    a, b = TopicPartition("t", 0), TopicPartition("t", 1)
    consumer = assigned(mem, a)
    assert _read_to_end(consumer, a) == [0, 1, 2]
    mem.append("t", b"x", b"v", partition=0)
    consumer.assign([a])  # the same set: nothing changes, the high watermark is stale
    assert (consumer.position(a), consumer.highwater(a)) == (3, 3)
    consumer.assign([a, b])  # a new set: ``a`` keeps its state, ``b`` starts blank
    assert (consumer.highwater(a), consumer.highwater(b)) == (3, None)
    assert consumer.position(b) == 0  # reset by auto_offset_reset: earliest
    consumer.assign([b])
    consumer.assign([a, b])  # ``a`` was dropped: it comes back blank
    assert consumer.highwater(a) is None
    consumer.assign([])
    with pytest.raises(IllegalStateError):
        consumer.highwater(a)


def test_seek_moves_the_position_only(mem: MemoryBroker) -> None:
    fill(mem, "t", 3)
    tp = TopicPartition("t", 0)
    consumer = assigned(mem, tp)
    _read_to_end(consumer, tp)
    mem.append("t", b"k", b"v")
    consumer.seek(tp, 1)
    assert (consumer.position(tp), consumer.highwater(tp)) == (1, 3)


def test_a_poll_while_the_fetch_is_in_flight_updates_nothing(mem: MemoryBroker) -> None:
    fill(mem, "t", 3)
    tp = TopicPartition("t", 0)
    consumer = assigned(mem, tp, 1)
    mem.in_flight_probability = 1.0
    for _ in range(5):
        assert consumer.poll(timeout_ms=100) == {}
        assert (consumer.position(tp), consumer.highwater(tp)) == (1, None)
    mem.in_flight_probability = 0.0
    assert offsets(consumer.poll(), tp) == [1, 2]


@pytest.mark.parametrize("stale", [1.0, 0.0])
def test_a_fetch_sent_earlier_answers_with_the_log_as_it_was(mem: MemoryBroker,
                                                             stale: float) -> None:
    fill(mem, "t", 2)
    tp = TopicPartition("t", 0)
    consumer = assigned(mem, tp)
    mem.in_flight_probability, mem.stale_fetch_probability = 1.0, stale
    assert consumer.poll() == {}  # its fetch at 0 is out
    mem.append("t", b"k", b"v")
    mem.append("t", b"k", b"v")
    mem.in_flight_probability = 0.0
    if stale:
        assert offsets(consumer.poll(), tp) == [0, 1]
        assert consumer.highwater(tp) == 2  # though the log ends at 4
        assert offsets(consumer.poll(), tp) == [2, 3]
    else:
        assert offsets(consumer.poll(), tp) == [0, 1, 2, 3]
    assert consumer.highwater(tp) == 4


@pytest.mark.parametrize(("seek_to", "want"), [(0, [0, 1]), (1, [1, 2, 3])])
def test_an_old_answer_counts_after_a_re_assign_if_the_position_matches(
        mem: MemoryBroker, seek_to: int, want: list[int]) -> None:
    fill(mem, "t", 2)
    tp = TopicPartition("t", 0)
    consumer = assigned(mem, tp)
    mem.in_flight_probability, mem.stale_fetch_probability = 1.0, 1.0
    assert consumer.poll() == {}
    mem.append("t", b"k", b"v")
    mem.append("t", b"k", b"v")
    consumer.assign([])
    consumer.assign([tp])
    consumer.seek(tp, seek_to)
    mem.in_flight_probability = 0.0
    assert offsets(consumer.poll(), tp) == want
    assert consumer.highwater(tp) == 2 + 2 * (seek_to != 0)


def test_an_answer_for_another_position_is_dropped_whole(clock: Clock) -> None:
    with new_broker(clock, auto_create=False) as broker:
        fill(broker, "t", 2)
        tp = TopicPartition("t", 0)
        consumer = assigned(broker, tp)
        broker.in_flight_probability, broker.stale_fetch_probability = 1.0, 1.0
        assert consumer.poll() == {}  # its fetch at 0 is out
        consumer.seek(tp, 1)
        broker.delete_topic("t")  # the fetch at 1 cannot be answered
        broker.in_flight_probability = 0.0
        assert consumer.poll() == {}
        assert consumer.highwater(tp) is None  # not even the old answer's high watermark


def test_out_of_range_resets_by_auto_offset_reset(mem: MemoryBroker) -> None:
    fill(mem, "t", 6)
    mem.delete_records("t", 0, 3)
    tp = TopicPartition("t", 0)
    below = assigned(mem, tp, 1)
    assert _read_to_end(below, tp) == [3, 4, 5]
    above = assigned(mem, tp, 9)  # Kafka: past the end is out of range too
    assert _read_to_end(above, tp) == [3, 4, 5]
    latest = assigned(mem, tp, 0, auto_offset_reset="latest")
    assert _read_to_end(latest, tp) == []
    assert latest.position(tp) == 6


def test_tansu_leaves_a_position_past_the_end_alone(clock: Clock) -> None:
    with new_broker(clock, tansu=True) as broker:
        fill(broker, "t", 3)
        tp = TopicPartition("t", 0)
        consumer = assigned(broker, tp, 9)
        for _ in range(5):
            assert consumer.poll() == {}
        assert (consumer.position(tp), consumer.highwater(tp)) == (9, 3)


def test_a_partition_that_does_not_exist_never_answers(clock: Clock) -> None:
    with new_broker(clock, auto_create=False) as broker:
        fill(broker, "t", 3)
        gone = TopicPartition("t", 2)
        consumer = assigned(broker, gone)
        broker.delete_topic("t")
        deleted = assigned(broker, TopicPartition("t", 0))
        for _ in range(5):
            assert consumer.poll() == {} and deleted.poll() == {}
        assert consumer.highwater(gone) is None
        assert broker.partition_count("t") is None


def test_a_consumer_re_creates_a_deleted_topic_it_reads(mem: MemoryBroker) -> None:
    fill(mem, "half", 3)
    tp = TopicPartition("half", 0)
    consumer = assigned(mem, tp)
    assert _read_to_end(consumer, tp) == [0, 1, 2]
    mem.delete_topic("half")
    for _ in range(3):  # the fetch finds no partition; the metadata request names the topic
        consumer.poll()
    assert mem.end_offset("half", 0) == 0
    consumer.seek(tp, 0)
    assert _read_to_end(consumer, tp) == []


def test_a_poll_returns_at_most_max_records(mem: MemoryBroker) -> None:
    fill(mem, "t", 10)
    tp = TopicPartition("t", 0)
    consumer = assigned(mem, tp, max_poll_records=4)
    assert offsets(consumer.poll(max_records=3), tp) == [0, 1, 2]
    assert offsets(consumer.poll(), tp) == [3, 4, 5, 6]
    assert offsets(consumer.poll(), tp) == [7, 8, 9]


def test_partitions_are_cached_until_metadata_is_asked_for(mem: MemoryBroker,
                                                           clock: Clock) -> None:
    mem.create_topic("t", 3)
    consumer = make_consumer(mem.settings)
    assert consumer.partitions_for_topic("t") == {0, 1, 2}
    mem.delete_topic("t")
    mem.create_topic("t", 1)
    assert consumer.partitions_for_topic("t") == {0, 1, 2}
    assert "t" in consumer.topics()
    assert consumer.partitions_for_topic("t") == {0}
    assert consumer.partitions_for_topic("missing") == set()
    mem.create_topic("u", 2)
    clock.now += 300_000  # metadata_max_age_ms
    assert consumer.partitions_for_topic("u") == {0, 1}


def test_a_schedule_replays_exactly_with_its_seed() -> None:
    assert trace_schedule(11) == trace_schedule(11)
    assert trace_schedule(11) != trace_schedule(12)


def test_a_schedule_replays_in_another_process() -> None:
    """Nothing depends on the order of a set (string hashing differs per process)."""
    code = "from tests.support import memory_helpers; print(memory_helpers.trace_schedule(11))"
    root = str(Path(__file__).resolve().parents[2])
    outputs = set()
    for hash_seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": hash_seed,
               "PYTHONPATH": os.pathsep.join([root, *sys.path])}
        done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                              text=True, timeout=120, check=True)
        outputs.add(done.stdout)
    assert outputs == {f"{trace_schedule(11)}\n"}
