"""The coordinator's configuration: one dataclass, RocketMQ's defaults, flags and env vars.

Every option has a command-line flag (``--check-max``) and an environment variable
(``TXSTREAM_CHECK_MAX``); a flag beats the variable, the variable beats the default.
"""

from __future__ import annotations

import argparse
import os
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from state.keys import KeyLayout
from state.policy import Policy
from streaming.session import DEFAULT_DRIVER_MEMORY, JIT_OPTIONS, check_driver_memory
from txstream.errors import ConfigError
from txstream.kafka import KafkaSettings
from txstream.topics import Topics

__all__ = [
    "DEFAULT_CHECKPOINT_ROOT",
    "RunConfig",
    "parse_duration_ms",
    "add_run_arguments",
    "config_from_args",
]

DEFAULT_CHECKPOINT_ROOT = Path(__file__).resolve().parent.parent / "checkpoints"

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
class RunConfig:
    """Everything ``txstream run`` needs. Defaults: RocketMQ's, and what measured best here."""

    kafka: KafkaSettings = field(default_factory=KafkaSettings)
    topics: Topics = field(default_factory=Topics)
    policy: Policy = field(default_factory=Policy)
    checkpoint_dir: Path = DEFAULT_CHECKPOINT_ROOT / "coordinator"
    trigger_ms: int = 0  # 0: a batch as soon as input or a due timer is there (best latency)
    # State keys (state/keys.py): a transaction id's creation-time window and one of
    # ``key_shards`` shards; ``buckets`` hash buckets for ids that carry no time. Pinned in the
    # checkpoint (streaming.query.pin_layout).
    key_window_ms: int = 1000
    key_shards: int = 2
    buckets: int = 16
    shuffle_partitions: int = 2
    state_store: str = "default"  # or "rocksdb"
    jit: str = "c1"  # the JVM's compilers: "c1" (quick, least CPU) or "tiered" (streaming.session)
    driver_memory: str = DEFAULT_DRIVER_MEMORY  # the driver's heap, which holds the local state
    max_offsets_per_trigger: int | None = 20_000
    topic_partitions: int = 2  # partitions of the half and end topics when txstream creates them
    history: bool = True  # write every transition to the history topic (txstream history)
    # Before the first batch after a restart, leave out the records a crashed run already wrote
    # (sinks/replay.py): no release twice. Off only to measure what it saves.
    replay_check: bool = True
    metrics_port: int | None = None
    query_name: str = "txstream-coordinator"

    def __post_init__(self) -> None:
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


# name, type, default-from-RunConfig/Policy, help. Durations are given as text ("6s").
_OPTIONS: list[tuple[str, str, str]] = [
    ("transaction-timeout", "duration", "first back-check after this (transactionTimeOut)"),
    ("check-interval", "duration", "time between back-checks (transactionCheckInterval)"),
    ("check-max", "int", "answered checks before discard (transactionCheckMax)"),
    ("reserved-time", "duration", "discard half messages older than this (fileReservedTime)"),
    ("orphan-end-timeout", "duration", "how long an end event waits for its half message"),
    ("resolved-retention", "duration", "how long resolved transactions are remembered"),
    ("timer-lead", "duration", "timers due this soon after a micro-batch starts run in it; "
                               "their records wait for the deadline (0: off)"),
]


def _env(name: str) -> str | None:
    return os.environ.get("TXSTREAM_" + name.upper().replace("-", "_"))


def add_run_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of ``txstream run`` (also used by ``demo`` and ``bench``)."""
    p = parser
    p.add_argument("--bootstrap-servers", default=_env("bootstrap-servers"),
                   help="Kafka HOST:PORT; default: start an embedded tansu broker")
    p.add_argument("--checkpoint-dir", default=_env("checkpoint-dir"),
                   help=f"default {DEFAULT_CHECKPOINT_ROOT / 'coordinator'}")
    for name, _kind, text in _OPTIONS:
        p.add_argument(f"--{name}", default=_env(name), help=text)
    p.add_argument("--trigger", default=_env("trigger") or "0s",
                   help="micro-batch trigger interval (0s: back to back)")
    p.add_argument("--key-window", default=_env("key-window"),
                   help="state keys: window of transaction-id creation times (default 1s)")
    p.add_argument("--key-shards", type=int, default=_env("key-shards"),
                   help="state keys per window (default 2: one per shuffle partition)")
    p.add_argument("--buckets", type=int, default=_env("buckets"),
                   help="state keys for transaction ids that carry no time (default 16)")
    p.add_argument("--shuffle-partitions", type=int, default=_env("shuffle-partitions"))
    p.add_argument("--state-store", choices=("default", "rocksdb"), default=_env("state-store"))
    p.add_argument("--jit", choices=tuple(JIT_OPTIONS), default=_env("jit"),
                   help="the JVM's compilers: c1 (default: quick, least CPU on small machines) "
                        "or tiered (the JVM's default, C2 too)")
    p.add_argument("--driver-memory", default=_env("driver-memory"),
                   help=f"the Spark driver's heap, where local state lives (default "
                        f"{DEFAULT_DRIVER_MEMORY}: ~420 bytes per pending transaction with "
                        f"200-byte bodies, plus ~200 MB)")
    p.add_argument("--max-offsets-per-trigger", type=int,
                   default=_env("max-offsets-per-trigger"))
    p.add_argument("--topic-prefix", default=_env("topic-prefix") or "",
                   help="prefix for every system topic (several coordinators on one broker)")
    p.add_argument("--metrics-port", type=int, default=_env("metrics-port"),
                   help="serve Prometheus metrics on this port")
    p.add_argument("--no-history", action="store_true",
                   default=(_env("no-history") or "").lower() in ("1", "true", "yes"),
                   help="do not write transitions to the history topic")
    p.add_argument("--no-replay-check", action="store_true",
                   default=(_env("no-replay-check") or "").lower() in ("1", "true", "yes"),
                   help="after a crash, write a replayed batch again whole (duplicates); "
                        "for measurements only")
    p.add_argument("--security-protocol", default=_env("security-protocol"))
    p.add_argument("--sasl-mechanism", default=_env("sasl-mechanism"))
    p.add_argument("--sasl-username", default=_env("sasl-username"))
    p.add_argument("--sasl-password", default=_env("sasl-password"))
    p.add_argument("--ssl-cafile", default=_env("ssl-cafile"))
    p.add_argument("--ssl-certfile", default=_env("ssl-certfile"))
    p.add_argument("--ssl-keyfile", default=_env("ssl-keyfile"))


def config_from_args(args: argparse.Namespace, bootstrap_servers: str) -> RunConfig:
    """Build the RunConfig from parsed flags; ``bootstrap_servers`` is already resolved."""
    policy_changes: dict[str, int] = {}
    for name, kind, _text in _OPTIONS:
        value = getattr(args, name.replace("-", "_"))
        if value is None:
            continue
        field_name = name.replace("-", "_")
        try:
            policy_changes[field_name] = (
                parse_duration_ms(value) if kind == "duration" else int(value)
            )
        except ValueError as exc:
            raise ConfigError(f"--{name}: {exc}") from None
    try:
        policy = replace(Policy(), **policy_changes)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    kafka = KafkaSettings.from_env(
        bootstrap_servers=bootstrap_servers,
        security_protocol=args.security_protocol,
        sasl_mechanism=args.sasl_mechanism,
        sasl_username=args.sasl_username,
        sasl_password=args.sasl_password,
        ssl_cafile=args.ssl_cafile,
        ssl_certfile=args.ssl_certfile,
        ssl_keyfile=args.ssl_keyfile,
    )
    changes: dict[str, Any] = {
        "kafka": kafka,
        "policy": policy,
        "topics": Topics.with_prefix(args.topic_prefix),
        "trigger_ms": parse_duration_ms(args.trigger),
        "history": not args.no_history,
        "replay_check": not getattr(args, "no_replay_check", False),
        "metrics_port": int(args.metrics_port) if args.metrics_port else None,
    }
    if args.checkpoint_dir:
        changes["checkpoint_dir"] = Path(args.checkpoint_dir)
    if getattr(args, "key_window", None) is not None:
        changes["key_window_ms"] = parse_duration_ms(args.key_window)
    for name in ("buckets", "key_shards", "shuffle_partitions", "state_store",
                 "max_offsets_per_trigger", "jit", "driver_memory"):
        value = getattr(args, name)
        if value is not None:
            text = name in ("state_store", "jit", "driver_memory")
            changes[name] = value if text else int(value)
    return RunConfig(**changes)
