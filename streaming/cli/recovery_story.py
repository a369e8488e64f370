"""The story of one transaction that was in flight at a crash: what ``txstream history`` says of
it, and what the demo saw around it on the real topic.

Its release was written by the batch the crash cut short; the history notes of a batch are
written after its releases (docs/decisions/0030-notes-after-releases.md), so its ``released``
note was usually not written yet. The restarted coordinator ran that batch again from the
checkpoint, found the release by its record id and wrote only the note
(docs/decisions/0005-replay-check.md). A note carries its batch's time, which the replay keeps:
the note is dated before the crash though written after the restart.
"""

from __future__ import annotations

import re
from collections import Counter

from txstream.console.index import MEMORY, Index
from txstream.kafka import KafkaSettings
from txstream.streaming.cli.history import trail_lines
from txstream.streaming.cli.recovery_crash import Crash
from txstream.streaming.cli.recovery_verdict import clock
from txstream.streaming.cli.recovery_watch import Release
from txstream.streaming.cli.transaction_trail import index_feed, trail_of
from txstream.topics import Topics

__all__ = ["in_flight_release", "story_lines", "replay_said", "seen_lines"]


def in_flight_release(crash: Crash, noted_at: dict[str, float | None]) -> Release | None:
    """A release the crashed batch wrote, preferably one whose note came after the restart."""
    if not crash.releases:
        return None
    restart = crash.restart_at or crash.at
    late = [r for r in crash.releases if (noted_at.get(r.txid) or 0) >= restart]
    return (late or crash.releases)[0]


def seen_lines(release: Release, crash: Crash, noted: float | None, copies: list[Release],
               received: int, real_topic: str) -> list[str]:
    """What the demo saw of ``release``'s transaction around ``crash``, in time order."""
    # (time, text), sorted at the end: the note may come before or after the crash.
    events = [(release.at, f"its release written to {real_topic} (partition "
                           f"{release.partition}, offset {release.offset}) by batch {crash.batch}"),
              (crash.at, f"crash: the coordinator SIGKILLed, batch {crash.batch} not committed")]
    if crash.restart_at is not None:
        events.append((crash.restart_at, "restart from the same checkpoint: batch "
                                         f"{crash.batch} runs again"))
    again = [r for r in copies if r.at > crash.at]
    events += [(r.at, f"the replay wrote its release AGAIN (partition {r.partition}, offset "
                      f"{r.offset})") for r in again]
    if noted is not None and noted < crash.at:
        events.append((noted, "its 'released' note written, before the crash"))
    elif noted is not None:
        what = "wrote its 'released' note" if again else (
            "found the release by its record id and wrote only its 'released' note")
        events.append((noted, f"the replay {what}"))
    lines = [f"  {clock(at)}  {text}" for at, text in sorted(events, key=lambda e: e[0])]
    times = "once" if len(copies) == 1 else f"{len(copies)} times"
    lines.append(f"  {real_topic} holds it {times}; the consumer was handed it "
                 f"{'once' if received == 1 else f'{received} times'}")
    return lines


def replay_said(log: str, batch: int | None) -> str | None:
    """What the restarted coordinator's sink logged of replaying ``batch``, if it did."""
    found = re.search(rf"batch {batch} was a replay: [^\n]*", log)
    return found.group(0) if found else None


def story_lines(settings: KafkaSettings, topics: Topics, crash: Crash, real_topic: str,
                noted_at: dict[str, float | None], releases: list[Release],
                received: Counter[str], replay_log: str = "") -> list[str]:
    release = in_flight_release(crash, noted_at)
    if release is None:
        return [f"no transaction's release was in flight at crash {crash.number}: "
                f"{crash.describe()}"]
    with Index(MEMORY) as index:
        with index_feed(index, settings, topics) as feed:
            feed.catch_up()
        trail = trail_of(index, release.txid)
    prefix = f" --topic-prefix {topics.prefix}" if topics.prefix else ""
    lines = [f"the story of a transaction in flight at crash {crash.number} "
             f"(txstream history {release.txid}{prefix}):",
             *trail_lines(trail, release.txid),
             "what the demo saw of it:",
             *seen_lines(release, crash, noted_at.get(release.txid),
                    [r for r in releases if r.txid == release.txid],
                    received[release.txid], real_topic)]
    said = replay_said(replay_log, crash.batch)
    if said:
        lines.append(f"  the restarted coordinator's log: {said}")
    return lines
