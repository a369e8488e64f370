"""Bad input and crashed producers, against a real coordinator (local Spark, tansu).

* Bad input of every kind goes to the dead-letter topic with its reason, the coordinator's
  counters (the keys' tallies, folded by ``MetricsBoard``) count it, the query keeps running, and
  the transactions it touched are exactly as they were.
* A producer killed (SIGKILL) between its half message and its end event: with nobody of its
  group online the transaction waits, checked but not counted, and ``txstream pending`` shows
  it; another producer of the group resolves it through a back-check; an operator resolves
  another with ``txstream resolve``, which the history records with who and when.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.support.kafka_helpers import (
    end_record,
    half_record,
    headers_of,
    history_of,
    now_ms,
    produce,
    read_topic,
    wait_for,
    wait_until,
)
from txstream.client import TransactionListener, TransactionProducer
from txstream.kafka import KafkaSettings
from txstream.message import MAX_BODY_BYTES, Decision, Message
from txstream.state.policy import Policy
from txstream.streaming.cli import main
from txstream.streaming.engine.config import RunConfig
from txstream.streaming.engine.coordinator import Coordinator
from txstream.topics import Topics
from txstream.wire import H, Record

pytestmark = pytest.mark.spark

COMMIT, ROLLBACK, UNKNOW = Decision.COMMIT_MESSAGE, Decision.ROLLBACK_MESSAGE, Decision.UNKNOW
POLICY = Policy(transaction_timeout=1000, check_interval=1500, check_max=2,
                orphan_end_timeout=3000)


@dataclass
class Running:
    kafka: KafkaSettings
    topics: Topics
    prefix: str
    checkpoint: Path
    coordinator: Coordinator

    @property
    def stats(self) -> dict[str, int]:
        """The coordinator's counters by metric (labels summed)."""
        return self.coordinator.listener.board.totals()

    @property
    def args(self) -> list[str]:
        return ["--bootstrap-servers", self.kafka.bootstrap_servers, "--topic-prefix",
                self.prefix]


@pytest.fixture(scope="module")
def coord(spark: Any, kafka: KafkaSettings, tmp_path_factory: pytest.TempPathFactory):
    prefix = f"f{uuid.uuid4().hex[:8]}_"
    topics = Topics.with_prefix(prefix)
    checkpoint = tmp_path_factory.mktemp("faults-cp")
    config = RunConfig(kafka=kafka, topics=topics, policy=POLICY, checkpoint_dir=checkpoint,
                       buckets=8, query_name=f"faults-{uuid.uuid4().hex[:6]}")
    coordinator = Coordinator(config).start()
    txid, real = f"warmup-{uuid.uuid4().hex[:6]}", f"{prefix}warmup"
    produce(kafka, [half_record(topics, txid, "warmup", real),
                    end_record(topics, txid, "warmup", COMMIT)])
    wait_for(kafka, real, 1, timeout_s=180)
    yield Running(kafka, topics, prefix, checkpoint, coordinator)
    coordinator.stop()


def _cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    rc = main(list(argv))
    out = capsys.readouterr()
    return rc, out.out, out.err


def _pending(coord: Running, capsys: pytest.CaptureFixture[str]) -> dict[str, dict[str, Any]]:
    rc, out, err = _cli(capsys, "pending", "--checkpoint-dir", str(coord.checkpoint), "--json")
    assert rc == 0, err
    return {r["transaction_id"]: r for r in map(json.loads, out.splitlines())}


def _dead_letters(coord: Running, unique: str) -> list[tuple[str, Any]]:
    """This test's dead letters with their reasons (their keys or values carry ``unique``)."""
    return [
        (headers_of(r)[H.DLQ_REASON], r)
        for r in read_topic(coord.kafka, coord.topics.dead_letter, timeout_s=5)
        if unique.encode() in (r.key or b"") or (r.value or b"").startswith(unique.encode())
    ]


def test_bad_input_is_dead_lettered_counted_and_changes_nothing(
    coord: Running, capsys: pytest.CaptureFixture[str], unique: str
) -> None:
    k, t = coord.kafka, coord.topics
    group, real = f"{unique}-g", f"{unique}-real"
    kept, dropped, never = f"{unique}-kept", f"{unique}-dropped", f"{unique}-never"
    produce(k, [half_record(t, kept, group, real, b"kept"),
                half_record(t, dropped, group, real, b"dropped"),
                end_record(t, dropped, group, ROLLBACK)])
    wait_until(lambda: history_of(k, t, kept) and any(
        n["event"] == "rolled_back" for n in history_of(k, t, dropped)), timeout_s=60)
    before = coord.stats
    big = unique.encode() + b"x" * MAX_BODY_BYTES  # one byte per character of unique too many
    bad = [
        half_record(t, "x", group, real, unique.encode() + b" no key")._replace(key=None),
        Record(t.end, f"{unique}-utf8".encode(), None,
               (("COMMIT_OR_ROLLBACK", b"\xff\xfe"), ("PGROUP", b"g"))),
        Record(t.end, f"{unique}-type".encode(), None,
               (("COMMIT_OR_ROLLBACK", b"MAYBE"), ("PGROUP", group.encode()))),
        half_record(t, f"{unique}-notx", group, real)._replace(
            headers=(("REAL_TOPIC", real.encode()), ("PGROUP", group.encode()))),
        half_record(t, f"{unique}-big", group, real, big),
        end_record(t, kept, "intruder", COMMIT),
        end_record(t, kept, "intruder", COMMIT, from_check=True, check_times=1),
        end_record(t, dropped, group, COMMIT),
        end_record(t, never, group, COMMIT, from_check=True, check_times=1),
    ]
    produce(k, bad)
    reasons = wait_until(lambda: (d := _dead_letters(coord, unique)) and len(d) >= len(bad) and d,
                         timeout_s=90)
    text = "\n".join(why for why, _ in reasons)
    assert "missing transaction id" in text
    assert "header 'COMMIT_OR_ROLLBACK' is not UTF-8 text" in text
    assert "unknown event type 'MAYBE'" in text
    assert "unknown event type on the half topic" in text
    assert f"exceeds the limit of {MAX_BODY_BYTES}" in text
    assert sum("'intruder' does not own" in why for why, _ in reasons) == 2
    assert f"COMMIT_MESSAGE for transaction {dropped} which is already ROLLED_BACK" in text
    assert f"no half message for transaction {never} within 3s" in text
    [oversized] = [r for why, r in reasons if "exceeds the limit" in why]
    # Too big to carry under the limit the coordinator writes under (Kafka's 1 MB): a
    # reference, to be read back at its origin.
    assert not oversized.value and int(headers_of(oversized)[H.DLQ_ORIGINAL_BYTES]) > len(big)
    assert headers_of(oversized)[H.DLQ_CODE] == "BODY_TOO_LARGE"
    # The others byte for byte, a third party's headers and empty values included.
    [utf8] = [r for why, r in reasons if "is not UTF-8 text" in why]
    assert utf8.headers[:2] == [("COMMIT_OR_ROLLBACK", b"\xff\xfe"), ("PGROUP", b"g")]

    def counted() -> dict[str, int] | None:
        now = coord.stats
        delta = {n: now.get(n, 0) - before.get(n, 0)
                 for n in ("dead_letters", "rejected", "expired")}
        return delta if delta["dead_letters"] >= len(bad) else None

    delta = wait_until(counted, timeout_s=30)
    time.sleep(2)  # nothing more may come
    assert counted() == delta == {"dead_letters": len(bad), "rejected": 3, "expired": 1}
    assert coord.coordinator.query.isActive and coord.coordinator.failure() is None

    # Nothing changed: the pending one is still pending, owned by its group, and its own
    # commit releases it once; the rolled-back one never shows.
    row = _pending(coord, capsys)[kept]
    assert (row["status"], row["producer_group"]) == ("PENDING", group)
    produce(k, [end_record(t, kept, group, COMMIT)])
    [visible] = wait_for(k, real, 1)
    time.sleep(2)
    assert visible.value == b"kept" and len(read_topic(k, real)) == 1


_CRASHING_PRODUCER = """
import os, signal, sys
from txstream.client import LocalTransactionState, Message, TransactionListener, TransactionProducer

class DiesMidTransaction(TransactionListener):
    def execute_local_transaction(self, msg, arg):
        print(msg.transaction_id, flush=True)
        os.kill(os.getpid(), signal.SIGKILL)  # after the half message, before the end event

    def check_local_transaction(self, msg):
        return LocalTransactionState.UNKNOW

servers, prefix, group, topic, body = sys.argv[1:]
producer = TransactionProducer(group, servers, DiesMidTransaction(), topic_prefix=prefix,
                               answer_checks=False).start()
producer.send_message_in_transaction(Message(topic, body.encode()))
"""


def _crash_a_producer(coord: Running, group: str, real: str, body: str) -> str:
    proc = subprocess.run(
        [sys.executable, "-c", _CRASHING_PRODUCER, coord.kafka.bootstrap_servers, coord.prefix,
         group, real, body], capture_output=True, text=True, timeout=120)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    return proc.stdout.split()[0]


class CommittedLocally(TransactionListener):
    """Another producer of the group: its durable local state says both committed."""

    def __init__(self) -> None:
        self.checked: set[str] = set()

    def execute_local_transaction(self, msg: Message, arg: object) -> Decision:
        return COMMIT

    def check_local_transaction(self, msg: Message) -> Decision:
        self.checked.add(msg.transaction_id or "")
        return COMMIT


def test_crashed_producer_waits_until_its_group_or_an_operator_resolves_it(
    coord: Running, capsys: pytest.CaptureFixture[str], unique: str
) -> None:
    k, t = coord.kafka, coord.topics
    group, real = f"{unique}-g", f"{unique}-real"
    by_check = _crash_a_producer(coord, group, real, "resolved by a check")
    by_hand = _crash_a_producer(coord, group, real, "resolved by hand")

    # Nobody of the group is online: checks go out, none is answered, nothing is discarded
    # although check_max (2) checks were sent long ago.
    def waiting() -> dict[str, Any] | None:
        rows = _pending(coord, capsys)
        ok = all(tx in rows and rows[tx]["checks_sent"] > POLICY.check_max
                 for tx in (by_check, by_hand))
        return rows if ok else None

    rows = wait_until(waiting, timeout_s=90)
    for tx in (by_check, by_hand):
        assert (rows[tx]["status"], rows[tx]["checks_answered"]) == ("PENDING", 0)
        assert rows[tx]["producer_group"] == group and rows[tx]["topic"] == real
    assert not [r for r in read_topic(k, t.discard) if r.key in (by_check.encode(),
                                                                 by_hand.encode())]
    rc, out, _ = _cli(capsys, "pending", "--checkpoint-dir", str(coord.checkpoint))
    assert rc == 0 and any(line.startswith(by_check) for line in out.splitlines())

    # An operator resolves one by hand: the history says who and when.
    asked = now_ms()
    rc, out, err = _cli(capsys, "resolve", by_hand, "--commit", *coord.args, "--operator",
                        "dave", "--reason", "producer host lost", "--wait", "60")
    assert rc == 0, err
    note = next(n for n in history_of(k, t, by_hand) if n["event"] == "released")
    assert (note["operator"], note["remark"]) == ("dave", "producer host lost")
    assert asked <= note["at"] <= now_ms()

    # Another producer of the group comes up and answers the checks of the other (and the old
    # requests for the one resolved by hand: a harmless duplicate commit by now).
    listener = CommittedLocally()
    with TransactionProducer(group, kafka=k, topics=t, listener=listener):
        wait_until(lambda: len(read_topic(k, real)) >= 2, timeout_s=90)
        time.sleep(2)  # a second release of either would show now
    visible = [(headers_of(r)["UNIQ_KEY"], r.value) for r in read_topic(k, real)]
    assert sorted(visible) == sorted([(by_check, b"resolved by a check"),
                                      (by_hand, b"resolved by hand")])
    released = next(n for n in history_of(k, t, by_check) if n["event"] == "released")
    assert released["from_check"] is True and "operator" not in released
    assert by_check in listener.checked
    wait_until(lambda: not {by_check, by_hand} & set(_pending(coord, capsys)), timeout_s=30)
