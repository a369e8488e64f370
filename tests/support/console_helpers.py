"""A coordinator for the console's tests (index and web pages), on topics of its own, with
checks nobody answers, and a producer that answers UNKNOW."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.support.kafka_helpers import end_record, half_record, produce, wait_for
from txstream.kafka import KafkaSettings
from txstream.message import Decision
from txstream.state.policy import Policy
from txstream.streaming.cli import main
from txstream.streaming.engine.config import RunConfig
from txstream.streaming.engine.query import start_coordinator
from txstream.topics import Topics

__all__ = ["POLICY", "Coordinator", "start_console_coordinator", "produce_unknown"]

# Checks start after 1 s and nobody answers them unless a test does, so a transaction stays
# pending. Reserved time 10 min: a half message born 11 minutes ago is discarded at once.
POLICY = Policy(transaction_timeout=1000, check_interval=2000, check_max=2,
                reserved_time=600_000, orphan_end_timeout=5000)


@dataclass
class Coordinator:
    kafka: KafkaSettings
    topics: Topics
    query: Any

    @property
    def args(self) -> list[str]:
        return ["--bootstrap-servers", self.kafka.bootstrap_servers,
                "--topic-prefix", self.topics.prefix]


def start_console_coordinator(spark: Any, kafka: KafkaSettings, checkpoint: Path
                              ) -> Coordinator:
    """A coordinator on topics of its own, warmed up (its first micro-batch is slow)."""
    topics = Topics.with_prefix(f"c{uuid.uuid4().hex[:8]}_")
    query = start_coordinator(spark, RunConfig(
        kafka=kafka, topics=topics, policy=POLICY, checkpoint_dir=checkpoint, buckets=8,
        query_name=f"console-{uuid.uuid4().hex[:6]}"))
    txid, real = f"warmup-{uuid.uuid4().hex[:6]}", f"{topics.half}_warmup"
    produce(kafka, [half_record(topics, txid, "warmup", real),
                    end_record(topics, txid, "warmup", Decision.COMMIT_MESSAGE)])
    wait_for(kafka, real, 1, timeout_s=120)
    return Coordinator(kafka, topics, query)


def produce_unknown(coord: Coordinator, capsys: pytest.CaptureFixture[str], group: str,
                    topic: str, body: str, *extra: str) -> str:
    """One transaction whose producer answers UNKNOW, through ``txstream produce``."""
    rc = main(["produce", *coord.args, "--topic", topic, "--group", group, "--unknown",
               *extra, body])
    out = capsys.readouterr().out
    assert rc == 0, out
    return out.split()[0]
