"""One state key's call, step by step (``txstream.streaming.engine.key_step.KeyStep``): plain
rows in, typed rows out, no DataFrame and no ``GroupState``. The adapter around it, driven as
Spark drives it, is ``tests/engine/test_operator.py``."""

from __future__ import annotations

import random
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from txstream.kafka import KafkaSettings
from txstream.kafka.memory import MemoryBroker
from txstream.message import Decision, EndEvent, Message
from txstream.readback import bodies
from txstream.schema import EventRow, Kind
from txstream.sources.event_rows import record_row, unreadable_row
from txstream.state.bucket import Bucket
from txstream.state.keys import KeyLayout, state_key
from txstream.state.policy import Policy
from txstream.state.transaction import BodyGone, Status
from txstream.streaming.engine.key_metrics import KeyTally
from txstream.streaming.engine.key_step import INPUT, KeyCall, KeyStep
from txstream.streaming.engine.records import coordinator_tag
from txstream.topics import Topics
from txstream.wire import encode_end, encode_half

T0 = 1_700_000_000_000
POLICY = Policy(transaction_timeout=6_000, check_interval=60_000, check_max=2,
                resolved_retention=120_000, timer_lead=500)
TOPICS = Topics.with_prefix("step_")
TXID = "0190A1B2C3D47E5F8A9B0C1D2E3F4A5B"
KEY = state_key(TXID, KeyLayout())
TAG = coordinator_tag(TOPICS)


def _input(row: EventRow) -> tuple[Any, ...]:
    return tuple(getattr(row, name) for name in INPUT)


def half(offset: int = 0, txid: str = TXID) -> tuple[Any, ...]:
    message = Message("orders", b"payload", transaction_id=txid, msg_id=txid,
                      producer_group="G", born_timestamp=T0)
    record = encode_half(message, TOPICS)
    return _input(record_row(True, record.key, record.value, list(record.headers), 0, offset,
                             KeyLayout()))


def end(decision: Decision, offset: int = 0, txid: str = TXID) -> tuple[Any, ...]:
    record = encode_end(EndEvent(txid, "G", decision), TOPICS)
    return _input(record_row(False, record.key, record.value, list(record.headers), 0, offset,
                             KeyLayout()))


def test_the_step_imports_neither_pandas_nor_spark() -> None:
    # In a process of its own: this one has them loaded already.
    code = (f"import sys; sys.path.insert(0, {str(Path(__file__).parents[2])!r}); "
            "import txstream.streaming.engine.key_step; "
            "print(sorted({'pandas', 'pyspark', 'pyarrow'} & set(sys.modules)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, check=True)
    assert out.stdout.strip() == "[]"


def test_a_half_and_its_commit_in_one_call_release_numbered_rows_and_keep_the_outcome() -> None:
    out = KeyStep(POLICY, TOPICS).run(KEY, Bucket(), [half(), end(Decision.COMMIT_MESSAGE)],
                                      T0, T0)
    assert [r.kind for r in out.rows] == [Kind.VISIBLE, Kind.HISTORY, Kind.TIMER]
    visible, _, timer = out.rows
    assert visible.value == b"payload"  # the body at hand: no read back
    assert [r.record_id for r in out.rows] == [f"{TAG}.{KEY}.{T0}.0", f"{TAG}.{KEY}.{T0}.1", None]
    # Kept until the resolved retention ends; the timer row carries when Spark fires it.
    assert out.timeout_ms == 120_000 and timer.not_before_ms == T0 + 120_000
    assert out.state is not None
    tx = Bucket.decode(out.state).get(TXID)
    assert tx is not None and tx.status is Status.COMMITTED


def test_an_empty_key_keeps_no_state_and_arms_nothing() -> None:
    unreadable = _input(unreadable_row(True, 0, 3, "bad CRC"))
    out = KeyStep(POLICY, TOPICS).run(KEY, Bucket(), [unreadable], T0, T0)
    assert [r.kind for r in out.rows] == [Kind.DEAD_LETTER, Kind.TIMER]
    assert (out.state, out.timeout_ms, out.rows[-1].not_before_ms) == (None, None, None)


def test_the_steps_one_at_a_time() -> None:
    step = KeyStep(POLICY, TOPICS)
    call = KeyCall(KEY, Bucket(), T0, T0, KeyTally(T0))
    events = step.decode(call, [half()])
    assert [type(e) for e in events] == [Message] and call.emits == []
    assert step.found_released(call) == [] and step.bodies_gone(call, events) == []
    step.apply_events(call, events)
    assert call.bucket.get(TXID).status is Status.PENDING  # type: ignore[union-attr]
    # The first check is due a transaction timeout after the birth; the key runs the lead
    # before it.
    assert step.timeout(call) == 6_000 - 500
    later = KeyCall(KEY, call.bucket, T0 + 6_000, T0 + 6_000, KeyTally(T0 + 6_000))
    step.run_timers(later)
    step.history(later)
    assert [e.kind for e in later.emits] == [Kind.CHECK, Kind.HISTORY]
    ids = step.take_numbers(later)
    assert ids == [f"{TAG}.{KEY}.{T0 + 6_000}.0", f"{TAG}.{KEY}.{T0 + 6_000}.1"]
    rows = step.output(later, ids, step.timeout(later))
    assert [r.kind for r in rows] == [Kind.CHECK, Kind.HISTORY, Kind.TIMER]


def test_a_held_body_needs_kafka_settings() -> None:
    step = KeyStep(POLICY, TOPICS)
    held = step.run(KEY, Bucket(), [half()], T0, T0).state  # kept without its body
    assert held is not None
    with pytest.raises(ValueError, match="without Kafka settings"):
        step.run(KEY, Bucket.decode(held), [end(Decision.COMMIT_MESSAGE)], T0 + 1_000, T0)


@pytest.fixture
def half_topic() -> Iterator[KafkaSettings]:
    """A half topic in memory whose partition 0 holds one record: ``TXID``'s half message."""
    with MemoryBroker("key-step-tests", lambda: T0, random.Random(0),
                      in_flight_probability=0.0) as broker:
        broker.create_topic(TOPICS.half, 1)
        record = encode_half(Message("orders", b"payload", transaction_id=TXID, msg_id=TXID,
                                     producer_group="G", born_timestamp=T0), TOPICS)
        broker.append(record.topic, record.key, record.value, record.headers, partition=0)
        yield KafkaSettings(bootstrap_servers="memory://key-step-tests")


def test_a_body_that_is_gone_is_told_as_an_event(half_topic: KafkaSettings,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    # The partition has ended short of it for long enough (txstream.readback.bodies).
    monkeypatch.setattr(bodies, "SHORT_SETTLE_S", 0.0)
    other = "0190A1B2C3D47E5F8A9B0C1D2E3F4A5C"
    step = KeyStep(POLICY, TOPICS, half_topic)
    held = step.run(KEY, Bucket(), [half(0), half(40, other)], T0, T0).state
    assert held is not None
    call = KeyCall(KEY, Bucket.decode(held), T0 + 1_000, T0, KeyTally(T0 + 1_000))
    events = step.decode(call, [end(Decision.COMMIT_MESSAGE, 1),
                                end(Decision.COMMIT_MESSAGE, 2, other)])
    # Offset 0 holds TXID's body; nothing lies at 40: its commit would claim a release.
    [gone] = step.bodies_gone(call, events)
    assert isinstance(gone, BodyGone) and gone.transaction_id == other


def test_a_replayed_call_gives_the_same_rows_under_the_same_ids(half_topic: KafkaSettings
                                                                ) -> None:
    step = KeyStep(POLICY, TOPICS, half_topic)
    first = step.run(KEY, Bucket(), [half()], T0, T0)
    assert first.state is not None
    rows = [end(Decision.ROLLBACK_MESSAGE, 1), end(Decision.COMMIT_MESSAGE, 2)]
    a = step.run(KEY, Bucket.decode(first.state), rows, T0 + 50, T0 + 50)
    b = step.run(KEY, Bucket.decode(first.state), rows, T0 + 50, T0 + 50)
    assert a == b
    assert [r.record_id for r in a.rows if r.record_id] == [f"{TAG}.{KEY}.{T0}.1",
                                                           f"{TAG}.{KEY}.{T0}.2"]
