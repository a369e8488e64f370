"""Many transactions under one state key: routing, timers, encoding (the layouts of the
state format: test_state_codec.py)."""

from __future__ import annotations

import dataclasses
import pickle

import pytest

from txstream.message import Decision, EndEvent, Message
from txstream.state.bucket import Bucket
from txstream.state.effects import DeadLetter, Discard, Note, Release, RequestCheck
from txstream.state.policy import Policy
from txstream.state.transaction import BodyGone, Status, Transaction
from txstream.topics import Topics
from txstream.wire import decode_half, encode_half

T0 = 1_700_000_000_000
P = Policy()
COMMIT, ROLLBACK, UNKNOWN = Decision.COMMIT_MESSAGE, Decision.ROLLBACK_MESSAGE, Decision.UNKNOW


def half(txid: str, born: int = T0, body: bytes = b"\x00body\xff", **kw: object) -> Message:
    return Message(topic="orders", body=body, transaction_id=txid, msg_id=txid,
                   producer_group="G", born_timestamp=born, **kw)  # type: ignore[arg-type]


def end(txid: str, decision: Decision = COMMIT, group: str = "G", **kw: object) -> EndEvent:
    return EndEvent(txid, group, decision, **kw)  # type: ignore[arg-type]


def every_status() -> Bucket:
    """One transaction in each status, with every optional field filled somewhere."""
    b = Bucket()
    rich = half("pending", tags="T", keys="K", properties={"a": "1", "ü": "ß"},
                check_immunity_time_s=30, queue_id=3, queue_offset=77, reconsume_times=1)
    b.apply(rich, T0, P)
    b.apply(half("committed"), T0, P)
    b.apply(end("committed", COMMIT, born_timestamp=T0 + 1), T0 + 1, P)
    b.apply(half("rolled-back"), T0, P)
    b.apply(end("rolled-back", ROLLBACK, remark="boom"), T0 + 1, P)
    b.apply(half("discarded"), T0 - P.reserved_time, P)  # registered the reserved time ago
    b.apply(half("lost", queue_id=1, queue_offset=9), T0, P)
    b.apply(BodyGone("lost", "is no longer in the topic"), T0, P)
    b.apply(end("lost", COMMIT), T0, P)
    b.apply(end("early", UNKNOWN, from_check=True, check_times=2), T0, P)
    b.apply(end("early", COMMIT, group="OTHER", operator=None), T0, P)
    b.apply(end("early-admin", ROLLBACK, group="ops", operator="alice"), T0, P)
    b.apply(half("checked"), T0, P)
    b.fire_due(T0 + P.transaction_timeout, P)  # discards one, checks two
    b.apply(end("checked", UNKNOWN, from_check=True, check_times=1), T0 + 7000, P)
    return b


def test_every_status_is_represented() -> None:
    statuses = {tx.status for tx in every_status()}
    assert statuses == set(Status)


def _without_body(tx: Transaction) -> Transaction:
    assert tx.half is not None
    return dataclasses.replace(tx, half=dataclasses.replace(tx.half, body=None))


def test_encode_decode_round_trip() -> None:
    b = every_status()
    back = Bucket.decode(b.encode())
    assert list(back.transactions) == list(b.transactions)  # same order: same timer order
    # The half messages that know where they lie (queue id and offset) are kept without their
    # bodies; every other field of every transaction comes back as it was.
    expected = {txid: _without_body(tx) if txid in ("pending", "lost") else tx
                for txid, tx in b.transactions.items()}
    assert back.transactions == expected
    assert (back.epoch, back.next_number, back.outcomes) == (b.epoch, b.next_number, b.outcomes)
    rich = back.get("pending")
    assert rich is not None and rich.half is not None and rich.half.body is None
    assert rich.half.properties == {"a": "1", "ü": "ß"} and rich.half.queue_offset == 77
    assert Bucket.decode(back.encode()) == back


def test_a_half_message_is_kept_without_its_body_only_when_it_can_be_read_back() -> None:
    b = Bucket()
    b.apply(half("at", queue_id=1, queue_offset=5), T0, P)
    b.apply(half("nowhere"), T0, P)  # not read from a topic (an admin tool's, a test's)
    before = b.get("at")
    assert before is not None and before.half is not None and before.half.body is not None
    back = Bucket.decode(b.encode())
    at, nowhere = back.get("at"), back.get("nowhere")
    assert at is not None and at.half is not None and at.half.body is None
    assert (at.half.queue_id, at.half.queue_offset) == (1, 5)
    assert nowhere is not None and nowhere.half is not None
    assert nowhere.half.body == b"\x00body\xff"


def test_a_held_body_takes_no_room_in_the_state() -> None:
    big, placed = Bucket(), Bucket()
    big.apply(half("t", body=b"x" * 10_000), T0, P)
    placed.apply(half("t", body=b"x" * 10_000, queue_id=0, queue_offset=9), T0, P)
    assert len(big.encode()) > 10_000 > 300 > len(placed.encode())


def test_buckets_differ_when_a_transaction_differs() -> None:
    a, b = every_status(), every_status()
    assert a == b
    b.apply(end("pending", COMMIT), T0 + 10, P)
    assert a != b
    assert a != "not a bucket"


@pytest.mark.parametrize("blob", [None, b""])
def test_no_state_is_an_empty_bucket(blob: bytes | None) -> None:
    b = Bucket.decode(blob)
    assert len(b) == 0 and b.next_deadline() is None and b == Bucket()


def test_apply_routes_each_event_to_its_transaction() -> None:
    b = Bucket()
    b.apply(half("a"), T0, P)
    b.apply(half("b"), T0, P)
    effects = b.apply(end("a"), T0 + 1, P)
    assert [type(e) for e in effects] == [Release, Note]
    a, bb = b.get("a"), b.get("b")
    assert a is not None and a.status is Status.COMMITTED
    assert bb is not None and bb.status is Status.PENDING
    assert [tx.transaction_id for tx in b.pending()] == ["b"]
    assert len(b) == 2 and {tx.transaction_id for tx in b} == {"a", "b"}
    assert b.get("nope") is None


def _tx(txid: str, deadline: int) -> Transaction:
    return Transaction(txid, Status.COMMITTED, deadline, "G")


def test_fire_due_runs_due_timers_in_deadline_then_id_order() -> None:
    b = Bucket()
    for txid, born in [("c", T0 + 2), ("a", T0 + 5), ("b", T0 + 2), ("late", T0 + 100)]:
        b.apply(half(txid, born=born), T0 + 200, P)  # born before it arrived
    effects = b.fire_due(T0 + 5 + P.transaction_timeout, P)
    checks = [e.message.transaction_id for e in effects if isinstance(e, RequestCheck)]
    assert checks == ["b", "c", "a"]
    late = [e.late_ms for e in effects if isinstance(e, RequestCheck)]
    assert late == [3, 3, 0]
    assert b.next_deadline() == T0 + 100 + P.transaction_timeout  # "late" is not due yet


def test_timers_due_within_the_lead_run_now_as_of_their_deadlines() -> None:
    b = Bucket()
    for txid, born in [("due", T0), ("soon", T0 + 300), ("later", T0 + 700)]:
        b.apply(half(txid, born=born), born, P)
    now = T0 + 100 + P.transaction_timeout  # "due" 100 ms late, "soon" due in 200 ms
    fired = b.run_timers(now, 500, P)
    assert [(at, [e.message.transaction_id for e in effects if isinstance(e, RequestCheck)])
            for at, effects in fired] == [(now, ["due"]), (now + 200, ["soon"])]
    soon = b.get("soon")
    assert soon is not None and soon.next_check == now + 200 + P.check_interval
    late = [e.late_ms for _, effects in fired for e in effects if isinstance(e, RequestCheck)]
    assert late == [100, 0]
    assert b.next_deadline() == T0 + 700 + P.transaction_timeout  # 600 ms out: not yet
    assert b.run_timers(now, 0, P) == []


def test_fire_due_leaves_only_future_deadlines() -> None:
    b = Bucket()
    b.apply(half("old"), T0 - P.reserved_time, P)
    b.apply(end("orphan", COMMIT), T0, P)
    b.apply(half("x"), T0, P)
    now = T0 + P.orphan_end_timeout
    effects = b.fire_due(now, P)
    assert {type(e) for e in effects} == {Discard, DeadLetter, RequestCheck, Note}
    assert b.get("orphan") is None
    deadline = b.next_deadline()
    assert deadline is not None and deadline > now
    assert b.fire_due(now, P) == []  # nothing is due twice


def test_fire_due_forgets_resolved_transactions() -> None:
    b = Bucket({"a": _tx("a", T0), "b": _tx("b", T0 + 1)})
    assert b.fire_due(T0, P) == []
    assert b.get("a") is None and b.get("b") is not None
    assert b.next_deadline() == T0 + 1


def test_next_deadline_is_the_earliest() -> None:
    b = Bucket({t.transaction_id: t for t in (_tx("a", 30), _tx("b", 10), _tx("c", 20))})
    assert b.next_deadline() == 10
    assert Bucket().next_deadline() is None


def test_a_partly_decoded_bucket_encodes_like_a_fully_decoded_one() -> None:
    # Decoding keeps transactions as tuples until touched; what is written back must not
    # depend on which ones a batch happened to touch.
    blob = every_status().encode()
    lazy, eager = Bucket.decode(blob), Bucket.decode(blob)
    assert len(eager.transactions) == len(every_status())  # decodes every one
    for b in (lazy, eager):
        b.apply(end("pending", COMMIT), T0 + 10, P)
        b.fire_due(T0 + P.check_interval + 7000, P)
    # The same rows (pickle's byte stream may share strings differently).
    assert pickle.loads(lazy.encode()) == pickle.loads(eager.encode())
    assert Bucket.decode(lazy.encode()) == eager


def test_equal_strings_are_written_once_per_key() -> None:
    # As the operator gets them: decoded from the wire, where the id, UNIQ_KEY and KEYS are
    # separate headers, so equal strings are separate objects. Spark copies every key's state
    # on every micro-batch; each repeat of an id is ~35 bytes per held transaction.
    topics = Topics.with_prefix("t_")
    b = Bucket()
    ids = [f"01A20E5DC83E7BA5BA430196C4DBAA{i:02X}" for i in range(20)]
    for txid in ids:
        msg = Message(topic="orders", body=b"x" * 200, keys=txid, transaction_id=txid,
                      msg_id=txid, producer_group="shop", born_timestamp=T0)
        record = encode_half(msg, topics)
        decoded = decode_half(record.key, record.value, record.headers)
        assert decoded.msg_id is not decoded.transaction_id  # what sharing has to undo
        b.apply(decoded, T0, P)
    blob = b.encode()
    assert [blob.count(txid.encode()) for txid in ids] == [1] * len(ids)
    assert blob.count(b"orders") == 1 and blob.count(b"shop") == 1
    assert Bucket.decode(blob) == b


def test_an_id_in_doubt_is_no_outcome_and_any_outcome_replaces_it() -> None:
    """IN_DOUBT (an earlier life may have released the id unnoted) sends its half message to be
    looked for, then applies it as new; an outcome replaces it, it replaces no outcome."""
    b = Bucket()
    assert b.recall_outcome("doubt", "IN_DOUBT", T0 + 10_000, T0)
    assert b.in_doubt("doubt", T0) and b.known_outcome("doubt", T0) is None
    notes = [e.event for e in b.apply(half("doubt"), T0, P) if isinstance(e, Note)]
    assert notes == ["half"]  # registered, no duplicate
    registered = b.get("doubt")
    assert registered is not None and registered.status is Status.PENDING
    assert b.recall_outcome("told", "IN_DOUBT", T0 + 10_000, T0)
    assert b.recall_outcome("told", "COMMITTED", T0 + 10_000, T0)
    assert not b.in_doubt("told", T0) and b.known_outcome("told", T0) == ("COMMITTED", T0 + 10_000)
    assert not b.recall_outcome("told", "IN_DOUBT", T0 + 20_000, T0)
    assert not b.in_doubt("doubt", T0 + 10_000)  # kept for its time only
