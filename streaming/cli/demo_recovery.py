"""``txstream demo --recovery``: the coordinator crashed under traffic, in front of the user,
and the proof that nothing was lost.

It starts a broker (the embedded tansu, Apache Kafka with ``--kafka``, or uses
``--bootstrap-servers``), the coordinator as a process of its own (``txstream run`` with the
demo's checkpoint and short timeouts), producers of one group at a steady rate and a consumer.
Then it SIGKILLs the coordinator's whole process tree in the middle of a micro-batch that has
written part of its records (:mod:`~txstream.streaming.cli.recovery_crash`), and restarts it
from the same checkpoint. A line a second says what was sent, committed, released, rolled back
and pending, and the coordinator's state. At the end: the verdict from the real topic and the
producers' own records, the story of a transaction the crash cut short, and a picture of the
run (an HTML page beside the checkpoint). It stops all it started, also on Ctrl-C, and keeps
its folder. With ``--cluster`` the coordinator is spark-submitted to a standalone cluster of
pyspark's own distribution, and an executor is killed as well as the driver.
"""

from __future__ import annotations

import re
import sys
import threading
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from txstream.broker import EmbeddedBroker
from txstream.errors import TxStreamError
from txstream.kafka import KafkaSettings, wait_for_broker
from txstream.kafka.provision import coordinator_topics, ensure_topics, topic_spec
from txstream.kafka_broker import KafkaBroker
from txstream.streaming.cli.coordinator_process import CoordinatorProcess, batch_ids
from txstream.streaming.cli.recovery_chart import chart_data, write_chart
from txstream.streaming.cli.recovery_crash import (
    Crash,
    Pause,
    crash_mid_batch,
    kill_executors,
    pause_broker,
)
from txstream.streaming.cli.recovery_ledger import Ledger
from txstream.streaming.cli.recovery_live import Live, say
from txstream.streaming.cli.recovery_story import story_lines
from txstream.streaming.cli.recovery_traffic import ReleaseConsumer, Traffic
from txstream.streaming.cli.recovery_verdict import judge, verdict_lines
from txstream.streaming.cli.recovery_watch import Release, TopicWatch
from txstream.streaming.cli.spark_standalone import StandaloneCluster, submit_command
from txstream.topics import Topics

__all__ = ["RecoveryOptions", "RecoveryDemo", "Launch", "DemoFailed", "local_launch",
           "cluster_launch"]

# How the demo starts a coordinator: ``txstream run ARGS``, its output to the log file.
Launch = Callable[[list[str], Path], CoordinatorProcess]


def local_launch(args: list[str], log: Path) -> CoordinatorProcess:
    return CoordinatorProcess(args, log)


def cluster_launch(cluster: StandaloneCluster) -> Launch:
    """``txstream run`` spark-submitted to ``cluster`` (client mode: the driver is the tree's)."""
    def launch(args: list[str], log: Path) -> CoordinatorProcess:
        return CoordinatorProcess(args, log, command=submit_command(
            cluster, "spark.ui.enabled=false"), cwd=log.parent)

    return launch


class DemoFailed(TxStreamError):
    """The demo could not go on (the coordinator exited on its own, a client failed)."""


@dataclass
class RecoveryOptions:
    folder: Path
    rate: float = 5.0
    kill_after: float = 10.0
    faults: tuple[str, ...] = ("kill",)
    down_s: float = 3.0
    pause_s: float = 5.0
    tail_s: float = 8.0
    producers: int = 2
    seed: int = 43
    topic: str = "Orders"
    group: str = "orders"
    kafka: KafkaSettings | None = None  # a Kafka of the user's; None: a broker of the demo's
    apache_kafka: bool = False
    topics: Topics = field(default_factory=Topics)
    policy: tuple[str, ...] = ("--transaction-timeout", "2s", "--check-interval", "2s",
                               "--trigger", "200ms")
    timeout_s: float = 600.0
    key_press: bool = False
    ui_port: int | None = None  # the console's port (--ui); None: no console
    cluster: bool = False  # spark-submit to a standalone cluster of the demo's

    @property
    def checkpoint(self) -> Path:
        return self.folder / "checkpoint"


class RecoveryDemo:
    """One run of the demo; :meth:`run` returns the exit code (0: the verdict passed)."""

    def __init__(self, options: RecoveryOptions, launch: Launch = local_launch) -> None:
        self.o = options
        self.launch = launch
        self.broker: EmbeddedBroker | KafkaBroker | None = None
        self.coordinator: CoordinatorProcess | None = None
        self.cluster: StandaloneCluster | None = None
        self._settings: KafkaSettings | None = None
        self._supervised: Pause | None = None  # a fault whose coordinator exit is restarted
        self.started = 0
        self.crashes: list[Crash] = []
        self.pauses: list[Pause] = []
        self.deadline = time.monotonic() + options.timeout_s
        self._enter = threading.Event()
        self._chart: Callable[[], dict[str, Any]] | None = None  # the run's chart so far
        self._final: dict[str, Any] | None = None

    # --- start --------------------------------------------------------------------------------

    def _connect(self, stack: ExitStack) -> KafkaSettings:
        if self.o.kafka is not None:
            return self.o.kafka
        if self.o.apache_kafka:
            self.broker = KafkaBroker()
            say("starting Apache Kafka (1 KRaft node)")
        else:
            self.broker = EmbeddedBroker()
            say("starting the embedded tansu broker")
        stack.callback(self.broker.stop)
        self.broker.start()
        say(f"broker listening on {self.broker.bootstrap_servers}")
        return KafkaSettings(bootstrap_servers=self.broker.bootstrap_servers)

    def _start_cluster(self, stack: ExitStack) -> None:
        say("starting a Spark standalone cluster from pyspark's distribution (a master, a "
            "worker of 2 cores)")
        self.cluster = StandaloneCluster(self.o.folder / "cluster")
        stack.callback(self.cluster.stop)
        self.cluster.start()
        self.launch = cluster_launch(self.cluster)
        say(f"cluster up at {self.cluster.url}; the coordinator is spark-submitted to it")

    def _start_coordinator(self, settings: KafkaSettings) -> None:
        self.started += 1
        args = ["--bootstrap-servers", settings.bootstrap_servers, "--checkpoint-dir",
                str(self.o.checkpoint), *self.o.policy, "--broker-timeout", "60"]
        if self.o.topics.prefix:
            args += ["--topic-prefix", self.o.topics.prefix]
        log = self.o.folder / f"coordinator-{self.started}.log"
        self.coordinator = self.launch(args, log).start()
        say(f"coordinator {self.started} started as a process tree of its own (txstream run "
            f"--checkpoint-dir {self.o.checkpoint} ...; output in {log.name})")

    def _stop_coordinator(self) -> None:
        if self.coordinator is not None and self.coordinator.running:
            say("stopping the coordinator")
            self.coordinator.terminate(timeout_s=30)

    def _check_coordinator(self) -> None:
        coordinator = self.coordinator
        if coordinator is None or coordinator.running:
            return
        tail = coordinator.output()[-2000:]
        supervised = self._supervised
        if supervised is None or self._settings is None:
            raise DemoFailed(f"the coordinator exited on its own:\n{tail}")
        # An executor lost with shuffle output fails the batch: no stage runs again within a
        # batch (docs/semantics.md); it runs again from the checkpoint once the coordinator is
        # restarted, which the demo does as a supervisor would.
        failed = re.search(r"coordinator failed: ([^\n]{0,160})", tail)
        supervised.restarts += 1
        say(f"*** the coordinator stopped the batch ({failed.group(1) if failed else 'exited'}"
            "...): a stage is not run again within a batch; restarted from the checkpoint, "
            "as a supervisor would")
        self._start_coordinator(self._settings)

    def _wait(self, done: Callable[[], bool], what: str, interval_s: float = 0.2) -> bool:
        """Wait for ``done``, the coordinator watched meanwhile; False at the demo's timeout."""
        while not done():
            self._check_coordinator()
            if time.monotonic() > self.deadline:
                say(f"timed out waiting for {what}")
                return False
            time.sleep(interval_s)
        return True

    # --- the run ------------------------------------------------------------------------------

    def run(self, stack: ExitStack) -> int:
        o = self.o
        o.folder.mkdir(parents=True, exist_ok=True)
        say(f"the demo's folder (kept at the end): {o.folder}")
        settings = self._settings = self._connect(stack)
        wait_for_broker(settings, timeout_s=60)
        ensure_topics(settings, [topic_spec("real", o.topic), *coordinator_topics(o.topics)],
                      "txstream topics create")
        ledger = Ledger(o.folder / "local-transactions.sqlite")
        stack.callback(ledger.close)
        if o.cluster:  # stopped after the coordinator: the stack unwinds last in, first out
            self._start_cluster(stack)
        stack.callback(self._stop_coordinator)
        self._start_coordinator(settings)
        traffic = Traffic(settings, o.topics, group=o.group, topic=o.topic, ledger=ledger,
                          rate=o.rate, producers=o.producers, seed=o.seed).start()
        stack.callback(traffic.close)
        consumer = ReleaseConsumer(settings, o.topics, o.topic).start()
        stack.callback(consumer.close)
        watch = TopicWatch(settings, o.topics, o.topic).start()
        stack.callback(watch.close)
        live = Live(ledger, watch)
        shown_from = [time.time()]  # the chart's start: the traffic's, once it began
        self._chart = lambda: self._chart_data(shown_from[0], ledger, watch, [])
        if o.ui_port is not None:
            self._console(stack, settings)
        if not self._wait(lambda: bool(batch_ids(o.checkpoint, "commits")), "the coordinator"):
            return 1
        live.state = "running"
        say(f"coordinator running: {o.producers} producers of group {o.group} send {o.rate:g} "
            f"transactions a second to {o.topic} (commits, rollbacks, and UNKNOW answers "
            "settled by back-checks); a consumer reads it")
        began = shown_from[0] = time.time()
        traffic.begin()
        stack.enter_context(live.printing())
        self._faults(settings, ledger, watch, live)
        drained = self._drain(traffic, ledger, watch, consumer, live)
        code = self._finish(settings, ledger, watch, consumer, began, live, drained)
        self._hold_console()
        return code

    def _console(self, stack: ExitStack, settings: KafkaSettings) -> None:
        # Only with --ui: the console's web framework is an extra a light install lacks.
        from txstream.streaming.cli.recovery_ui import RECOVERY_PATH, chart_page, start_console

        assert self.o.ui_port is not None and self._chart is not None
        chart = self._chart
        server = start_console(self.o.folder, settings, self.o.topics, self.o.ui_port,
                               lambda: chart_page(self._final or chart(), bool(self._final)))
        stack.callback(server.close)
        say(f"the console: {server.url}/ (this run's chart: {server.url}{RECOVERY_PATH})")

    def _hold_console(self) -> None:
        """On a terminal with --ui, the final chart stays up until Enter (or Ctrl-C)."""
        if self.o.ui_port is None or not self.o.key_press:
            return
        say("the console stays up with the final chart: press Enter to stop it")
        self._enter.clear()
        while not self._enter.wait(0.5):  # a timed wait: Ctrl-C still interrupts it
            pass

    def _chart_data(self, began: float, ledger: Ledger, watch: TopicWatch,
                    verdict: list[str]) -> dict[str, Any]:
        return chart_data(started=began, ended=time.time(), releases=_ours(ledger, watch),
                          commits=ledger.commit_times(), crashes=self.crashes,
                          pauses=self.pauses, verdict=verdict)

    def _moment(self, fault: str) -> None:
        """Wait ``--kill-after`` seconds, or for Enter."""
        enter = " (or press Enter)" if self.o.key_press else ""
        say(f"next fault, {fault}, in {self.o.kill_after:g} s{enter}")
        deadline = time.monotonic() + self.o.kill_after
        self._wait(lambda: time.monotonic() > deadline or self._enter.is_set(), "the moment")
        self._enter.clear()

    def _faults(self, settings: KafkaSettings, ledger: Ledger, watch: TopicWatch,
                live: Live) -> None:
        if self.o.key_press:
            threading.Thread(target=self._read_keys, name="recovery-keys", daemon=True).start()
        for fault in self.o.faults:
            self._moment(fault)
            if fault == "pause":
                self._pause(ledger, watch, live)
            elif fault == "executor":
                self._kill_executor(ledger, watch, live)
            else:
                self._crash(settings, ledger, watch, live)

    def _read_keys(self) -> None:
        for _line in sys.stdin:
            self._enter.set()

    def _crash(self, settings: KafkaSettings, ledger: Ledger, watch: TopicWatch,
               live: Live) -> None:
        assert self.coordinator is not None
        number = len(self.crashes) + 1
        say(f"crash {number}: waiting for a micro-batch in flight that has written releases")
        crash = crash_mid_batch(number, self.coordinator, self.o.checkpoint, settings,
                                self.o.topic, self.o.topics.history)
        self.crashes.append(crash)
        live.mark(f"*** CRASH {number}: SIGKILL of the coordinator's {crash.processes} "
                  f"processes; {crash.describe()}", state="DOWN")
        time.sleep(self.o.down_s)  # a supervisor's restart delay; the traffic goes on
        crash.restart_at = time.time()
        self._start_coordinator(settings)
        live.state = "recovering"
        live.mark("*** RESTART from the same checkpoint")
        restart = crash.restart_at
        if not self._wait(lambda: watch.first_release_after(restart) is not None,
                          "the first release"):
            return
        crash.first_release_at = first = watch.first_release_after(restart) or restart
        # The backlog: what the producers committed until the coordinator worked again.
        owed = ledger.told_commits_before(first)
        crash.backlog = len(owed - {r.txid for r in watch.releases() if r.at < crash.at})
        live.mark(f"*** first release after the restart: +{first - restart:.1f} s; "
                  f"{crash.backlog} commits wait to be released")
        crash.caught_up_at = self._caught_up(owed, watch, restart, live)

    def _caught_up(self, owed: set[str], watch: TopicWatch, since: float,
                   live: Live) -> float | None:
        """When the last of ``owed`` was released (its record's time), once all are."""
        if not self._wait(lambda: owed <= set(watch.copies()), "the coordinator to catch up"):
            return None
        firsts: dict[str, float] = {}
        for r in watch.releases():
            firsts.setdefault(r.txid, r.at)
        at = max([since, *(firsts[t] for t in owed if firsts[t] >= since)])
        at = max(at, watch.first_release_after(since) or since)
        live.state = "CAUGHT UP"
        live.mark(f"*** caught up: every commit made before it came back is released, "
                  f"+{at - since:.1f} s after")
        return at

    def _pause(self, ledger: Ledger, watch: TopicWatch, live: Live) -> None:
        assert self.broker is not None
        live.state = "broker paused"
        live.mark(f"*** BROKER PAUSED (SIGSTOP) for {self.o.pause_s:g} s")
        pause = pause_broker(self.broker, self.o.pause_s)
        self.pauses.append(pause)
        live.state = "recovering"
        live.mark("*** broker back (SIGCONT)")
        owed = ledger.told_commits_before(pause.until)
        pause.caught_up_at = self._caught_up(owed, watch, pause.until, live)

    def _kill_executor(self, ledger: Ledger, watch: TopicWatch, live: Live) -> None:
        assert self.cluster is not None
        live.mark("*** EXECUTOR KILLED: SIGKILL of the worker's executors, tasks and all")
        killed = kill_executors(self.cluster)
        if killed is None:
            live.mark("no executor was running: nothing killed")
            return
        self.pauses.append(killed)
        live.state = "recovering"
        live.mark(f"*** the worker runs a new executor, {killed.until - killed.at:.1f} s after")
        owed = ledger.told_commits_before(killed.until)
        self._supervised = killed
        try:
            killed.caught_up_at = self._caught_up(owed, watch, killed.until, live)
        finally:
            self._supervised = None

    # --- the end ------------------------------------------------------------------------------

    def _drain(self, traffic: Traffic, ledger: Ledger, watch: TopicWatch,
               consumer: ReleaseConsumer, live: Live) -> bool:
        time.sleep(self.o.tail_s)
        traffic.stop_sending()
        live.mark("traffic stopped: waiting for every transaction to end")

        def settled() -> bool:
            visible = set(watch.copies())
            ended = watch.ended_otherwise()
            committed = ledger.committed()
            return (all(t in visible or t in ended for t in ledger.sent())
                    and committed <= set(consumer.snapshot()))

        drained = self._wait(settled, "every transaction to end", interval_s=0.5)
        time.sleep(1.5)  # a late copy would be written by now
        return drained

    def _finish(self, settings: KafkaSettings, ledger: Ledger, watch: TopicWatch,
                consumer: ReleaseConsumer, began: float, live: Live, drained: bool) -> int:
        live.stop()
        copies, received = watch.copies(), consumer.snapshot()
        verdict = judge(ledger, copies, watch.ended_otherwise(), received)
        lines = verdict_lines(verdict, self.o.topic, self.crashes, self.pauses,
                              None if drained else self.o.timeout_s)
        for line in lines:
            say(line)
        releases = _ours(ledger, watch)
        if self.crashes:
            crash = self.crashes[0]
            noted = {r.txid: watch.noted_at(r.txid) for r in crash.releases}
            restarted = self.o.folder / f"coordinator-{crash.number + 1}.log"
            log = restarted.read_text(errors="replace") if restarted.exists() else ""
            for line in story_lines(settings, self.o.topics, crash, self.o.topic, noted,
                                    releases, received, log):
                say(line)
        data = self._final = self._chart_data(began, ledger, watch, lines)
        say(f"the picture: {write_chart(self.o.folder, data)}")
        return 0 if verdict.ok else 1


def _ours(ledger: Ledger, watch: TopicWatch) -> list[Release]:
    """The real topic's records of this run's transactions (another writer's are not)."""
    ours = ledger.sent() | ledger.doubtful()
    return [r for r in watch.releases() if r.txid in ours]
