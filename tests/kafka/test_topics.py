"""Topic provisioning: the deployment's description, ``txstream topics create|check`` on the
tansu broker, the coordinator's start verification and a producer's check topic.

tansu does not say whether it auto-creates topics (its broker DescribeConfigs answer is empty,
and it does create them): the auto-create-off branch is tested through the decision function
and through ``provision.broker_auto_create``, the one place the broker's answer comes from.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

import pytest

from tests.support.kafka_helpers import produce
from txstream.client import LocalTransactionState, Message, TransactionListener, TransactionProducer
from txstream.errors import ConfigError
from txstream.kafka import KafkaSettings
from txstream.kafka import provision as prov
from txstream.outputs import encode_check
from txstream.streaming.cli import main
from txstream.streaming.engine import coordinator as coordinator_module
from txstream.streaming.engine.config import RunConfig
from txstream.streaming.engine.coordinator import Coordinator
from txstream.topics import Topics

S = LocalTransactionState
SYSTEM = ("half", "end", "discard", "dead_letter", "history")


def _states(kafka: KafkaSettings, names: list[str]) -> dict[str, prov.TopicState]:
    with prov.admin_client(kafka) as admin:
        return prov.topic_states(admin, names, with_configs=True)


def _cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, list[str], str]:
    rc = main(list(argv))
    out = capsys.readouterr()
    return rc, out.out.splitlines(), out.err


# --- the description, without a broker -------------------------------------------------------


def test_deployment_names_every_topic_per_prefix() -> None:
    topics = Topics.with_prefix("p_")
    needs = prov.deployment(topics, producer_groups=["G1", "G2", "G1"], real_topics=["orders"],
                            consumer_groups=["C1"])
    names = [s.name for s in needs.topics]
    assert names == ["p_RMQ_SYS_TRANS_HALF_TOPIC", "p_RMQ_SYS_TRANS_OP_HALF_TOPIC",
                     "p_TRANS_CHECK_MAX_TIME_TOPIC", "p_TXSTREAM_DEAD_LETTER",
                     "p_TXSTREAM_HISTORY", "p_RMQ_SYS_TRANS_CHECK_G1",
                     "p_RMQ_SYS_TRANS_CHECK_G2", "orders", "p_TXSTREAM_RETRY_C1",
                     "p_TXSTREAM_DLQ_C1"]
    assert [g.name for g in needs.groups] == ["p_RMQ_SYS_TRANS_CHECK_G1.checkers",
                                             "p_RMQ_SYS_TRANS_CHECK_G2.checkers", "C1"]
    assert needs.groups[2].topics == ("orders", "p_TXSTREAM_RETRY_C1")
    # The same names the clients use.
    producer = TransactionProducer("G1", "127.0.0.1:1", topics=topics)
    assert producer.check_topic == names[5]
    assert needs.groups[0].name == producer.check_group_id
    bare = [s.name for s in prov.deployment(Topics()).topics]
    assert bare == ["RMQ_SYS_TRANS_HALF_TOPIC", "RMQ_SYS_TRANS_OP_HALF_TOPIC",
                    "TRANS_CHECK_MAX_TIME_TOPIC", "TXSTREAM_DEAD_LETTER", "TXSTREAM_HISTORY"]


def test_deployment_configs_and_roles() -> None:
    needs = prov.deployment(Topics(), producer_groups=["G"], real_topics=["T"],
                            consumer_groups=["C"])
    by_kind = {s.kind: s for s in needs.topics}
    # The broker's clock stamps half messages and end events (timers trust it, state.timing).
    assert by_kind["half"].configs == {"retention.ms": str(7 * 86_400_000),
                                       "message.timestamp.type": "LogAppendTime"}
    # Keyed by transaction id: compaction leaves about one request per transaction.
    assert by_kind["check"].configs == {"retention.ms": "86400000",
                                        "cleanup.policy": "compact,delete"}
    assert by_kind["real"].configs == {}  # the application's topic: the broker's retention
    assert by_kind["half"].writers == ("producer:G",)
    assert by_kind["half"].readers == ("coordinator",)
    assert by_kind["end"].writers == ("producer:G", "operator")
    assert set(by_kind["check"].readers) == {"producer:G", "coordinator"}
    assert by_kind["retry"].writers == by_kind["retry"].readers == ("consumer:C",)
    one = prov.deployment(Topics(), real_topics=["T"], partitions=4, replication_factor=3,
                          retention_ms=-1, max_message_bytes=2_000_000)
    by_kind_extra = {"half": {"message.timestamp.type": "LogAppendTime"},
                     "end": {"message.timestamp.type": "LogAppendTime"},
                     "check": {"cleanup.policy": "compact,delete"}}
    for spec in one.topics:
        assert (spec.partitions, spec.replication_factor) == (4, 3)
        assert spec.configs == {"retention.ms": "-1", "max.message.bytes": "2000000",
                                **by_kind_extra.get(spec.kind, {})}
    with pytest.raises(ConfigError):
        prov.deployment(Topics(), partitions=0)
    with pytest.raises(ConfigError):
        prov.deployment(Topics(), replication_factor=0)
    assert [s.name for s in prov.coordinator_topics(Topics.with_prefix("x_"), 3)] == [
        getattr(Topics.with_prefix("x_"), k) for k in SYSTEM]


def test_acls_name_every_topic_and_group() -> None:
    needs = prov.deployment(Topics(), producer_groups=["G"], real_topics=["T"],
                            consumer_groups=["C"])
    acls = needs.acls()
    topics_named = {a.name for a in acls if a.resource == "topic"}
    assert topics_named == {s.name for s in needs.topics}
    assert {a.name for a in acls if a.resource == "group"} == {g.name for g in needs.groups}
    have = {(a.role, a.operation, a.name) for a in acls}
    assert ("producer:G", "Write", "RMQ_SYS_TRANS_HALF_TOPIC") in have
    assert ("producer:G", "Read", "RMQ_SYS_TRANS_CHECK_G") in have
    assert ("producer:G", "Read", "RMQ_SYS_TRANS_CHECK_G.checkers") in have
    assert ("coordinator", "Write", "T") in have
    assert ("consumer:C", "Read", "T") in have
    assert ("consumer:C", "Read", "C") in have
    assert ("consumer:C", "Write", "TXSTREAM_DLQ_C") in have
    # The coordinator reads with assign(): no group of its own.
    assert not any(a.role == "coordinator" and a.resource == "group" for a in acls)
    flags = prov.Acl("coordinator", "Read", "topic", "X").flags({"coordinator": "User:tx"})
    assert flags == "--allow-principal User:tx --operation Read --topic X"
    assert prov.Acl("operator", "DescribeConfigs", "cluster").flags() == (
        "--allow-principal User:<operator> --operation DescribeConfigs --cluster")


def test_missing_topics_rule_follows_the_brokers_auto_create() -> None:
    assert prov.topics_to_create([], False, "cmd") == []
    assert prov.topics_to_create(["A", "B"], True, "cmd") == ["A", "B"]
    assert prov.topics_to_create(["A"], None, "cmd") == ["A"]  # not told: Kafka's default
    with pytest.raises(ConfigError) as err:
        prov.topics_to_create(["A", "B"], False, "txstream topics create --bootstrap-servers h:1")
    text = str(err.value)
    assert "\n" not in text
    assert text == ("topics missing and the broker does not create topics: A, B "
                    "(txstream topics create --bootstrap-servers h:1)")


class _Admin:
    """An admin client answering the broker config questions as a Kafka broker would."""

    def __init__(self, value: str | None) -> None:
        self.value = value

    def describe_cluster(self) -> dict[str, Any]:
        return {"brokers": [{"broker_id": 7}]}

    def describe_configs(self, resources: list[Any], config_filter: str) -> dict[str, Any]:
        assert resources[0].name == "7" and config_filter == "all"
        configs = {} if self.value is None else {"auto.create.topics.enable": {
            "value": self.value}}
        return {"broker": {"7": configs}}


def test_broker_auto_create_reads_the_brokers_config() -> None:
    assert prov.broker_auto_create(_Admin("false")) is False
    assert prov.broker_auto_create(_Admin("true")) is True
    assert prov.broker_auto_create(_Admin(None)) is None


# --- against tansu ---------------------------------------------------------------------------


@pytest.mark.kafka
def test_tansu_does_not_tell_whether_it_creates_topics(tansu_settings: KafkaSettings) -> None:
    with prov.admin_client(tansu_settings) as admin:
        assert prov.broker_auto_create(admin) is None


@pytest.mark.kafka
def test_topics_create_then_check(kafka: KafkaSettings, topics: Topics, unique: str,
                                  capsys: pytest.CaptureFixture[str]) -> None:
    args = ["--bootstrap-servers", kafka.bootstrap_servers, "--topic-prefix", topics.prefix,
            "--group", "G", "--real-topic", f"{unique}-real", "--consumer-group", "C"]
    names = [s.name for s in prov.deployment(topics, producer_groups=["G"],
                                             real_topics=[f"{unique}-real"],
                                             consumer_groups=["C"]).topics]
    rc, lines, _ = _cli(capsys, "topics", "check", *args)
    assert rc == 1
    topic_lines = [line for line in lines if line.startswith("topic ")]
    assert [line.split()[1] for line in topic_lines] == names
    assert all(line.split()[2] == "MISSING" for line in topic_lines)

    rc, lines, _ = _cli(capsys, "topics", "create", *args, "--partitions", "3",
                        "--retention", "3d", "--max-message-bytes", "2097152")
    assert rc == 0
    topic_lines = [line for line in lines if line.startswith("topic ")]
    assert len(topic_lines) == len(names)
    for line in topic_lines:
        assert " created " in line, line
        assert "partitions=3" in line and "retention.ms=259200000" in line, line
        assert "max.message.bytes=2097152" in line, line
    states = _states(kafka, names)
    assert all(s.present and s.partitions == 3 for s in states.values())
    # The broker keeps the configs a topic was created with, and tells them (Apache Kafka
    # also the defaults of the others txstream shows).
    assert states[topics.half].configs.items() >= {"retention.ms": "259200000",
                                                   "max.message.bytes": "2097152",
                                                   "message.timestamp.type": "LogAppendTime"
                                                   }.items()

    rc, lines, _ = _cli(capsys, "topics", "create", *args)
    assert rc == 0
    topic_lines = [line for line in lines if line.startswith("topic ")]
    assert all("exists, left alone" in line for line in topic_lines)
    assert "retention.ms=259200000 (wanted 604800000)" in topic_lines[0]

    rc, lines, _ = _cli(capsys, "topics", "check", *args)
    assert rc == 0
    topic_lines = [line for line in lines if line.startswith("topic ")]
    assert all(line.split()[2] == "present" and "partitions=3" in line
               for line in topic_lines)


@pytest.mark.kafka
def test_topics_create_fails_when_the_broker_refuses(
        kafka: KafkaSettings, topics: Topics, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    real = prov.create_topics

    def refuse_history(admin: Any, specs: list[prov.TopicSpec]) -> dict[str, str | None]:
        out = real(admin, [s for s in specs if s.kind != "history"])
        return {**out, topics.history: "PolicyViolationError: not here"}

    monkeypatch.setattr("txstream.streaming.cli.topics.create_topics", refuse_history)
    rc, lines, _ = _cli(capsys, "topics", "create", "--bootstrap-servers",
                        kafka.bootstrap_servers, "--topic-prefix", topics.prefix)
    assert rc == 1
    by_name = {line.split()[1]: line for line in lines if line.startswith("topic ")}
    assert "FAILED (PolicyViolationError: not here)" in by_name[topics.history]
    assert " created " in by_name[topics.half]


@pytest.mark.kafka
def test_topics_lists_groups_and_acls(kafka: KafkaSettings, topics: Topics,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    rc, lines, _ = _cli(capsys, "topics", "check", "--bootstrap-servers",
                        kafka.bootstrap_servers, "--topic-prefix", topics.prefix,
                        "--group", "G", "--real-topic", "R", "--consumer-group", "C",
                        "--principal", "coordinator=User:tx")
    assert rc == 1
    groups = {line.split()[1] for line in lines if line.startswith("group ")}
    assert groups == {topics.check("G") + ".checkers", "C"}
    acls = [line for line in lines if line.startswith("acl ")]
    named = {line.split()[-1] for line in acls}
    topic_names = {line.split()[1] for line in lines if line.startswith("topic ")}
    assert topic_names | groups <= named
    assert (f"acl --allow-principal User:tx --operation Read --topic {topics.half}") in acls
    assert (f"acl --allow-principal User:<producer:G> --operation Read --group "
            f"{topics.check('G')}.checkers") in acls


# --- the coordinator's start verification ----------------------------------------------------


class _NoSpark(Exception):
    pass


def _no_spark(config: RunConfig) -> Any:
    raise _NoSpark("the topics were verified; Spark is not needed here")


@pytest.mark.kafka
def test_coordinator_refuses_missing_topics_when_the_broker_does_not_create_them(
        kafka: KafkaSettings, topics: Topics, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    # The broker's answer, "auto.create.topics.enable=false", where the provisioning module
    # asks for it; Spark must not even start.
    monkeypatch.setattr(prov, "broker_auto_create", lambda admin: False)
    monkeypatch.setattr(coordinator_module, "session_for", _no_spark)
    rc, _, err = _cli(capsys, "run", "--bootstrap-servers", kafka.bootstrap_servers,
                      "--topic-prefix", topics.prefix, "--broker-timeout", "10")
    assert rc == 2
    line = err.strip()
    assert "\n" not in line
    expected = ", ".join(getattr(topics, k) for k in SYSTEM)
    assert line == (f"txstream: topics missing and the broker does not create topics: "
                    f"{expected} (txstream topics create --bootstrap-servers "
                    f"{kafka.bootstrap_servers} --topic-prefix {topics.prefix})")
    assert not any(s.present for s in _states(kafka, [getattr(topics, k)
                                                      for k in SYSTEM]).values())


@pytest.mark.kafka
def test_coordinator_creates_its_topics_when_the_broker_would(
        kafka: KafkaSettings, topics: Topics, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(coordinator_module, "session_for", _no_spark)
    said: list[str] = []
    config = RunConfig(kafka=kafka, topics=topics, topic_partitions=3)
    with pytest.raises(_NoSpark):
        Coordinator(config, emit=said.append).start()
    names = [getattr(topics, k) for k in SYSTEM]
    states = _states(kafka, names)
    assert all(states[n].present and states[n].partitions == 3 for n in names)
    assert said == [f"created topics {', '.join(names)}"]
    # Present now: a broker that does not create topics is no obstacle any more.
    monkeypatch.setattr(prov, "broker_auto_create", lambda admin: False)
    with pytest.raises(_NoSpark):
        Coordinator(config, emit=said.append).start()
    assert len(said) == 1


@pytest.mark.kafka
def test_coordinator_warns_of_a_half_topic_that_drops_records_too_soon(
        kafka: KafkaSettings, topics: Topics, monkeypatch: pytest.MonkeyPatch) -> None:
    # The sink reads held bodies back from the half topic until the reserved time (72 h).
    monkeypatch.setattr(coordinator_module, "session_for", _no_spark)
    with prov.admin_client(kafka) as admin:
        prov.create_topics(admin, [prov.topic_spec("half", topics.half, retention_ms=3_600_000)])
    said: list[str] = []
    with pytest.raises(_NoSpark):
        Coordinator(RunConfig(kafka=kafka, topics=topics), emit=said.append).start()
    warnings = [line for line in said if line.startswith("warning:")]
    assert warnings == [
        f"warning: the half topic {topics.half} keeps records 3600000 ms, less than the "
        f"reserved time of 259200000 ms: a transaction that lives longer loses its body, and "
        f"its release or discard goes to the dead-letter topic (HALF_MESSAGE_LOST); raise its "
        f"retention.ms"]


# --- a producer's check topic ----------------------------------------------------------------


class _Listener(TransactionListener):
    def __init__(self) -> None:
        self.checked = threading.Event()

    def execute_local_transaction(self, msg: Message, arg: object) -> S:
        return S.UNKNOW

    def check_local_transaction(self, msg: Message) -> S:
        self.checked.set()
        return S.COMMIT_MESSAGE


@pytest.mark.kafka
def test_producer_creates_its_check_topic_before_anyone_subscribes(
        kafka: KafkaSettings, topics: Topics) -> None:
    # Not answering checks: nothing subscribes, so only start() can have made the topic.
    with TransactionProducer("G", kafka=kafka, topics=topics, listener=_Listener(),
                             answer_checks=False):
        state = _states(kafka, [topics.check("G")])[topics.check("G")]
        assert state.present and state.partitions == prov.DEFAULT_PARTITIONS


@pytest.mark.kafka
def test_check_request_reaches_a_producer_started_before_any_coordinator(
        kafka: KafkaSettings, topics: Topics) -> None:
    listener = _Listener()
    with TransactionProducer("G", kafka=kafka, topics=topics, listener=listener):
        assert _states(kafka, [topics.check("G")])[topics.check("G")].present
        msg = Message("T", b"body", transaction_id="TX1", msg_id="TX1", producer_group="G",
                      born_timestamp=1_700_000_000_000)
        produce(kafka, [encode_check(msg, 1, topics)])
        assert listener.checked.wait(30), "the check request did not reach the listener"


@pytest.mark.kafka
def test_producer_starts_when_the_broker_refuses_its_check_topic(
        kafka: KafkaSettings, topics: Topics, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(prov, "create_topics",
                        lambda admin, specs: {s.name: "PolicyViolationError" for s in specs})
    with caplog.at_level(logging.WARNING, logger=prov.__name__), \
            TransactionProducer("G", kafka=kafka, topics=topics, listener=_Listener(),
                                answer_checks=False) as producer:
        assert producer.send_message_in_transaction(Message("T", b"x")).msg_id
    warning = " ".join(r.getMessage() for r in caplog.records)
    assert topics.check("G") in warning and "PolicyViolationError" in warning
    assert (f"txstream topics create --bootstrap-servers {kafka.bootstrap_servers} "
            f"--topic-prefix {topics.prefix} --group G") in warning



@pytest.mark.parametrize(("configs", "warned"), [
    ({}, None),
    ({"retention.ms": str(3 * 86_400_000 + 1)}, None),
    ({"retention.ms": "3600000"}, "retention.ms"),
    ({"retention.bytes": "1073741824"}, "retention.bytes"),
])
def test_the_coordinator_warns_when_the_half_topic_may_drop_pending_bodies(
        configs: dict[str, str], warned: str | None) -> None:
    """By time or by size: bodies of pending transactions are read back from the half topic."""
    import random

    from txstream.kafka.memory import MemoryBroker
    from txstream.streaming.engine.config import RunConfig
    from txstream.streaming.engine.coordinator import half_retention_warning

    with MemoryBroker("retention-warning", lambda: 0, random.Random(0)) as broker:
        topics = Topics.with_prefix("w_")
        broker.create_topic(topics.half, 2, configs)
        warning = half_retention_warning(RunConfig(kafka=broker.settings, topics=topics))
    if warned is None:
        assert warning is None
    else:
        assert warning is not None and warned in warning and "HALF_MESSAGE_LOST" in warning
