"""The command line's flags and their environment variables: the one place either is read.

Every flag ``--check-max`` has a variable ``TXSTREAM_CHECK_MAX``; a flag beats the variable,
the variable beats the default. The flags of ``txstream run`` become one validated
:class:`~streaming.engine.config.RunConfig` (:func:`config_from_args`); the Kafka flags every
command shares become :class:`~txstream.kafka.KafkaSettings` (TLS/SASL variables included, and
``--kafka-config``/``-X`` client properties), so one exported environment serves every command.
"""

from __future__ import annotations

import argparse
import logging
import os
from dataclasses import MISSING, fields, replace
from typing import Any

from txstream.errors import ConfigError
from txstream.kafka import KafkaSettings
from txstream.kafka.properties import canonical_name, is_secret, read_properties
from txstream.options import parse_bool
from txstream.state.policy import Policy
from txstream.streaming.cli.logs import LOG_FORMATS, configure_logging
from txstream.streaming.engine.config import (
    DEFAULT_CHECKPOINT_ROOT,
    LOG_LEVELS,
    HealthThresholds,
    RunConfig,
    parse_duration_ms,
)
from txstream.streaming.engine.spark_settings import JIT_OPTIONS
from txstream.topics import Topics

__all__ = ["env", "add_kafka_arguments", "settings_of", "topics_of",
           "add_spark_arguments", "spark_conf_of", "set_log_level", "add_run_arguments",
           "config_from_args", "run_defaults", "duration_text"]

# The core's timing rules (state.policy.Policy): flag, kind, help; --help adds each default,
# taken from Policy. Durations are text ("6s").
_POLICY_FLAGS: list[tuple[str, str, str]] = [
    ("transaction-timeout", "duration", "first back-check after this (transactionTimeOut)"),
    ("check-interval", "duration", "time between back-checks (transactionCheckInterval)"),
    ("check-max", "int", "answered checks before discard (transactionCheckMax)"),
    ("reserved-time", "duration", "discard half messages pending this long after the "
     "coordinator registered them (fileReservedTime)"),
    ("orphan-end-timeout", "duration", "how long an end event waits for its half message"),
    ("resolved-retention", "duration", "how long resolved transactions are remembered"),
    ("timer-lead", "duration", "checks due this soon after a micro-batch starts run in it; "
                               "their records wait for the deadline (0: off)"),
    ("max-clock-skew", "duration", "a producer's born time further than this from the "
                                   "record's timestamp does not set the first check"),
    ("check-backoff-max", "int", "unanswered checks come twice as far apart each time, up to "
                                 "this many intervals (1: every interval)"),
]
_LOG_FORMAT = "text"
# Flags of RunConfig fields given as they are (numbers and names), by field name.
_PLAIN_FIELDS = ("buckets", "key_shards", "shuffle_partitions", "state_store",
                 "max_offsets_per_trigger", "max_message_bytes", "jit", "driver_memory")
_SECURITY_FLAGS = ("security-protocol", "sasl-mechanism", "sasl-username", "sasl-password",
                   "ssl-cafile", "ssl-certfile", "ssl-keyfile")


def duration_text(ms: int | float) -> str:
    """A duration as a flag takes it, in the largest unit that keeps it whole: 72h, 2m, 500ms."""
    for unit, size in (("h", 3_600_000), ("m", 60_000), ("s", 1000)):
        if ms and ms % size == 0:
            return f"{int(ms // size)}{unit}"
    return f"{int(ms)}ms" if ms else "0s"


def run_defaults() -> dict[str, str]:
    """The default of every flag of ``txstream run`` that has one, as it would be given on the
    command line: what ``--help`` says, taken from ``Policy`` and ``RunConfig`` (their fields
    hold each number once). ``tests/cli/test_flag_defaults.py`` holds docs/configuration.md to
    it."""
    policy = {f.name: f.default for f in fields(Policy)}
    config = {f.name: f.default for f in fields(RunConfig) if f.default is not MISSING}
    shown = {name: duration_text(policy[name.replace("-", "_")]) if kind == "duration"
             else str(policy[name.replace("-", "_")]) for name, kind, _text in _POLICY_FLAGS}
    shown.update({name.replace("_", "-"): str(config[name]) for name in _PLAIN_FIELDS})
    shown["key-window"] = duration_text(config["key_window_ms"])
    shown["trigger"] = duration_text(config["trigger_ms"])
    shown["broker-outage-limit"] = duration_text(config["broker_outage_limit_ms"])
    shown["metrics-host"] = config["metrics_host"]
    shown["transactions"] = config["transactions"]
    shown["log-format"] = _LOG_FORMAT
    health = HealthThresholds()
    shown["health-lag-growing"] = duration_text(health.lag_growing_s * 1000)
    shown["health-timer-overdue"] = duration_text(health.timer_overdue_s * 1000)
    return shown


def _default(flag: str) -> str:
    return run_defaults()[flag]


def _with_default(text: str, flag: str) -> str:
    if text.endswith(")"):  # "... (transactionTimeOut; default 6s)"
        return f"{text[:-1]}; default {_default(flag)})"
    return f"{text} (default {_default(flag)})"


def env(flag: str) -> str | None:
    """The environment variable of ``--flag``: ``TXSTREAM_FLAG`` (dashes as underscores)."""
    return os.environ.get("TXSTREAM_" + flag.upper().replace("-", "_")) or None


def add_kafka_arguments(p: argparse.ArgumentParser) -> None:
    """Where the broker is, how to reach it, and the coordinator's topic prefix."""
    p.add_argument("--bootstrap-servers", default=_env_bootstrap(), action=_BootstrapFlag,
                   help="Kafka HOST:PORT[,...] (env TXSTREAM_BOOTSTRAP_SERVERS)")
    p.add_argument("--topic-prefix", default=env("topic-prefix") or "",
                   help="prefix of every system topic, as the coordinator was given it "
                        "(env TXSTREAM_TOPIC_PREFIX)")
    p.add_argument("--kafka-config", metavar="FILE", default=env("kafka-config"),
                   action=_KafkaConfig,
                   help="Kafka client properties, as Kafka's tools take them (Kafka's names; "
                        "env TXSTREAM_KAFKA_CONFIG)")
    p.add_argument("-X", dest="kafka_property", metavar="KEY=VALUE", action=_KafkaProperty,
                   help="a Kafka client property (repeatable; beats --kafka-config)")
    for flag in _SECURITY_FLAGS:
        p.add_argument(f"--{flag}", default=None,
                       help=argparse.SUPPRESS if flag != "security-protocol" else
                       "TLS/SASL: --security-protocol, --sasl-mechanism, --sasl-username, "
                       "--sasl-password, --ssl-cafile, --ssl-certfile, --ssl-keyfile (or "
                       "their TXSTREAM_* variables)")


def settings_of(args: argparse.Namespace, bootstrap_servers: str | None = None
                ) -> KafkaSettings:
    """The Kafka settings of the parsed flags, setting by setting: ``TXSTREAM_*`` variables <
    the ``--kafka-config`` file (or ``TXSTREAM_KAFKA_CONFIG``'s) < ``-X`` < the named flags.
    A secret given on the command line is used, with a warning."""
    given = {flag.replace("-", "_"): getattr(args, flag.replace("-", "_"), None)
             for flag in _SECURITY_FLAGS}
    pairs = getattr(args, "kafka_property", None) or []
    shown = (["--sasl-password"] if given["sasl_password"] else []) + [
        f"-X {key}" for key, _ in pairs if is_secret(key)]
    if shown:
        logging.getLogger("txstream.kafka").warning(
            "%s on the command line is visible in the process list: prefer --kafka-config, "
            "TXSTREAM_SASL_PASSWORD or TXSTREAM_SASL_PASSWORD_FILE", ", ".join(shown))
    return KafkaSettings.from_properties(
        {canonical_name(key): value for key, value in pairs},
        file=getattr(args, "kafka_config", None), env=True, client_role="cli",
        bootstrap_servers=bootstrap_servers or args.bootstrap_servers, **given)


# Where args.bootstrap_servers came from; each source beats those before it, as in
# settings_of. run and demo start an embedded broker when it stays empty, so servers given in
# the properties file or by -X must land there while the flags are parsed.
_FROM_ENV, _FROM_FILE, _FROM_X, _FROM_FLAG = range(4)


def _offer_bootstrap(ns: argparse.Namespace, servers: str | None, rank: int) -> None:
    if rank >= getattr(ns, "kafka_bootstrap_rank", _FROM_ENV):
        ns.bootstrap_servers, ns.kafka_bootstrap_rank = servers, rank


def _file_bootstrap(path: str) -> str | None:
    props = read_properties(path)
    return next((str(v).strip() for k, v in props.items()
                 if canonical_name(k) == "bootstrap.servers"), None)


def _env_bootstrap() -> str | None:
    """TXSTREAM_KAFKA_CONFIG's servers, else TXSTREAM_BOOTSTRAP_SERVERS. A file that cannot be
    read is reported by settings_of, not while the parsers are built."""
    path = env("kafka-config")
    try:
        servers = _file_bootstrap(path) if path else None
    except ConfigError:
        servers = None
    return servers or env("bootstrap-servers")


class _BootstrapFlag(argparse.Action):
    def __call__(self, parser: Any, ns: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        _offer_bootstrap(ns, values, _FROM_FLAG)


class _KafkaConfig(argparse.Action):
    def __call__(self, parser: Any, ns: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        try:
            servers = _file_bootstrap(values)
        except ConfigError as exc:
            raise argparse.ArgumentError(self, str(exc)) from None
        ns.kafka_config = values
        # This file replaces TXSTREAM_KAFKA_CONFIG's, servers included.
        _offer_bootstrap(ns, servers or env("bootstrap-servers"), _FROM_FILE)


class _KafkaProperty(argparse.Action):
    def __call__(self, parser: Any, ns: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        key, sep, value = str(values).partition("=")
        if not sep or not key.strip():
            raise argparse.ArgumentError(self, "wants KEY=VALUE")  # never echo: maybe a secret
        ns.kafka_property = [*(getattr(ns, "kafka_property", None) or []), (key.strip(), value)]
        if canonical_name(key) == "bootstrap.servers":
            _offer_bootstrap(ns, value.strip(), _FROM_X)


def topics_of(args: argparse.Namespace) -> Topics:
    return Topics.with_prefix(args.topic_prefix or "")


def add_spark_arguments(p: argparse.ArgumentParser) -> None:
    """Where Spark runs and what it is told, as ``spark-submit`` takes it."""
    p.add_argument("--master", default=env("master"),
                   help="cluster manager URL, as spark-submit --master (default: spark-submit's, "
                        "or local[2] on loopback)")
    p.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE",
                   help="a Spark setting (repeatable); it beats txstream's own values, as "
                        "spark-submit --conf and spark-defaults.conf do")
    p.add_argument("--log-level", type=str.upper, choices=LOG_LEVELS, default=env("log-level"),
                   help="Spark's log level, and txstream's (default: Spark's log4j "
                        "configuration; txstream's own lines: WARN)")
    p.add_argument("--log-format", choices=LOG_FORMATS,
                   default=env("log-format") or _default("log-format"),
                   help=f"txstream's own lines: text with ISO 8601 times, or json, one object "
                        f"per line for log shippers (default {_default('log-format')})")


_PYTHON_LEVELS = {"ALL": logging.DEBUG, "TRACE": logging.DEBUG, "DEBUG": logging.DEBUG,
                  "INFO": logging.INFO, "WARN": logging.WARNING, "ERROR": logging.ERROR,
                  "FATAL": logging.CRITICAL, "OFF": logging.CRITICAL + 10}


def set_log_level(level: str | None, fmt: str | None = None) -> None:
    """txstream's own log level from ``--log-level`` (log4j's names; None keeps WARN), and the
    format of its lines from ``--log-format``."""
    if level:
        logging.getLogger().setLevel(_PYTHON_LEVELS[level.upper()])
    if fmt:
        configure_logging(fmt)


def spark_conf_of(args: argparse.Namespace) -> tuple[tuple[str, str], ...]:
    """The ``--conf KEY=VALUE`` pairs, in order; a key given twice keeps its last value."""
    pairs: dict[str, str] = {}
    for item in args.conf:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--conf wants KEY=VALUE, got {item!r}")
        pairs[key.strip()] = value
    return tuple(pairs.items())


def add_run_arguments(p: argparse.ArgumentParser, sink_transactions: bool = True) -> None:
    """The flags of ``txstream run`` (also taken by the benchmark, whose ``--transactions``
    is a count: ``sink_transactions=False`` leaves the run's out)."""
    add_kafka_arguments(p)
    add_spark_arguments(p)
    p.add_argument("--checkpoint-dir", default=env("checkpoint-dir"),
                   help="a path or a URI Spark can write (file://, hdfs://, s3a://...; default "
                        f"{DEFAULT_CHECKPOINT_ROOT / 'coordinator'})")
    for name, _kind, text in _POLICY_FLAGS:
        p.add_argument(f"--{name}", default=env(name), help=_with_default(text, name))
    p.add_argument("--trigger", default=env("trigger") or _default("trigger"),
                   help=f"micro-batch trigger interval (default {_default('trigger')}: back "
                        "to back)")
    p.add_argument("--key-window", default=env("key-window"),
                   help="state keys: window of transaction-id creation times (default "
                        f"{_default('key-window')})")
    p.add_argument("--key-shards", type=int, default=env("key-shards"),
                   help=f"state keys per window (default {_default('key-shards')}: one per "
                        "shuffle partition)")
    p.add_argument("--buckets", type=int, default=env("buckets"),
                   help="state keys for transaction ids that carry no time (default "
                        f"{_default('buckets')})")
    p.add_argument("--shuffle-partitions", type=int, default=env("shuffle-partitions"),
                   help=f"Spark's shuffle partitions (default {_default('shuffle-partitions')})")
    p.add_argument("--state-store", choices=("default", "rocksdb"), default=env("state-store"),
                   help=f"(default {_default('state-store')})")
    p.add_argument("--jit", choices=tuple(JIT_OPTIONS), default=env("jit"),
                   help="the JVM's compilers: c1 (quick, least CPU on small machines) or "
                        f"tiered (the JVM's default, C2 too) (default {_default('jit')})")
    p.add_argument("--driver-memory", default=env("driver-memory"),
                   help=f"the Spark driver's heap, where local state lives (default "
                        f"{_default('driver-memory')})")
    p.add_argument("--max-offsets-per-trigger", type=int, default=env("max-offsets-per-trigger"),
                   help="records read per micro-batch at most (default "
                        f"{_default('max-offsets-per-trigger')})")
    p.add_argument("--max-message-bytes", type=int, default=env("max-message-bytes"),
                   help="the largest record the coordinator writes (default "
                        f"{_default('max-message-bytes')}, Kafka's message.max.bytes): a half "
                        "message whose records would be bigger is dead-lettered as it comes")
    if sink_transactions:
        _add_transactions_flag(p)
    p.add_argument("--metrics-port", type=int, default=env("metrics-port"),
                   help="serve Prometheus metrics on this port")
    _add_tail_arguments(p)


def _add_transactions_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--transactions", dest="sink_transactions", choices=("auto", "on", "off"),
                   default=env("transactions"),
                   help="each sink task's records in one Kafka transaction: auto where the "
                        "broker isolates transactions (probed once per checkpoint), on (refuse "
                        "to start on a broker that does not), off (releases acknowledged before "
                        f"their notes) (default {_default('transactions')})")


def _add_tail_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--metrics-host", default=env("metrics-host") or _default("metrics-host"),
                   help="address the metrics server binds (default "
                        f"{_default('metrics-host')}: all interfaces)")
    p.add_argument("--health-lag-growing",
                   default=env("health-lag-growing") or _default("health-lag-growing"),
                   help="/healthz says 503 once the input lag grew, or was not read while "
                        f"records waited, for this long (default {_default('health-lag-growing')})")
    p.add_argument("--health-timer-overdue",
                   default=env("health-timer-overdue") or _default("health-timer-overdue"),
                   help="/healthz says 503 once a timer is overdue by this much (default "
                        f"{_default('health-timer-overdue')})")
    p.add_argument("--broker-outage-limit",
                   default=env("broker-outage-limit") or _default("broker-outage-limit"),
                   help="a query that fails while the broker is unreachable restarts from its "
                        "checkpoint once the broker answers; the coordinator fails once the "
                        f"outage is this long (default {_default('broker-outage-limit')})")
    p.add_argument("--no-history", action="store_true",
                   default=parse_bool(env("no-history") or "false", "TXSTREAM_NO_HISTORY"),
                   help="do not write transitions to the history topic (a new checkpoint "
                        "then cannot read back what was decided)")
    p.add_argument("--no-fail-on-data-loss", dest="fail_on_data_loss", action="store_false",
                   default=parse_bool(env("fail-on-data-loss") or "true",
                                      "TXSTREAM_FAIL_ON_DATA_LOSS"),
                   help="when the broker lost half or end records the checkpoint has read (a "
                        "partition cut, a topic created again), read those partitions again "
                        "from their start, after the history's outcomes, instead of stopping")


def _policy(args: argparse.Namespace) -> Policy:
    changes: dict[str, int] = {}
    for name, kind, _text in _POLICY_FLAGS:
        value = getattr(args, name.replace("-", "_"))
        if value is None:
            continue
        try:
            changes[name.replace("-", "_")] = (
                parse_duration_ms(value) if kind == "duration" else int(value))
        except ValueError as exc:
            raise ConfigError(f"--{name}: {exc}") from None
    try:
        return replace(Policy(), **changes)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def _duration(flag: str, text: str) -> int:
    try:
        return parse_duration_ms(text)
    except ValueError as exc:
        raise ConfigError(f"--{flag}: {exc}") from None


def config_from_args(args: argparse.Namespace, bootstrap_servers: str) -> RunConfig:
    """The RunConfig of the parsed flags; ``bootstrap_servers`` is already resolved."""
    changes: dict[str, Any] = {
        "transactions": getattr(args, "sink_transactions", None) or "auto",
        "kafka": settings_of(args, bootstrap_servers),
        "policy": _policy(args),
        "topics": Topics.with_prefix(args.topic_prefix),
        "trigger_ms": parse_duration_ms(args.trigger),
        "broker_outage_limit_ms": _duration("broker-outage-limit", args.broker_outage_limit),
        "history": not args.no_history,
        "fail_on_data_loss": args.fail_on_data_loss,
        "metrics_port": int(args.metrics_port) if args.metrics_port else None,
        "metrics_host": args.metrics_host,
        "master": args.master,
        "spark_conf": spark_conf_of(args),
        "log_level": args.log_level,
    }
    if args.checkpoint_dir:
        changes["checkpoint_dir"] = args.checkpoint_dir  # a URI stays as given
    if args.key_window is not None:
        changes["key_window_ms"] = parse_duration_ms(args.key_window)
    for name in _PLAIN_FIELDS:
        value = getattr(args, name)
        if value is not None:
            text = name in ("state_store", "jit", "driver_memory")
            changes[name] = value if text else int(value)
    return RunConfig(**changes)
