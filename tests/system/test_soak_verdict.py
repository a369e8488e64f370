"""The soak's judge (tests/support/soak_verdict.py) on made-up runs: each way of breaking the
promise is named with its transaction, and a run that kept it has no failure. (The soak
itself, tests/system/test_soak.py, runs only with ``-m soak``.)"""

from __future__ import annotations

from collections import Counter
from types import SimpleNamespace
from typing import Any

from tests.support.soak_verdict import Observed, Verdict
from txstream.wire import H

COMMIT, ROLLBACK, UNKNOW = "COMMIT_MESSAGE", "ROLLBACK_MESSAGE", "UNKNOW"


def _record(key: str, body: bytes = b"b", **headers: str) -> Any:
    return SimpleNamespace(key=key.encode(), value=body, topic="HALF", partition=0, offset=7,
                           headers=[(k, v.encode()) for k, v in headers.items()])


def _sent(txid: str, decision: str, first: str | None = None, end_ack: bool = True
          ) -> list[dict[str, Any]]:
    return [{"ev": "decision", "pid": 1, "txid": txid, "decision": decision,
             "first": first or decision},
            {"ev": "sent", "pid": 1, "txid": txid, "first": first or decision,
             "end_ack": end_ack, "topic": "orders", "body": f"body-{txid}"}]


class Run:
    """A made-up run: ledger entries, and what the topics and the consumer hold."""

    def __init__(self) -> None:
        self.entries: list[dict[str, Any]] = []
        self.o = Observed()
        self.delivered: Counter[str] = Counter()

    def tx(self, txid: str, decision: str | None, outcome: str | None, on_topic: int = 0,
           delivered: int | None = None, **sent: Any) -> None:
        if decision is not None:
            self.entries += _sent(txid, decision, **sent)
        self.o.halves[txid].append(_record(txid, f"body-{txid}".encode()))
        if outcome is not None:
            self.o.history[txid].append({"transaction_id": txid, "event": outcome})
        self.o.on_topic[txid] += on_topic
        self.delivered[txid] += on_topic if delivered is None else delivered

    def verdict(self) -> Verdict:
        return Verdict(self.entries, self.o, self.delivered, consumer_duplicates=0)


def _failed(verdict: Verdict) -> dict[str, set[str]]:
    return {kind: {txid for txid, _ in items} for kind, items in verdict.failures.items()}


def test_a_run_that_kept_the_promise_has_no_failure() -> None:
    run = Run()
    run.tx("C1", COMMIT, "released", on_topic=1)
    run.tx("C2", COMMIT, "released", on_topic=1, first=UNKNOW)
    run.tx("R1", ROLLBACK, "rolled_back")
    run.tx("N1", None, "rolled_back")  # its producer was killed before its local transaction
    run.tx("D1", ROLLBACK, "discarded")
    verdict = run.verdict()
    assert not verdict.failures
    counts = verdict.counts()
    assert (counts["transactions"], counts["released"], counts["rolled_back"],
            counts["discarded"], counts["commit_via_check"]) == (5, 2, 2, 1, 1)


def test_each_broken_promise_is_named_with_its_transaction() -> None:
    run = Run()
    run.tx("ok", COMMIT, "released", on_topic=1)
    run.tx("lost", COMMIT, "released", on_topic=0)  # told released, not on the topic
    run.o.dead_letters["lost"].append("HALF_MESSAGE_LOST: body gone")
    run.tx("lost-by-discard", COMMIT, "discarded", first=UNKNOW)
    run.tx("twice", COMMIT, "released", on_topic=2, delivered=1)
    run.tx("shown", ROLLBACK, "rolled_back", on_topic=1)
    run.tx("never-ran-shown", None, "released", on_topic=1)
    run.tx("waiting", COMMIT, None)
    run.tx("consumer-missed", COMMIT, "released", on_topic=1, delivered=0)
    run.tx("consumer-twice", COMMIT, "released", on_topic=1, delivered=2)
    run.tx("unnoted", COMMIT, "discarded", on_topic=1)  # on the topic, history says otherwise
    run.o.on_topic["nobody"] += 1
    run.entries += _sent("vanished", COMMIT)  # acknowledged, yet not on the half topic
    assert _failed(run.verdict()) == {
        "history_disagrees": {"unnoted"},
        "lost": {"lost", "lost-by-discard"},
        "duplicated": {"twice"},
        "visible_rollback": {"shown", "never-ran-shown"},
        "pending": {"waiting"},
        "not_delivered": {"consumer-missed"},
        "delivered_twice": {"consumer-twice"},
        "phantom": {"nobody"},
        "half_missing": {"vanished"},
    }


def test_a_commits_metric_that_is_not_what_the_real_topics_hold_fails() -> None:
    run = Run()
    run.tx("a", COMMIT, "released", on_topic=1)
    run.tx("b", COMMIT, "released", on_topic=1)
    assert _failed(Verdict(run.entries, run.o, run.delivered, 0, commits_metric=2)) == {}
    assert _failed(Verdict(run.entries, run.o, run.delivered, 0, commits_metric=3)) == {
        "metric_disagrees": {"commits"}}


def test_the_report_tells_how_a_lost_commit_was_made_its_story_and_the_replay() -> None:
    run = Run()
    run.tx("L1", COMMIT, "released", on_topic=0)
    run.o.history["L1"].insert(0, {"transaction_id": "L1", "event": "half"})
    run.o.ends["L1"].append("COMMIT_MESSAGE")
    # A release's dead letter is keyed by the message's KEYS; its ids are in the headers.
    run.o.dead_letters["L1"].append("HALF_MESSAGE_LOST: the body read back is gone")
    verdict = run.verdict()
    report = verdict.failure_report("TXSTREAM_SOAK_SEED=7 replay")
    assert "L1: COMMIT end event acknowledged" in report
    assert "half message still stored at HALF/0@7" in report
    assert '"event": "half"' in report and "HALF_MESSAGE_LOST" in report
    assert "end event COMMIT_MESSAGE" in report
    assert report.endswith("replay: TXSTREAM_SOAK_SEED=7 replay")
    summary = verdict.summary("header", [{"kind": "broker_pause", "pause_s": 3.0}], [])
    assert "lost 1," in summary and "broker_pause 1 (3.0 s)" in summary


def test_a_stored_half_message_whose_send_raised_is_known_by_its_body() -> None:
    run = Run()
    run.entries.append({"ev": "half_failed", "pid": 1, "error": "timed out", "body": "body-F"})
    run.o.halves["F"].append(_record("F", b"body-F", **{H.UNIQ_KEY: "F"}))
    run.o.history["F"].append({"transaction_id": "F", "event": "rolled_back"})
    verdict = run.verdict()
    assert not verdict.failures
    assert verdict.counts()["failed_send_but_stored"] == 1
