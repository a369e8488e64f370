"""The Kafka boundary (txstream/kafka/protocols.py): the clients behind ``make_producer``,
``make_consumer`` and ``make_admin`` have every member of their Protocol, taking the parameters
it names. mypy checks the in-memory broker's clients against the Protocols; kafka-python ships
no types, so its clients are checked here, by signature."""

from __future__ import annotations

import inspect
import re
import runpy
import tomllib
from pathlib import Path
from typing import Any

import pytest
from kafka import KafkaAdminClient, KafkaProducer
from kafka.consumer.fetcher import ConsumerRecord as KafkaConsumerRecord
from kafka.producer.future import FutureRecordMetadata
from kafka.producer.future import RecordMetadata as KafkaRecordMetadata

from txstream.kafka import errors, protocols
from txstream.kafka.clients import CommittedEndConsumer
from txstream.kafka.memory_admin import MemoryAdmin
from txstream.kafka.memory_clients import MemoryProducer, RecordFuture
from txstream.kafka.memory_consumer import MemoryConsumer

P = inspect.Parameter

CLIENTS = [
    # make_producer's TopicTrackingProducer: KafkaProducer, its send() passing all on.
    (protocols.Producer, KafkaProducer),
    (protocols.Producer, MemoryProducer),
    (protocols.Consumer, CommittedEndConsumer),  # what make_consumer makes
    (protocols.Consumer, MemoryConsumer),
    (protocols.Admin, KafkaAdminClient),
    (protocols.Admin, MemoryAdmin),
    (protocols.SendFuture, FutureRecordMetadata),
    (protocols.SendFuture, RecordFuture),
]


def members(proto: type) -> dict[str, Any]:
    """The Protocol's own members: methods and (read-only property) data."""
    return {name: value for name, value in vars(proto).items()
            if not name.startswith("_") and (callable(value) or isinstance(value, property))}


def _accepts(real: inspect.Signature, wanted: inspect.Parameter) -> str | None:
    """Why ``real`` cannot take ``wanted`` as the Protocol's callers pass it (None: it can)."""
    params = real.parameters
    kinds = {p.kind for p in params.values()}
    if wanted.kind is P.VAR_POSITIONAL:
        return None if P.VAR_POSITIONAL in kinds else "no *args"
    found = params.get(wanted.name)
    if found is None or found.kind in (P.POSITIONAL_ONLY, P.VAR_POSITIONAL, P.VAR_KEYWORD):
        if P.VAR_KEYWORD in kinds and P.VAR_POSITIONAL in kinds:
            return None  # (*args, **kwargs): takes anything
        return f"no parameter {wanted.name}"
    if wanted.default is not P.empty and found.default is P.empty:
        return f"{wanted.name} has no default"
    return None


@pytest.mark.parametrize(("proto", "cls"), CLIENTS,
                         ids=[f"{p.__name__}-{c.__name__}" for p, c in CLIENTS])
def test_a_client_has_every_member_of_its_protocol(proto: type, cls: type) -> None:
    wrong = []
    for name, member in members(proto).items():
        if isinstance(member, property):
            # Data: a class attribute, a slot, or set by __init__.
            slots = {s for k in cls.__mro__ for s in getattr(k, "__slots__", ())}
            if not (hasattr(cls, name) or name in slots or re.search(
                    rf"self\.{name}\b[^=\n]*=", inspect.getsource(cls.__init__))):
                wrong.append(f"{name}: missing")
            continue
        real = getattr(cls, name, None)
        if not callable(real):
            wrong.append(f"{name}(): missing")
            continue
        real_sig = inspect.signature(real)
        for wanted in list(inspect.signature(member).parameters.values())[1:]:
            why = _accepts(real_sig, wanted)
            if why:
                wrong.append(f"{name}(): {why}")
    assert wrong == [], f"{cls.__name__} is no {proto.__name__}: {wrong}"


def test_the_protocols_cover_what_txstream_calls() -> None:
    assert {"send", "flush", "close", "partitions_for", "init_transactions",
            "send_offsets_to_transaction"} <= set(members(protocols.Producer))
    assert {"assign", "seek", "poll", "position", "highwater", "partitions_for_topic", "topics",
            "subscribe", "commit", "close"} <= set(members(protocols.Consumer))


@pytest.mark.parametrize(("proto", "cls"), [
    (protocols.ConsumerRecord, KafkaConsumerRecord),
    (protocols.RecordMetadata, KafkaRecordMetadata),
])
def test_records_have_every_field_of_their_protocol(proto: type, cls: Any) -> None:
    assert set(members(proto)) <= set(cls._fields)


def test_value_types_are_kafka_pythons_with_the_fields_mypy_sees() -> None:
    # protocols.py declares these as NamedTuples for mypy only; at run time they are
    # kafka-python's, which its consumer checks with isinstance.
    from kafka.structs import OffsetAndMetadata, OffsetAndTimestamp, TopicPartition

    assert protocols.TopicPartition is TopicPartition
    assert protocols.OffsetAndMetadata is OffsetAndMetadata
    assert protocols.OffsetAndTimestamp is OffsetAndTimestamp
    assert TopicPartition._fields == ("topic", "partition")
    assert OffsetAndMetadata._fields == ("offset", "metadata", "leader_epoch")
    assert OffsetAndTimestamp._fields == ("offset", "timestamp", "leader_epoch")


def test_errors_are_kafka_pythons_own() -> None:
    import kafka.errors

    for name in errors.__all__:
        if name != "for_code":
            assert getattr(errors, name) is getattr(kafka.errors, name), name
    assert errors.for_code(0) is errors.NoError
    assert errors.for_code(3) is errors.UnknownTopicOrPartitionError



def test_mypy_checks_the_kafka_boundary_and_its_users() -> None:
    # The Protocols are worth their types where mypy reads their users; and at least 40 % of
    # the product's lines are checked.
    repo = Path(__file__).resolve().parents[2]
    files = tomllib.loads((repo / "pyproject.toml").read_text())["tool"]["mypy"]["files"]
    assert {"txstream/kafka", "txstream/client", "txstream/sources", "txstream/sinks"} <= set(files)
    found = runpy.run_path(str(repo / "scripts" / "mypy_coverage.py"))
    checked, total = found["coverage"](repo)
    assert checked / total >= 0.40, f"mypy checks {checked} of {total} product lines"


def test_a_metadata_question_a_dead_node_refused_goes_again_to_a_live_one(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """txstream's consumers ask again when the node a metadata request went to refuses the
    connection (one node of a cluster down); a broker wholly down is told within the bound."""
    from kafka.errors import KafkaConnectionError

    from txstream.kafka import clients

    monkeypatch.setattr(clients, "_METADATA_RETRY_S", 0.0)
    answers: list[Any] = [KafkaConnectionError("111 ECONNREFUSED")] * 2 + [{0, 1}]

    def ask() -> Any:
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    assert clients._asking_live_nodes(ask, 30_000) == {0, 1}
    monkeypatch.setattr(clients, "_METADATA_RETRY_FOR_S", 0.0)

    def refused() -> Any:
        raise KafkaConnectionError("111 ECONNREFUSED")

    with pytest.raises(KafkaConnectionError):
        clients._asking_live_nodes(refused, 30_000)


def test_the_boundary_knows_no_fake_and_hands_a_plugged_schemes_settings_to_its_factory(
) -> None:
    """make_* switch on no URL of their own: a ClientFactory plugged for a scheme (the
    in-memory broker's, a test kit's, another client library's) gets that scheme's settings."""
    import ast

    from txstream.kafka import clients
    from txstream.kafka.settings import KafkaSettings

    tree = ast.parse(Path(clients.__file__).read_text())
    named = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert not {m for m in named if m.startswith("txstream.kafka.memory")}

    made: list[tuple[str, str]] = []

    class Factory:
        def producer(self, settings: KafkaSettings, kwargs: dict[str, Any]) -> Any:
            made.append(("producer", settings.bootstrap_servers))
            return object()

        def consumer(self, settings: KafkaSettings, kwargs: dict[str, Any]) -> Any:
            made.append(("consumer", kwargs["client_id"]))
            return object()

        def admin(self, settings: KafkaSettings, kwargs: dict[str, Any]) -> Any:
            made.append(("admin", settings.bootstrap_servers))
            return object()

        def wait(self, settings: KafkaSettings) -> None:
            made.append(("wait", settings.bootstrap_servers))

    clients.plug_clients("other://", Factory())
    try:
        settings = KafkaSettings(bootstrap_servers="other://here:1")
        clients.make_producer(settings)
        clients.make_consumer(settings, role="source")
        clients.make_admin(settings)
        clients.wait_for_broker(settings)
    finally:
        clients.unplug_clients("other://")
    assert made == [("producer", "other://here:1"), ("consumer", "txstream-source"),
                    ("admin", "other://here:1"), ("wait", "other://here:1")]
