"""The coordinator's one metrics pipeline without Spark: the core's effects tallied per key
(``KeyTally``), folded on the driver (``MetricsBoard``), printed as the progress line and
exported to Prometheus; and the metric list of docs/operations.md checked against the registry."""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, NamedTuple

from hypothesis import given
from hypothesis import strategies as st
from prometheus_client.core import CollectorRegistry
from pyspark.sql import Row

from txstream.message import Decision, EndEvent, Message
from txstream.state.bucket import Bucket
from txstream.state.effects import NoteKind
from txstream.state.policy import Policy
from txstream.state.transaction import BodyGone, Event, Status
from txstream.streaming.engine.health import LagReading
from txstream.streaming.engine.key_metrics import (
    BUCKETS_MS,
    KEY_SUMMARIES,
    Counted,
    KeyTally,
    bucket_of,
)
from txstream.streaming.engine.metric_totals import MetricsBoard
from txstream.streaming.engine.metrics import BoardCollector, MetricsSources
from txstream.streaming.engine.progress import format_batch
from txstream.streaming.engine.query import OBSERVATION

T0 = 1_700_000_000_000
POLICY = Policy(transaction_timeout=6_000, check_interval=60_000, orphan_end_timeout=3_000)
DOCS = Path(__file__).resolve().parents[2] / "docs" / "operations.md"


class Progress(NamedTuple):
    """The fields of a ``StreamingQueryProgress`` the board reads."""

    batchId: int
    numInputRows: int
    observedMetrics: dict[str, Row]
    durationMs: dict[str, int]
    sources: Sequence[Any] = ()


def half(txid: str, group: str = "G") -> Message:
    return Message("orders", b"x", transaction_id=txid, msg_id=txid, producer_group=group,
                   born_timestamp=T0, queue_id=0, queue_offset=5)


def end(txid: str, decision: Decision, group: str = "G") -> EndEvent:
    return EndEvent(txid, group, decision)


def run_key(bucket: Bucket, key: int, events: Iterable[Event], now: int,
            timers_at: int | None = None) -> bytes:
    """One operator call of a key, as the operator tallies it: its summary."""
    tally = KeyTally(now)
    for event in events:
        before = bucket.get(event.transaction_id) if isinstance(event, EndEvent) else None
        tally.applied(event, before, bucket.apply(event, now, POLICY))
    if timers_at is not None:
        for _, fired in bucket.run_timers(timers_at, 0, POLICY):
            tally.effects(fired)
    return tally.summary(key, bucket)


def progress(batch: int, summaries: Sequence[bytes], rows: int = 0) -> Progress:
    observed = Row(**{KEY_SUMMARIES: [s.decode() for s in summaries]})
    return Progress(batch, rows, {OBSERVATION: observed}, {"triggerExecution": 40})


def test_a_lost_release_is_no_longer_pending() -> None:
    """Committed, but its half message's body was gone: the transaction ended (LOST); the
    progress line's pending and the gauges count it out."""
    bucket, board = Bucket.decode(None), MetricsBoard()
    board.add_progress(progress(0, [run_key(bucket, 1, [half("a"), half("b")], T0)], rows=2))
    assert board.view().pending == 2
    counts = board.add_progress(progress(1, [run_key(bucket, 1, [
        BodyGone("a", "was deleted by retention"), end("a", Decision.COMMIT_MESSAGE),
        end("b", Decision.ROLLBACK_MESSAGE)], T0 + 1)], rows=3))
    assert bucket.get("a").status is Status.LOST  # type: ignore[union-attr]
    view = board.view()
    assert view.pending == 0 and view.open_counts == {}
    assert counts[Counted.DEAD_LETTERS] == 1 and counts[Counted.ROLLBACKS] == 1
    assert Counted.COMMITS not in counts  # nothing was released
    line = format_batch(progress(1, [], rows=3), counts, view.pending)
    assert line.endswith("released 0 rolled back 1 checks 0 discarded 0 dead letters 1 | "
                         "pending 0"), line


def test_the_board_adds_what_the_core_decided_by_kind() -> None:
    """Duplicates, refusals and expiries are counted from the core's notes, once each."""
    bucket, board = Bucket.decode(None), MetricsBoard()
    summaries = [run_key(bucket, 1, [half("a"), end("a", Decision.COMMIT_MESSAGE),
                                     end("a", Decision.COMMIT_MESSAGE),  # a duplicate
                                     end("a", Decision.ROLLBACK_MESSAGE),  # contradicts
                                     end("never", Decision.COMMIT_MESSAGE)],  # held
                         T0, timers_at=T0 + 3_001)]  # the held end event expires
    board.add_progress(progress(0, summaries, rows=5))
    totals = board.totals()
    assert totals[Counted.HALF_MESSAGES] == 1 and totals[Counted.COMMITS] == 1
    assert totals[Counted.DUPLICATES] == 1 and totals[Counted.REJECTED] == 1
    assert totals[Counted.EXPIRED] == 1
    view = board.view()
    assert view.batches == 1 and view.input_rows == 5 and view.pending == 0


def test_pending_is_unknown_until_the_state_was_read() -> None:
    board = MetricsBoard(open_known=False)
    bucket = Bucket.decode(None)
    counts = board.add_progress(progress(0, [run_key(bucket, 1, [half("a")], T0)], rows=1))
    assert board.view().pending is None
    assert format_batch(progress(0, [], 1), counts, None).endswith("| pending ?")
    board.seed(0, [])
    assert board.view().pending == 1


@given(st.integers(min_value=-10, max_value=100_000))
def test_a_time_falls_in_the_first_bucket_whose_bound_it_does_not_pass(ms: int) -> None:
    index = bucket_of(ms)
    assert all(ms > bound for bound in BUCKETS_MS[:index])
    assert index == len(BUCKETS_MS) or ms <= BUCKETS_MS[index]


def test_every_note_kind_is_written_as_its_word() -> None:
    """The history topic holds the words: the enum is the wire format."""
    assert all(kind == kind.value and str(kind) == kind.value for kind in NoteKind)
    assert len({kind.value for kind in NoteKind}) == len(NoteKind)


class _Lag:
    def reading(self) -> LagReading:
        return LagReading({("half", 0): 0}, None)


def _documented() -> dict[str, tuple[str, tuple[str, ...]]]:
    """docs/operations.md's metric table: name -> (type, label names)."""
    text = DOCS.read_text()
    section = text[text.index("## Metrics"):]
    section = section[:section.index("\n### ")]
    out = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 4 or not cells[0].startswith("`"):
            continue
        names, kind, labels, _ = cells
        label_names = tuple(re.findall(r"`([^`]+)`", re.sub(r"\([^)]*\)", "", labels)))
        for name in re.findall(r"`([^`]+)`", names):
            out[name] = (kind, label_names)
    return out


def _registered() -> dict[str, tuple[str, tuple[str, ...]]]:
    registry = CollectorRegistry(auto_describe=True)
    board = MetricsBoard()
    board.seed(0, [run_key(Bucket.decode(None), 1, [half("a")], T0)])
    registry.register(BoardCollector(MetricsSources(board, _Lag(),  # type: ignore[arg-type]
                                                    heap=lambda: (1, 2), restarts=lambda: 0)))
    out = {}
    for family in registry.collect():
        name = family.name + ("_total" if family.type == "counter" else "")
        labels = {k for s in family.samples for k in s.labels if k not in ("le",)}
        out[name] = (family.type, tuple(sorted(labels | set(getattr(family, "_labelnames", ())))))
    return out


def test_the_documented_metrics_are_the_registered_ones() -> None:
    documented, registered = _documented(), _registered()
    assert documented.pop("process_*")[0] == ""  # prometheus_client's process collector
    assert {n: (k, tuple(sorted(labels))) for n, (k, labels) in documented.items()} \
        == registered
