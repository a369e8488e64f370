"""Shared fixtures: one real tansu broker and one local SparkSession per test session."""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from txstream.broker import EmbeddedBroker
from txstream.kafka import KafkaSettings
from txstream.topics import Topics


@pytest.fixture(scope="session")
def broker() -> Iterator[EmbeddedBroker]:
    with EmbeddedBroker() as b:
        yield b


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
    from cluster_helpers import StandaloneCluster

    standalone = StandaloneCluster(tmp_path_factory.mktemp("standalone")).start()
    yield standalone
    standalone.stop()
