"""The world around the coordinator: producer applications of several groups, and a consumer.

A producer application (RocketMQ's ``TransactionProducer`` and its listener) sends a half
message, runs its local transaction, records the outcome durably (its "database", shared by
the group's producers) and sends the end event; its check listener answers **by transaction
id** from that record: an id it has no record of never ran its local transaction (a send it
was told failed, a producer that died first) and is rolled back. The records are the wire
format's (``txstream.wire``), written straight into the in-memory broker; which check requests
a group answers is the client's own rule (``txstream.client.check_choice``).

What the seed varies here: each transaction's outcome and timings, end events before their
half messages, duplicated records, producers that die between the half message and the end
event, a group away for a while, skewed producer clocks, sends whose acknowledgement is lost
(the half message stored all the same), and answers that race the next check.

``Ledger`` is the ground truth the oracle judges against.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

from txstream.client.check_choice import CheckChoice, Fetched
from txstream.client.consume_service import decode
from txstream.client.dedup import DedupCache
from txstream.errors import MalformedRecord
from txstream.message import Decision, EndEvent, Message
from txstream.outputs import decode_check
from txstream.topics import Topics
from txstream.wire import H, encode_end, encode_half

__all__ = ["Ledger", "TxTruth", "TxPlan", "Producers", "Consumer"]

COMMIT, ROLLBACK, UNKNOW = Decision.COMMIT_MESSAGE, Decision.ROLLBACK_MESSAGE, Decision.UNKNOW


@dataclass
class TxPlan:
    """What one business operation does, decided by the seed."""

    business_key: str
    group: str
    topic: str
    send_at: int
    outcome: Decision  # the local transaction's: COMMIT, ROLLBACK, or UNKNOW (never decided)
    decide_after: int  # ms after the send when the outcome is known
    end_delay: int  # ms after the send when the end event goes out
    dies: bool = False  # the producer dies before sending the end event
    end_first: bool = False  # a raw client writes the end event before the half message
    duplicate: bool = False  # the half message and end event are written twice
    in_doubt: bool = False  # the half message's acknowledgement is lost (it is stored)
    late_copy: int = 0  # ms after the send when its records are written again (0: never)
    keyless: bool = False  # no message key: its release goes to any partition of its topic


@dataclass
class TxTruth:
    """What happened to one transaction, as the world saw it."""

    txid: str
    plan: TxPlan
    halves: list[tuple[int, int, int]] = field(default_factory=list)  # (at, partition, offset)
    decision: Decision | None = None  # the durable record of the local transaction
    decided_at: int | None = None
    ends: list[tuple[int, Decision, int | None]] = field(default_factory=list)  # at, dec, check

    def committed_before(self, at: int, since: int = -1) -> bool:
        """Whether a commit for it was written before ``at`` (and not before ``since``)."""
        return any(d is COMMIT and since <= t < at for t, d, _ in self.ends)


class Ledger:
    def __init__(self) -> None:
        self.tx: dict[str, TxTruth] = {}
        self.by_key: dict[str, list[str]] = {}

    def add(self, truth: TxTruth) -> None:
        self.tx[truth.txid] = truth
        self.by_key.setdefault(truth.plan.business_key, []).append(truth.txid)


class Producers:
    """Every producer application, by group."""

    def __init__(self, world: Any, plans: list[TxPlan], rng: random.Random,
                 skews: dict[str, int], grace_ms: int, resend_lost_after: int = 0) -> None:
        self.world = world
        self.rng = rng
        self.ledger = Ledger()
        self.queue = sorted(plans, key=lambda p: p.send_at)
        self.skews = skews  # per group: its producers' clock minus the true time
        self.away: dict[str, tuple[int, int]] = {}  # group -> [from, until)
        self.choice = {g: CheckChoice(grace_ms) for g in skews}
        self.positions: dict[tuple[str, int], int] = {}
        self.later: list[tuple[int, int, Any]] = []  # (at, seq, action)
        # Check requests a group read: the latest (life, number) per transaction, those
        # answered, and those skipped (when read), for the oracle.
        self.requested: dict[tuple[str, str], tuple[int, int]] = {}
        self.answered: set[tuple[str, str, tuple[int, int]]] = set()
        self.skipped: list[tuple[str, str, tuple[int, int], int]] = []
        self.expired_when_written = 0
        self.late_answers = 0  # answers given a while after their request was read
        # An application that sends a half message again this long after it read that its
        # release was lost (a HALF_MESSAGE_LOST dead letter keyed by its id; 0: never).
        self.resend_lost_after = resend_lost_after
        self._halves: dict[str, Any] = {}  # txid -> its half record, to send again
        self._dead_letters: dict[tuple[str, int], int] = {}
        self._seq = 0
        self._ids = 0

    @property
    def topics(self) -> Topics:
        return self.world.topics  # type: ignore[no-any-return]

    def _clock(self, group: str) -> int:
        return int(self.world.now + self.skews.get(group, 0))

    def _at(self, when: int, action: Any) -> None:
        self._seq += 1
        self.later.append((when, self._seq, action))

    def _append(self, record: Any, group: str) -> tuple[int, int]:
        return self.world.broker.append(record.topic, record.key, record.value,
                                        list(record.headers), timestamp=self._clock(group))

    def _txid(self) -> str:
        """A UUIDv7, as the client library makes them (its time: the true time)."""
        self._ids += 1
        ms = self.world.now
        rand = self.rng.getrandbits(62)
        return (f"{ms:012X}7{self._ids & 0xFFF:03X}{0x8 | (rand >> 60):X}"
                f"{rand & ((1 << 60) - 1):015X}")[:32]

    # --- the applications -------------------------------------------------------------------

    def step(self) -> None:
        now = self.world.now
        while self.queue and self.queue[0].send_at <= now:
            self._send(self.queue.pop(0))
        due = sorted(a for a in self.later if a[0] <= now)
        self.later = [a for a in self.later if a[0] > now]
        for _, _, action in due:
            action()
        for group in self.skews:
            self._answer_checks(group)
        if self.resend_lost_after:
            self._resend_lost()

    def _resend_lost(self) -> None:
        if self.world.broker_down:
            return
        for truth in self._lost_releases(self._dead_letters):
            half = self._halves[truth.txid]
            self._at(self.world.now + self.resend_lost_after,
                     lambda t=truth, h=half: self._copy(t, h))

    def _lost_releases(self, positions: dict[tuple[str, int], int]) -> list[TxTruth]:
        """The committed transactions whose release a dead letter after ``positions`` (moved
        on) says was lost."""
        lost = []
        for records in self.world.read_new(self.topics.dead_letter, positions).values():
            for rec in records:
                code = dict(rec.headers).get(H.DLQ_CODE)
                truth = self.ledger.tx.get(bytes(rec.key or b"").decode("utf-8", "replace"))
                if code == b"HALF_MESSAGE_LOST" and truth is not None and truth.decision:
                    lost.append(truth)
        return lost

    def resend_coming(self) -> bool:
        """Whether a lost release's copy will be sent: its dead letter is not read yet."""
        return bool(self.resend_lost_after) and bool(
            self._lost_releases(dict(self._dead_letters)))

    def _send(self, plan: TxPlan) -> None:
        txid = self._txid()
        truth = TxTruth(txid, plan)
        self.ledger.add(truth)
        msg = Message(plan.topic, f"body of {plan.business_key}".encode(), tags="T",
                      keys=None if plan.keyless else plan.business_key,
                      transaction_id=txid, msg_id=txid,
                      producer_group=plan.group, born_timestamp=self._clock(plan.group))
        half = encode_half(msg, self.topics)
        self._halves[txid] = half
        if self.world.broker_down:
            self._retry_later(plan, "SendFailed")  # not stored: the application tries again
            return
        if plan.end_first:
            self._at(self.world.now, lambda: self._end(truth))
            self._at(self.world.now + plan.end_delay, lambda: self._write_half(truth, half))
        else:
            self._write_half(truth, half)
        if plan.in_doubt:
            # Stored, but the application was told SendInDoubt: it never runs its local
            # transaction for this id, and sends the operation again under a new one.
            self._retry_later(plan, "SendInDoubt")
            return
        self._at(self.world.now + plan.decide_after, lambda: self._decide(truth))
        if not plan.end_first and not plan.dies:
            self._at(self.world.now + plan.end_delay, lambda: self._end(truth))

    def _write_half(self, truth: TxTruth, half: Any) -> None:
        for _ in range(2 if truth.plan.duplicate else 1):
            partition, offset = self._append(half, truth.plan.group)
            truth.halves.append((self.world.now, partition, offset))
        if truth.plan.late_copy:  # a copy delivered long after (a client's retry, a replay)
            self._at(self.world.now + truth.plan.late_copy, lambda: self._copy(truth, half))

    def _copy(self, truth: TxTruth, half: Any) -> None:
        if self.world.broker_down:
            return
        partition, offset = self._append(half, truth.plan.group)
        truth.halves.append((self.world.now, partition, offset))
        for _, decision, check in truth.ends[:1]:
            self._write_end(truth, decision, check)

    def _retry_later(self, plan: TxPlan, why: str) -> None:
        retry = TxPlan(**{**plan.__dict__, "send_at": self.world.now + 500, "in_doubt": False})
        self.queue.append(retry)
        self.queue.sort(key=lambda p: p.send_at)

    def _decide(self, truth: TxTruth) -> None:
        if truth.plan.outcome is not UNKNOW and not truth.plan.dies:
            truth.decision, truth.decided_at = truth.plan.outcome, self.world.now

    def _end(self, truth: TxTruth) -> None:
        decision = truth.decision or UNKNOW
        self._write_end(truth, decision, None)

    def _write_end(self, truth: TxTruth, decision: Decision, check: int | None) -> None:
        if self.world.broker_down:
            return  # not acknowledged: a back-check settles it
        end = EndEvent(truth.txid, truth.plan.group, decision, from_check=check is not None,
                       check_times=check, born_timestamp=self._clock(truth.plan.group))
        for _ in range(2 if truth.plan.duplicate and check is None else 1):
            self._append(encode_end(end, self.topics), truth.plan.group)
            truth.ends.append((self.world.now, decision, check))

    # --- back-checks ------------------------------------------------------------------------

    def _answer_checks(self, group: str) -> None:
        start, until = self.away.get(group, (0, 0))
        if start <= self.world.now < until or self.world.broker_down:
            return
        topic = self.topics.check(group)
        for records in self.world.read_new(topic, self.positions).values():
            fetched = []
            for rec in records:
                try:
                    fetched.append(Fetched(decode_check(rec.key, rec.value, rec.headers),
                                           rec.timestamp))
                except MalformedRecord:
                    fetched.append(Fetched(None, rec.timestamp))
            choice = self.choice[group].choose(fetched, self._clock(group))
            chosen = set(choice.answered())
            for i, f in enumerate(fetched):
                if f.request is None or not f.request.message.transaction_id:
                    continue
                key = (group, f.request.message.transaction_id)
                self.requested[key] = max(self.requested.get(key, (0, 0)), _which(f.request))
                if i in chosen:
                    continue
                valid = f.request.valid_until
                stamp = f.timestamp_ms
                if valid is not None and stamp is not None and (
                        stamp > valid + self.choice[group].grace_ms):
                    # Written past its validity: a batch replayed long after it was planned
                    # (a partition's outage failed it meanwhile); the next check is due at once.
                    self.expired_when_written += 1
                    continue
                self.skipped.append((*key, _which(f.request), self.world.now))
            for i in sorted(chosen):
                req = fetched[i].request
                assert req is not None
                txid = req.message.transaction_id or ""
                self.answered.add((group, txid, _which(req)))
                delay = self.rng.choice((0, 0, 50, 300, 900, 2500))  # may race the next check
                self.late_answers += delay >= 300
                self._at(self.world.now + delay, lambda t=txid, n=req.check_times:
                         self._answer(t, n))

    def _answer(self, txid: str, check: int) -> None:
        truth = self.ledger.tx.get(txid)
        if truth is None:
            return
        if truth.decision is not None:
            decision = truth.decision
        elif truth.plan.in_doubt or truth.plan.dies:
            decision = ROLLBACK  # its local transaction never ran (or was rolled back)
        else:
            decision = UNKNOW
        self._write_end(truth, decision, check)


def _which(request: Any) -> tuple[int, int]:
    """Which check a request is, as the coordinator wrote it: (life, number)."""
    return (request.life or 0, request.check_times)


class Consumer:
    """A push consumer of every real topic: decoded as the client decodes a released record,
    duplicates dropped by message id (``txstream.client.dedup``), everything else delivered."""

    def __init__(self, world: Any, topics: list[str]) -> None:
        self.world = world
        self.topics = topics
        self.positions: dict[tuple[str, int], int] = {}
        self.dedup = DedupCache(capacity=1_000_000, ttl_s=3600.0,
                                clock=lambda: world.now / 1000)
        self.delivered: dict[str, int] = {}  # message id -> deliveries

    def step(self) -> None:
        if self.world.broker_down:
            return
        for topic in self.topics:
            for records in self.world.read_new(topic, self.positions).values():
                for rec in records:
                    if not any(name == H.TRANSACTION_ID for name, _ in rec.headers):
                        continue  # another writer's record: not a message of this run's
                    msg = decode(rec, False)
                    if msg.msg_id in self.dedup:
                        continue
                    self.dedup.add([msg.msg_id])
                    self.delivered[msg.msg_id or ""] = self.delivered.get(msg.msg_id or "", 0) + 1
