"""The state's layouts (txstream.state.codec): every field written, every readable version read.

``tests/state/data/format-<version>.pickle`` is a blob of :func:`sample_bucket` written by the
code of that version. A new format version adds its sample, and keeps the old ones as long as
their versions are readable: ``PYTHONPATH=$PWD python tests/state/test_state_codec.py`` writes the
current version's sample if it has none (it never overwrites one).
"""

from __future__ import annotations

import dataclasses
import pickle
import sys
from pathlib import Path
from typing import Any

import pytest

from txstream.message import Decision, EndEvent, Message, RawRecord
from txstream.state.bucket import Bucket
from txstream.state.codec import FORMAT_VERSION, LAYOUTS, Layout, transaction_of
from txstream.state.outcomes import OUTCOME_CODES, Outcomes
from txstream.state.policy import Policy
from txstream.state.transaction import Status, Transaction

SAMPLES = Path(__file__).resolve().parent / "data"
T0 = 1_700_000_000_000
HOUR = 3_600_000


def sample_bucket() -> Bucket:
    """A bucket in which every field of every class the state holds is set, each to a value
    of its own, and every status occurs: a field read from the wrong position shows."""
    raw = RawRecord(partition=3, offset=41, key=b"tx-early", value=b"v\x00", headers=b"\x01h")
    placed = Message(topic="orders", body=b"\x00body\xff", tags="T", keys="K",
                     properties={"a": "1", "\u00fc": "\u00df"}, transaction_id="tx-pending",
                     msg_id="m-pending", producer_group="G", born_timestamp=T0 + 1,
                     check_immunity_time_s=30, queue_id=2, queue_offset=77, reconsume_times=1,
                     stored_timestamp=T0 + 5)
    kept = Message("orders", b"kept", transaction_id="tx-committed", msg_id="tx-committed",
                   producer_group="G", born_timestamp=T0)
    lost = Message("orders", b"gone", transaction_id="tx-lost", producer_group="G",
                   born_timestamp=T0, queue_id=0, queue_offset=9)
    early = (EndEvent("tx-early", "G", Decision.UNKNOW, from_check=True, check_times=2,
                      operator="alice", remark="why", born_timestamp=T0 + 2, raw=raw),
             EndEvent("tx-early", "OTHER", Decision.COMMIT_MESSAGE))
    transactions = [
        Transaction("tx-pending", Status.PENDING, T0 + 66_000, "G", placed, (),
                    checks_sent=2, checks_answered=1, next_check=T0 + 66_000, last_answered=2,
                    seen_at=T0 + 3, check_due=T0 + 6_000),
        Transaction("tx-early", Status.EARLY_END, T0 + 60_000, None, None, early),
        Transaction("tx-committed", Status.COMMITTED, T0 + 120_000, "G", kept,
                    remember_until=T0 + 72 * HOUR, seen_at=T0),
        Transaction("tx-rolled-back", Status.ROLLED_BACK, T0 + 120_001, "G"),
        Transaction("tx-discarded", Status.DISCARDED, T0 + 120_002, "G"),
        Transaction("tx-lost", Status.LOST, T0 + 120_003, "G", lost,
                    remember_until=T0 + 72 * HOUR, body_gone="is no longer in the topic"),
    ]
    return Bucket({tx.transaction_id: tx for tx in transactions}, epoch=T0, next_number=7,
                  outcomes=_outcomes(OUTCOME_CODES[1:]))


def _outcomes(statuses: tuple[str, ...]) -> Outcomes:
    """One remembered outcome of each of ``statuses``."""
    outcomes = Outcomes()
    for i, status in enumerate(statuses):
        outcomes.remember(f"tx-gone-{status.lower()}", status, T0 + (i + 1) * HOUR)
    return outcomes


def meant(version: int) -> Bucket:
    """What a sample of ``version`` stands for in today's classes: the sample, with the
    bodies of the half messages that know where they lie left to be read back. Format 6 held
    two outcomes then, in two bits of status."""
    assert version in (6, 7, 8), "a new readable version says here what its sample means"
    sample = sample_bucket()
    transactions = {
        txid: dataclasses.replace(tx, half=dataclasses.replace(tx.half, body=None))
        if tx.half is not None and tx.half.queue_id is not None else tx
        for txid, tx in sample.transactions.items()}
    outcomes = sample.outcomes
    if version == 6:  # what the sample held then
        outcomes = Outcomes()
        outcomes.remember("tx-gone", "COMMITTED", T0 + HOUR)
        outcomes.remember("tx-gone-too", "DISCARDED", T0 + 2 * HOUR)
    if version == 7:  # no IN_DOUBT then
        outcomes = _outcomes(OUTCOME_CODES[1:5])
    return Bucket(transactions, sample.epoch, sample.next_number, outcomes)


def contents(bucket: Bucket) -> tuple[Any, ...]:
    """Everything a bucket holds, in its order; unlike ``==`` this compares the record a held
    end event was read from (``EndEvent.raw`` is left out of its equality)."""
    return ([dataclasses.asdict(tx) for tx in bucket.transactions.values()],
            bucket.epoch, bucket.next_number, bucket.outcomes.encode())


_HELD = {"transaction": Transaction, "message": Message, "end_event": EndEvent,
         "raw_record": RawRecord}


@pytest.mark.parametrize("part", sorted(_HELD))
def test_the_current_layout_writes_every_field(part: str) -> None:
    cls = _HELD[part]
    names = {f.name for f in dataclasses.fields(cls)}
    layout = getattr(LAYOUTS[FORMAT_VERSION], part)
    assert len(set(layout)) == len(layout)
    assert set(layout) == names, (
        f"{cls.__name__}'s fields differ from what state format {FORMAT_VERSION} writes: "
        f"missing {sorted(names - set(layout))}, unknown {sorted(set(layout) - names)}. Add a "
        f"layout under a new FORMAT_VERSION in txstream/state/codec.py, and its sample here")


def test_every_layout_is_filed_under_its_version_and_starts_with_it() -> None:
    for version, layout in LAYOUTS.items():
        assert layout.version == version and layout.bucket[0] == "format"
    assert max(LAYOUTS) == FORMAT_VERSION


def _instances(bucket: Bucket) -> list[object]:
    found: list[object] = []
    for tx in bucket.transactions.values():
        found += [tx, *([tx.half] if tx.half else []), *tx.held]
        found += [e.raw for e in tx.held if e.raw is not None]
    return found


@pytest.mark.parametrize("cls", list(_HELD.values()), ids=lambda c: c.__name__)
def test_the_sample_sets_every_field_to_a_value_of_its_own(cls: type) -> None:
    instances = [o for o in _instances(sample_bucket()) if type(o) is cls]
    for f in dataclasses.fields(cls):
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            continue
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        assert any(getattr(o, f.name) != default for o in instances), f"{cls.__name__}.{f.name}"
    assert {tx.status for tx in sample_bucket().transactions.values()} == set(Status)
    # And every resolved status is remembered once it left the state.
    assert {sample_bucket().outcomes.recall(f"tx-gone-{s.value.lower()}", T0) is not None
            for s in Status if s.resolved} == {True}


def test_a_blob_of_the_current_code_decodes_to_the_same_bucket() -> None:
    blob = sample_bucket().encode()
    assert contents(Bucket.decode(blob)) == contents(meant(FORMAT_VERSION))
    # The stored sample of this version has the same rows: its layout did not change in place.
    stored = (SAMPLES / f"format-{FORMAT_VERSION}.pickle").read_bytes()
    assert pickle.loads(stored) == pickle.loads(blob)


def test_there_is_a_sample_of_every_readable_version() -> None:
    assert sorted(p.name for p in SAMPLES.glob("*.pickle")) == sorted(
        f"format-{v}.pickle" for v in LAYOUTS)


@pytest.mark.parametrize("version", sorted(LAYOUTS))
def test_a_stored_sample_decodes_to_what_it_meant(version: int) -> None:
    bucket = Bucket.decode((SAMPLES / f"format-{version}.pickle").read_bytes())
    assert contents(bucket) == contents(meant(version))
    # Held rows are read in place (open counts, deadlines) before they are decoded.
    assert bucket.open_counts() == meant(version).open_counts() == (
        {("PENDING", "G"): 1, ("EARLY_END", ""): 1}, T0 + 1)
    assert bucket.next_deadline() == T0 + 60_000
    # And it goes on working: a commit releases the pending half message.
    bucket.apply(EndEvent("tx-pending", "G", Decision.COMMIT_MESSAGE), T0 + 7_000, Policy())
    pending = bucket.get("tx-pending")
    assert pending is not None and pending.status is Status.COMMITTED


def test_a_row_of_an_older_layout_is_read_by_name() -> None:
    # What a next format does with this one: a field the old layout did not write takes its
    # default, whatever the positions.
    now = LAYOUTS[FORMAT_VERSION]
    old = Layout(now.version - 1, now.bucket, now.transaction, tuple(
        n for n in reversed(now.message) if n != "stored_timestamp"), now.end_event,
        now.raw_record)
    fields = {"topic": "orders", "body": b"b", "tags": None, "keys": None, "properties": {},
              "transaction_id": "p", "msg_id": "p", "producer_group": "G",
              "born_timestamp": T0, "check_immunity_time_s": None, "queue_id": None,
              "queue_offset": None, "reconsume_times": 3}
    message = tuple(fields[n] for n in old.message)
    row = ("p", "PENDING", T0 + 6_000, "G", message, (), 0, 0, T0 + 6_000, 0, None, T0, None,
           None)
    tx = transaction_of(row, old)
    assert tx.half == Message("orders", b"b", transaction_id="p", msg_id="p",
                              producer_group="G", born_timestamp=T0, reconsume_times=3)
    assert tx.half.stored_timestamp is None and tx.seen_at == T0


def test_a_format_no_layout_names_is_refused() -> None:
    for envelope in [(5, [], None, 0, None), (999, []), "not a state"]:
        with pytest.raises(ValueError, match="is not one of"):
            Bucket.decode(pickle.dumps(envelope))


def test_a_row_of_another_length_is_refused_not_misread() -> None:
    version, rows, *rest = pickle.loads(sample_bucket().encode())
    with pytest.raises(ValueError, match="format changed without a new version"):
        Bucket.decode(pickle.dumps((version, [(*rows[0], "new field")], *rest)))
    with pytest.raises(ValueError, match="format changed without a new version"):
        Bucket.decode(pickle.dumps((version, rows, *rest, "new field")))


def test_every_outcome_code_keeps_its_until_to_the_year_3000() -> None:
    """Eight bits of status (format 8) leave the until its 55 bits."""
    year_3000 = 32_503_680_000_000
    outcomes = Outcomes()
    for code in OUTCOME_CODES[1:]:
        outcomes.remember(f"tx-{code}", code, year_3000)
    keys_values = outcomes.encode()
    back = Outcomes.decode(keys_values)
    assert [back.recall(f"tx-{code}", T0) for code in OUTCOME_CODES[1:]] == [
        (code, year_3000) for code in OUTCOME_CODES[1:]]


def _write_sample() -> None:
    path = SAMPLES / f"format-{FORMAT_VERSION}.pickle"
    if path.exists():
        sys.exit(f"{path} exists: a sample is never rewritten (a new layout needs a new version)")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(sample_bucket().encode())
    print(f"wrote {path}")


if __name__ == "__main__":
    _write_sample()
