"""The coordinator's configuration: one frozen dataclass, validated once, with RocketMQ's
defaults where RocketMQ has one.

The command line builds it (``txstream.streaming.cli.options``: flags and ``TXSTREAM_*`` variables);
everything else (the session, the source's and sink's options, the checkpoint) is derived
from it.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from txstream.errors import ConfigError
from txstream.kafka import KafkaSettings
from txstream.outputs import KAFKA_MAX_MESSAGE_BYTES
from txstream.state.keys import KeyLayout
from txstream.state.policy import Policy
from txstream.streaming.engine.spark_settings import (
    DEFAULT_DRIVER_MEMORY,
    JIT_OPTIONS,
    check_driver_memory,
)
from txstream.streaming.engine.transactions import MODES as TRANSACTION_MODES
from txstream.topics import Topics

__all__ = [
    "HealthThresholds",
    "DEFAULT_CHECKPOINT_ROOT",
    "RunConfig",
    "parse_duration_ms",
    "LOG_LEVELS",
]

DEFAULT_CHECKPOINT_ROOT = Path(__file__).resolve().parents[2] / "checkpoints"

# log4j's levels, which Spark's setLogLevel takes; Python's logging gets the nearest.
LOG_LEVELS = ("ALL", "TRACE", "DEBUG", "INFO", "WARN", "ERROR", "FATAL", "OFF")

_KEYS = KeyLayout()
_UNITS = {"ms": 1, "s": 1000, "m": 60_000, "min": 60_000, "h": 3_600_000, "d": 86_400_000}
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|min|h|d)?\s*$")


def parse_duration_ms(text: str | int | float) -> int:
    """``'6s'``, ``'250ms'``, ``'72h'``, ``'1.5m'`` or a bare number of seconds -> milliseconds."""
    if isinstance(text, (int, float)):
        return int(text * 1000)
    match = _DURATION.match(str(text))
    if not match:
        raise ConfigError(f"not a duration: {text!r} (examples: 6s, 250ms, 60s, 72h)")
    number, unit = match.groups()
    return int(float(number) * _UNITS[unit or "s"])


@dataclass(frozen=True)
class HealthThresholds:
    """``--health-lag-growing`` and ``--health-timer-overdue``, in seconds (here, with the rest
    of the configuration: the command line reads their defaults without the engine's imports)."""

    lag_growing_s: float = 300.0
    timer_overdue_s: float = 120.0


@dataclass(frozen=True)
class RunConfig:
    """Everything ``txstream run`` needs. Defaults: RocketMQ's, and what measured best here."""

    kafka: KafkaSettings = field(default_factory=KafkaSettings)
    topics: Topics = field(default_factory=Topics)
    policy: Policy = field(default_factory=Policy)
    # A path or a URI (file://, hdfs://, s3a://, ...), handed to Spark as given; a Path is
    # taken as its text.
    checkpoint_dir: str = str(DEFAULT_CHECKPOINT_ROOT / "coordinator")
    trigger_ms: int = 0  # 0: a batch as soon as input or a due timer is there (best latency)
    # State keys (state/keys.py): a transaction id's creation-time window and one of
    # ``key_shards`` shards; ``buckets`` hash buckets for ids that carry no time. Pinned in the
    # checkpoint (streaming.engine.checkpoint). The defaults are KeyLayout's.
    key_window_ms: int = _KEYS.window_ms
    key_shards: int = _KEYS.shards
    buckets: int = _KEYS.fallback_buckets
    shuffle_partitions: int = _KEYS.partitions
    state_store: str = "default"  # or "rocksdb"
    jit: str = "c1"  # the JVM's compilers: "c1" (quick, least CPU) or "tiered"
    driver_memory: str = DEFAULT_DRIVER_MEMORY  # the driver's heap, which holds the local state
    max_offsets_per_trigger: int | None = 20_000
    topic_partitions: int = 2  # partitions of the half and end topics when txstream creates them
    # The largest record the coordinator writes (Kafka's message.max.bytes, 1 MB by default):
    # bigger ones are refused or dead-lettered as a reference, never left to fail a batch.
    max_message_bytes: int = KAFKA_MAX_MESSAGE_BYTES
    history: bool = True  # write every transition to the history topic (txstream history)
    # False: a half or end partition that lost records the checkpoint has read is read again
    # from its start (after the history's outcomes), instead of failing the query.
    fail_on_data_loss: bool = True
    # Spark: the cluster manager (None: spark-submit's, or local[2]), settings that beat
    # txstream's own (streaming.engine.session), and the log level (None: log4j's config).
    master: str | None = None
    spark_conf: tuple[tuple[str, str], ...] = ()
    log_level: str | None = None
    metrics_port: int | None = None
    # A broker outage the coordinator rides out: a query failure the broker caused restarts
    # the query once the broker answers, until the outage is this long
    # (docs/decisions/0027-broker-outage.md).
    broker_outage_limit_ms: int = 300_000
    metrics_host: str = "0.0.0.0"  # all interfaces: a scraper in another container must reach it
    query_name: str = "txstream-coordinator"
    # Each sink task's records in one Kafka transaction: "auto" where the broker isolates
    # transactions (probed once per checkpoint), "on", "off" (streaming.engine.transactions).
    transactions: str = "auto"
    # Set when the choice is made at start: the checkpoint's transactional id (None: off).
    transactional_id: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "checkpoint_dir", os.fspath(self.checkpoint_dir))
        if not self.checkpoint_dir:
            raise ConfigError("the checkpoint location must not be empty")
        if self.log_level is not None and self.log_level.upper() not in LOG_LEVELS:
            raise ConfigError(f"log level must be one of {', '.join(LOG_LEVELS)}, "
                              f"not {self.log_level!r}")
        if self.buckets < 1 or self.key_shards < 1:
            raise ConfigError("buckets and key shards must be at least 1")
        if self.key_window_ms < 1:
            raise ConfigError("the key window must be at least 1 ms")
        if self.shuffle_partitions < 1:
            raise ConfigError("shuffle partitions must be at least 1")
        if self.state_store not in ("default", "rocksdb"):
            raise ConfigError("state store must be 'default' or 'rocksdb'")
        if self.jit not in JIT_OPTIONS:
            raise ConfigError(f"jit must be one of {', '.join(JIT_OPTIONS)}, not {self.jit!r}")
        if self.max_message_bytes < 1024:
            raise ConfigError("the largest message must be at least 1024 bytes")
        if self.transactions not in TRANSACTION_MODES:
            raise ConfigError(f"transactions must be one of {', '.join(TRANSACTION_MODES)}, "
                              f"not {self.transactions!r}")
        if self.trigger_ms < 0:
            raise ConfigError("trigger must not be negative")
        try:
            check_driver_memory(self.driver_memory)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None

    @property
    def layout(self) -> KeyLayout:
        return KeyLayout(self.key_window_ms, self.key_shards, self.buckets,
                         self.shuffle_partitions)

    def with_(self, **changes: Any) -> RunConfig:
        return replace(self, **changes)
