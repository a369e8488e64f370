"""Security: the TLS/SASL settings reach every Kafka client txstream builds.

The session's broker speaks PLAINTEXT only. Every client path is pointed at it with
SASL_PLAINTEXT/PLAIN: if a path dropped the settings it would connect (PLAINTEXT works there);
instead each must fail, and kafka-python must log the SASL handshake the broker refused
(tansu answers that it has no such mechanism, Apache Kafka's PLAINTEXT listener that a SASL
handshake is out of place). The
settings travel the way each component gets them: objects for the libraries, the JSON
``txstream run`` hands the Spark source and sink (built from its flags), environment
variables for the admin commands. Each path is run twice: with the named settings (flags,
fields), and with a Kafka properties file (``--kafka-config``, ``kafka_config=``,
``KafkaSettings.from_properties``) holding Kafka's own names, ``sasl.jaas.config`` included.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.support.kafka_helpers import output_row
from tests.support.process_helpers import REPO
from txstream.client import PushConsumer, TransactionListener, TransactionProducer
from txstream.errors import TxStreamError
from txstream.kafka import (
    KafkaSettings,
    TopicReader,
    make_admin,
    make_consumer,
    make_producer,
    wait_for_broker,
)
from txstream.message import Decision, Message
from txstream.sinks.kafka_sink import SinkOptions, send_rows
from txstream.sources.kafka_io import SourceOptions, consumer_for, drop_consumer
from txstream.streaming.cli.options import (
    add_kafka_arguments,
    add_run_arguments,
    config_from_args,
    settings_of,
)

pytestmark = pytest.mark.kafka

SASL_FLAGS = ["--security-protocol", "SASL_PLAINTEXT", "--sasl-mechanism", "PLAIN",
              "--sasl-username", "alice", "--sasl-password", "s3cret"]
FAST = {"bootstrap_timeout_ms": 1500}  # fail in 1.5 s rather than kafka-python's 30 s


def _sasl(kafka: KafkaSettings) -> KafkaSettings:
    return dataclasses.replace(kafka, security_protocol="SASL_PLAINTEXT", sasl_mechanism="PLAIN",
                               sasl_username="alice", sasl_password="s3cret", extra=FAST)


def _properties_file(kafka: KafkaSettings, path: Path) -> str:
    """SASL_FLAGS, and the short bootstrap wait, as a Kafka client properties file."""
    path.write_text(
        "# what a production Kafka's client.properties holds\n"
        f"bootstrap.servers={kafka.bootstrap_servers}\n"
        "security.protocol=SASL_PLAINTEXT\nsasl.mechanism: PLAIN\n"
        "sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required \\\n"
        '    username="alice" password="s3cret";\n'
        f"bootstrap.timeout.ms {FAST['bootstrap_timeout_ms']}\n")
    return str(path)


@dataclass
class _Via:
    """SASL settings, given one way to every kind of component."""

    settings: KafkaSettings  # to the Kafka module, as objects
    run_flags: list[str]  # to txstream run, whose query hands them to the source and sink
    client: dict[str, Any]  # to the client library's keyword options


@pytest.fixture(params=["flags", "properties file"])
def via(request: pytest.FixtureRequest, kafka: KafkaSettings, tmp_path: Path) -> _Via:
    if request.param == "flags":
        return _Via(_sasl(kafka), SASL_FLAGS, {"kafka": _sasl(kafka)})
    file = _properties_file(kafka, tmp_path / "client.properties")
    return _Via(KafkaSettings.from_properties(file=file), ["--kafka-config", file],
                {"kafka_config": file})


def _run_json(kafka: KafkaSettings, flags: list[str] = SASL_FLAGS) -> str:
    """The ``kafka`` option ``txstream run`` gives the Spark source and sink for ``flags``."""
    parser = argparse.ArgumentParser()
    add_run_arguments(parser)
    args = parser.parse_args(flags)
    config = config_from_args(args, args.bootstrap_servers or kafka.bootstrap_servers)
    as_dict = dict(config.kafka.as_dict(), extra=FAST)
    return json.dumps(as_dict)


class _Listener(TransactionListener):
    def execute_local_transaction(self, msg: Message, arg: object) -> Decision:
        return Decision.COMMIT_MESSAGE

    def check_local_transaction(self, msg: Message) -> Decision:
        return Decision.COMMIT_MESSAGE


def _source(kafka: KafkaSettings, via: _Via) -> None:
    options = SourceOptions.parse({"kafka": _run_json(kafka, via.run_flags)})
    try:
        consumer_for(options, "offsets")
    finally:
        drop_consumer(options, "offsets")


def _sink(kafka: KafkaSettings, via: _Via) -> None:
    send_rows(SinkOptions.parse({"kafka": _run_json(kafka, via.run_flags)}),
              [output_row("visible", "sasl-probe", b"k", b"v", b"")])


def _push_consumer(kafka: KafkaSettings, via: _Via) -> None:
    consumer = PushConsumer("sasl-probe", kafka.bootstrap_servers, **via.client,
                            connect_timeout_s=1.5)
    consumer.subscribe("sasl-probe")
    consumer.register_message_listener(lambda msgs: None)  # type: ignore[arg-type,return-value]
    consumer.start()


PATHS: dict[str, Callable[[KafkaSettings, _Via], Any]] = {
    "make_producer": lambda k, via: make_producer(via.settings),
    "make_consumer": lambda k, via: make_consumer(via.settings),
    "make_admin": lambda k, via: make_admin(via.settings),
    # wait_for_broker bounds each attempt itself (2 s).
    "wait_for_broker": lambda k, via: wait_for_broker(via.settings, timeout_s=1.5),
    "spark source (txstream run flags)": _source,
    "spark sink (txstream run flags)": _sink,
    "TransactionProducer": lambda k, via: TransactionProducer(
        "sasl-probe", k.bootstrap_servers, listener=_Listener(), connect_timeout_s=1.5,
        **via.client).start(),
    "PushConsumer": _push_consumer,
}


SASL_REFUSED = ("UnsupportedSaslMechanismError", "IllegalSaslStateError")  # tansu, Apache Kafka


def _refused_handshake(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name.startswith("kafka")
            and any(error in r.getMessage() for error in SASL_REFUSED)]


@pytest.mark.parametrize("path", list(PATHS))
def test_sasl_settings_reach_the_client(
    path: str, via: _Via, kafka: KafkaSettings, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR, logger="kafka")
    with pytest.raises(TxStreamError, match="Unable to bootstrap"):
        PATHS[path](kafka, via)
    handshake = [r.getMessage() for r in caplog.records if r.name.startswith("kafka")]
    assert _refused_handshake(caplog), handshake[-5:]


def test_oauthbearer_settings_reach_the_client(
    kafka: KafkaSettings, caplog: pytest.LogCaptureFixture
) -> None:
    """The broker refuses the mechanism before any token is asked for (the token endpoint is
    tested in test_kafka_properties.py)."""
    settings = kafka.with_properties({
        "security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "OAUTHBEARER",
        "sasl.oauthbearer.token.endpoint.url": "http://127.0.0.1:9/token",
        "sasl.oauthbearer.client.id": "app", "sasl.oauthbearer.client.secret": "x",
        "bootstrap.timeout.ms": "1500"})
    caplog.set_level(logging.ERROR, logger="kafka")
    with pytest.raises(TxStreamError, match="Unable to bootstrap"):
        make_producer(settings)
    assert _refused_handshake(caplog)


def test_plaintext_control_connects(kafka: KafkaSettings) -> None:
    """The same broker with the same code but PLAINTEXT: the failures above are the SASL's."""
    wait_for_broker(kafka, timeout_s=5)
    make_consumer(dataclasses.replace(kafka, extra=FAST)).close()


def test_admin_commands_take_sasl_from_the_environment(
    kafka: KafkaSettings, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    for name, value in zip(SASL_FLAGS[::2], SASL_FLAGS[1::2], strict=True):
        monkeypatch.setenv("TXSTREAM_" + name[2:].upper().replace("-", "_"), value)
    parser = argparse.ArgumentParser()
    add_kafka_arguments(parser)
    settings = settings_of(parser.parse_args(["--bootstrap-servers", kafka.bootstrap_servers]))
    assert (settings.security_protocol, settings.sasl_mechanism, settings.sasl_username) == (
        "SASL_PLAINTEXT", "PLAIN", "alice")
    caplog.set_level(logging.ERROR, logger="kafka")
    # The reader `txstream history` and `resolve` use, with these settings.
    with pytest.raises(TxStreamError, match="Unable to bootstrap"):
        TopicReader(dataclasses.replace(settings, extra=FAST), ["some-topic"])
    assert _refused_handshake(caplog)


def test_admin_commands_take_a_properties_file_from_the_environment(
    kafka: KafkaSettings, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
    tmp_path: Path
) -> None:
    for name in list(os.environ):
        if name.startswith("TXSTREAM_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("TXSTREAM_KAFKA_CONFIG",
                       _properties_file(kafka, tmp_path / "client.properties"))
    parser = argparse.ArgumentParser()
    add_kafka_arguments(parser)
    settings = settings_of(parser.parse_args([]))
    assert (settings.bootstrap_servers, settings.sasl_username, settings.sasl_password) == (
        kafka.bootstrap_servers, "alice", "s3cret")
    caplog.set_level(logging.ERROR, logger="kafka")
    with pytest.raises(TxStreamError, match="Unable to bootstrap"):
        TopicReader(settings, ["some-topic"])
    assert _refused_handshake(caplog)


def _run(kafka: KafkaSettings, flags: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "txstream.streaming.cli", "run", "--broker-timeout", "2", *flags],
        capture_output=True, text=True, timeout=120, cwd=REPO,
        env={k: v for k, v in os.environ.items() if not k.startswith("TXSTREAM_")})


def test_run_with_sasl_against_a_plaintext_broker_fails_in_one_line(
    kafka: KafkaSettings, tmp_path: Path
) -> None:
    """From a properties file: one line. The password as a flag works too, with a warning."""
    proc = _run(kafka, ["--kafka-config", _properties_file(kafka, tmp_path / "c.properties")])
    assert proc.returncode == 2, proc.stderr[-2000:]
    [line] = proc.stderr.strip().splitlines()
    assert line.startswith("txstream: ") and kafka.bootstrap_servers in line
    assert "s3cret" not in proc.stdout + proc.stderr, "the password is never printed"
    proc = _run(kafka, ["--bootstrap-servers", kafka.bootstrap_servers, *SASL_FLAGS])
    assert proc.returncode == 2, proc.stderr[-2000:]
    warning, line = proc.stderr.strip().splitlines()
    assert "--sasl-password on the command line is visible in the process list" in warning
    assert line.startswith("txstream: ") and kafka.bootstrap_servers in line
    assert "s3cret" not in proc.stdout + proc.stderr, "the password is never printed"
