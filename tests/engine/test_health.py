"""/healthz's verdicts: the input lag against a real broker, the driver's timer schedule in a real
file, and the log formats of txstream's own lines."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from tests.support.kafka_helpers import half_record, produce, wait_until
from tests.support.ports import reserve_port
from txstream.errors import BrokerUnavailable
from txstream.kafka import KafkaSettings
from txstream.kafka.partition_health import PartitionTrouble, partition_troubles
from txstream.kafka.reading import partition_ends
from txstream.streaming.engine.health import HealthCheck, HealthThresholds, LagWatch
from txstream.streaming.engine.metric_totals import MetricsBoard
from txstream.timer_schedule import Schedule
from txstream.topics import Topics


def _watch(kafka: KafkaSettings, topics: Topics, board: MetricsBoard) -> LagWatch:
    return LagWatch(kafka, [topics.half, topics.end], board, interval_s=1.0, window_s=60.0)


@pytest.mark.kafka
def test_the_lag_is_what_no_batch_has_read_yet(kafka: KafkaSettings, topics: Topics,
                                              unique: str) -> None:
    board = MetricsBoard()
    board.seed(-1, (), {})  # a new checkpoint: nothing read yet
    produce(kafka, [half_record(topics, f"{unique}-{i}", "g", "real") for i in range(5)])
    watch = _watch(kafka, topics, board)
    try:
        watch.sample()
        lag = watch.lag()
        assert lag is not None and sum(lag.values()) == 5
        assert {topic for topic, _ in lag} <= {topics.half, topics.end}
        read = {pos: end for pos, end in lag.items()}  # a batch read everything
        board.seed(0, (), read)
        watch.sample()
        assert sum((watch.lag() or {}).values()) == 0
    finally:
        watch.close()


@pytest.mark.kafka
def test_a_lag_that_grows_or_is_not_read_is_unhealthy(kafka: KafkaSettings, topics: Topics,
                                                     unique: str) -> None:
    board = MetricsBoard()
    board.seed(-1, (), {})
    watch = _watch(kafka, topics, board)
    check = HealthCheck(lambda: None, board, watch, thresholds=HealthThresholds(1.0, 60.0))
    try:
        for i in range(4):  # records keep coming, no batch reads them
            produce(kafka, [half_record(topics, f"{unique}-{i}", "g", "real")])
            watch.sample()
            time.sleep(0.4)
        healthy, body = check.check()
        assert not healthy and body["input_lag"] == 4, body
        assert "no input read for 1s while 4 records wait" in body["reasons"][0]
        # Read, but less than came in: two records come and one is read each time.
        for i in range(5):
            produce(kafka, [half_record(topics, f"{unique}-{i}-{n}", "g", "real")
                            for n in range(2)])
            ends = wait_until(lambda n=4 + 2 * (i + 1): _ends_at(kafka, topics, n), 10)
            fullest = max(ends, key=lambda pos: ends[pos])
            board.seed(10 + i, (), {**ends, fullest: ends[fullest] - (i + 1)})
            watch.sample()
            time.sleep(0.4)
        healthy, body = check.check()
        assert not healthy and body["input_lag"] == 5, body
        assert "input lag grew for 1s" in body["reasons"][0], body
        board.seed(20, (), ends)
        watch.sample()  # caught up: healthy at once
        healthy, body = check.check()
        assert healthy and body == {"batches": 0, "input_lag": 0, "status": "ok"}, body
    finally:
        watch.close()


def _ends_at(kafka: KafkaSettings, topics: Topics, records: int) -> dict[Any, int] | None:
    """The partitions' ends once they hold ``records`` in all (the broker's high watermark
    may trail an acknowledged write by a fetch)."""
    ends = {(t, p): e for t in (topics.half, topics.end)
            for p, e in partition_ends(kafka, t).items()}
    return ends if sum(ends.values()) == records else None


def test_an_idle_coordinator_is_healthy_and_an_overdue_timer_is_not(tmp_path: Path) -> None:
    schedule = tmp_path / "timers.json"
    board = MetricsBoard()
    check = HealthCheck(lambda: None, board, schedule=schedule,
                        thresholds=HealthThresholds(timer_overdue_s=30.0))
    assert check.check() == (True, {"batches": 0, "status": "ok"})  # no schedule yet
    now_ms = int(time.time() * 1000)
    Schedule({1: now_ms + 60_000, 2: now_ms - 5_000}, batch=3).save(schedule)
    healthy, body = check.check()  # due 5 s ago: within the threshold
    assert healthy and 4 < body["timer_overdue_s"] < 30, body
    Schedule({1: now_ms - 45_000}, batch=4).save(schedule)
    healthy, body = check.check()
    assert not healthy and body["reasons"] == [
        f"a timer is overdue by {body['timer_overdue_s']:.1f}s (--health-timer-overdue 30s)"]
    failed = HealthCheck(lambda: "query failed: boom", board)
    assert failed.check() == (False, {"batches": 0, "status": "unhealthy",
                                      "reasons": ["query failed: boom"]})


def test_a_broker_that_does_not_answer_is_unhealthy_with_the_lag_unknown(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from txstream.streaming.engine import health

    monkeypatch.setattr(health, "PROBE_TIMEOUT_S", 1.0)  # the client's wait, not 8 s
    closed = f"127.0.0.1:{reserve_port()}"  # nothing listens there
    board = MetricsBoard()
    board.seed(3, (), {("half", 0): 5})
    watch = LagWatch(KafkaSettings(bootstrap_servers=closed), ["half", "end"], board)
    check = HealthCheck(lambda: None, board, watch)
    assert check.check()[1]["input_lag"] is None  # not sampled yet: unknown
    with pytest.raises(BrokerUnavailable, match=f"cannot reach Kafka at {closed}"):
        watch.sample()
    away = watch.unreachable()
    assert away is not None and watch.lag() is None
    healthy, body = check.check()
    assert not healthy and body["input_lag"] is None, body
    [reason] = body["reasons"]
    assert re.fullmatch(rf"broker {re.escape(closed)} unreachable for \d+s \(.+\)", reason)
    stopping = HealthCheck(lambda: None, board, watch, stopping=lambda: True)
    assert stopping.check() == (False, {"status": "stopping", "reasons": ["stopping"]})


def test_a_probe_passing_its_timeout_mid_check_never_shows_a_lag_beside_unreachable(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """One /healthz body is one instant: a clock that moves on between the lag and the
    broker's reason (a loaded machine) must not give both "input_lag: 0" and "unreachable"."""
    from txstream.streaming.engine import health

    clock = iter(range(100, 10_000))  # every look at the clock is a second later
    monkeypatch.setattr(health.time, "monotonic", lambda: float(next(clock)))
    board = MetricsBoard()
    watch = LagWatch(KafkaSettings(bootstrap_servers="127.0.0.1:1"), ["half", "end"], board)
    watch._lag = {("half", 0): 0}  # sampled before; a new sample now waits on the broker
    watch._sampling_since = 100.0 - health.PROBE_TIMEOUT_S  # timed out at the next look
    for _ in range(3):  # the probe's timeout passes at one of these checks, or between
        body = HealthCheck(lambda: None, board, watch).check()[1]
        unreachable = any("unreachable" in r for r in body.get("reasons", []))
        assert (body["input_lag"] is None) == unreachable, body


_ISO = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}[+-]\d\d:\d\d"


def _lines(fmt: str) -> tuple[str, str]:
    code = ("import logging; from txstream.streaming.cli.options import set_log_level; "
            f"from txstream.streaming.cli.logs import say; set_log_level('INFO', {fmt!r}); "
            "say('coordinator running'); logging.getLogger('txstream.x').warning('look')")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, check=True)
    return done.stdout.strip(), done.stderr.strip()


def test_txstream_lines_carry_an_iso_8601_time_as_text_or_json() -> None:
    out, err = _lines("text")
    assert re.fullmatch(rf"\[{_ISO}\] coordinator running", out), out
    assert re.fullmatch(rf"{_ISO} WARNING txstream.x: look", err), err
    out, err = _lines("json")
    said, logged = json.loads(out), json.loads(err)
    assert said["message"] == "coordinator running" and said["level"] == "INFO"
    assert logged == {"time": logged["time"], "level": "WARNING", "logger": "txstream.x",
                      "message": "look"}
    assert re.fullmatch(_ISO, said["time"]) and re.fullmatch(_ISO, logged["time"])


class _Described:
    """An admin's describe_topics answer, as Apache Kafka gives it (kafka-python's shapes)."""

    def __init__(self, partitions: dict[str, list[tuple[int, list[int], list[int]]]]) -> None:
        self.partitions = partitions

    def describe_topics(self, topics: list[str]) -> list[dict[str, Any]]:
        return [{"name": t, "error_code": 0 if t in self.partitions else 3, "partitions": [
            {"partition_index": p, "leader_id": leader, "replica_nodes": replicas,
             "isr_nodes": isr} for p, (leader, replicas, isr) in
            enumerate(self.partitions.get(t, []))]} for t in topics]


def test_a_partition_without_a_leader_or_below_its_min_isr_refuses_writes() -> None:
    admin = _Described({"orders": [(0, [0, 1, 2], [0, 1, 2]), (-1, [0, 1, 2], []),
                                   (1, [0, 1, 2], [1])],
                        "history": [(2, [0, 1, 2], [2, 0])]})
    troubles = partition_troubles(admin, ["orders", "history", "gone"],  # type: ignore[arg-type]
                                  {"orders": 2, "history": 2})
    assert [str(t) for t in troubles] == [
        "orders-1 has no leader: writes to it wait",
        "orders-2 has 1 in-sync replica(s) of 3, below min.insync.replicas 2: writes to it "
        "are refused"]
    # Where the broker does not tell min.insync.replicas, Kafka's default (1) holds.
    assert [str(t) for t in partition_troubles(admin, ["orders"])] == [  # type: ignore[arg-type]
        "orders-1 has no leader: writes to it wait"]


def test_healthz_names_the_partitions_that_refuse_writes() -> None:
    class Troubled(LagWatch):
        def troubles(self) -> list[PartitionTrouble]:
            return [PartitionTrouble(f"orders{i}", i, 1, 3, 2, True) for i in range(7)]

    board = MetricsBoard()
    check = HealthCheck(lambda: None, board, Troubled(KafkaSettings(), ["half"], board))
    healthy, body = check.check()
    assert not healthy and body["reasons"] == [
        "partitions refusing writes: " + "; ".join(
            f"orders{i}-{i} has 1 in-sync replica(s) of 3, below min.insync.replicas 2: writes "
            f"to it are refused" for i in range(5)) + " (and 2 more)"]


class _Watch:
    """A lag watch whose broker always answers and whose partitions are as the test says."""

    bootstrap_servers = "127.0.0.1:1"

    def __init__(self) -> None:
        self.troubles: list[str] = []
        self.seen_at: float | None = None

    def sample_partitions(self) -> None:
        if self.troubles:
            self.seen_at = time.monotonic()

    def unreachable(self) -> None:
        return None

    def unreachable_since(self, since: float) -> bool:
        return False

    def troubled(self) -> tuple[float, str] | None:
        return (1.0, "; ".join(self.troubles)) if self.troubles else None

    def troubled_since(self, since: float) -> bool:
        return self.seen_at is not None and self.seen_at >= since


@pytest.mark.fast
def test_a_query_failed_by_a_partition_short_of_replicas_restarts_once_they_are_back() -> None:
    """The broker answers all along: a batch that failed while a partition it needs was short
    of in-sync replicas (a body behind a held high watermark, a refused write) is restarted
    once the partition has them, not ended; a failure with every partition well is ended."""
    import threading

    from txstream.streaming.engine.outage import OutageRide

    watch, said = _Watch(), []
    ride = OutageRide(watch, limit_s=300, emit=said.append, poll_s=0.01)  # type: ignore[arg-type]
    assert ride.verdict("SendFailed: a bug", threading.Event()) == "SendFailed: a bug"
    watch.troubles = ["h-0 has 1 in-sync replica(s) of 2, below min.insync.replicas 2"]
    stop = threading.Event()
    threading.Timer(0.2, lambda: watch.troubles.clear()).start()
    assert ride.verdict("SendFailed: h/0 ends short of offset 5", stop) is None
    ride.restarted()
    assert said == ["the partitions have their replicas: the query restarted from its "
                    "checkpoint (restart 1; it had failed with: SendFailed: h/0 ends short of "
                    "offset 5)"]
    ride_past = OutageRide(watch, limit_s=0.5, poll_s=0.01)  # type: ignore[arg-type]
    watch.troubles = ["h-0 has no leader: writes to it wait"]
    assert ride_past.verdict("SendFailed: x", stop) == (
        "partitions short of in-sync replicas for 1s, past --broker-outage-limit 0.5s (h-0 "
        "has no leader: writes to it wait); the query failed with: SendFailed: x")


@pytest.mark.fast
def test_a_metadata_request_left_unanswered_shows_the_broker_unreachable(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The ends answered, then the broker stopped answering: the partitions' metadata request
    waits out its client's timeout. /healthz says 503 from PROBE_TIMEOUT_S on, as for the
    ends, not 200 for the whole wait; a request refused at once is no absence."""
    import threading

    from txstream.streaming.engine import health

    monkeypatch.setattr(health, "PROBE_TIMEOUT_S", 0.2)
    board = MetricsBoard()
    board.seed(0, (), {})
    watch = LagWatch(KafkaSettings(bootstrap_servers="127.0.0.1:1"), ["half"], board,
                     writes_to=lambda: ["half"])
    answer = threading.Event()
    seen: list[tuple[float, str] | None] = []

    def hung(topics: list[str]) -> Exception:
        seen.append(watch.unreachable())  # asked at once: the broker answers so far
        answer.wait(5.0)
        return TimeoutError("Request timed out after 8000 ms")

    monkeypatch.setattr(watch, "_ends", lambda starts: {})
    monkeypatch.setattr(watch, "_described", hung)
    sampling = threading.Thread(target=watch.sample)
    sampling.start()
    wait_until(lambda: watch.unreachable() is not None, timeout_s=5.0, interval_s=0.05)
    answer.set()
    sampling.join()
    away = watch.unreachable()
    assert seen == [None] and away is not None and "timed out" in away[1], away
    assert watch.unreachable_since(0.0)

    fresh = LagWatch(KafkaSettings(bootstrap_servers="127.0.0.1:1"), ["half"], board,
                     writes_to=lambda: ["half"])
    monkeypatch.setattr(fresh, "_ends", lambda starts: {})
    monkeypatch.setattr(fresh, "_described", lambda topics: PermissionError("ACL"))
    fresh.sample()
    assert fresh.unreachable() is None and not fresh.unreachable_since(0.0)


@pytest.mark.fast
def test_partition_health_asks_again_only_when_a_node_refused_the_connection(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A node of the cluster down refuses the connection: a new client goes to another. A
    broker that does not answer is told at once, not waited for again. The admin client that
    answered is kept for the next ask (a new one costs a connection and metadata)."""
    from txstream.kafka import clients, partition_health

    errors: list[Exception] = []
    calls: list[int] = []

    def make_admin(settings: KafkaSettings) -> Any:
        calls.append(1)
        if errors:
            raise errors.pop(0)
        return SimpleNamespace(close=lambda: None)

    monkeypatch.setattr(clients, "make_admin", make_admin)
    monkeypatch.setattr(partition_health, "min_insync_replicas", lambda admin, topics: {"t": 2})
    trouble = PartitionTrouble("t", 0, 1, 2, 2, True)
    monkeypatch.setattr(partition_health, "partition_troubles",
                        lambda admin, topics, limits: [trouble])
    settings = KafkaSettings(bootstrap_servers="127.0.0.1:1")
    clients.drop_cached_client(("partition-health", settings.key))
    refused = "Kafka broker at 127.0.0.1:1 unreachable: KafkaConnectionError: 111 ECONNREFUSED"
    errors[:] = [BrokerUnavailable(refused), BrokerUnavailable(refused)]
    assert partition_health.troubles_of(settings, ["t"]) == {("t", 0): trouble}
    assert len(calls) == 3
    assert partition_health.troubles_of(settings, ["t"]) == {("t", 0): trouble}
    assert len(calls) == 3  # the kept client asked
    clients.drop_cached_client(("partition-health", settings.key))
    calls.clear()
    errors[:] = [BrokerUnavailable("Kafka broker at 127.0.0.1:1 unreachable after 8 s: "
                                   "KafkaTimeoutError")]
    with pytest.raises(BrokerUnavailable):
        partition_health.troubles_of(settings, ["t"])
    assert len(calls) == 1
