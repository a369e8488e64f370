"""The ``applyInPandasWithState`` adapter, driven by hand: no query, no JVM.

pyspark's ``GroupState`` is a plain Python object, so each call is made as Spark would make it
(the key, the key's rows as pandas frames, its state with the batch's processing time) and what
comes back is checked: the rows emitted, the state saved, the timeout armed.
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence
from typing import Any

import pandas as pd
import pytest
from pyspark.sql.streaming.state import GroupState, GroupStateTimeout
from pyspark.sql.types import BinaryType, Row, StructField, StructType

from txstream.kafka import KafkaSettings
from txstream.kafka.memory import MemoryBroker
from txstream.message import Decision, EndEvent, Message
from txstream.readback import bodies
from txstream.schema import EventRow, Kind, OutputRow
from txstream.sources.event_rows import record_row, unreadable_row
from txstream.state.bucket import Bucket
from txstream.state.keys import KeyLayout, state_key
from txstream.state.policy import Policy
from txstream.state.transaction import Status
from txstream.streaming.engine.key_metrics import Counted, Timed, decode_summary
from txstream.streaming.engine.operator import coordinator_function
from txstream.streaming.engine.records import coordinator_tag
from txstream.topics import Topics
from txstream.wire import H, Record, encode_end, encode_half, unpack_headers

T0 = 1_700_000_000_000
POLICY = Policy(transaction_timeout=6_000, check_interval=60_000, check_max=2,
                resolved_retention=120_000, timer_lead=500)
TOPICS = Topics.with_prefix("op_")
TXID = "0190A1B2C3D47E5F8A9B0C1D2E3F4A5B"  # a UUIDv7: its key is a time window's shard
KEY = state_key(TXID, KeyLayout())
_STATE = StructType([StructField("blob", BinaryType())])


def group_state(now: int, blob: bytes | None = None, timed_out: bool = False) -> GroupState:
    """The state Spark hands the function for one key in a batch at ``now``."""
    return GroupState(
        optionalValue=Row(blob) if blob is not None else Row(),
        batchProcessingTimeMs=now, eventTimeWatermarkMs=-1,
        timeoutConf=GroupStateTimeout.ProcessingTimeTimeout, hasTimedOut=timed_out,
        watermarkPresent=False, defined=blob is not None, updated=False, removed=False,
        timeoutTimestamp=GroupState.NO_TIMESTAMP, keyAsUnsafe=b"", valueSchema=_STATE,
    )


def _half(born: int = T0) -> Message:
    return Message("orders", b"payload", tags="TagA", keys="K1", transaction_id=TXID,
                   msg_id=TXID, producer_group="G", born_timestamp=born)


def half_row(born: int = T0, offset: int = 0) -> EventRow:
    return _row(encode_half(_half(born), TOPICS), True, offset)


KAFKA = KafkaSettings(bootstrap_servers="memory://operator-tests")


@pytest.fixture(autouse=True)
def half_topic() -> Iterator[MemoryBroker]:
    """The half topic the function reads held bodies back from (in memory): the half message
    lies at offsets 0 to 9 of its partition 0."""
    with MemoryBroker("operator-tests", lambda: T0, random.Random(0),
                      in_flight_probability=0.0) as broker:
        broker.create_topic(TOPICS.half, 1)
        record = encode_half(_half(), TOPICS)
        for _ in range(10):
            broker.append(record.topic, record.key, record.value, record.headers, partition=0)
        yield broker


def end_row(decision: Decision, offset: int = 0, **fields: Any) -> EventRow:
    return _row(encode_end(EndEvent(TXID, "G", decision, **fields), TOPICS), False, offset)


def _row(record: Record, is_half: bool, offset: int) -> EventRow:
    return record_row(is_half, record.key, record.value, list(record.headers), 0, offset,
                      KeyLayout())


def call(state: GroupState, rows: Sequence[EventRow] = ()) -> list[OutputRow]:
    """One call of the coordinator's function, its output frames as rows (nulls as None)."""
    frames = [pd.DataFrame(list(rows), columns=list(EventRow._fields))] if rows else []
    function = coordinator_function(POLICY, TOPICS, KAFKA)
    out = pd.concat(list(function((KEY,), iter(frames), state)), ignore_index=True)
    out = out.astype(object).where(out.notna(), None)
    return [OutputRow._make(r) for r in out.itertuples(index=False, name=None)]


def kinds(rows: Sequence[OutputRow]) -> list[str]:
    return [r.kind for r in rows]


def tally(rows: Sequence[OutputRow]) -> dict[str, Any]:
    """The call's metrics: counts by metric (labels summed) and histograms, from its timer
    row."""
    [timer] = [r for r in rows if r.kind == Kind.TIMER]
    doc = decode_summary(timer.value.decode())  # type: ignore[union-attr]
    counts: dict[str, int] = {}
    for name, *_, n in doc.get("c", ()):
        counts[name] = counts.get(name, 0) + n
    return {"counts": counts, "histograms": doc.get("h", {})}


def saved(state: GroupState) -> Bucket:
    assert state.exists
    return Bucket.decode(state.get[0])


def test_a_half_message_is_stored_and_its_first_check_armed() -> None:
    state = group_state(T0)
    rows = call(state, [half_row()])
    assert kinds(rows) == [Kind.HISTORY, Kind.TIMER]
    history, timer = rows
    assert history.topic == TOPICS.history
    assert tally(rows)["counts"] == {Counted.HALF_MESSAGES: 1}
    # The first check is due at born + transaction timeout; the timeout fires the lead earlier.
    assert state.getCurrentProcessingTimeMs() == T0
    assert state._timeout_timestamp == T0 + 6_000 - 500
    assert timer.not_before_ms == T0 + 6_000 - 500 and timer.record_id is None
    tx = saved(state).get(TXID)
    assert tx is not None and tx.status is Status.PENDING and tx.half is not None
    # Kept without its body: the half topic's record at (0, 0) holds it.
    assert tx.half.body is None and (tx.half.queue_id, tx.half.queue_offset) == (0, 0)
    assert tx.next_check == T0 + 6_000


def test_a_commit_in_the_half_messages_batch_releases_the_body_at_hand() -> None:
    state = group_state(T0)
    rows = call(state, [half_row(offset=7), end_row(Decision.COMMIT_MESSAGE, offset=3)])
    visible = rows[0]
    assert visible.kind == Kind.VISIBLE and visible.value == b"payload"


def test_the_timeout_sends_the_check_held_until_due_and_rearms() -> None:
    state = group_state(T0)
    call(state, [half_row()])
    blob = state.get[0]
    due = T0 + 6_000
    fired = group_state(due - 300, blob, timed_out=True)  # inside the lead
    rows = call(fired)
    assert kinds(rows) == [Kind.CHECK, Kind.HISTORY, Kind.TIMER]
    check = rows[0]
    assert check.topic == TOPICS.check("G") and check.key == TXID.encode()
    # Its body lies in the half topic: the sink reads it back, it never passes through the JVM.
    assert check.value is None and (check.body_partition, check.body_offset) == (0, 0)
    # Made ahead of its deadline, so the sink must hold it until then.
    assert check.not_before_ms == due
    # Asked as of its deadline: no lateness (the first bucket; sum 0 ms).
    lateness = tally(rows)["histograms"][Timed.CHECK_LATENESS]
    assert lateness[0] == 1 and sum(lateness[:-1]) == 1 and lateness[-1] == 0
    headers = dict(unpack_headers(check.headers))
    assert headers[H.CHECK_TIMES] == b"1"
    assert headers[H.RECORD_ID].decode() == check.record_id
    # Re-armed for the next check, an interval after this one.
    assert fired._timeout_timestamp == due + 60_000 - 500
    assert saved(fired).get(TXID).checks_sent == 1  # type: ignore[union-attr]


def test_a_commit_releases_the_message_and_arms_the_forgetting() -> None:
    state = group_state(T0)
    call(state, [half_row()])
    later = group_state(T0 + 1_000, state.get[0])
    rows = call(later, [end_row(Decision.COMMIT_MESSAGE, born_timestamp=T0 + 900)])
    assert kinds(rows) == [Kind.VISIBLE, Kind.HISTORY, Kind.TIMER]
    visible = rows[0]
    # Its body is read back by the sink from where the half message lies (readback.bodies).
    assert (visible.topic, visible.key, visible.value) == ("orders", b"K1", None)
    assert (visible.body_partition, visible.body_offset) == (0, 0)
    assert visible.not_before_ms is None
    assert tally(rows)["histograms"][Timed.COMMIT_TO_VISIBLE][-1] == 100  # ms from the commit
    tx = saved(later).get(TXID)
    assert tx is not None and tx.status is Status.COMMITTED and tx.half is None
    assert later._timeout_timestamp == T0 + 1_000 + 120_000  # no lead: only checks run ahead
    # Once forgotten, the key keeps the outcome alone, the reserved time after the commit ...
    kept = group_state(T0 + 121_000, later.get[0], timed_out=True)
    rows = call(kept)
    reserved_end = T0 + 1_000 + POLICY.reserved_time
    assert kinds(rows) == [Kind.TIMER] and rows[0].not_before_ms == reserved_end
    assert saved(kept).get(TXID) is None and len(saved(kept).outcomes) == 1
    # ... then it is empty: its state is removed and its timer cleared.
    gone = group_state(reserved_end, kept.get[0], timed_out=True)
    rows = call(gone)
    assert kinds(rows) == [Kind.TIMER] and rows[0].not_before_ms is None
    assert not gone.exists


def test_record_ids_number_on_from_the_saved_state_and_repeat_in_a_replay() -> None:
    first = group_state(T0)
    call(first, [half_row()])
    blob = first.get[0]
    replay_a, replay_b = group_state(T0 + 50, blob), group_state(T0 + 50, blob)
    rows = [end_row(Decision.ROLLBACK_MESSAGE, offset=1), end_row(Decision.COMMIT_MESSAGE, 2)]
    a, b = call(replay_a, rows), call(replay_b, rows)
    assert a == b  # a replayed batch: same state, same input, same time -> the same records
    tag = coordinator_tag(TOPICS)
    ids = [r.record_id for r in a if r.record_id]
    assert ids == [f"{tag}.{KEY}.{T0}.1", f"{tag}.{KEY}.{T0}.2"]  # 0 went to the first batch
    assert kinds(a) == [Kind.DEAD_LETTER, Kind.HISTORY, Kind.TIMER]  # commit after rollback


def test_an_unreadable_or_malformed_record_is_dead_lettered_and_changes_nothing() -> None:
    state = group_state(T0)
    broken = end_row(Decision.COMMIT_MESSAGE)._replace(headers=b"\x00\x09cut")
    rows = call(state, [unreadable_row(True, 0, 7, "bad CRC"), broken])
    assert kinds(rows) == [Kind.DEAD_LETTER, Kind.DEAD_LETTER, Kind.TIMER]
    reasons = [dict(unpack_headers(r.headers))[H.DLQ_REASON] for r in rows[:2]]
    assert reasons[0] == b"bad CRC" and b"packed headers" in reasons[1]
    assert not state.exists and rows[-1].not_before_ms is None


def _history(rows: Sequence[OutputRow]) -> list[dict[str, Any]]:
    from txstream.outputs import decode_history

    return [n for r in rows if r.kind == Kind.HISTORY for n in decode_history(r.value, r.key)]


def test_a_commit_whose_body_is_gone_is_no_release_and_the_half_sent_again_is(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # The partition has ended short of it for long enough (txstream.readback.bodies).
    monkeypatch.setattr(bodies, "SHORT_SETTLE_S", 0.0)
    state = group_state(T0)
    call(state, [half_row(offset=40)])  # held without its body: nothing lies at offset 40
    later = group_state(T0 + 1_000, state.get[0])
    rows = call(later, [end_row(Decision.COMMIT_MESSAGE, offset=5)])
    assert kinds(rows) == [Kind.DEAD_LETTER, Kind.HISTORY, Kind.TIMER]
    letter, history = rows[0], _history(rows)
    headers = dict(unpack_headers(letter.headers))
    # In the transaction's own story: keyed by its id, the half message without its body.
    assert letter.key == TXID.encode() and letter.value is None
    assert headers[H.DLQ_CODE] == b"HALF_MESSAGE_LOST"
    assert f"{TOPICS.half}/0 offset 40".encode() in headers[H.DLQ_REASON]
    assert [n["event"] for n in history] == ["body_gone", "release_lost"]
    assert saved(later).get(TXID).status is Status.LOST  # type: ignore[union-attr]
    # The half message sent again (same transaction id) is released, once.
    again = group_state(T0 + 2_000, later.get[0])
    rows = call(again, [half_row(offset=3)])
    assert kinds(rows) == [Kind.VISIBLE, Kind.HISTORY, Kind.TIMER]
    assert rows[0].value == b"payload"
    assert saved(again).get(TXID).status is Status.COMMITTED  # type: ignore[union-attr]


def _watermarked(now: int, blob: bytes, ends_read: int) -> GroupState:
    state = group_state(now, blob, timed_out=True)
    state._event_time_watermark_ms, state._watermark_present = ends_read, True
    return state


def test_a_discard_for_age_waits_for_the_end_topic_to_be_read_past_it() -> None:
    state = group_state(T0)
    call(state, [half_row()])
    blob = state.get[0]
    due = T0 + POLICY.reserved_time
    behind = _watermarked(due + 5_000, blob, ends_read=due - 1)  # a commit may be unread
    rows = call(behind)
    assert kinds(rows) == [Kind.TIMER] and behind._timeout_timestamp == due + 5_000 + 1
    read = _watermarked(due + 6_000, behind.get[0], ends_read=due)
    rows = call(read)
    assert kinds(rows) == [Kind.DISCARD, Kind.HISTORY, Kind.TIMER]
