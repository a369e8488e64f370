"""The console's index against a real coordinator (local Spark, the tansu broker): pending
transactions with their group, topic and checks; a resolved one's whole timeline; a restart
that resumes from the stored offsets; discards and dead letters with their reasons; search by
message id and business key; bad records skipped; ``txstream history --index``."""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

import txstream.console.feed as feed_module
from tests.support.console_helpers import Coordinator, produce_unknown, start_console_coordinator
from tests.support.kafka_helpers import (
    discard_by_answers,
    end_record,
    half_record,
    now_ms,
    produce,
    read_topic,
    wait_for,
    wait_until,
)
from txstream.console import FeedStats, Index, IndexFeed, IndexStatus, TxQuery
from txstream.console.index import MEMORY
from txstream.console.record_entries import Source
from txstream.kafka import KafkaSettings
from txstream.message import Decision, Message
from txstream.state.transaction import Status
from txstream.streaming.cli import main
from txstream.streaming.cli.operator_decision import send_decision
from txstream.topics import Topics
from txstream.wire import H, Record, encode_half

pytestmark = pytest.mark.spark

T = TypeVar("T")


def feed_until(feed: IndexFeed, predicate: Callable[[], T], timeout_s: float = 60.0) -> T:
    """Catch the index up until ``predicate`` holds."""
    def caught_up() -> T:
        feed.catch_up()
        return predicate()
    return wait_until(caught_up, timeout_s=timeout_s, interval_s=0.3)


@pytest.fixture(scope="module")
def coord(spark: Any, kafka: KafkaSettings, tmp_path_factory: pytest.TempPathFactory
          ) -> Iterator[Coordinator]:
    running = start_console_coordinator(spark, kafka, tmp_path_factory.mktemp("console-cp"))
    yield running
    running.query.stop()


@pytest.fixture(scope="module")
def feed(coord: Coordinator) -> Iterator[IndexFeed]:
    with Index(MEMORY) as index, IndexFeed(index, coord.kafka, coord.topics) as fed:
        yield fed


def _history_kinds(index: Index, txid: str) -> list[str]:
    return [e.kind for e in index.events(txid, (Source.HISTORY,))]


def test_a_pending_transaction_shows_its_group_topic_and_checks(
    coord: Coordinator, feed: IndexFeed, capsys: pytest.CaptureFixture[str], unique: str
) -> None:
    before = now_ms()
    group, real = f"{unique}-g", f"{unique}-real"
    txid = produce_unknown(coord, capsys, group, real, "waiting", "--keys", f"{unique}-order",
                           "--tags", "paid")
    index = feed.index
    # The producer's own UNKNOW is read in the half message's micro-batch or after (or before:
    # the two topics are read side by side, and an end event may wait for its half message);
    # on a loaded machine even after the first check.
    row = feed_until(feed, lambda: (r := index.transaction(txid)) and r.checks_sent >= 1
                     and "unknown" in _history_kinds(index, txid) and r)
    assert row.status == Status.PENDING
    assert (row.producer_group, row.real_topic) == (group, real)
    assert (row.msg_id, row.keys, row.tags) == (txid, f"{unique}-order", "paid")
    assert row.born_ms is not None and before <= row.born_ms <= now_ms()
    assert row.first_seen_ms is not None and row.first_seen_ms >= row.born_ms
    assert row.checks_answered == 0  # nobody of the group answers
    assert row.next_check_ms is not None and row.next_check_ms > row.born_ms + 1000
    assert {"half", "unknown", "check_sent"} <= set(_history_kinds(index, txid))

    rows, total = index.transactions(TxQuery(statuses=IndexStatus.OPEN, group=group))
    assert [r.transaction_id for r in rows] == [txid] and total == 1
    assert [r.transaction_id for r in index.transactions(TxQuery(text=real))[0]] == [txid]
    assert index.transactions(TxQuery(statuses=(Status.COMMITTED,), group=group)) == ([], 0)

    # A producer answers a check (no number: the latest one): it counts.
    produce(coord.kafka, [end_record(coord.topics, txid, group, Decision.UNKNOW,
                                     from_check=True)])
    row = feed_until(feed, lambda: (r := index.transaction(txid)) and r.checks_answered and r)
    assert row.checks_answered == 1 and row.status == Status.PENDING


def test_a_resolved_transaction_has_its_whole_timeline(
    coord: Coordinator, feed: IndexFeed, capsys: pytest.CaptureFixture[str], unique: str
) -> None:
    group, real = f"{unique}-g", f"{unique}-real"
    txid = produce_unknown(coord, capsys, group, real, "to commit")
    index = feed.index
    feed_until(feed, lambda: (r := index.transaction(txid)) and r.checks_sent >= 2)
    send_decision(coord.kafka, coord.topics, txid, Decision.COMMIT_MESSAGE, "alice",
                  "paid by phone")
    row = feed_until(feed, lambda: (r := index.transaction(txid)) and r.outcome and r)
    assert (row.status, row.outcome, row.operator, row.reason) == (
        Status.COMMITTED, "released", "alice", "paid by phone")
    assert row.next_check_ms is None
    assert len(wait_for(coord.kafka, real, 1, timeout_s=30)) == 1

    events = index.events(txid)
    kinds = [e.kind for e in events if e.source == Source.HISTORY]
    assert {"half", "unknown"} <= set(kinds) and kinds[-1] == "released"
    checks = [e.detail["check"] for e in events if e.kind == "check_sent"]
    assert checks == list(range(1, row.checks_sent + 1)) and len(checks) >= 2
    released = events[-1].detail
    assert (released["operator"], released["remark"], released["decision"]) == (
        "alice", "paid by phone", "COMMIT_MESSAGE")
    [half] = [e for e in events if e.source == Source.HALF]
    assert half.detail["headers"][H.PGROUP] == group


def test_a_restarted_index_resumes_from_its_stored_offsets(
    coord: Coordinator, capsys: pytest.CaptureFixture[str], unique: str, tmp_path: Path
) -> None:
    path = tmp_path / "index.sqlite"
    first = produce_unknown(coord, capsys, f"{unique}-g", f"{unique}-real", "before")
    with Index(path) as index, IndexFeed(index, coord.kafka, coord.topics) as feed:
        feed_until(feed, lambda: index.transaction(first))
        stored = index.offsets()
        events = index.counts()["events"]
    second = produce_unknown(coord, capsys, f"{unique}-g", f"{unique}-real", "after")
    wait_until(lambda: _in_history(coord, second), timeout_s=60)

    with Index(path) as index, IndexFeed(index, coord.kafka, coord.topics) as feed:
        assert index.offsets() == stored and index.counts()["events"] == events
        stats = feed.catch_up()
        after = index.offsets()
        # It read what was added since, no record before the stored offsets (on Apache Kafka
        # a transaction's commit marker takes an offset too: records are counted, not offsets).
        added = sum(1 for topic in {t for t, _ in after} for r in read_topic(coord.kafka, topic)
                    if stored.get((topic, r.partition), 0) <= r.offset
                    < after.get((topic, r.partition), 0))
        assert stats.records == added
        assert stats.records > 0 and index.transaction(second) is not None
        assert index.transaction(first) is not None
        resumed = _timeline(index)
    with Index(MEMORY) as fresh, IndexFeed(fresh, coord.kafka, coord.topics) as feed:
        feed.catch_up()
        # Exactly what one reading from the beginning finds, up to the same offsets.
        assert resumed == [e for e in _timeline(fresh) if _read_below(after, e)]


def test_a_catch_up_cut_short_loses_and_repeats_nothing(
    coord: Coordinator, feed: IndexFeed, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every chunk commits with its offset: a failure in the middle of one (its rows written,
    its offset not yet) leaves the index where the last chunk ended, and the next catch-up
    goes on from there."""
    # Its own traffic, whichever tests ran before it on this worker: six commits, each a half
    # and a release note at least.
    tag = uuid.uuid4().hex[:8]
    produce(coord.kafka, [record for i in range(6) for record in (
        half_record(coord.topics, f"cut-{tag}-{i}", f"cut-{tag}", f"cut-{tag}-real"),
        end_record(coord.topics, f"cut-{tag}-{i}", f"cut-{tag}", Decision.COMMIT_MESSAGE))])
    feed_until(feed, lambda: feed.index.counts()["events"] > 10)
    monkeypatch.setattr(feed_module, "_ENTRIES_PER_CHUNK", 1)
    calls = 0

    class Cut(Exception):
        pass

    with Index(MEMORY) as index:
        real_store = index._store

        def failing_store(db: Any, entries: list[Any]) -> None:
            nonlocal calls
            calls += bool(entries)
            real_store(db, entries)
            if calls == 6:
                raise Cut()

        monkeypatch.setattr(index, "_store", failing_store)
        with IndexFeed(index, coord.kafka, coord.topics) as cut:
            with pytest.raises(Cut):
                cut.catch_up()
            # The five chunks before the failure are in, with their offsets; nothing after.
            stored = index.offsets()
            kept = _timeline(index)
            assert kept and all(_offset_of(e) < stored[_at(e)] for e in kept)
            cut.catch_up()
        after = index.offsets()
        resumed = _timeline(index)
    with Index(MEMORY) as fresh, IndexFeed(fresh, coord.kafka, coord.topics) as whole:
        whole.catch_up()
        assert resumed == [e for e in _timeline(fresh) if _read_below(after, e)]


def test_two_feeds_on_one_file_store_each_event_once(coord: Coordinator, tmp_path: Path
                                                     ) -> None:
    """The console and ``txstream history --index`` may feed one file at the same time."""
    tag = uuid.uuid4().hex[:8]  # its own traffic, whichever tests ran before it here
    produce(coord.kafka, [half_record(coord.topics, f"two-{tag}", f"two-{tag}", f"two-{tag}-r"),
                          end_record(coord.topics, f"two-{tag}", f"two-{tag}",
                                     Decision.COMMIT_MESSAGE)])
    wait_for(coord.kafka, f"two-{tag}-r", 1, timeout_s=60)
    wait_until(lambda: read_topic(coord.kafka, coord.topics.history), timeout_s=60)
    path = tmp_path / "shared.sqlite"
    stats: list[FeedStats] = []
    with Index(path) as one, Index(path) as two, \
            IndexFeed(one, coord.kafka, coord.topics) as first, \
            IndexFeed(two, coord.kafka, coord.topics) as second:
        threads = [threading.Thread(target=lambda f=f: stats.append(f.catch_up()))
                   for f in (first, second)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
        assert len(stats) == 2
        after = one.offsets()
        shared = _timeline(one)
        # Each event was stored by one of them, once.
        assert sum(s.entries for s in stats) == len(shared) > 0
    with Index(MEMORY) as fresh, IndexFeed(fresh, coord.kafka, coord.topics) as whole:
        whole.catch_up()
        assert shared == [e for e in _timeline(fresh) if _read_below(after, e)]


def test_discards_and_dead_letters_come_with_their_reasons(
    coord: Coordinator, feed: IndexFeed, unique: str
) -> None:
    txid, group = f"{unique}-old", f"{unique}-g"
    discard_by_answers(coord.kafka, coord.topics, txid, group, f"{unique}-real")
    index = feed.index
    row = feed_until(feed, lambda: (r := index.transaction(txid)) and r.outcome and r)
    produce(coord.kafka, [end_record(coord.topics, txid, "intruder", Decision.COMMIT_MESSAGE)])
    feed_until(feed, lambda: {"dead_letter", "rejected"} <= {e.kind for e in index.events(txid)})
    row = index.transaction(txid)
    assert row is not None and (row.status, row.outcome) == (Status.DISCARDED, "discarded")
    assert row.reason is not None
    assert row.reason.startswith("still unknown after 2 answered checks")
    kinds = [e.kind for e in index.events(txid)]
    assert {"discarded", "discard_record", "rejected", "dead_letter"} <= set(kinds)

    refused, total = index.refused()
    mine = [e for e in refused if e.transaction_id == txid]
    assert total >= 2 and {e.source for e in mine} == {Source.DISCARD, Source.DEAD_LETTER}
    [discard] = [e for e in mine if e.source == Source.DISCARD]
    assert discard.detail["headers"][H.DISCARD_REASON] == row.reason
    [dead] = [e for e in mine if e.source == Source.DEAD_LETTER]
    assert dead.detail["headers"][H.DLQ_CODE] == "WRONG_GROUP"
    assert "does not own transaction" in dead.detail["headers"][H.DLQ_REASON]


def test_a_refused_half_message_is_marked_with_the_reason(
    coord: Coordinator, feed: IndexFeed, unique: str
) -> None:
    txid = f"{unique}-nogroup"
    record = half_record(coord.topics, txid, "g", f"{unique}-real")
    headers = tuple(h for h in record.headers if h[0] != H.PGROUP)
    produce(coord.kafka, [Record(record.topic, record.key, record.value, headers)])
    row = feed_until(feed, lambda: (r := feed.index.transaction(txid))
                     and r.status == IndexStatus.REFUSED and r)
    assert row.reason is not None and H.PGROUP in row.reason
    assert row.real_topic == f"{unique}-real"


def test_search_by_message_id_and_business_keys(
    coord: Coordinator, feed: IndexFeed, unique: str
) -> None:
    txid, msg_id = f"{unique}-tx", f"{unique}-msg"
    msg = Message(f"{unique}-real", b"keyed", keys=f"{unique}-order {unique}-customer",
                  transaction_id=txid, msg_id=msg_id, producer_group=f"{unique}-g",
                  born_timestamp=now_ms())
    produce(coord.kafka, [encode_half(msg, coord.topics)])
    index = feed.index
    feed_until(feed, lambda: (r := index.transaction(txid)) and r.status == Status.PENDING)
    for text in (txid, msg_id, f"{unique}-order", f"{unique}-customer"):
        assert [r.transaction_id for r in index.search(text)] == [txid], text
    assert index.search(f"{unique}-nothing") == []
    # A piece of a key finds it too, when nothing matches exactly.
    assert [r.transaction_id for r in index.search(f"{unique}-cust")] == [txid]


def test_a_bad_history_record_is_logged_and_skipped(
    coord: Coordinator, feed: IndexFeed, capsys: pytest.CaptureFixture[str], unique: str,
    caplog: pytest.LogCaptureFixture
) -> None:
    produce(coord.kafka, [Record(coord.topics.history, b"1", b"{not json", ()),
                          Record(coord.topics.history, b"1", b'[{"event": "half"}]', ())])
    skipped = 0

    def both_skipped() -> bool:
        nonlocal skipped
        skipped += feed.catch_up().skipped
        return skipped >= 2

    with caplog.at_level(logging.WARNING, logger="txstream.console.feed"):
        wait_until(both_skipped, timeout_s=30)
    assert skipped == 2
    lines = [r.getMessage() for r in caplog.records if "skipped" in r.getMessage()]
    assert any("history record is not JSON" in line for line in lines), lines
    assert any("without a transaction id" in line for line in lines), lines
    # The feed goes on past them.
    txid = produce_unknown(coord, capsys, f"{unique}-g", f"{unique}-real", "after the bad")
    feed_until(feed, lambda: feed.index.transaction(txid))


def test_history_reads_a_shared_index_file(
    coord: Coordinator, capsys: pytest.CaptureFixture[str], unique: str, tmp_path: Path
) -> None:
    txid = produce_unknown(coord, capsys, f"{unique}-g", f"{unique}-real", "shared")
    wait_until(lambda: _in_history(coord, txid), timeout_s=60)
    path = str(tmp_path / "shared.sqlite")
    outputs = []
    for extra in ([], ["--index", path], ["--index", path]):  # in memory, new file, kept file
        rc = main(["history", txid, *coord.args, *extra])
        outputs.append(capsys.readouterr().out)
        assert rc == 0
    lines = outputs[0].splitlines()
    assert lines[0] == f"transaction {txid}" and "half message registered" in lines[1]
    # The file answers what the scan answered (a check may have come since: its line added).
    assert all(o.splitlines()[:len(lines)] == lines for o in outputs[1:]), outputs

    other = Topics.with_prefix(f"o{uuid.uuid4().hex[:6]}_")
    rc = main(["history", txid, "--bootstrap-servers", coord.kafka.bootstrap_servers,
               "--topic-prefix", other.prefix, "--index", path])
    assert rc == 2 and "give each coordinator (topic prefix) an index of its own" in (
        capsys.readouterr().err)


# --- helpers -------------------------------------------------------------------------------


def _in_history(coord: Coordinator, txid: str) -> bool:
    with Index(MEMORY) as index, IndexFeed(index, coord.kafka, coord.topics,
                                           read_half=False) as feed:
        feed.catch_up()
        return bool(index.events(txid, (Source.HISTORY,)))


def _timeline(index: Index) -> list[tuple[Any, ...]]:
    """Every event the index holds, in a comparable form, in the order of the topics (the
    notes of one history record in their order)."""
    rows = [tuple(r) for r in index._all("SELECT transaction_id, at_ms, kind, source, detail, "
                                         "origin FROM events ORDER BY seq")]
    return sorted(rows, key=lambda e: (*_at(e), _offset_of(e)))


def _at(event: tuple[Any, ...]) -> tuple[str, int]:
    topic, _, rest = event[5].rpartition("[")
    return topic, int(rest.split("]")[0])


def _offset_of(event: tuple[Any, ...]) -> int:
    return int(event[5].rsplit("@", 1)[1])


def _read_below(offsets: dict[tuple[str, int], int], event: tuple[Any, ...]) -> bool:
    """Whether an index that stopped at ``offsets`` had read ``event``: a partition it has no
    offset for had nothing yet when it read (the running query may write there since)."""
    return _offset_of(event) < offsets.get(_at(event), 0)
