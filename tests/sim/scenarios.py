"""What a seed decides: the coordinator's settings, the traffic and the faults of one schedule.

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
:mod:`sim.schedule` plays it.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, replace
from typing import Any

from tests.sim.actors import TxPlan
from txstream.kafka.read_back import READ_BACK_CHUNK
from txstream.message import Decision
from txstream.state.keys import KeyLayout
from txstream.state.policy import Policy

__all__ = ["FAULTS", "Scenario", "Fault", "scenario", "TRANSACTIONS"]

COMMIT, ROLLBACK, UNKNOW = Decision.COMMIT_MESSAGE, Decision.ROLLBACK_MESSAGE, Decision.UNKNOW
# The faults a seed draws from its main stream, and those drawn from a stream of their own
# (``_later_faults``), so that adding one leaves every other seed's schedule as it was and
# the seeds that caught a defect (tests/sim/test_sim_defects.py) keep catching it.
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


def _held_look(rng: random.Random, traffic_ms: int) -> list[Fault]:
    """A batch dies as it releases; the real partition it released to holds its high
    watermark below that release, and a new checkpoint looks for it meanwhile (0029 under a
    held end: the look must wait, not conclude it was never written)."""
    return [Fault(rng.randrange(traffic_ms), "crash",
                  arg=("releasing", 1, "stall", rng.choice((2000, 4000)), 5, "fresh"))]


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
    ("held-look", ("stall", "crash", "fresh"), 0.1, _held_look),  # the same
)


def _later_faults(seed: int, traffic_ms: int, kinds: tuple[str, ...], replicated: bool
                  ) -> list[Fault]:
    faults: list[Fault] = []
    for name, needs, probability, draw in _FAMILIES:
        rng = random.Random(f"{seed}:{name}")
        if "stall" in needs and not replicated:  # a held high watermark needs replicas
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
        # A held look's release sent again goes elsewhere only without a key: the held
        # partition refuses it otherwise, and the batch waits for the look's answer anyway.
        every = any(f.kind == "crash" and f.arg[0] == "releasing" for f in later)
        sc.plans = [replace(p, keyless=every or keyless.random() < 0.5) for p in sc.plans]
    if any(f.kind == "foreign" for f in later):
        sc.read_back_chunk = random.Random(seed ^ 0xC4).choice((5, 16, 2000))
    return sc
