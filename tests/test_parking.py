"""Parking changes where a pending transaction waits, never what happens to it.

The same events and timers run through a plain bucket and through a bucket that parks (and
restores, with its half message read back by position) every transaction it can; both must emit
exactly the same effects, batch by batch, and hold the same transactions.
"""

from __future__ import annotations

import random

import numpy as np
import pytest

from state.bucket import Bucket
from state.effects import Effect
from state.lifecycle import Status, Transaction
from state.parking import RECORD, Parked, join, park, parkable, restore, split, txid_hash
from state.policy import Policy
from streaming.parking_lot import ParkingLot
from txstream.message import Decision, EndEvent, Message

T0 = 1_700_000_000_000
P = Policy(transaction_timeout=6_000, check_interval=60_000, check_max=3,
           reserved_time=3_600_000, orphan_end_timeout=60_000, resolved_retention=120_000)
PARK_AFTER = 30_000
COMMIT, ROLLBACK, UNKNOWN = Decision.COMMIT_MESSAGE, Decision.ROLLBACK_MESSAGE, Decision.UNKNOW


class HalfLog:
    """The half topic of a test: every half message at its (partition, offset)."""

    def __init__(self) -> None:
        self.at: dict[tuple[int, int], Message] = {}
        self.reads = 0

    def half(self, txid: str, born: int, immunity: int | None = None,
             partition: int = 0) -> Message:
        offset = sum(1 for p, _ in self.at if p == partition)
        msg = Message("orders", f"body of {txid}".encode(), tags="T", keys=txid,
                      properties={"k": txid}, transaction_id=txid, msg_id=txid,
                      producer_group="G", born_timestamp=born,
                      check_immunity_time_s=immunity, queue_id=partition, queue_offset=offset)
        self.at[(partition, offset)] = msg
        return msg

    def read(self, wanted: object) -> dict[tuple[int, int], Message]:
        self.reads += 1
        return {pos: self.at[pos] for pos in wanted}  # type: ignore[attr-defined]


def end(txid: str, decision: Decision, **kw: object) -> EndEvent:
    return EndEvent(txid, "G", decision, **kw)  # type: ignore[arg-type]


def _run_batch(lot: ParkingLot | None, blob: bytes | None, plain: Bucket,
               events: list[Message | EndEvent], now: int) -> tuple[bytes | None, list[Effect],
                                                                     list[Effect]]:
    """One micro-batch through the plain bucket and through the parking one."""
    want: list[Effect] = []
    for e in events:
        want += plain.apply(e, now, P)
    want += plain.fire_due(now, P)
    assert lot is not None
    bucket, parked = lot.load(blob)
    lot.unpark(bucket, parked, [e.transaction_id or "" for e in events], now)
    got: list[Effect] = []
    for e in events:
        got += bucket.apply(e, now, P)
    got += bucket.fire_due(now, P)
    new_blob, _ = lot.store(bucket, parked, now)
    return new_blob, want, got


def _everything(lot: ParkingLot, blob: bytes | None, log: HalfLog) -> dict[str, Transaction]:
    """Hot and parked transactions (what an admin tool lists), the parked ones read back."""
    return {tx.transaction_id: tx for tx in lot.everything(blob)}


def test_a_parked_transaction_is_restored_equal() -> None:
    log = HalfLog()
    b = Bucket()
    b.apply(log.half("a", T0, immunity=3600), T0, P)
    before = b.get("a")
    parked = Parked()
    assert park(b, parked, T0, PARK_AFTER) == 1 and len(b) == 0
    raw_bucket, back = split(join(b.encode(), parked))
    assert Bucket.decode(raw_bucket) == b and len(back) == 1
    (rec,) = back.records
    assert restore(rec, log.at[(0, 0)]) == before


def test_only_far_off_pending_transactions_with_a_position_are_parked() -> None:
    log = HalfLog()
    b = Bucket()
    b.apply(log.half("soon", T0), T0, P)  # first check in 6 s
    b.apply(log.half("far", T0, immunity=3600), T0, P)
    nowhere = Message("orders", b"x", transaction_id="nowhere", msg_id="nowhere",
                      producer_group="G", born_timestamp=T0, check_immunity_time_s=3600)
    b.apply(nowhere, T0, P)
    b.apply(end("early", COMMIT), T0, P)
    assert [tx.transaction_id for tx in b if parkable(tx, T0, PARK_AFTER)] == ["far"]


def test_a_bucket_reader_sees_the_hot_part_of_a_parked_state() -> None:
    log = HalfLog()
    b = Bucket()
    b.apply(log.half("far", T0, immunity=3600), T0, P)
    b.apply(log.half("hot", T0), T0, P)
    parked = Parked()
    park(b, parked, T0, PARK_AFTER)
    assert set(Bucket.decode(join(b.encode(), parked)).transactions) == {"hot"}
    own, none = split(b.encode())  # a state written without parking reads unchanged
    assert own == b.encode() and len(none) == 0


def test_find_due_take_add() -> None:
    p = Parked()
    recs = np.zeros(3, RECORD)
    for i, txid in enumerate(["x", "y", "z"]):
        recs[i]["h"] = txid_hash(txid)
        recs[i]["deadline"] = T0 + i
    p.add(recs)
    assert list(p.records["h"]) == sorted(p.records["h"])
    assert len(p.find(["y", "nope"])) == 1
    assert p.min_deadline() == T0
    assert list(p.records[p.due(T0 + 1)]["deadline"]) == sorted([T0, T0 + 1])
    taken = p.take(p.find(["x"]))
    assert len(taken) == 1 and len(p) == 2 and not len(p.find(["x"]))


def test_a_restored_transaction_runs_its_timer_and_is_parked_again() -> None:
    log = HalfLog()
    lot = ParkingLot(None, "half", PARK_AFTER, halves=log.read)
    plain = Bucket()
    blob, want, got = _run_batch(lot, None, plain, [log.half("a", T0)], T0)
    assert got == want
    # Its first check is due 6 s after it was born; the next one 60 s later: it is parked.
    blob, want, got = _run_batch(lot, blob, plain, [], T0 + 6_000)
    assert got == want and len(split(blob)[1]) == 1
    blob, want, got = _run_batch(lot, blob, plain, [end("a", UNKNOWN, from_check=True,
                                                        check_times=1)], T0 + 7_000)
    assert got == want and log.reads == 1 and len(split(blob)[1]) == 1
    blob, want, got = _run_batch(lot, blob, plain, [], T0 + 66_000)
    assert got == want and log.reads == 2
    assert _everything(lot, blob, log) == plain.transactions


@pytest.mark.parametrize("seed", range(12))
def test_parking_never_changes_the_outcome(seed: int) -> None:
    rnd = random.Random(seed)
    log = HalfLog()
    lot = ParkingLot(None, "half", PARK_AFTER, halves=log.read)
    plain = Bucket()
    blob: bytes | None = None
    now = T0
    txids = [f"tx{i}" for i in range(40)]
    for _ in range(120):
        now += rnd.choice([1, 500, 5_000, 20_000, 61_000])
        events: list[Message | EndEvent] = []
        for _ in range(rnd.randint(0, 6)):
            txid = rnd.choice(txids)
            kind = rnd.random()
            if kind < 0.35:
                immunity = rnd.choice([None, None, 40, 3600])
                events.append(log.half(txid, now - rnd.randint(0, 3_000), immunity,
                                       partition=rnd.randint(0, 1)))
            else:
                decision = rnd.choice([COMMIT, ROLLBACK, UNKNOWN, UNKNOWN])
                checked = rnd.random() < 0.5
                events.append(end(txid, decision, from_check=checked,
                                  check_times=rnd.randint(1, 4) if checked else None))
        blob, want, got = _run_batch(lot, blob, plain, events, now)
        assert got == want
    everything = _everything(lot, blob, log)
    assert everything == plain.transactions


def test_the_random_runs_do_park_and_restore() -> None:
    """The property above would hold vacuously if nothing were ever parked."""
    log = HalfLog()
    lot = ParkingLot(None, "half", PARK_AFTER, halves=log.read)
    plain = Bucket()
    blob = None
    most = 0
    for i in range(30):
        blob, want, got = _run_batch(lot, blob, plain, [log.half(f"t{i}", T0, 3600)], T0 + i)
        most = max(most, len(split(blob)[1]))
    blob, want, got = _run_batch(lot, blob, plain, [end("t3", COMMIT)], T0 + 100)
    assert got == want and most == 30 and log.reads == 1
    assert plain.get("t3") is not None and plain.get("t3").status is Status.COMMITTED
