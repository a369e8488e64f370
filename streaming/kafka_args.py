"""Flags every Kafka-facing subcommand shares: where the broker is, and the topic prefix.

TLS/SASL come from the ``TXSTREAM_*`` environment variables (``KafkaSettings.from_env``), as
for ``txstream run``, so one exported environment serves every command.
"""

from __future__ import annotations

import argparse
import os
import time

from txstream.kafka import KafkaSettings
from txstream.topics import Topics

__all__ = ["add_kafka_arguments", "settings_of", "topics_of", "format_ms"]


def add_kafka_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--bootstrap-servers", default=os.environ.get("TXSTREAM_BOOTSTRAP_SERVERS"),
                   help="Kafka HOST:PORT (env TXSTREAM_BOOTSTRAP_SERVERS; default "
                        "127.0.0.1:9092, where `txstream broker` listens)")
    p.add_argument("--topic-prefix", default=os.environ.get("TXSTREAM_TOPIC_PREFIX") or "",
                   help="the coordinator's --topic-prefix (env TXSTREAM_TOPIC_PREFIX)")


def settings_of(args: argparse.Namespace) -> KafkaSettings:
    return KafkaSettings.from_env(bootstrap_servers=args.bootstrap_servers)


def topics_of(args: argparse.Namespace) -> Topics:
    return Topics.with_prefix(args.topic_prefix or "")


def format_ms(epoch_ms: int | None) -> str:
    """Local wall-clock time with milliseconds, or '-'."""
    if epoch_ms is None:
        return "-"
    seconds, ms = divmod(int(epoch_ms), 1000)
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(seconds)) + f".{ms:03d}"
