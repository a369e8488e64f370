"""What a seed decides, and the loop that plays it: one schedule, checked all along.

The seed chooses the coordinator's settings (timeouts, interval, check max, reserved time, the
timer lead, the back-off, ``maxOffsetsPerTrigger``, the state-key layout), the traffic (groups,
transactions, their outcomes and timings, duplicated records, end events before their half
messages, producers dying between the two, sends in doubt, skewed producer clocks), the
consumer's quirks (fetches in flight, answers of fetches sent earlier) and the faults: crashes
before, during or after a batch's writes; an outage of the coordinator, longer than the reserved
time or not, then catch-up; a new checkpoint over the topics; the broker down; a group away;
bodies deleted by the half topic's retention; the half topic re-created; one partition of a
real, history or check topic refusing writes for a while as the others take them (a leader
election, too few in-sync replicas), a new checkpoint sometimes starting meanwhile.
"""

from __future__ import annotations

import random
import tempfile
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import txstream.kafka.read_back as read_back
import txstream.readback.bodies as bodies
import txstream.streaming.engine.transactions as transactions
from txstream.errors import TxStreamError
from txstream.kafka.read_back import READ_BACK_CHUNK
from txstream.message import Decision, EndEvent
from txstream.sinks.kafka_sink import SinkOptions
from txstream.sources.kafka_io import SourceOptions
from txstream.state.keys import KeyLayout
from txstream.state.policy import Policy
from txstream.streaming.engine.operator import coordinator_function
from txstream.wire import encode_end

from sim.actors import Consumer, Producers, TxPlan
from sim.oracle import (
    Observer,
    Violation,
    check_end,
    check_metrics,
    check_requests_answered,
    check_step,
    lost_copy_owed,
    unknowable,
)
from sim.spark import SimCrash, SparkModel
from sim.world import T0, World

__all__ = ["FAULTS", "Scenario", "Fault", "scenario", "run", "Report"]

COMMIT, ROLLBACK, UNKNOW = Decision.COMMIT_MESSAGE, Decision.ROLLBACK_MESSAGE, Decision.UNKNOW
# The faults a seed draws from its main stream, and those drawn from a stream of their own
# (``_later_faults``), so that adding one leaves every other seed's schedule as it was and
# the seeds that caught a defect (tests/test_sim_defects.py) keep catching it.
_MAIN_FAULTS = ("crash", "outage", "fresh", "broker_down", "away", "retention", "recreate",
                "flood")
_LATER_FAULTS = ("refuse", "foreign", "resend", "stall")
FAULTS = _MAIN_FAULTS + _LATER_FAULTS
_CRASH_POINTS = ("planned", "writing", "written")


@dataclass(frozen=True)
class Fault:
    at: int  # ms after the start
    kind: str
    length: int = 0  # ms, for the faults that last
    arg: Any = None


@dataclass
class Scenario:
    seed: int
    policy: Policy
    layout: KeyLayout
    max_offsets: int | None
    plans: list[TxPlan]
    skews: dict[str, int]
    faults: list[Fault]
    traffic_ms: int
    in_flight: float
    pipelined: float
    like_tansu: bool
    # The sink writes each task's records in one Kafka transaction (only where the broker
    # isolates them: not like tansu); readers read committed records.
    transactional: bool = False
    # Offsets read per step backwards (txstream.kafka.read_back): a few, where other writers'
    # records must take several steps.
    read_back_chunk: int = READ_BACK_CHUNK


@dataclass
class Report:
    seed: int
    batches: int = 0
    replays: int = 0
    transactions: int = 0
    faults: Counter[str] = field(default_factory=Counter)
    outcomes: Counter[str] = field(default_factory=Counter)


def _policy(rng: random.Random) -> Policy:
    interval = rng.choice((1000, 2000, 3000))
    timeout = rng.choice((1000, 2000))
    return Policy(
        transaction_timeout=timeout,
        check_interval=interval,
        check_max=rng.choice((1, 2, 3)),
        reserved_time=rng.choice((6000, 10_000, 20_000, 40_000)),
        orphan_end_timeout=rng.choice((2000, 4000)),
        resolved_retention=rng.choice((1000, 3000)),
        timer_lead=rng.choice((0, 300, 500)),
        max_clock_skew=10_000,
        check_backoff_max=rng.choice((1, 2, 16)),
    )


def _plans(rng: random.Random, groups: list[str], traffic_ms: int, n: int,
           policy: Policy) -> list[TxPlan]:
    plans = []
    for i in range(n):
        outcome = rng.choice((COMMIT, COMMIT, ROLLBACK, UNKNOW))
        plans.append(TxPlan(
            business_key=f"order-{i}", group=rng.choice(groups),
            topic=rng.choice(("orders", "payments")), send_at=rng.randrange(traffic_ms),
            outcome=outcome, decide_after=rng.choice((0, 0, 0, 1500, 5000)),
            end_delay=rng.choice((0, 5, 100, 1000, 3000)), dies=rng.random() < 0.08,
            end_first=rng.random() < 0.08, duplicate=rng.random() < 0.08,
            in_doubt=rng.random() < 0.05,
            # A copy written again later (a producer's retry, or the same id sent again): past
            # the whole transaction's retention, and past its outcome's too sometimes.
            late_copy=(rng.randrange(policy.resolved_retention + 1000,
                                     2 * policy.reserved_time)
                       if rng.random() < 0.1 else 0)))
    return plans


def _faults(rng: random.Random, traffic_ms: int, policy: Policy, groups: list[str],
            kinds: tuple[str, ...]) -> list[Fault]:
    faults = []
    for _ in range(rng.choice((0, 1, 2, 3))):
        kind = rng.choice(kinds)
        at = rng.randrange(traffic_ms)
        if kind == "crash":
            faults.append(Fault(at, kind, arg=(rng.choice(_CRASH_POINTS), rng.randrange(1, 6))))
        elif kind == "outage":
            length = rng.choice((2000, policy.reserved_time + rng.randrange(1000, 10_000)))
            faults.append(Fault(at, kind, length))
        elif kind == "broker_down":
            faults.append(Fault(at, kind, rng.choice((500, 2000, 5000))))
        elif kind == "away":
            length = rng.choice((3 * policy.check_interval, 8 * policy.check_interval,
                                 policy.reserved_time + 3000))
            faults.append(Fault(at, kind, length, rng.choice(groups)))
        elif kind == "flood":
            faults.append(Fault(at, kind, arg=rng.choice((30, 80, 150))))
        else:
            faults.append(Fault(at, kind))
    return sorted(faults, key=lambda f: f.at)


def _refuse(rng: random.Random, traffic_ms: int) -> list[Fault]:
    at, length = rng.randrange(traffic_ms), rng.choice((500, 2000, 5000))
    target = rng.choice(("real", "real", "real", "history", "check"))
    # One partition, or all of one topic's (the others' topics take writes).
    faults = [Fault(at, "refuse", length, (target, rng.choice((0, 1, None))))]
    if rng.random() < 0.5:  # a new checkpoint before the refused batch is replayed
        faults.append(Fault(at + rng.randrange(length), "fresh"))
    return faults


def _stall(rng: random.Random, traffic_ms: int) -> list[Fault]:
    """A half partition's leader short of in-sync replicas keeps its high watermark a few
    records back (Kafka 4, KIP-966), sometimes past the source's patience with an end below
    its checkpoint (``loss_confirm_ms``), sometimes across a new checkpoint."""
    at, length = rng.randrange(traffic_ms), rng.choice((1000, 4000, 40_000))
    faults = [Fault(at, "stall", length, (rng.randrange(4), rng.choice((1, 2, 5))))]
    if rng.random() < 0.3:
        faults.append(Fault(at + rng.randrange(length), "fresh"))
    return faults


def _stall_real(rng: random.Random, traffic_ms: int) -> list[Fault]:
    """The same on a real topic's partition (the latest one released to), sometimes just as a
    batch died writing: what it released past the held high watermark is stored and not
    handed out, and the look for it (the replay check, 0029's after a new checkpoint) must
    not conclude it was never written."""
    at, length = rng.randrange(traffic_ms), rng.choice((1000, 4000, 40_000))
    back = rng.choice((1, 2, 5))
    if rng.random() < 0.3:
        return [Fault(at, "stall", length, (0, back, "real"))]
    point, appends = rng.choice(("writing", "written")), rng.randrange(1, 6)
    then = ("fresh",) if rng.random() < 0.5 else ()
    return [Fault(at, "crash", arg=(point, appends, "stall", length, back, *then))]


def _crash_then_fresh(rng: random.Random, traffic_ms: int) -> list[Fault]:
    """A batch dies as it writes, and a new checkpoint replaces the old one before the batch
    runs again: what it wrote is all a successor can know of it (0029)."""
    return [Fault(rng.randrange(traffic_ms), "crash",
                  arg=(rng.choice(("writing", "written")), rng.randrange(1, 6), "fresh"))]


def _crash_then_retention(rng: random.Random, traffic_ms: int) -> list[Fault]:
    """A batch dies as it writes, and retention deletes bodies it had read before it runs
    again: the replay must still emit what its first run wrote (defects 12 and 14)."""
    return [Fault(rng.randrange(traffic_ms), "crash",
                  arg=(rng.choice(("writing", "written")), rng.randrange(1, 6), "retention"))]


def _recreated_while_away(rng: random.Random, traffic_ms: int) -> list[Fault]:
    """The half topic deleted and created again while the coordinator is away, and written
    past where the checkpoint read it before it looks: only its id tells (KIP-516)."""
    at, length = rng.randrange(traffic_ms), rng.choice((2000, 5000))
    return [Fault(at, "outage", length), Fault(at + 100, "recreate", arg=2),
            Fault(at + length - 50, "filler")]


def _lost_then_resent(rng: random.Random, traffic_ms: int) -> list[Fault]:
    """Bodies lost (retention) and, sometimes, a new checkpoint; the application sends a half
    message again once it reads that its release was lost."""
    faults = [Fault(rng.randrange(traffic_ms), "retention")]
    if rng.random() < 0.6:
        faults.append(Fault(rng.randrange(traffic_ms), "fresh"))
    return [*faults, Fault(0, "resend", arg=rng.choice((300, 2000)))]


def _foreign(rng: random.Random, traffic_ms: int) -> list[Fault]:
    """Another writer on a real topic, its timestamps anything (event time, a mirror, a clock
    a day behind or ahead): as many records as a few read-back chunks."""
    faults = []
    for _ in range(rng.choice((1, 2, 3))):
        skew = rng.choice((-86_400_000, -3_600_000, -600_001, 0, 86_400_000))
        at, after_crash = rng.randrange(traffic_ms), rng.random() < 0.5
        if after_crash:  # written between a crashed batch and its replay
            faults.append(Fault(at, "crash", arg=(rng.choice(("writing", "written")),
                                                  rng.randrange(1, 6))))
        faults.append(Fault(at, "foreign", arg=(rng.choice((5, 20, 60)), skew, after_crash)))
    return faults


# Each family of later faults: the fault kinds it needs, how often, and how it is drawn, from
# a random stream of its own (one family changed moves no other's schedules).
_FAMILIES = (
    ("refuse", ("refuse",), 0.2, _refuse),
    ("crash-fresh", ("crash", "fresh"), 0.1, _crash_then_fresh),
    ("crash-retention", ("crash", "retention"), 0.1, _crash_then_retention),
    ("recreate-away", ("recreate", "outage"), 0.25, _recreated_while_away),
    ("resend", ("resend",), 0.15, _lost_then_resent),
    ("foreign", ("foreign",), 0.2, _foreign),
    ("stall", ("stall",), 0.2, _stall),  # replicated brokers only (not like tansu)
    ("stall-real", ("stall", "crash", "fresh"), 0.15, _stall_real),  # the same
)


def _later_faults(seed: int, traffic_ms: int, kinds: tuple[str, ...], replicated: bool
                  ) -> list[Fault]:
    faults: list[Fault] = []
    for name, needs, probability, draw in _FAMILIES:
        rng = random.Random(f"{seed}:{name}")
        if name.startswith("stall") and not replicated:
            continue
        if set(needs) <= set(kinds) and rng.random() < probability:
            faults += draw(rng, traffic_ms)
    return faults


# Whether schedules may take the transactional path (a test pins a seed's ordered one).
TRANSACTIONS = True


def scenario(seed: int, kinds: tuple[str, ...] = FAULTS) -> Scenario:
    rng = random.Random(seed)
    policy = _policy(rng)
    groups = [f"G{i}" for i in range(rng.choice((1, 2, 2, 3)))]
    traffic_ms = rng.choice((4000, 8000, 15_000))
    skews = {g: rng.choice((0, 0, 0, 800, -3000, -100 * 3600_000, 365 * 86_400_000))
             for g in groups}
    main = tuple(k for k in kinds if k in _MAIN_FAULTS)
    sc = Scenario(
        seed=seed, policy=policy,
        layout=KeyLayout(window_ms=rng.choice((500, 2000)), shards=rng.choice((1, 2)),
                         partitions=2),
        max_offsets=rng.choice((None, None, 3, 7, 20)),
        plans=_plans(rng, groups, traffic_ms, rng.randrange(2, 9), policy),
        skews=skews,
        faults=_faults(rng, traffic_ms, policy, groups, main) if main else [],
        traffic_ms=traffic_ms,
        in_flight=rng.choice((0.0, 0.3, 0.6)),
        pipelined=rng.choice((0.0, 0.3, 0.6)),
        like_tansu=rng.random() < 0.5,
    )
    # From a stream of its own: drawing it moves no other part of a seed's schedule.
    sc.transactional = (TRANSACTIONS and not sc.like_tansu
                        and random.Random(f"{seed}:transactions").random() < 0.5)
    later = _later_faults(seed, traffic_ms, kinds, replicated=not sc.like_tansu)
    if later:
        sc.faults = sorted(sc.faults + later, key=lambda f: f.at)
    if any((f.kind == "stall" and len(f.arg) == 3) or (f.kind == "crash" and "stall" in f.arg)
           for f in later):
        # Releases without a key go to any partition: past one whose high watermark is held.
        keyless = random.Random(f"{seed}:keyless")
        sc.plans = [replace(p, keyless=keyless.random() < 0.5) for p in sc.plans]
    if any(f.kind == "foreign" for f in later):
        sc.read_back_chunk = random.Random(seed ^ 0xC4).choice((5, 16, 2000))
    return sc


class Simulation:
    """One scenario played: the world, the coordinator, the actors, the faults."""

    def __init__(self, sc: Scenario, workdir: Path) -> None:
        self.sc = sc
        self.rng = random.Random(sc.seed ^ 0x5EED)
        self.world = World(sc.seed, self.rng, in_flight=sc.in_flight, stale=sc.pipelined,
                           like_tansu=sc.like_tansu, committed=sc.transactional)
        self.world.slack_ms = 3000 + 2 * (sc.policy.timer_lead + 400)
        topics = self.world.topics
        self.real_topics = sorted({p.topic for p in sc.plans})
        if any(p.keyless for p in sc.plans):  # somewhere else to go than a stalled partition
            for topic in self.real_topics:
                self.world.broker.create_topic(topic, 3)
        fresh_ok = any(f.kind == "recreate" for f in sc.faults)
        source = SourceOptions(
            kafka=self.world.settings, half_topic=topics.half, end_topic=topics.end,
            key_layout=sc.layout, read_timeout_ms=2000, read_tasks=2,
            max_offsets_per_trigger=sc.max_offsets, timer_file=str(workdir / "timers.json"),
            journal_topic=topics.history, fail_on_data_loss=not fresh_ok)
        sink = SinkOptions(kafka=self.world.settings, timer_file=str(workdir / "timers.json"),
                           dead_letter_topic=topics.dead_letter, half_topic=topics.half,
                           transactional_id=self._transactional_id())
        self.spark = SparkModel(
            source=source, sink=sink,
            function_of=lambda: coordinator_function(sc.policy, topics, self.world.settings),
            partitions=sc.layout.partitions, clock=lambda: self.world.now, rng=self.rng,
            timer_file=workdir / "timers.json", max_offsets=sc.max_offsets)
        self.producers = Producers(self.world, sc.plans, self.rng, sc.skews,
                                   grace_ms=10_000)
        self.consumer = Consumer(self.world, self.real_topics)
        self.observer = Observer(self.world, self.real_topics)
        self.report = Report(sc.seed)
        self.summaries: list[bytes] = []
        self.down_until = 0  # the coordinator is down until then
        self.broker_until = 0
        self.refusing_until = 0  # a partition refuses writes until then
        self.foreign_after_crash: list[tuple[int, int, bool]] = []  # written at the next crash
        self.quiet_since = T0
        self.pending_crash: tuple[Any, ...] | None = None
        self.fresh_at: list[float] = []
        # Releases written by a crashed batch not replayed yet, and by crashed batches a new
        # checkpoint replaced before their replay: never counted by the metrics.
        self.unreplayed = 0
        self.uncounted = 0
        self.failed_batch: int | None = None
        self.failures = 0
        self.away_spans: list[tuple[str, int, int]] = []
        self.backlog: dict[int, int] = {}  # a flood's end offsets, until read past

    # --- faults ------------------------------------------------------------------------------

    def _transactional_id(self) -> str | None:
        """The coordinator's: a new checkpoint keeps it (streaming.engine.transactions)."""
        return (transactions.transactional_id_of(self.world.topics.half)
                if self.sc.transactional else None)

    def _fault(self, fault: Fault) -> None:
        now, world = self.world.now, self.world
        self.report.faults[fault.kind] += 1
        if fault.kind == "crash":
            self.pending_crash = fault.arg
        elif fault.kind == "outage":
            self.down_until = now + fault.length
        elif fault.kind == "fresh":
            # A crashed batch's releases are on their topics, but its counts die with it.
            self.uncounted += self.unreplayed
            self.unreplayed = 0
            # A new checkpoint chooses its transactional id anew (streaming.engine.transactions).
            self.spark.sink = replace(self.spark.sink, transactional_id=self._transactional_id())
            self.spark.fresh_checkpoint()
            # Between ticks: what the last batch wrote at ``now`` came from the old checkpoint.
            self.fresh_at.append(now + 0.5)
        elif fault.kind == "broker_down":
            self.broker_until = now + fault.length
            world.set_down(True)
        elif fault.kind == "away":
            self.producers.away[fault.arg] = (now, now + fault.length)
            self.away_spans.append((fault.arg, now, now + fault.length))
        elif fault.kind == "retention":
            # Retention deletes old records: ones the coordinator has read and committed
            # (bodies of transactions it still holds among them).
            read = self.spark.read_to(world.topics.half)
            for partition in range(world.broker.partition_count(world.topics.half) or 0):
                upto = min(read.get(partition, 0),
                           world.broker.end_offset(world.topics.half, partition))
                start = world.broker.start_offset(world.topics.half, partition)
                if upto > start:
                    world.broker.delete_records(world.topics.half, partition,
                                                self.rng.randrange(start, upto + 1))
        elif fault.kind == "flood":  # end events of transactions nobody sent: a backlog
            for i in range(fault.arg):
                end = EndEvent(f"orphan-{self.sc.seed}-{now}-{i}", "GX", COMMIT)
                record = encode_end(end, world.topics)
                world.broker.append(record.topic, record.key, record.value, record.headers)
            topic = world.topics.end
            self.backlog = {p: world.broker.end_offset(topic, p)
                            for p in range(world.broker.partition_count(topic) or 0)}
        elif fault.kind == "refuse":
            target, partition = fault.arg
            topic = {"real": self.rng.choice(self.real_topics), "history": world.topics.history,
                     "check": world.topics.check(self.rng.choice(sorted(self.sc.skews)))}[target]
            for p in range(4) if partition is None else (partition,):
                world.broker.refuse_appends(topic, p, now + fault.length)
            self.refusing_until = max(self.refusing_until, now + fault.length)
        elif fault.kind == "resend":
            self.producers.resend_lost_after = fault.arg
        elif fault.kind == "stall":
            self._stall(fault)
        elif fault.kind == "foreign":
            if fault.arg[2]:
                self.foreign_after_crash.append(fault.arg)
            else:
                self._foreign(fault.arg)
        elif fault.kind == "recreate":
            world.broker.delete_topic(world.topics.half)
            world.broker.create_topic(world.topics.half, fault.arg or 1)
            world.recreated = True
        elif fault.kind == "filler":
            # Other producers' records (unreadable as half messages: dead-lettered) until
            # each half partition ends past where the checkpoint read it.
            read = self.spark.read_to(world.topics.half)
            for p in range(world.broker.partition_count(world.topics.half) or 0):
                while world.broker.end_offset(world.topics.half, p) <= read.get(p, 0):
                    world.broker.append(world.topics.half, None, b"filler", partition=p)
        self.quiet_since = max(self.quiet_since, now + fault.length)

    def _stall(self, fault: Fault) -> None:
        index, back, *where = fault.arg
        broker = self.world.broker
        topic, p = self._last_released() if where else (self.world.topics.half, index)
        count = broker.partition_count(topic) if topic in broker.topic_names() else None
        if count:
            p = p % count
            at = max(broker.start_offset(topic, p), broker.end_offset(topic, p) - back)
            broker.hold_high_watermark(topic, p, at, self.world.now + fault.length)
            self.refusing_until = max(self.refusing_until, self.world.now + fault.length)

    def _last_released(self) -> tuple[str, int]:
        """The real topic partition of the latest release (the first one's, if none yet)."""
        broker, latest = self.world.broker, (-1, self.real_topics[0], 0)
        for topic in self.real_topics:
            for p in range(broker.partition_count(topic) or 0):
                records = broker.records(topic, p)
                if records and records[-1].timestamp > latest[0]:
                    latest = (records[-1].timestamp, topic, p)
        return latest[1], latest[2]

    def _foreign(self, arg: tuple[int, int, bool]) -> None:
        """Another writer's records on a real topic, stamped ``skew`` off the true time."""
        count, skew, _ = arg
        topic = self.rng.choice(self.real_topics)
        for i in range(count):
            self.world.broker.append(topic, f"foreign-{i}".encode(), b"not txstream's",
                                     [("source", b"mirror")], timestamp=self.world.now + skew)

    # --- the loop ----------------------------------------------------------------------------

    def _coordinator(self) -> None:
        now = self.world.now
        # While the broker does not answer, the coordinator waits for it (its planning blocks
        # on the end offsets; what it does past its read timeout is not this simulation's).
        if now < self.down_until or self.world.broker_down:
            return
        at, appends, *then = self.pending_crash or (None, 0)
        left = [appends]

        def on_append(topic: str, partition: int, record: Any) -> None:
            left[0] -= 1
            if left[0] <= 0:
                raise SimCrash("while writing")

        if at == "writing":
            self.world.broker.on_append = on_append
        released = self._released()
        try:
            report = self.spark.step(at if at in ("planned", "written") else None)
        except SimCrash:
            self.unreplayed += self._released() - released
            self.report.faults["crash:" + str(at)] += 1
            self.pending_crash = None
            while self.foreign_after_crash:
                self._foreign(self.foreign_after_crash.pop())
            if then[:1] == ["stall"]:  # a real partition's high watermark held back
                self._fault(Fault(0, "stall", then[1], (0, then[2], "real")))
                then = then[3:]
            if then == ["fresh"]:
                self._fault(Fault(0, "fresh"))
            else:
                if then == ["retention"]:
                    self._fault(Fault(0, "retention"))
                self.spark.restart()
            return
        except TxStreamError as exc:
            # The batch failed (the query stops; whoever runs it starts it again): fine once,
            # but no record may stop the coordinator for good. What it wrote stays written.
            self.unreplayed += self._released() - released
            self._failed(exc)
            return
        finally:
            self.world.broker.on_append = None
        if report is None:
            return  # no batch ran: a crash due waits for one
        self.unreplayed = 0  # a batch committed: the crashed one's replay, if one crashed
        if at == "writing" and left[0] < appends:
            self.pending_crash = None  # it wrote fewer records than the crash waited for
        elif at != "writing":
            self.pending_crash = None
        self.report.batches += 1
        self.report.replays += report.replay
        self._read_backlog()
        self.summaries.extend(report.timers)
        check_step(self.producers.ledger, self.observer.update(), True, self.sc.policy,
                   self.fresh_at)

    def _released(self) -> int:
        """How many records the real topics hold (with transactions, the committed ones: an
        aborted or still open transaction's releases are no one's to count)."""
        broker = self.world.broker
        parts = [(topic, p) for topic in self.real_topics
                 for p in range(broker.partition_count(topic) or 0)]
        if self.world.committed:
            return sum(len(self.world.visible(topic, p)) for topic, p in parts)
        return sum(broker.end_offset(topic, p) for topic, p in parts)

    def _read_backlog(self) -> None:
        """A flood's backlog lasts until the coordinator has read past it: answers written
        meanwhile wait behind it, so timeliness is judged from then on (``quiet_since``)."""
        if not self.backlog:
            return
        read = self.spark.read_to(self.world.topics.end)
        if all(read.get(p, 0) >= end for p, end in self.backlog.items()):
            self.backlog = {}
        self.quiet_since = max(self.quiet_since, self.world.now)

    def _failed(self, exc: Exception) -> None:
        if "deleted and created again since this micro-batch was planned" in str(exc):
            # The batch a crash left cannot run again: its topic was created again since. The
            # coordinator says to start on a new checkpoint; its operator does.
            self.report.faults["new checkpoint after a topic created again"] += 1
            self._fault(Fault(0, "fresh"))
            return
        if self.world.now < self.refusing_until:
            # A partition refuses writes: every run of the batch fails until it takes them.
            self.report.faults["failed batch (a partition refusing)"] += 1
            self.spark.restart()
            return
        if "a half message read before" in str(exc):
            # Its partition ends short of a body (a recreated half topic): the batch fails
            # until bodies.SHORT_SETTLE_S has passed, then the body is gone.
            self.report.faults["failed batch (a half partition short)"] += 1
            self.spark.restart()
            return
        batch = 0 if self.spark.committed is None else self.spark.committed + 1
        self.failures = self.failures + 1 if batch == self.failed_batch else 1
        self.failed_batch = batch
        if self.failures >= 3:
            raise Violation(f"batch {batch} failed {self.failures} times in a row: "
                            f"{type(exc).__name__}: {exc}")
        self.report.faults["failed batch"] += 1
        self.spark.restart()

    def _tick(self) -> None:
        world = self.world
        world.now += self.rng.choice((20, 50, 100, 200, 400))
        if world.broker_down and world.now >= self.broker_until:
            world.set_down(False)
        self.producers.step()
        self.consumer.step()
        self._coordinator()

    def run(self) -> Report:
        sc, world = self.sc, self.world
        faults = list(sc.faults)
        while world.now < T0 + sc.traffic_ms:
            while faults and T0 + faults[0].at <= world.now:
                self._fault(faults.pop(0))
            self._tick()
        # Faults stop: the broker is back, every group too, the coordinator runs on.
        world.set_down(False)
        self.producers.away.clear()
        self.down_until = 0
        # From when every partition takes writes again (a stall may outlast the traffic).
        settle_until = max(world.now, self.refusing_until) + self._settling_time()
        ticks = 0
        while world.now < settle_until and (ticks % 5 or not self._all_ended()):
            self._tick()
            ticks += 1
        for _ in range(10):  # what is still in flight: answers, the consumer's reads
            self._tick()
        seen = self.observer.update()
        check_end(world, self.producers.ledger, seen, self.consumer.delivered, sc.policy,
                  self.quiet_since, self.fresh_at)
        check_requests_answered(self.producers, seen, sc.policy, self.fresh_at)
        check_metrics(seen, self.summaries, self.uncounted)
        self.report.transactions = len(self.producers.ledger.tx)
        self._count_traffic_faults()
        for txid in self.producers.ledger.tx:
            ended = seen.ended(txid)
            self.report.outcomes[ended["event"] if ended else "not stored"] += 1
        return self.report

    def _count_traffic_faults(self) -> None:
        """The faults that come with the traffic and the settings, for the report."""
        faults = self.report.faults
        for plan in self.sc.plans:
            for name in ("dies", "end_first", "duplicate", "in_doubt", "late_copy"):
                faults[name] += bool(getattr(plan, name))
        faults["skewed clocks"] += any(self.sc.skews.values())
        faults["timer lead"] += self.sc.policy.timer_lead > 0
        faults["Kafka transactions"] += self.sc.transactional
        faults["catch-up past the reserved time"] += any(
            f.kind == "outage" and f.length > self.sc.policy.reserved_time
            for f in self.sc.faults)
        faults["answers racing the next check"] += self.producers.late_answers

    def _settling_time(self) -> int:
        p = self.sc.policy
        return (p.reserved_time + p.check_interval * (p.check_max + 2) * p.check_backoff_max
                + p.orphan_end_timeout + 30_000)

    def _all_ended(self) -> bool:
        if self.producers.queue or self.producers.later or self.producers.resend_coming():
            # A send still due (an application's retry of a send the outage refused, a late
            # copy, an end event) may start a life.
            return False
        if self.world.now < self.refusing_until:
            return False  # a batch a partition refuses fails until it takes its records
        seen = self.observer.update()
        policy = self.sc.policy
        return all((seen.ended(txid) is not None
                    or unknowable(self.world, truth, seen, self.fresh_at))
                   # a lost release's copy sent again is owed its release (a new partition
                   # of a re-created half topic is found within a listing's refresh)
                   and lost_copy_owed(self.world, truth, seen.notes.get(txid, []), policy) is None
                   for txid, truth in self.producers.ledger.tx.items() if truth.halves)


def run(seed: int, kinds: tuple[str, ...] = FAULTS) -> Report:
    """Play the schedule of ``seed``; raises ``sim.oracle.Violation`` on a broken promise."""
    shm = Path("/dev/shm")  # the timer schedule is a file: in memory where there is a tmpfs
    with tempfile.TemporaryDirectory(prefix="txstream-sim-",
                                     dir=shm if shm.is_dir() else None) as tmp:
        sc = scenario(seed, kinds)
        simulation = Simulation(sc, Path(tmp))
        chunk, read_back.READ_BACK_CHUNK = read_back.READ_BACK_CHUNK, sc.read_back_chunk
        clock, bodies.settle_clock = bodies.settle_clock, lambda: simulation.world.now / 1000
        try:
            return simulation.run()
        finally:
            read_back.READ_BACK_CHUNK = chunk
            bodies.settle_clock = clock
            simulation.world.close()
