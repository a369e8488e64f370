"""The recovery demo's verdict: from the real topic and the producers' own records, never from
the coordinator's counters.

What the producers committed (their ledger) must be on the real topic once: none lost, none
there twice. What they rolled back, and what they sent without an acknowledgement (their
checks are answered ROLLBACK), must never be there. Nothing may be left pending: every
transaction sent is on the real topic, or the history topic says how it ended otherwise. The
consumer must have been handed each committed message once.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from txstream.streaming.cli.recovery_crash import Crash, Pause
from txstream.streaming.cli.recovery_ledger import Counts, Ledger

__all__ = ["Verdict", "judge", "verdict_lines", "clock"]


def clock(at: float | None) -> str:
    """``12:01:03.310``: a wall-clock time to the millisecond."""
    if at is None:
        return "-"
    return time.strftime("%H:%M:%S", time.localtime(at)) + f".{int(at * 1000) % 1000:03d}"


@dataclass(frozen=True)
class Verdict:
    counts: Counts
    released: int  # committed transactions on the real topic
    records: int  # the run's records on the real topic, copies included
    lost: int  # committed, not on the real topic
    doubled: int  # records beyond the first of a transaction
    visible_rollbacks: int  # rolled back or never acknowledged, yet on the real topic
    pending: int  # sent, neither on the real topic nor ended otherwise by the history
    ended_otherwise: Mapping[str, int]  # history outcome -> how many of the sent
    consumer_received: int  # committed messages the consumer was handed
    consumer_extra: int  # handings past the first (after its own dedup)

    @property
    def ok(self) -> bool:
        return (self.lost == 0 and self.doubled == 0 and self.visible_rollbacks == 0
                and self.pending == 0 and self.consumer_extra == 0
                and self.consumer_received == self.counts.committed)

    def failures(self) -> list[str]:
        out = []
        if self.lost:
            out.append(f"{self.lost} committed messages lost")
        if self.doubled:
            out.append(f"{self.doubled} released twice")
        if self.visible_rollbacks:
            out.append(f"{self.visible_rollbacks} rolled-back messages visible")
        if self.pending:
            out.append(f"{self.pending} transactions still pending")
        if self.consumer_extra or self.consumer_received != self.counts.committed:
            out.append(f"the consumer was handed {self.consumer_received} of "
                       f"{self.counts.committed} committed messages, {self.consumer_extra} "
                       "more than once")
        return out


def judge(ledger: Ledger, copies: Counter[str], ended: Mapping[str, str],
          received: Counter[str]) -> Verdict:
    """The verdict over the producers' ledger, the real topic's records per transaction id
    (``copies``), the history's other outcomes (``ended``) and the consumer's handings."""
    sent, committed = ledger.sent(), ledger.committed()
    never = ledger.rolled_back() | ledger.doubtful()
    ours = sent | ledger.doubtful()
    visible = {t for t, n in copies.items() if n and t in ours}
    outcomes = Counter(ended[t] for t in sent if t in ended and t not in visible)
    return Verdict(
        counts=ledger.counts(),
        released=len(committed & visible),
        records=sum(copies[t] for t in visible),
        lost=len(committed - visible),
        doubled=sum(copies[t] - 1 for t in visible),
        visible_rollbacks=len(never & visible),
        pending=len({t for t in sent if t not in visible and t not in ended}),
        ended_otherwise=dict(outcomes),
        consumer_received=len(committed & set(received)),
        consumer_extra=sum(n - 1 for t, n in received.items() if t in ours and n > 1),
    )


def _recovery_line(crash: Crash) -> str:
    def after(at: float | None) -> str:
        return "-" if at is None or crash.restart_at is None else f"{at - crash.restart_at:.1f} s"

    return (f"    down {crash.down_s or 0:.1f} s; from the restart to the first release "
            f"{after(crash.first_release_at)}, to caught up {after(crash.caught_up_at)} "
            f"({crash.backlog} commits waited)")


def verdict_lines(v: Verdict, real_topic: str, crashes: Sequence[Crash],
                  pauses: Sequence[Pause] = (), timed_out_s: float | None = None) -> list[str]:
    """The verdict's lines. ``timed_out_s``: the demo's time ran out before every transaction
    ended, so what is not released is not lost yet, and the verdict says so."""
    c = v.counts
    missing = "not released yet" if timed_out_s is not None else "lost"
    lines = [
        "verdict, from the real topic and the producers' own records:",
        f"  sent {c.sent}: committed {c.committed}, rolled back {c.rolled_back} "
        f"({c.unknown_first} answered UNKNOW first, settled by {c.checks_answered} back-check "
        f"answers)" + (f"; {c.in_doubt} sends not acknowledged" if c.in_doubt else ""),
        f"  released {v.released} of {c.committed} committed: {missing} {v.lost}, doubled "
        f"{v.doubled} ({real_topic} holds {v.records} records of this run)",
        f"  rolled back never visible: {v.visible_rollbacks} of "
        f"{c.rolled_back + c.in_doubt} on {real_topic}",
        f"  pending {v.pending}",
        f"  the consumer was handed {v.consumer_received} of {c.committed} committed messages, "
        f"{v.consumer_extra} more than once",
    ]
    if v.ended_otherwise:
        lines.append("  the history says: " + ", ".join(
            f"{n} {what}" for what, n in sorted(v.ended_otherwise.items())))
    for crash in crashes:
        lines.append(f"  crash {crash.number} at {clock(crash.at)} (SIGKILL, {crash.processes} "
                     f"processes): {crash.describe()}")
        lines.append(_recovery_line(crash))
    for p in pauses:
        caught = "-" if p.caught_up_at is None else f"{p.caught_up_at - p.until:.1f} s"
        if p.kind == "broker":
            lines.append(f"  broker paused {clock(p.at)} for {p.until - p.at:.1f} s; caught up "
                         f"{caught} after it came back")
            continue
        restarted = (f"; the coordinator failed its batch and was restarted {p.restarts} time"
                     f"{'s' if p.restarts > 1 else ''}" if p.restarts else "")
        lines.append(f"  executor killed at {clock(p.at)} (SIGKILL, pids "
                     f"{', '.join(map(str, p.killed))}): a new one after "
                     f"{p.until - p.at:.1f} s{restarted}; caught up {caught} after")
    if v.ok:
        lines.append("PASS: lost 0, doubled 0, pending 0")
    elif timed_out_s is not None and not v.doubled and not v.visible_rollbacks:
        lines.append(f"FAIL: --timeout {timed_out_s:.0f} s ran out before every transaction "
                     f"ended ({v.lost} committed not released yet, {v.pending} pending): no "
                     "verdict on loss; on a slow machine give it longer")
    else:
        lines.append("FAIL: " + "; ".join(v.failures()))
    return lines
