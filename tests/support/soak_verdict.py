"""What each transaction of a soak run should have become, what it became, and the summary.

Should: the producers' ledgers (tests/support/soak_ledger.py): the decision each local transaction
recorded, whether its half message and end event were acknowledged, where a producer was
killed. Became: the coordinator's topics read to their end (half, end, history, discard, dead
letter), the real topics, and what the consumer delivered. The promise checked: a committed
message is on its real topic once and delivered once, a rolled-back one (or one whose local
transaction never ran) never, and every stored half message has ended (released, rolled back
or discarded, with its reason).
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from tests.support.soak_ledger import DECISION, HALF_FAILED, HUNG, SENT
from txstream.kafka import KafkaSettings, TopicReader, partition_ends
from txstream.outputs import decode_history
from txstream.topics import Topics
from txstream.wire import H, header_dict

__all__ = ["EndWatch", "Observed", "Verdict", "read_whole", "ENDINGS"]

ENDINGS = ("released", "rolled_back", "discarded")
COMMIT = "COMMIT_MESSAGE"
SHOWN = 15  # transactions shown per kind of failure


def read_whole(kafka: KafkaSettings, topic: str, attempts: int = 5) -> list[Any]:
    """Every record of ``topic``, checked to reach each partition's end (a fresh high
    watermark): a record missing from this read would be reported as lost."""
    for _ in range(attempts):
        ends = partition_ends(kafka, topic)
        with TopicReader(kafka, [topic], fetch_max_wait_ms=5, max_poll_records=10_000) as reader:
            records = reader.read_new(timeout_s=60)
            reached = reader.positions()  # past commit markers too, not only the last record
        if all(reached.get((topic, p), 0) >= end for p, end in ends.items()):
            return sorted(records, key=lambda r: (r.partition, r.offset))
    raise AssertionError(f"{topic} could not be read to its end in {attempts} attempts")


class EndWatch:
    """While the run ends: the stored half messages and the transactions that ended, read as
    the topics grow."""

    def __init__(self, kafka: KafkaSettings, topics: Topics) -> None:
        self.topics = topics
        self.reader = TopicReader(kafka, [topics.half, topics.history])
        self.halves: set[str] = set()
        self.ended: set[str] = set()

    def pending(self) -> set[str]:
        for r in self.reader.read_new(timeout_s=30):
            if r.topic == self.topics.half:
                self.halves.add(bytes(r.key or b"").decode("utf-8", "replace"))
            else:
                self.ended.update(str(n["transaction_id"]) for n in decode_history(r.value, r.key)
                                  if n["event"] in ENDINGS)
        return self.halves - self.ended

    def close(self) -> None:
        self.reader.close()


@dataclass
class Observed:
    """The topics of a run, read to their end."""

    halves: dict[str, list[Any]] = field(default_factory=lambda: defaultdict(list))
    history: dict[str, list[dict[str, Any]]] = field(default_factory=lambda: defaultdict(list))
    ends: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))
    discards: dict[str, str] = field(default_factory=dict)
    dead_letters: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))
    dead_letter_codes: Counter[str] = field(default_factory=Counter)
    dead_letter_list: list[tuple[str, str]] = field(default_factory=list)
    on_topic: Counter[str] = field(default_factory=Counter)
    bodies_on_topic: Counter[bytes] = field(default_factory=Counter)
    real_records: int = 0

    @classmethod
    def read(cls, kafka: KafkaSettings, topics: Topics, real_topics: list[str]) -> Observed:
        o = cls()
        for r in read_whole(kafka, topics.half):
            o.halves[_key(r)].append(r)
        for r in read_whole(kafka, topics.end):
            h = header_dict(r.headers)
            check = " (check)" if h.get(H.FROM_CHECK, "").lower() == "true" else ""
            o.ends[_key(r)].append(f"{h.get(H.COMMIT_OR_ROLLBACK)}{check}")
        for r in read_whole(kafka, topics.history):
            for note in decode_history(r.value, r.key):
                o.history[str(note["transaction_id"])].append(note)
        for r in read_whole(kafka, topics.discard):
            o.discards[_key(r)] = header_dict(r.headers).get(H.DISCARD_REASON, "")
        for r in read_whole(kafka, topics.dead_letter):
            h = header_dict(r.headers)
            o.dead_letter_codes[h.get(H.DLQ_CODE, "?")] += 1
            told = (f"{h.get(H.DLQ_CODE)}: {h.get(H.DLQ_REASON)} (origin "
                    f"{h.get(H.DLQ_ORIGIN_TOPIC)}/{h.get(H.DLQ_ORIGIN_PARTITION)}@"
                    f"{h.get(H.DLQ_ORIGIN_OFFSET)})")
            o.dead_letter_list.append((_key(r) or h.get(H.UNIQ_KEY, ""), told))
            # A release's dead letter is keyed by the message's KEYS: its ids are in headers.
            for txid in {_key(r), h.get(H.UNIQ_KEY), h.get(H.TRANSACTION_ID)} - {"", None}:
                o.dead_letters[str(txid)].append(told)
        for topic in real_topics:
            for r in read_whole(kafka, topic):
                o.real_records += 1
                o.on_topic[header_dict(r.headers).get(H.UNIQ_KEY, "?")] += 1
                o.bodies_on_topic[bytes(r.value or b"")] += 1
        return o

    def outcomes(self, txid: str) -> list[str]:
        return [str(n["event"]) for n in self.history.get(txid, ()) if n["event"] in ENDINGS]


def _key(record: Any) -> str:
    return bytes(record.key or b"").decode("utf-8", "replace")


@dataclass
class Tx:
    """One transaction: what its producer recorded, and what became of it."""

    txid: str
    decision: str | None = None  # the local transaction's, from the ledger
    first: str | None = None  # what the local transaction told the producer
    end_ack: bool | None = None  # None: send_message_in_transaction did not return
    hung: str | None = None  # the producer was killed in it: "before"/"after" the decision
    failed_send: bool = False  # its half message's send raised, and it was stored anyway
    body: bytes = b""

    def how_committed(self) -> str:
        if self.hung == "after":
            return "producer killed after recording COMMIT, no end event sent"
        if self.first != COMMIT:
            return "UNKNOW, then COMMIT answered by a check"
        if self.end_ack:
            return "COMMIT end event acknowledged"
        return "COMMIT end event not acknowledged"


class Verdict:
    """The run's transactions held against the promise; :attr:`failures` is empty when kept."""

    def __init__(self, ledger_entries: list[dict[str, Any]], observed: Observed,
                 delivered: Mapping[str, int], consumer_duplicates: int,
                 commits_metric: int | None = None) -> None:
        """``commits_metric``: the coordinator's commits counter at the end (None: not read)."""
        self.o, self.delivered, self.consumer_duplicates = observed, delivered, consumer_duplicates
        self.commits_metric = commits_metric
        self.txs: dict[str, Tx] = {}
        self.half_failed = 0
        failed_bodies: set[bytes] = set()
        for e in ledger_entries:
            if e["ev"] == HALF_FAILED:
                self.half_failed += 1
                failed_bodies.add(e["body"].encode())
                continue
            if "txid" not in e:
                continue
            tx = self.txs.setdefault(e["txid"], Tx(e["txid"]))
            if e["ev"] == DECISION:
                tx.decision, tx.first = e["decision"], e["first"]
            elif e["ev"] == SENT:
                tx.end_ack, tx.body = e["end_ack"], e["body"].encode()
            elif e["ev"] == HUNG:
                tx.hung = e["mode"]
        for txid, records in observed.halves.items():
            tx = self.txs.setdefault(txid, Tx(txid))
            tx.body = bytes(records[0].value or b"")
            tx.failed_send = tx.body in failed_bodies
        self.failures: dict[str, list[tuple[str, str]]] = defaultdict(list)
        self._judge()

    def _fail(self, kind: str, tx: Tx, detail: str) -> None:
        self.failures[kind].append((tx.txid, detail))

    def _judge(self) -> None:
        o = self.o
        for tx in self.txs.values():
            stored, on_topic = len(o.halves.get(tx.txid, ())), o.on_topic.get(tx.txid, 0)
            outcomes, got = o.outcomes(tx.txid), self.delivered.get(tx.txid, 0)
            if tx.end_ack is not None and not stored:
                self._fail("half_missing", tx, "half message acknowledged, not on the half topic")
            if len(set(outcomes)) > 1:
                self._fail("contradictory_outcomes", tx, f"history says {outcomes}")
            if stored and not outcomes:
                self._fail("pending", tx, f"decision {tx.decision}, ends {o.ends.get(tx.txid)}")
            if tx.decision == COMMIT and outcomes and on_topic == 0:  # pending: above
                half = o.halves[tx.txid][0]
                self._fail("lost", tx, f"{tx.how_committed()}; outcomes {outcomes}; half "
                           f"message still stored at {half.topic}/{half.partition}@"
                           f"{half.offset}; body on a real topic "
                           f"{o.bodies_on_topic[tx.body]} times")
            if tx.decision != COMMIT and on_topic:
                self._fail("visible_rollback", tx, f"decision {tx.decision}, hung {tx.hung}, "
                           f"on the real topic {on_topic} times")
            if on_topic > 1:
                self._fail("duplicated", tx, f"on the real topic {on_topic} times")
            if tx.decision == COMMIT and on_topic and outcomes and "released" not in outcomes:
                self._fail("history_disagrees", tx, f"on the real topic, history says "
                                                    f"{outcomes}")
            if on_topic and got != 1:
                self._fail("delivered_twice" if got else "not_delivered", tx,
                           f"the consumer delivered it {got} times")
        for uniq in o.on_topic.keys() - o.halves.keys():
            self._fail("phantom", Tx(uniq), "on a real topic, no half message has its id")
        if self.commits_metric is not None and self.commits_metric != len(o.on_topic):
            self._fail("metric_disagrees", Tx("commits"), f"the commits metric says "
                       f"{self.commits_metric}, the real topics hold {len(o.on_topic)} messages")

    def counts(self) -> dict[str, int]:
        stored = [t for t in self.txs.values() if t.txid in self.o.halves]
        outcome = Counter(self.o.outcomes(t.txid)[-1] for t in stored if self.o.outcomes(t.txid))
        return {
            "transactions": len(stored),
            "acknowledged": sum(t.end_ack is not None for t in self.txs.values()),
            "end_not_acknowledged": sum(t.end_ack is False for t in self.txs.values()),
            "half_send_failed": self.half_failed,
            "failed_send_but_stored": sum(t.failed_send for t in stored),
            "killed_in_local_tx": sum(t.hung is not None for t in self.txs.values()),
            "commit": sum(t.decision == COMMIT for t in stored),
            "commit_via_check": sum(t.decision == COMMIT and t.first != COMMIT for t in stored),
            "rollback_or_never_ran": sum(t.decision != COMMIT for t in stored),
            "released": outcome["released"], "rolled_back": outcome["rolled_back"],
            "discarded": outcome["discarded"],
            "real_records": self.o.real_records, "distinct_on_topic": len(self.o.on_topic),
            "delivered": sum(self.delivered.values()),
            "consumer_dropped_duplicates": self.consumer_duplicates,
        }

    def summary(self, header: str, faults: list[dict[str, Any]],
                unplanned: list[dict[str, Any]]) -> str:
        c = self.counts()
        kinds = Counter(f["kind"] for f in faults)
        detail = {
            "coordinator_kill": sum(bool(f.get("mid_batch")) for f in faults
                                    if f["kind"] == "coordinator_kill"),
            "producer_kill": sum(f.get("mode") == "after" for f in faults
                                 if f["kind"] == "producer_kill"),
            "broker_pause": round(sum(f.get("pause_s", 0) for f in faults), 1),
        }
        bad = {k: len(self.failures.get(k, ())) for k in
               ("lost", "duplicated", "visible_rollback", "pending", "half_missing",
                "not_delivered", "delivered_twice", "phantom", "history_disagrees")}
        return "\n".join([
            header,
            f"faults: coordinator_kill {kinds['coordinator_kill']} "
            f"({detail['coordinator_kill']} mid-batch), producer_kill "
            f"{kinds['producer_kill']} ({detail['producer_kill']} after the decision was "
            f"recorded), broker_pause {kinds['broker_pause']} ({detail['broker_pause']} s); "
            f"unplanned exits {len(unplanned)}",
            f"transactions {c['transactions']} (half stored): acknowledged {c['acknowledged']}, "
            f"end not acknowledged {c['end_not_acknowledged']}, half send failed "
            f"{c['half_send_failed']} (stored anyway {c['failed_send_but_stored']}), "
            f"killed in the local transaction {c['killed_in_local_tx']}",
            f"decisions: commit {c['commit']} ({c['commit_via_check']} via check), rollback or "
            f"never ran {c['rollback_or_never_ran']}",
            f"ended: released {c['released']}, rolled back {c['rolled_back']}, discarded "
            f"{c['discarded']}; dead letters {dict(self.o.dead_letter_codes) or 0}",
            f"real topics: {c['real_records']} records, {c['distinct_on_topic']} distinct; "
            f"consumer delivered {c['delivered']} (dropped {c['consumer_dropped_duplicates']} "
            "duplicates)",
            "lost {lost}, duplicated {duplicated}, visible rollbacks {visible_rollback}, "
            "still pending {pending}, half missing {half_missing}, not delivered "
            "{not_delivered}, delivered twice {delivered_twice}, phantom {phantom}, history "
            "disagrees {history_disagrees}".format(**bad),
            f"commits metric {self.commits_metric}, distinct on the real topics "
            f"{c['distinct_on_topic']}",
        ])

    def failure_report(self, replay: str) -> str:
        """Each failed transaction (the first few per kind with their story), and the command
        that replays the run."""
        lines = []
        for kind, items in sorted(self.failures.items()):
            lines.append(f"{kind}: {len(items)}")
            for txid, detail in items[:SHOWN]:
                lines.append(f"  {txid}: {detail}")
            for txid, _ in items[:3]:
                lines.append(f"  story of {txid}:")
                for note in self.o.history.get(txid, ()):
                    lines.append(f"    history {json.dumps(note, sort_keys=True)}")
                lines += [f"    end event {e}" for e in self.o.ends.get(txid, ())]
                lines += [f"    dead letter {d}" for d in self.o.dead_letters.get(txid, ())]
                if txid in self.o.discards:
                    lines.append(f"    discard: {self.o.discards[txid]}")
        if self.o.dead_letter_list:
            lines.append(f"dead letters: {len(self.o.dead_letter_list)}")
            lines += [f"  {key}: {told}" for key, told in self.o.dead_letter_list[:SHOWN]]
        lines.append(f"replay: {replay}")
        return "\n".join(lines)
