"""``txstream history TXID`` from the console's index, on the history of 100,000 transactions.

``python -m bench.history_index [--transactions N]`` starts the embedded broker, writes what a
coordinator would have written for N transactions (their half messages; history records of
many notes, one per state key and micro-batch; a discard record for 1 % of them, a dead
letter for 0.5 %), then measures:

- the catch-up: an empty index file read up to the topics' ends;
- ``txstream history TXID --index FILE`` on transactions picked at random, in this process
  (the command as ``main`` runs it: a catch-up that finds nothing new, then the query) and as
  a new process (Python's start included);
- the same command without ``--index``, which reads the topics from their beginning (what
  ``history`` did before the index).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from bench.workload import BulkProducer
from txstream.broker import EmbeddedBroker
from txstream.console import Index, IndexFeed
from txstream.kafka import KafkaSettings
from txstream.message import Message
from txstream.outputs import Note, encode_discard, encode_history
from txstream.refusals import Code
from txstream.state.effects import NoteKind
from txstream.streaming.cli import main as txstream
from txstream.topics import Topics
from txstream.wire import H, Record, encode_half, utf8

__all__ = ["main", "write_history"]

TX_PER_BATCH = 1000  # transactions per simulated micro-batch
STATE_KEYS = 8  # state keys a batch's transactions fall in (one history record each)


def _notes(txid: str, i: int, at: int) -> list[Note]:
    """A transaction's history: 70 % committed, 20 % rolled back after a check, 9 % still
    pending, 1 % discarded."""
    check = {"check": 1, "late_ms": 3, "next_check": at + 66_000}
    notes: list[Note] = [(txid, at, NoteKind.HALF,
                          {"group": "shop", "topic": "Orders", "first_check": at + 6000})]
    kind = i % 100
    if kind < 70:
        notes.append((txid, at, NoteKind.RELEASED,
                      {"decision": "COMMIT_MESSAGE", "from_check": False}))
    elif kind < 90:
        notes += [(txid, at + 6000, NoteKind.CHECK_SENT, check),
                  (txid, at + 6100, NoteKind.ROLLED_BACK,
                   {"decision": "ROLLBACK_MESSAGE", "from_check": True})]
    elif kind < 99:
        notes += [(txid, at, NoteKind.UNKNOWN,
                   {"decision": "UNKNOW", "from_check": False, "checks_answered": 0}),
                  (txid, at + 6000, NoteKind.CHECK_SENT, check)]
    else:
        notes.append((txid, at + 9000, NoteKind.DISCARDED,
                      {"reason": "still unknown after 15 answered checks (check_max=15)",
                       "checks_sent": 15}))
    return notes


def _records(topics: Topics, txids: list[str], start_ms: int) -> Iterator[Record]:
    for batch in range(0, len(txids), TX_PER_BATCH):
        at = start_ms + batch  # a batch a millisecond per transaction after the last
        by_key: dict[int, list[Note]] = {}
        for i in range(batch, min(batch + TX_PER_BATCH, len(txids))):
            msg = Message("Orders", b"order %d" % i, keys=f"order-{i}", tags="paid",
                          transaction_id=txids[i], msg_id=txids[i], producer_group="shop",
                          born_timestamp=at - 50)
            yield encode_half(msg, topics)
            by_key.setdefault(i % STATE_KEYS, []).extend(_notes(txids[i], i, at))
            if i % 100 == 99:
                yield encode_discard(msg, "still unknown after 15 answered checks "
                                          "(check_max=15)", 15, topics)
            if i % 200 == 7:
                yield Record(topics.dead_letter, utf8(txids[i]), None, (
                    (H.COMMIT_OR_ROLLBACK, b"ROLLBACK_MESSAGE"), (H.PGROUP, b"intruder"),
                    (H.DLQ_REASON, b"end event from group intruder, which does not own "
                                   b"transaction"), (H.DLQ_CODE, Code.WRONG_GROUP.encode())))
        for key, notes in by_key.items():
            for record, _ in encode_history(notes, str(key).encode(), topics):
                yield record


def write_history(settings: KafkaSettings, topics: Topics, count: int) -> list[str]:
    """Write ``count`` transactions' records; return their ids."""
    txids = [f"BENCH{i:027X}" for i in range(count)]
    producer = BulkProducer(settings)
    try:
        producer.send(_records(topics, txids, int(time.time() * 1000) - 3_600_000))
        producer.flush()
    finally:
        producer.close()
    return txids


def _history(argv: list[str]) -> tuple[float, str]:
    out = io.StringIO()
    started = time.perf_counter()
    with contextlib.redirect_stdout(out):
        rc = txstream(["history", *argv])
    took = time.perf_counter() - started
    if rc != 0:
        raise SystemExit(f"txstream history {' '.join(argv)} failed ({rc})")
    return took, out.getvalue()


def _process(argv: list[str]) -> float:
    started = time.perf_counter()
    subprocess.run([sys.executable, "-m", "txstream.streaming.cli", "history", *argv], check=True,
                   capture_output=True, timeout=300)
    return time.perf_counter() - started


def _measure(settings: KafkaSettings, topics: Topics, txids: list[str], path: Path,
             samples: int) -> None:
    kafka = ["--bootstrap-servers", settings.bootstrap_servers, "--topic-prefix",
             topics.prefix]
    started = time.perf_counter()
    with Index(path) as index, IndexFeed(index, settings, topics) as feed:
        stats = feed.catch_up()
        counts = index.counts()
    took = time.perf_counter() - started
    print(f"catch-up of an empty index: {stats.records:,} records, {counts['events']:,} "
          f"events, {sum(counts[s] for s in counts if s != 'events'):,} transactions in "
          f"{took:.1f} s ({stats.records / took:,.0f} records/s); file "
          f"{path.stat().st_size / 1e6:.0f} MB")
    picked = random.Random(7).sample(txids, samples)
    in_process = [_history([t, *kafka, "--index", str(path)])[0] for t in picked]
    processes = [_process([t, *kafka, "--index", str(path)]) for t in picked]
    print(f"txstream history TXID --index FILE, in-process: median "
          f"{statistics.median(in_process) * 1000:.0f} ms, max {max(in_process) * 1000:.0f} ms "
          f"({samples} transactions)")
    print(f"txstream history TXID --index FILE, new process: median "
          f"{statistics.median(processes) * 1000:.0f} ms, max {max(processes) * 1000:.0f} ms")
    with Index(path) as index:
        started = time.perf_counter()
        for txid in picked:
            index.events(txid)
        query = (time.perf_counter() - started) / samples
    print(f"  of which the query: {query * 1000:.2f} ms")
    scan, _ = _history([picked[0], *kafka])
    print(f"txstream history TXID without an index (reads the topics from the start): "
          f"{scan:.1f} s")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.history_index",
                                     description=__doc__.splitlines()[0] if __doc__ else "")
    parser.add_argument("--transactions", type=int, default=100_000)
    parser.add_argument("--samples", type=int, default=5, help="transactions asked about")
    args = parser.parse_args(argv)
    topics = Topics.with_prefix("bench_")
    with EmbeddedBroker() as broker, tempfile.TemporaryDirectory() as tmp:
        settings = KafkaSettings(bootstrap_servers=broker.bootstrap_servers)
        started = time.perf_counter()
        txids = write_history(settings, topics, args.transactions)
        print(f"wrote {args.transactions:,} transactions' half messages, history, discards "
              f"and dead letters in {time.perf_counter() - started:.1f} s")
        _measure(settings, topics, txids, Path(tmp) / "index.sqlite", args.samples)
    return 0


if __name__ == "__main__":
    sys.exit(main())
