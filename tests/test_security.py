"""Issue 5, security: the TLS/SASL settings reach every Kafka client txstream builds.

The session's tansu broker speaks PLAINTEXT only. Every client path is pointed at it with
SASL_PLAINTEXT/PLAIN: if a path dropped the settings it would connect (PLAINTEXT works there);
instead each must fail, and kafka-python must log the SASL handshake the broker refused. The
settings travel the way each component gets them: objects for the libraries, the JSON
``txstream run`` hands the Spark source and sink (built from its flags), environment
variables for the admin commands.
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
from typing import Any

import pytest

from client import PushConsumer, TransactionListener, TransactionProducer
from sinks.kafka_sink import SinkOptions, send_rows
from sources.kafka_io import SourceOptions, consumer_for, drop_consumer
from streaming.cli.options import (
    add_kafka_arguments,
    add_run_arguments,
    config_from_args,
    settings_of,
)
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

from kafka_helpers import output_row
from process_helpers import REPO

pytestmark = pytest.mark.kafka

SASL_FLAGS = ["--security-protocol", "SASL_PLAINTEXT", "--sasl-mechanism", "PLAIN",
              "--sasl-username", "alice", "--sasl-password", "s3cret"]
FAST = {"bootstrap_timeout_ms": 1500}  # fail in 1.5 s rather than kafka-python's 30 s


def _sasl(kafka: KafkaSettings, fast: bool = True) -> KafkaSettings:
    return dataclasses.replace(kafka, security_protocol="SASL_PLAINTEXT", sasl_mechanism="PLAIN",
                               sasl_username="alice", sasl_password="s3cret",
                               extra=FAST if fast else {})


def _run_json(kafka: KafkaSettings) -> str:
    """The ``kafka`` option ``txstream run`` gives the Spark source and sink for SASL_FLAGS."""
    parser = argparse.ArgumentParser()
    add_run_arguments(parser)
    config = config_from_args(parser.parse_args(SASL_FLAGS), kafka.bootstrap_servers)
    as_dict = dict(config.kafka.as_dict(), extra=FAST)
    return json.dumps(as_dict)


class _Listener(TransactionListener):
    def execute_local_transaction(self, msg: Message, arg: object) -> Decision:
        return Decision.COMMIT_MESSAGE

    def check_local_transaction(self, msg: Message) -> Decision:
        return Decision.COMMIT_MESSAGE


def _source(kafka: KafkaSettings) -> None:
    options = SourceOptions.parse({"kafka": _run_json(kafka)})
    try:
        consumer_for(options, "offsets")
    finally:
        drop_consumer(options, "offsets")


def _sink(kafka: KafkaSettings) -> None:
    send_rows(SinkOptions.parse({"kafka": _run_json(kafka)}),
              [output_row("visible", "sasl-probe", b"k", b"v", b"")])


def _push_consumer(kafka: KafkaSettings) -> None:
    consumer = PushConsumer("sasl-probe", kafka=_sasl(kafka), connect_timeout_s=1.5)
    consumer.subscribe("sasl-probe")
    consumer.register_message_listener(lambda msgs: None)  # type: ignore[arg-type,return-value]
    consumer.start()


PATHS: dict[str, Callable[[KafkaSettings], Any]] = {
    "make_producer": lambda k: make_producer(_sasl(k)),
    "make_consumer": lambda k: make_consumer(_sasl(k)),
    "make_admin": lambda k: make_admin(_sasl(k)),
    # wait_for_broker bounds each attempt itself (2 s).
    "wait_for_broker": lambda k: wait_for_broker(_sasl(k, fast=False), timeout_s=1.5),
    "spark source (txstream run flags)": _source,
    "spark sink (txstream run flags)": _sink,
    "TransactionProducer": lambda k: TransactionProducer(
        "sasl-probe", kafka=_sasl(k), listener=_Listener(), connect_timeout_s=1.5).start(),
    "PushConsumer": _push_consumer,
}


@pytest.mark.parametrize("path", list(PATHS))
def test_sasl_settings_reach_the_client(
    path: str, kafka: KafkaSettings, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR, logger="kafka")
    with pytest.raises(TxStreamError, match="Unable to bootstrap"):
        PATHS[path](kafka)
    handshake = [r.getMessage() for r in caplog.records if r.name.startswith("kafka")]
    assert any("UnsupportedSaslMechanismError" in m for m in handshake), handshake[-5:]


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
    assert any("UnsupportedSaslMechanismError" in r.getMessage() for r in caplog.records)


def test_run_with_sasl_against_a_plaintext_broker_fails_in_one_line(kafka: KafkaSettings) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "streaming.cli", "run", "--bootstrap-servers",
         kafka.bootstrap_servers, "--broker-timeout", "2", *SASL_FLAGS],
        capture_output=True, text=True, timeout=120, cwd=REPO,
        env={k: v for k, v in os.environ.items() if not k.startswith("TXSTREAM_")})
    assert proc.returncode == 2, proc.stderr[-2000:]
    [line] = proc.stderr.strip().splitlines()
    assert line.startswith("txstream: ") and kafka.bootstrap_servers in line
    assert "s3cret" not in proc.stdout + proc.stderr, "the password is never printed"
