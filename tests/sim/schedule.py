"""The loop that plays a seed's schedule (:mod:`sim.scenarios`), checked all along: the world,
the coordinator's own operator, source and sink on the Spark stand-in, the actors, the faults
as they come, and the oracle after every batch and at the end.
"""

from __future__ import annotations

import hashlib
import random
import tempfile
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import txstream.kafka.read_back as read_back
import txstream.readback.bodies as bodies
import txstream.streaming.engine.transactions as transactions
from tests.sim.actors import Consumer, Producers
from tests.sim.oracle import (
    Observer,
    Violation,
    check_end,
    check_metrics,
    check_requests_answered,
    check_step,
    is_release,
    lost_copy_owed,
    unknowable,
)
from tests.sim.scenarios import FAULTS, Fault, Scenario, scenario
from tests.sim.world import T0, World
from txstream.errors import TxStreamError
from txstream.message import Decision, EndEvent
from txstream.sinks.kafka_sink import SinkOptions
from txstream.sources.kafka_io import SourceOptions
from txstream.streaming.engine.key_step import KeyStep
from txstream.testing.spark_model import SimCrash, SparkModel
from txstream.wire import encode_end

__all__ = ["FAULTS", "Scenario", "Fault", "scenario", "run", "Report"]

COMMIT = Decision.COMMIT_MESSAGE


@dataclass
class Report:
    seed: int
    batches: int = 0
    replays: int = 0
    transactions: int = 0
    faults: Counter[str] = field(default_factory=Counter)
    outcomes: Counter[str] = field(default_factory=Counter)
    # Every record the broker holds at the end, hashed: two plays of a seed that agree on it
    # wrote the same records in the same places.
    records: str = ""



class Simulation:
    """One scenario played: the world, the coordinator, the actors, the faults."""

    def __init__(self, sc: Scenario, workdir: Path, through_pandas: bool = False) -> None:
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
            step_of=lambda: KeyStep(sc.policy, topics, self.world.settings),
            partitions=sc.layout.partitions, clock=lambda: self.world.now, rng=self.rng,
            timer_file=workdir / "timers.json", max_offsets=sc.max_offsets,
            through_pandas=through_pandas)
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
        topic, p = ((self.world.topics.half, index) if not where else
                    where[0] if isinstance(where[0], tuple) else self._last_released())
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
        released_to: list[tuple[str, int]] = []  # where a crash "releasing" released last

        def on_append(topic: str, partition: int, record: Any) -> None:
            if at == "releasing":  # it dies at the append after its n-th release's
                if left[0] <= 0:
                    raise SimCrash("after releasing")
                if topic in self.real_topics:
                    left[0] -= 1
                    released_to[:] = [(topic, partition)]
                return
            left[0] -= 1
            if left[0] <= 0:
                raise SimCrash("while writing")

        if at in ("writing", "releasing"):
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
                where = released_to[0] if released_to else "real"  # else the latest's
                self._fault(Fault(0, "stall", then[1], (0, then[2], where)))
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
        if at in ("writing", "releasing") and left[0] < appends:
            self.pending_crash = None  # it wrote fewer records than the crash waited for
        elif at not in ("writing", "releasing"):
            self.pending_crash = None
        self.report.batches += 1
        self.report.replays += report.replay
        self._read_backlog()
        self.summaries.extend(report.timers)
        check_step(self.producers.ledger, self.observer.update(), True, self.sc.policy,
                   self.fresh_at)

    def _released(self) -> int:
        """How many releases the real topics hold (with transactions, the committed ones: an
        aborted or still open transaction's releases are no one's to count). Another
        writer's records are not releases: a transaction aborted or committed in a batch
        makes the ones it held back visible then, as if the batch had written them."""
        broker = self.world.broker
        parts = [(topic, p) for topic in self.real_topics
                 for p in range(broker.partition_count(topic) or 0)]
        if self.world.committed:
            return sum(1 for topic, p in parts for rec in self.world.visible(topic, p)
                       if is_release(rec.headers))
        # Without transactions nothing shows late: the step's appends are all its own.
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
        # From when every partition takes writes again (a stall may outlast the traffic), and
        # long enough for a life a late copy starts after the traffic to end too.
        settle_until = max(max(world.now, self.refusing_until) + self._settling_time(),
                           self._last_due() + self._life_time())
        ticks = 0
        while world.now < settle_until and (ticks % 5 or not self._all_ended()):
            self._tick()
            ticks += 1
        for _ in range(10):  # what is still in flight: answers, the consumer's reads
            self._tick()
        self.consumer.step()  # what the last tick's batch released (a tick reads, then runs)
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
        self.report.records = _records_digest(world)
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
        return self.sc.policy.reserved_time + self._life_time()

    def _life_time(self) -> int:
        """How long a life takes to end once its half message is in: its checks, answered or
        not, and the end event it may wait for, with the settling time's slack."""
        p = self.sc.policy
        return (p.check_interval * (p.check_max + 2) * p.check_backoff_max
                + p.orphan_end_timeout + 30_000)

    def _last_due(self) -> int:
        """When the last send the producers have scheduled is due (a late copy of a half
        message may come up to twice the reserved time after its first send)."""
        return max((at for at, _, _ in self.producers.later), default=self.world.now)

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


def _records_digest(world: World) -> str:
    broker, digest = world.broker, hashlib.sha256()
    for topic in sorted(broker.topic_names()):
        for partition in range(broker.partition_count(topic) or 0):
            digest.update(repr((topic, partition, broker.start_offset(topic, partition),
                                broker.records(topic, partition))).encode())
    return digest.hexdigest()


def run(seed: int, kinds: tuple[str, ...] = FAULTS, through_pandas: bool = False) -> Report:
    """Play the schedule of ``seed``; raises ``sim.oracle.Violation`` on a broken promise.
    ``through_pandas``: the operator is called as Spark calls it, with a pandas frame per key
    (by default its step is called with the rows the frames would give: the same schedule at
    about half the cost; tests/sim/test_sim.py checks that both play alike)."""
    shm = Path("/dev/shm")  # the timer schedule is a file: in memory where there is a tmpfs
    with tempfile.TemporaryDirectory(prefix="txstream-sim-",
                                     dir=shm if shm.is_dir() else None) as tmp:
        sc = scenario(seed, kinds)
        simulation = Simulation(sc, Path(tmp), through_pandas)
        chunk, read_back.READ_BACK_CHUNK = read_back.READ_BACK_CHUNK, sc.read_back_chunk
        clock, bodies.settle_clock = bodies.settle_clock, lambda: simulation.world.now / 1000
        try:
            return simulation.run()
        finally:
            read_back.READ_BACK_CHUNK = chunk
            bodies.settle_clock = clock
            simulation.world.close()
