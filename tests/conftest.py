"""Shared fixtures: one real tansu broker and one local SparkSession per test session (per
xdist worker), Apache Kafka when a test asks for it, and the tiers.

A test's tier comes from the fixtures it uses, never from a marker written by hand: asking for
``spark``, ``coordinator_processes``, ``broker``/``kafka`` (or Apache Kafka's: ``apache_kafka``,
``own_kafka_cluster``, ``broker_processes``) or ``cluster`` marks it ``spark``, ``kafka`` or
``cluster``. A test without them that still starts Spark, a coordinator process
or a broker fails and says which fixture to use, so nothing slow leaks into ``make test-fast``
(``-m fast``: no Spark, no broker).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.memory_helpers import Clock, new_broker
from tests.support.ports import reserve_port
from txstream.broker import EmbeddedBroker
from txstream.kafka import KafkaSettings
from txstream.kafka.memory import MemoryBroker
from txstream.kafka_broker import KafkaBroker
from txstream.topics import Topics

# Fixture -> the marker it gives every test that uses it (directly or through other fixtures).
FIXTURE_MARKS = {"spark": "spark", "coordinator_processes": "spark", "cluster": "cluster",
                 "broker": "kafka", "kafka": "kafka", "own_broker": "kafka", "tansu": "kafka",
                 "apache_kafka": "kafka", "apache_kafka_settings": "kafka",
                 "own_kafka_cluster": "kafka", "broker_processes": "kafka"}
# Markers of tests that need Spark or a broker: the fast tier is everything else.
SLOW_MARKS = {"spark", "kafka", "cluster", "crash", "soak"}
# Tests that share one resource run on one xdist worker, one after another (--dist loadgroup):
# the standalone cluster's (one cluster, and one submission per module), and the crash tests,
# which each load both cores with a coordinator under traffic. xdist starts the biggest group
# first. tests/project/test_test_groups.py checks that it honours them.
GROUPS = {"cluster": "cluster", "crash": "crash"}


def group_of(marks: set[str]) -> str | None:
    return next((group for mark, group in GROUPS.items() if mark in marks), None)


@pytest.hookimpl(tryfirst=True)  # before xdist's, which reads the groups set here
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        names = set(getattr(item, "fixturenames", ()))
        for fixture, mark in FIXTURE_MARKS.items():
            if fixture in names:
                item.add_marker(mark)
        marks = {m.name for m in item.iter_markers()}
        if not marks & SLOW_MARKS:
            item.add_marker("fast")
        group = group_of(marks)
        if group:
            item.add_marker(pytest.mark.xdist_group(group))
    items.sort(key=_start_rank)


# Longest first, so that no worker is left alone with a long test at the end: the simulation's
# schedules (on a pool of their own), the soak and the crash tests, then Spark's tests, then the
# brokers', then the fast tier, which fills the gaps. xdist starts the cluster's group first.
_RANKS = (({"sim", "soak", "crash"}, 0), ({"spark"}, 1), ({"kafka"}, 2))


def _start_rank(item: pytest.Item) -> int:
    marks = {m.name for m in item.iter_markers()}
    return next((rank for names, rank in _RANKS if names & marks), len(_RANKS))


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """Reports a test recorded for the reader (``record_property("report", text)``), also from
    xdist workers, whose output is not shown."""
    for outcome in ("passed", "failed"):
        for report in terminalreporter.stats.get(outcome, []):
            for name, text in getattr(report, "user_properties", ()):
                if name == "report" and report.when == "call":
                    terminalreporter.write_line(str(text))


def _refuse(what: str, fixture: str) -> Any:
    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(f"this test starts {what} without the {fixture!r} fixture: use it, "
                           "so the test is marked for its tier (tests/conftest.py)")
    return refuse


# Commands that start Spark, a coordinator or a broker (``txstream pending``, ``produce``, ...
# and plain ``python -c`` scripts are fine in the fast tier).
_HEAVY = ({"txstream.streaming.cli", "txstream"}, {"run", "demo", "broker", "bench", "console"})


# Apache Kafka's JVMs, however started: the broker and its storage formatter.
_KAFKA_MAINS = {"kafka.Kafka", "kafka.tools.StorageTool"}


def _heavy(args: Any) -> bool:
    words = [str(a) for a in args] if isinstance(args, (list, tuple)) else str(args).split()
    names = [w.rsplit("/", 1)[-1] for w in words]
    if any(n in ("spark-submit", "spark-class") or n.startswith("tansu") for n in names):
        return True
    if _KAFKA_MAINS & set(words):
        return True
    for i, word in enumerate(words[:-1]):
        if (word in _HEAVY[0] or names[i] == "txstream") and words[i + 1] in _HEAVY[1]:
            return True
    return False


@pytest.fixture(autouse=True)
def _tier_walls(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """A fast test cannot start Spark, a coordinator or a broker, in its process or another."""
    if request.node.get_closest_marker("fast") is None:
        return
    from pyspark.sql import SparkSession

    monkeypatch.setattr(SparkSession.Builder, "getOrCreate", _refuse("Spark", "spark"))
    monkeypatch.setattr(EmbeddedBroker, "start", _refuse("a tansu broker", "broker"))
    refuse_kafka = _refuse("Apache Kafka", "apache_kafka")

    def kafka_start(self: KafkaBroker, *args: Any, **kwargs: Any) -> Any:
        self.check_installed()  # a fast test may see a missing install refused, never a JVM
        return refuse_kafka()

    monkeypatch.setattr(KafkaBroker, "start", kafka_start)
    popen = subprocess.Popen.__init__

    def checked(self: Any, args: Any, *rest: Any, **kwargs: Any) -> None:
        if _heavy(args):
            _refuse(f"{' '.join(map(str, args))!r}", "coordinator_processes")()
        popen(self, args, *rest, **kwargs)

    monkeypatch.setattr(subprocess.Popen, "__init__", checked)


# The broker tier's broker: Apache Kafka, what users run (TXSTREAM_TEST_BROKER=tansu: the
# embedded tansu instead). The smoke of tansu, the default that ``make run`` starts, is kept
# by the tests that start it themselves (the demo, the seed example, ``own_broker``) and by
# those that take the ``tansu`` fixture.
TEST_BROKER = os.environ.get("TXSTREAM_TEST_BROKER", "kafka")
# Topic defaults as tansu's, which the tests' own topics were written against: four partitions
# for a topic created on first use, and no size limit that a test does not set itself (a half
# message of RocketMQ's largest body, 4 MiB, goes through). The size-limit paths run on topics
# and brokers of their own.
TEST_KAFKA_CONFIGS = {"num.partitions": "4", "message.max.bytes": str(16 * 1024 * 1024)}


@pytest.fixture(scope="session")
def tansu() -> Iterator[EmbeddedBroker]:
    """The embedded tansu, per session (per xdist worker): the broker tier's when that is
    tansu."""
    with EmbeddedBroker(port=reserve_port()) as b:
        yield b


@pytest.fixture(scope="session")
def broker(request: pytest.FixtureRequest) -> Iterator[EmbeddedBroker | KafkaBroker]:
    if TEST_BROKER == "tansu":
        yield request.getfixturevalue("tansu")
        return
    with KafkaBroker(port=reserve_port(), reserve=reserve_port,
                     configs=TEST_KAFKA_CONFIGS) as b:
        yield b


@pytest.fixture(scope="session")
def tansu_settings(tansu: EmbeddedBroker) -> KafkaSettings:
    return KafkaSettings(bootstrap_servers=tansu.bootstrap_servers)


@pytest.fixture(scope="session")
def kafka(broker: EmbeddedBroker) -> KafkaSettings:
    return KafkaSettings(bootstrap_servers=broker.bootstrap_servers)


@pytest.fixture(scope="session")
def spark():
    from txstream.streaming.engine.session import build_session

    session = build_session(app_name="txstream-tests", conf={"spark.ui.enabled": "false"})
    yield session
    for query in session.streams.active:
        query.stop()
    session.stop()


@pytest.fixture
def own_broker() -> Iterator[Callable[..., EmbeddedBroker]]:
    """Brokers of the test's own (to stop, pause or lose), stopped after it:
    ``own_broker(**EmbeddedBroker options)``, not yet started."""
    made: list[EmbeddedBroker] = []

    def make(**options: Any) -> EmbeddedBroker:
        made.append(EmbeddedBroker(**{"port": reserve_port(), **options}))
        return made[-1]

    yield make
    for broker in made:
        broker.stop()


@pytest.fixture(scope="session")
def apache_kafka(request: pytest.FixtureRequest) -> Iterator[KafkaBroker]:
    """One Apache Kafka node per session (per xdist worker), started on first use: the broker
    tier's own when that is Apache Kafka."""
    if TEST_BROKER != "tansu":
        yield request.getfixturevalue("broker")
        return
    with KafkaBroker(port=reserve_port(), reserve=reserve_port) as b:
        yield b


@pytest.fixture(scope="session")
def apache_kafka_settings(apache_kafka: KafkaBroker) -> KafkaSettings:
    return KafkaSettings(bootstrap_servers=apache_kafka.bootstrap_servers)


@pytest.fixture
def own_kafka_cluster() -> Iterator[Callable[..., KafkaBroker]]:
    """Apache Kafka clusters of the test's own (3 nodes, auto-creation off, nodes to kill or
    pause), stopped after it: ``own_kafka_cluster(**KafkaBroker options)``, not yet started."""
    made: list[KafkaBroker] = []

    def make(**options: Any) -> KafkaBroker:
        made.append(KafkaBroker(**{"port": reserve_port(), "reserve": reserve_port, **options}))
        return made[-1]

    yield make
    for cluster in made:
        cluster.stop()


@pytest.fixture
def broker_processes() -> Iterator[Callable[..., subprocess.Popen[str]]]:
    """``txstream broker ARGS`` processes of the test (their output in ``stdout``, text),
    killed after it if still running: ``broker_processes(args)``, started."""
    made: list[subprocess.Popen[str]] = []

    def start(args: list[str]) -> subprocess.Popen[str]:
        made.append(subprocess.Popen([sys.executable, "-m", "txstream.streaming.cli", "broker",
                                      *args], stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True))
        return made[-1]

    yield start
    for proc in made:
        if proc.poll() is None:
            proc.terminate()  # the command stops its brokers on SIGTERM
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


@pytest.fixture
def coordinator_processes(tmp_path: Path) -> Iterator[Callable[..., Any]]:
    """Coordinator processes of the test (``python -m txstream.streaming.cli run ARGS``), ended
    after it: ``coordinator_processes(args, **CoordinatorProcess options)``, not yet started."""
    from tests.support.process_helpers import CoordinatorProcess

    made: list[CoordinatorProcess] = []

    def make(args: list[str], log_path: Path | None = None, **options: Any) -> CoordinatorProcess:
        log = log_path or tmp_path / f"coordinator-{len(made)}.log"
        made.append(CoordinatorProcess(args, log, **options))
        return made[-1]

    yield make
    for process in made:
        if process.proc is not None:
            process.terminate()


@pytest.fixture
def topics() -> Topics:
    """System topics unique to one test, so tests never see each other's records."""
    return Topics.with_prefix(f"t{uuid.uuid4().hex[:10]}_")


@pytest.fixture
def unique() -> str:
    """A unique name for a test's own topics and groups."""
    return f"u{uuid.uuid4().hex[:10]}"


@pytest.fixture
def checkpoint_dir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="txstream-cp-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(autouse=True)
def _stop_queries(request: pytest.FixtureRequest) -> Iterator[None]:
    """Stop the streaming queries a test started (not those of module fixtures)."""
    if "spark" not in request.fixturenames:
        yield
        return
    session = request.getfixturevalue("spark")
    before = {q.id for q in session.streams.active}
    yield
    for query in session.streams.active:
        if query.id not in before:
            query.stop()


os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A Spark standalone master and worker (pyspark's own distribution) on loopback."""
    from tests.support.cluster_helpers import StandaloneCluster

    standalone = StandaloneCluster(tmp_path_factory.mktemp("standalone")).start()
    yield standalone
    standalone.stop()


@pytest.fixture
def clock() -> Clock:
    """The in-memory broker's clock, moved by the test (a module may define its own)."""
    return Clock()


@pytest.fixture
def mem(clock: Clock) -> Iterator[MemoryBroker]:
    """An in-memory broker on ``clock``, gone after the test."""
    with new_broker(clock) as broker:
        yield broker
