"""The parts of ``txstream demo --recovery`` that need neither Spark nor a broker: the producers'
ledger and its answers, the verdict, the picture's data and page, the process tree frozen and
killed whole, the checkpoint's batch in flight, the flags."""

from __future__ import annotations

import io
import json
import os
import re
import threading
import time
from collections import Counter
from pathlib import Path

import pytest

from txstream.errors import ConfigError
from txstream.message import Decision, Message
from txstream.streaming.cli import build_parser
from txstream.streaming.cli.coordinator_process import (
    CoordinatorProcess,
    alive,
    descendants,
    in_flight_batch,
)
from txstream.streaming.cli.demo_recovery import RecoveryDemo, RecoveryOptions
from txstream.streaming.cli.recovery_chart import chart_data, render_html, render_svg, write_chart
from txstream.streaming.cli.recovery_command import recovery_options
from txstream.streaming.cli.recovery_crash import Crash, Pause
from txstream.streaming.cli.recovery_ledger import PLANS, Ledger, LedgerListener
from txstream.streaming.cli.recovery_live import Live
from txstream.streaming.cli.recovery_story import in_flight_release, replay_said, seen_lines
from txstream.streaming.cli.recovery_verdict import judge, verdict_lines
from txstream.streaming.cli.recovery_watch import Release


@pytest.fixture
def ledger(tmp_path: Path) -> Ledger:
    led = Ledger(tmp_path / "ledger.sqlite")
    yield led
    led.close()


def _ran(ledger: Ledger, txid: str, plan: str, told: bool = True) -> None:
    ledger.ran(txid, PLANS[plan])
    if told:
        ledger.told(txid)


def test_a_check_is_answered_from_the_ledger_by_transaction_id(ledger: Ledger) -> None:
    listener = LedgerListener(ledger)
    msg = Message("Orders", b"x", transaction_id="T1")
    assert listener.execute_local_transaction(msg, PLANS["unknown-commit"]) is Decision.UNKNOW
    assert ledger.told_commits_before(time.time() + 1) == set()  # UNKNOW told nothing yet
    assert listener.check_local_transaction(msg) is Decision.COMMIT_MESSAGE
    assert ledger.told_commits_before(time.time() + 1) == {"T1"}
    # A half message whose send raised never ran its local transaction: rolled back.
    ghost = Message("Orders", b"y", transaction_id="T2")
    assert listener.check_local_transaction(ghost) is Decision.ROLLBACK_MESSAGE
    counts = ledger.counts()
    assert (counts.sent, counts.committed, counts.unknown_first, counts.checks_answered) == (
        1, 1, 1, 1)


def _mixed(ledger: Ledger) -> None:
    _ran(ledger, "C1", "commit")
    _ran(ledger, "C2", "unknown-commit", told=False)
    _ran(ledger, "R1", "rollback")
    ledger.in_doubt("D1")


def test_the_verdict_passes_when_each_commit_is_released_once(ledger: Ledger) -> None:
    _mixed(ledger)
    v = judge(ledger, Counter({"C1": 1, "C2": 1, "other-run": 2}), {"R1": "rolled_back"},
              Counter({"C1": 1, "C2": 1}))
    assert (v.released, v.lost, v.doubled, v.visible_rollbacks, v.pending) == (2, 0, 0, 0, 0)
    assert v.ok and v.records == 2
    lines = verdict_lines(v, "Orders", [])
    assert lines[-1] == "PASS: lost 0, doubled 0, pending 0"
    assert "released 2 of 2 committed: lost 0, doubled 0" in "\n".join(lines)
    paused = verdict_lines(v, "Orders", [], [Pause(100.0, 104.0, caught_up_at=111.0)])
    assert re.search(r"^  broker paused \S+ for 4.0 s; caught up 7.0 s after it came back$",
                     paused[-2])


def test_the_verdict_fails_on_a_copy_a_loss_a_visible_rollback_and_a_pending_one(
    ledger: Ledger
) -> None:
    _mixed(ledger)
    _ran(ledger, "R2", "unknown-rollback", told=False)
    v = judge(ledger, Counter({"C1": 2, "R1": 1, "D1": 1}), {}, Counter({"C1": 1}))
    assert (v.lost, v.doubled, v.visible_rollbacks, v.pending) == (1, 1, 2, 2)
    assert not v.ok
    fail = verdict_lines(v, "Orders", [])[-1]
    assert fail.startswith("FAIL: 1 committed messages lost; 1 released twice; 2 rolled-back")
    assert "2 transactions still pending" in fail and "handed 1 of 2" in fail


def test_a_run_out_of_time_is_no_verdict_on_loss(ledger: Ledger) -> None:
    """The demo's --timeout ran out with commits not released yet: it fails, and says that
    it did not judge them lost; a copy is a failure all the same."""
    _mixed(ledger)
    v = judge(ledger, Counter({"R1": 0}), {"R1": "rolled_back"}, Counter())
    assert v.lost == 2 and not v.ok
    lines = verdict_lines(v, "Orders", [], timed_out_s=660.0)
    assert "committed: not released yet 2, doubled 0" in "\n".join(lines)
    assert lines[-1].startswith("FAIL: --timeout 660 s ran out before every transaction ended "
                                "(2 committed not released yet")
    doubled = judge(ledger, Counter({"C1": 2}), {}, Counter())
    assert verdict_lines(doubled, "Orders", [], timed_out_s=660.0)[-1].startswith(
        "FAIL: 1 committed messages lost; 1 released twice")


def test_a_consumer_handed_a_message_twice_fails_the_verdict(ledger: Ledger) -> None:
    _ran(ledger, "C1", "commit")
    v = judge(ledger, Counter({"C1": 1}), {}, Counter({"C1": 2}))
    assert v.consumer_extra == 1 and not v.ok


def _crash(t0: float) -> Crash:
    return Crash(1, t0 + 5.2, 7, True, 12, [Release("A", t0 + 5.1, 0, 3)], 0,
                 restart_at=t0 + 8.0, first_release_at=t0 + 30.5, caught_up_at=t0 + 33.0,
                 backlog=40)


def test_the_picture_marks_the_crash_and_counts_releases_by_the_second(tmp_path: Path) -> None:
    t0 = 1_800_000_000.0
    releases = [Release("A", t0 + 5.1, 0, 3), Release("B", t0 + 30.6, 0, 4),
                Release("C", t0 + 30.9, 1, 0), Release("C", t0 + 31.2, 1, 1)]
    data = chart_data(started=t0 + 0.4, ended=t0 + 40, releases=releases,
                      commits=[t0 + 1.5, t0 + 20.0], crashes=[_crash(t0)], pauses=[],
                      verdict=["PASS: lost 0, doubled 0, pending 0"])
    assert data["seconds"] == 40
    assert data["released_per_second"][5] == 1 and data["released_per_second"][30:32] == [2, 1]
    assert sum(data["released_per_second"][6:30]) == 0
    assert data["committed_per_second"][1] == 1 and data["committed_per_second"][20] == 1
    assert [(m["kind"], m["t"]) for m in data["marks"]] == [
        ("crash", 5.2), ("restart", 8.0), ("first_release", 30.5), ("caught_up", 33.0)]
    assert data["bands"] == [{"kind": "down", "from": 5.2, "to": 8.0},
                             {"kind": "recovering", "from": 8.0, "to": 33.0}]
    page = write_chart(tmp_path, data)
    html = page.read_text()
    assert html == render_html(data)
    assert '<line class="mark crash"' in html and '<rect class="band down"' in html
    assert html.count('<rect class="released"') == 3  # one bar per second with releases
    embedded = re.search(r'<script type="application/json" id="recovery-data">(.*)</script>',
                         html)
    assert embedded and json.loads(embedded.group(1)) == data
    assert json.loads((tmp_path / "recovery.json").read_text()) == data
    assert (tmp_path / "recovery.svg").read_text() == render_svg(data) + "\n"


def test_the_story_picks_a_release_whose_note_came_after_the_restart() -> None:
    t0 = 1_800_000_000.0
    crash = _crash(t0)
    crash.releases = [Release("early", t0 + 5.0, 0, 1), Release("late", t0 + 5.1, 0, 2)]
    assert in_flight_release(crash, {"early": t0 + 5.1, "late": t0 + 31.0}).txid == "late"
    crash.releases = []
    assert in_flight_release(crash, {}) is None


def test_what_the_demo_saw_of_a_transaction_is_told_in_time_order() -> None:
    t0 = 1_800_000_000.0
    crash = _crash(t0)  # release at 5.1, crash at 5.2, restart at 8.0
    once = seen_lines(crash.releases[0], crash, t0 + 5.15, crash.releases, 1, "Orders")
    assert ["release written" in once[0], "note written, before the crash" in once[1],
            "crash" in once[2], "restart" in once[3]] == [True] * 4
    assert once[-1] == "  Orders holds it once; the consumer was handed it once"
    # A replay that wrote the release again: said, and the topic holds it twice.
    copy = Release("A", t0 + 31.0, 0, 9)
    twice = seen_lines(crash.releases[0], crash, t0 + 31.1, [*crash.releases, copy], 2,
                       "Orders")
    assert "the replay wrote its release AGAIN (partition 0, offset 9)" in twice[3]
    assert "the replay wrote its 'released' note" in twice[4]
    assert twice[-1] == "  Orders holds it 2 times; the consumer was handed it 2 times"


def _state(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0]


def test_a_process_tree_is_frozen_and_killed_whole_even_a_child_in_its_own_session(
    tmp_path: Path
) -> None:
    # As pyspark's daemon does, one child leaves the tree's process group (setsid).
    tree = CoordinatorProcess([], tmp_path / "tree.log",
                              command=("sh", "-c", "setsid sleep 60 & sleep 60 & wait"))
    tree.start()
    assert tree.proc is not None
    deadline = time.monotonic() + 10
    while len(descendants(tree.proc.pid)) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    pids = [tree.proc.pid, *descendants(tree.proc.pid)]
    assert len(pids) == 3
    tree.freeze()
    assert {_state(p) for p in pids} == {"T"}
    tree.thaw()
    assert "T" not in {_state(p) for p in pids}
    tree.freeze()
    assert tree.kill() == 3
    assert not any(alive(p) for p in pids) and not tree.running


def test_the_batch_in_flight_is_planned_and_not_committed(tmp_path: Path) -> None:
    assert in_flight_batch(tmp_path) is None
    for log, ids in (("offsets", (0, 1, 2)), ("commits", (0, 1))):
        (tmp_path / log).mkdir()
        for i in ids:
            (tmp_path / log / str(i)).write_text("v1")
    (tmp_path / "offsets" / ".2.crc").write_text("")
    assert in_flight_batch(tmp_path) == 2
    (tmp_path / "commits" / "2").write_text("v1")
    assert in_flight_batch(tmp_path) is None


def _args(*flags: str) -> object:
    return build_parser().parse_args(["demo", "--recovery", *flags])


def test_the_flags_are_checked_before_anything_starts(tmp_path: Path) -> None:
    o = recovery_options(_args("--checkpoint-dir", str(tmp_path), "--faults", "kill,kill,pause"))
    assert o.faults == ("kill", "kill", "pause") and o.kafka is None
    assert (o.topic, o.group, o.checkpoint) == ("Orders", "orders", tmp_path / "checkpoint")
    assert o.policy == ("--transaction-timeout", "2s", "--check-interval", "2s", "--trigger",
                        "200ms")
    with pytest.raises(ConfigError, match="--faults takes"):
        recovery_options(_args("--faults", "kill,explode"))
    with pytest.raises(ConfigError, match="not with --bootstrap-servers"):
        recovery_options(_args("--faults", "pause", "--bootstrap-servers", "127.0.0.1:1"))
    outside = recovery_options(_args("--bootstrap-servers", "127.0.0.1:1"))
    assert outside.topics.prefix.startswith("recovery") and outside.topic.startswith("Orders_")


def test_the_story_quotes_what_the_restarted_sink_said_of_the_replay() -> None:
    log = ("batch 2 was a replay: 3 records its first run had written were not written again\n"
           "batch 12 was a replay: 9 records its first run had written were not written again\n")
    assert replay_said(log, 12) == ("batch 12 was a replay: 9 records its first run had "
                                    "written were not written again")
    assert replay_said(log, 7) is None and replay_said("", None) is None


def test_enter_on_a_terminal_brings_the_fault_now(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    reading, writing = os.pipe()
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.FileIO(reading, "r")))
    demo = RecoveryDemo(RecoveryOptions(folder=tmp_path, kill_after=120.0, key_press=True))
    threading.Thread(target=demo._read_keys, daemon=True).start()
    waited: list[float] = []

    def moment() -> None:
        started = time.monotonic()
        demo._moment("kill")
        waited.append(time.monotonic() - started)

    waiting = threading.Thread(target=moment)
    waiting.start()
    time.sleep(0.5)
    assert not waited  # the moment is 120 s away: nothing yet
    os.write(writing, b"\n")
    waiting.join(timeout=10)
    assert waited and waited[0] < 10, waited  # Enter brought it, not the 120 s
    os.close(writing)


def test_the_final_chart_stays_up_on_a_terminal_until_enter(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Without --ui, or off a terminal, the run ends at once.
    RecoveryDemo(RecoveryOptions(folder=tmp_path, key_press=True))._hold_console()
    RecoveryDemo(RecoveryOptions(folder=tmp_path, ui_port=0))._hold_console()
    reading, writing = os.pipe()
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.FileIO(reading, "r")))
    demo = RecoveryDemo(RecoveryOptions(folder=tmp_path, key_press=True, ui_port=0))
    threading.Thread(target=demo._read_keys, daemon=True).start()
    holding = threading.Thread(target=demo._hold_console)
    holding.start()
    time.sleep(1.0)
    assert holding.is_alive()  # the console is held for the user
    os.write(writing, b"\n")
    holding.join(timeout=10)
    assert not holding.is_alive()
    os.close(writing)


class _Seen:
    def copies(self) -> Counter[str]:
        return Counter()

    def ended_otherwise(self) -> dict[str, str]:
        return {}


def test_a_state_shorter_than_the_lines_second_is_still_on_a_line(
        ledger: Ledger, capsys: pytest.CaptureFixture[str]) -> None:
    """The coordinator is down for ``--down`` seconds (1 in the system test): under load the
    once-a-second line could miss it. Entering the state prints the line at once."""
    live = Live(ledger, _Seen())  # type: ignore[arg-type]
    live.mark("*** CRASH 1: SIGKILL", state="DOWN")
    live.state = "recovering"
    out = capsys.readouterr().out.splitlines()
    assert out[0].endswith("*** CRASH 1: SIGKILL")
    assert out[1].endswith("| coordinator DOWN")
