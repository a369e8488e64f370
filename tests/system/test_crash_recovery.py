"""The coordinator is killed (SIGKILL, whole process tree) and restarted, again and again.

A producer of the group sends transactions at a steady rate the whole time, with a mix of
outcomes: commit, rollback, and unknown-then-check (the local transaction answers UNKNOW, a
back-check later gets the final answer from the producer). The coordinator runs as its own
process (``python -m txstream.streaming.cli run``) and is killed three times at different moments:

* ``random``: whenever the dice say, maybe between batches;
* ``mid-batch``: while a batch is planned (``offsets/N``) but not committed (``commits/N``);
* ``after-write``: mid-batch, once the sink has written some of that batch's records, the
  moment that used to release a message twice after the restart.

Each time it restarts from the same checkpoint. In the end every committed message is on its
real topic, no rolled-back one is, every unknown one was checked and resolved, a consumer sees
each message exactly once, and the topic itself holds each exactly once (the sink's replay
check, ``txstream/readback/replay.py``). The figures are printed (``pytest -m crash -s``).
"""

from __future__ import annotations

import random
import re
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from kafka import TopicPartition

from tests.support.kafka_helpers import headers_of, read_topic, wait_until
from tests.support.process_helpers import CoordinatorProcess, batch_ids, in_flight_batch
from txstream.client import (
    ConsumeFromWhere,
    ConsumeStatus,
    PushConsumer,
    TransactionListener,
    TransactionProducer,
)
from txstream.kafka import KafkaSettings, make_consumer
from txstream.message import Decision, Message
from txstream.outputs import decode_history
from txstream.topics import Topics

pytestmark = pytest.mark.crash

COMMIT, ROLLBACK, UNKNOW = Decision.COMMIT_MESSAGE, Decision.ROLLBACK_MESSAGE, Decision.UNKNOW
RATE = 8  # transactions per second, steady, for the whole test
KILLS = ("random", "mid-batch", "after-write")
SEED = 5


class PlannedListener(TransactionListener):
    """The local transaction ends as planned; its final outcome is kept for the checks.

    ``arg`` is (first answer, final outcome): UNKNOW first means "ask me later".
    """

    def __init__(self) -> None:
        self.final: dict[str, Decision] = {}
        self.checked: Counter[str] = Counter()
        self.lock = threading.Lock()

    def execute_local_transaction(self, msg: Message, arg: object) -> Decision:
        first, final = arg  # type: ignore[misc]
        with self.lock:
            self.final[msg.transaction_id or ""] = final
        return first

    def check_local_transaction(self, msg: Message) -> Decision:
        txid = msg.transaction_id or ""
        with self.lock:
            self.checked[txid] += 1
            return self.final.get(txid, UNKNOW)


@dataclass
class SteadyLoad:
    """Sends transactions at RATE per second on a thread until stopped."""

    producer: TransactionProducer
    real_topic: str
    rng: random.Random
    sent: dict[str, tuple[Decision, Decision]] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def plan(self) -> tuple[Decision, Decision]:
        roll = self.rng.random()
        if roll < 0.55:
            return COMMIT, COMMIT
        if roll < 0.80:
            return ROLLBACK, ROLLBACK
        return UNKNOW, COMMIT if roll < 0.90 else ROLLBACK

    def run(self) -> None:
        started, i = time.monotonic(), 0
        while not self.stop.is_set():
            first, final = self.plan()
            keys = f"k{i % 7}" if i % 3 == 0 else None  # keyed and keyless releases
            try:
                result = self.producer.send_message_in_transaction(
                    Message(self.real_topic, f"body-{i}".encode(), keys=keys), (first, final))
                self.sent[result.transaction_id] = (first, final)
            except Exception as exc:  # the test fails on it: nothing may be refused here
                self.errors.append(f"{type(exc).__name__}: {exc}")
            i += 1
            time.sleep(max(0.0, started + i / RATE - time.monotonic()))


class Watermark:
    """The summed high watermark of some topics, fresh from the broker at each call."""

    def __init__(self, kafka: KafkaSettings, topics: list[str]) -> None:
        self.consumer = make_consumer(kafka, fetch_max_wait_ms=1, max_partition_fetch_bytes=1)
        self.tps = [TopicPartition(t, p) for t in topics
                    for p in sorted(self.consumer.partitions_for_topic(t) or ())]
        self.ends = dict.fromkeys(self.tps, 0)

    def total(self) -> int:
        # Re-assigning forgets the remembered watermarks: what comes back is this fetch's.
        self.consumer.assign([])
        self.consumer.assign(self.tps)
        for tp in self.tps:
            self.consumer.seek(tp, self.ends[tp])
        fresh: dict[TopicPartition, int] = {}
        deadline = time.monotonic() + 10
        while len(fresh) < len(self.tps) and time.monotonic() < deadline:
            self.consumer.poll(timeout_ms=5, max_records=1)
            for tp in self.tps:
                hw = self.consumer.highwater(tp)
                if hw is not None:
                    fresh[tp] = hw
        self.ends.update(fresh)
        return sum(self.ends.values())

    def close(self) -> None:
        self.consumer.close()


def _last_commit(cp: Path) -> int:
    return max(batch_ids(cp, "commits"), default=-1)


def _kill(mode: str, coord: CoordinatorProcess, cp: Path, watermark: Watermark | None,
          rng: random.Random) -> dict[str, Any]:
    """Kill ``coord`` at the moment ``mode`` asks for, once this run committed a batch."""
    before = _last_commit(cp)
    wait_until(lambda: _last_commit(cp) > before or not coord.running, timeout_s=240,
               interval_s=0.1)
    assert coord.running, coord.output()[-3000:]
    time.sleep(rng.uniform(1.0, 4.0))
    deadline = time.monotonic() + 60
    batch = in_flight_batch(cp)
    if mode != "random":
        while time.monotonic() < deadline:
            batch = in_flight_batch(cp)
            if batch is None:
                time.sleep(0.005)
                continue
            if mode == "mid-batch":
                break
            assert watermark is not None
            start = watermark.total()
            while batch not in batch_ids(cp, "commits") and watermark.total() == start:
                pass
            time.sleep(rng.uniform(0.0, 0.05))  # let the sink write a little more of it
            if batch not in batch_ids(cp, "commits"):
                break  # the sink wrote part of this batch, which is not committed
    processes = coord.kill()
    mid = batch is not None and batch not in batch_ids(cp, "commits")
    return {"mode": mode, "batch": batch, "mid_batch": mid, "processes": processes}


def _visible(kafka: KafkaSettings, topic: str) -> list[str]:
    return [headers_of(r)["UNIQ_KEY"] for r in read_topic(kafka, topic, timeout_s=5)]


def _resolved(kafka: KafkaSettings, topics: Topics) -> set[str]:
    return {
        str(note["transaction_id"])
        for r in read_topic(kafka, topics.history, timeout_s=10)
        for note in decode_history(r.value, r.key)
        if note["event"] in ("released", "rolled_back")
    }


def _consume_once(kafka: KafkaSettings, topic: str, expect: int) -> tuple[Counter[str], int]:
    """What a consumer of the real topic is handed, after its dedup by UNIQ_KEY."""
    seen: Counter[str] = Counter()

    def listener(msgs: Any) -> ConsumeStatus:
        for m in msgs:
            seen[m.msg_id] += 1
        return ConsumeStatus.CONSUME_SUCCESS

    consumer = PushConsumer(f"crash-{uuid.uuid4().hex[:8]}", kafka=kafka,
                            consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET)
    consumer.subscribe(topic)
    consumer.register_message_listener(listener)
    consumer.start()
    try:
        wait_until(lambda: len(seen) >= expect, timeout_s=90)
        time.sleep(2)  # a duplicate handed over late would show now
        return seen, int(consumer.stats["duplicates"])
    finally:
        consumer.shutdown()


def _awaited(left: Callable[[], set[str]], quiet_s: float, limit_s: float) -> set[str]:
    """``left()`` until it is empty, it stopped shrinking for ``quiet_s``, or ``limit_s``
    passed: what is left then."""
    start = time.monotonic()
    remaining = left()
    shrunk_at = start
    while remaining and time.monotonic() - shrunk_at < quiet_s and (
            time.monotonic() - start < limit_s):
        time.sleep(2)
        now = left()
        if len(now) < len(remaining):
            shrunk_at = time.monotonic()
        remaining = now
    return remaining


@pytest.mark.timeout(1500)  # four coordinator starts under traffic, minutes each under load
def test_coordinator_killed_three_times_loses_nothing_and_releases_once(
    kafka: KafkaSettings, checkpoint_dir: Path, tmp_path: Path, unique: str
) -> None:
    rng = random.Random(SEED)
    real, group, prefix = f"{unique}-orders", f"{unique}-pg", f"{unique}_"
    topics = Topics.with_prefix(prefix)
    args = ["--bootstrap-servers", kafka.bootstrap_servers, "--checkpoint-dir",
            str(checkpoint_dir), "--topic-prefix", prefix,
            "--transaction-timeout", "3s", "--check-interval", "3s", "--buckets", "8",
            "--trigger", "250ms", "--max-offsets-per-trigger", "500", "--broker-timeout", "30"]
    listener = PlannedListener()
    producer = TransactionProducer(group, kafka=kafka, topics=topics, listener=listener).start()
    load = SteadyLoad(producer, real, rng)
    sender = threading.Thread(target=load.run, name="steady-load", daemon=True)
    sender.start()
    kills: list[dict[str, Any]] = []
    watermark: Watermark | None = None
    coord: CoordinatorProcess | None = None
    started = time.monotonic()
    try:
        for cycle, mode in enumerate(KILLS):
            coord = CoordinatorProcess(args, tmp_path / f"run{cycle}.log").start()
            if mode == "after-write" and watermark is None:
                watermark = Watermark(kafka, [topics.history, real])
            kills.append(_kill(mode, coord, checkpoint_dir, watermark, rng))
        coord = CoordinatorProcess(args, tmp_path / "final.log").start()
        wait_until(lambda: _last_commit(checkpoint_dir) >= 0 and len(load.sent) > 0,
                   timeout_s=120)
        time.sleep(3)  # the load goes on a little while the last run catches up
        load.stop.set()
        sender.join(timeout=30)
        assert not load.errors, load.errors[:5]
        commits = {t for t, (_, final) in load.sent.items() if final is COMMIT}
        rollbacks = set(load.sent) - commits
        # The last run catches up with everything sent across the kills: minutes on a loaded
        # CI machine. Waited for, from its start, while it makes progress; what never shows
        # is named.
        wait_until(lambda: "coordinator running" in coord.output(), timeout_s=300)
        missing = _awaited(lambda: commits - set(_visible(kafka, real)), quiet_s=180,
                           limit_s=600)
        assert not missing, (f"{len(missing)} of {len(commits)} commits never released: "
                             f"{sorted(missing)[:10]}\n{coord.output()[-3000:]}")
        wait_until(lambda: set(load.sent) <= _resolved(kafka, topics), timeout_s=120,
                   interval_s=2)
        time.sleep(3)  # a late duplicate from the last run would be written by now
        raw = _visible(kafka, real)
        assert coord.running, coord.output()[-3000:]
    finally:
        load.stop.set()
        if coord is not None:
            coord.terminate()
        producer.shutdown()
        if watermark is not None:
            watermark.close()

    distinct = set(raw)
    unknowns = {t for t, (first, _) in load.sent.items() if first is UNKNOW}
    checked = {r.key.decode() for r in read_topic(kafka, topics.check(group), timeout_s=5)}
    delivered, dropped = _consume_once(kafka, real, len(distinct))
    # What the sink's replay check left out, as its commit logs it.
    not_rewritten = sum(
        int(n) for log in tmp_path.glob("*.log")
        for n in re.findall(r"was a replay: (\d+) records", log.read_text(errors="replace")))
    figures = {
        "kill_cycles": len(kills),
        "kills": [(k["mode"], k["batch"], k["mid_batch"]) for k in kills],
        "transactions": len(load.sent),
        "commits": len(commits),
        "rollbacks": len(rollbacks),
        "unknown_then_checked": len(unknowns),
        "lost": len(commits - distinct),
        "visible_rollbacks": len(distinct & rollbacks),
        "raw_visible_records": len(raw),
        "raw_duplicates": len(raw) - len(distinct),
        "records_not_rewritten_on_replay": not_rewritten,
        "consumer_dropped_duplicates": dropped,
        "duplicates_after_dedup": sum(n - 1 for n in delivered.values()),
        "seconds": round(time.monotonic() - started),
    }
    print(f"\ncrash recovery figures: {figures}")
    assert figures["lost"] == 0
    assert figures["visible_rollbacks"] == 0
    assert distinct == commits
    assert any(k["mid_batch"] for k in kills), kills
    assert unknowns <= checked, "every unknown transaction was back-checked"
    assert {t for t in unknowns if listener.checked[t]} == unknowns
    assert set(delivered) == commits and figures["duplicates_after_dedup"] == 0
    assert figures["raw_duplicates"] == 0, "a restart released a message twice"
