"""The topics, consumer groups and ACLs a txstream deployment needs, and making the topics.

:func:`deployment` is a pure description: every topic (its name, who creates, writes and reads
it, its record key, its configs), every consumer group, every ACL. The admin calls below it
inspect and create topics: txstream creates topics itself only through :func:`ensure_topics`
(the coordinator at start, its source) and :func:`ensure_check_topic` (a producer's start).

Roles, as the ACLs name them: ``coordinator``, ``producer:G`` (the producers of group G),
``consumer:C`` (the push consumers of group C) and ``operator`` (``txstream resolve`` and
``txstream history``). The coordinator and ``txstream history`` read with ``assign()``: they
need no consumer group.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from txstream.errors import BrokerUnavailable, ConfigError
from txstream.kafka.clients import make_admin
from txstream.kafka.errors import KafkaError, TopicAlreadyExistsError, for_code
from txstream.kafka.protocols import Admin
from txstream.kafka.settings import KafkaSettings
from txstream.topics import DLQ_PREFIX, RETRY_PREFIX, Topics, validate_topic

__all__ = [
    "admin_errors",
    "DEFAULT_PARTITIONS",
    "DEFAULT_RETENTION_MS",
    "EXISTS",
    "SYSTEM_KINDS",
    "TopicSpec",
    "GroupSpec",
    "Acl",
    "Deployment",
    "TopicState",
    "topic_spec",
    "deployment",
    "coordinator_topics",
    "create_command",
    "admin_client",
    "topic_states",
    "create_topics",
    "broker_auto_create",
    "topics_to_create",
    "ensure_topics",
    "ensure_check_topic",
]

log = logging.getLogger(__name__)

DEFAULT_PARTITIONS = 2
_DAY_MS = 86_400_000
# Per kind: (created by, record key, default retention.ms; None: the broker's default).
# Half and end records wait for a coordinator that is down; a check request is stale once the
# next check is due; discards and dead letters wait for a person; the longest retry delay is 2 h.
_KINDS: dict[str, tuple[str, str, int | None]] = {
    "half": ("coordinator at start, or txstream topics create", "transaction id", 7 * _DAY_MS),
    "end": ("coordinator at start, or txstream topics create", "transaction id", 7 * _DAY_MS),
    "discard": ("coordinator at start, or txstream topics create", "transaction id",
                30 * _DAY_MS),
    "dead-letter": ("coordinator at start, or txstream topics create",
                    "the refused record's key (a transaction id)", 30 * _DAY_MS),
    "history": ("coordinator at start, or txstream topics create",
                "the coordinator's state key (decimal text)", 7 * _DAY_MS),
    "check": ("the group's first producer at start(), or txstream topics create --group",
              "transaction id", _DAY_MS),
    "real": ("txstream topics create --real-topic (the application's topic)",
             "the message's keys (RocketMQ KEYS), or none", None),
    "retry": ("txstream topics create --consumer-group", "the delivered record's key",
              7 * _DAY_MS),
    "consumer-dlq": ("txstream topics create --consumer-group", "the delivered record's key",
                     30 * _DAY_MS),
}
DEFAULT_RETENTION_MS: dict[str, int | None] = {k: v[2] for k, v in _KINDS.items()}
# Configs a kind always gets. The half and end topics keep the broker's time, which the
# coordinator's timers trust over a producer's clock (state/timing.py). A check topic keeps the
# latest request per transaction: a group away for days comes back to one, not thousands.
_KIND_CONFIGS: dict[str, dict[str, str]] = {
    "half": {"message.timestamp.type": "LogAppendTime"},
    "end": {"message.timestamp.type": "LogAppendTime"},
    "check": {"cleanup.policy": "compact,delete"},
}
EXISTS = "exists"  # create_topics' answer for a topic that was there already

COORDINATOR, OPERATOR = "coordinator", "operator"
SYSTEM_KINDS = ("half", "end", "discard", "dead-letter", "history")  # the coordinator's own


@dataclass(frozen=True)
class TopicSpec:
    """One topic of a deployment. ``replication_factor`` -1: the broker's default."""

    name: str
    kind: str
    created_by: str
    writers: tuple[str, ...]
    readers: tuple[str, ...]
    key: str
    partitions: int = DEFAULT_PARTITIONS
    replication_factor: int = -1
    configs: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class GroupSpec:
    """A Kafka consumer group: who joins it and what it subscribes to."""

    name: str
    members: str
    topics: tuple[str, ...]


@dataclass(frozen=True)
class Acl:
    """One allow rule: ``role`` may ``operation`` the ``resource`` (topic, group, cluster)."""

    role: str
    operation: str
    resource: str
    name: str = ""

    def flags(self, principals: Mapping[str, str] | None = None) -> str:
        """The rule as ``kafka-acls.sh --add`` flags; a role without a principal in
        ``principals`` stays a placeholder ``User:<role>``."""
        principal = (principals or {}).get(self.role, f"User:<{self.role}>")
        where = "--cluster" if self.resource == "cluster" else f"--{self.resource} {self.name}"
        return f"--allow-principal {principal} --operation {self.operation} {where}"


@dataclass(frozen=True)
class Deployment:
    topics: tuple[TopicSpec, ...]
    groups: tuple[GroupSpec, ...]

    def acls(self) -> list[Acl]:
        """Every rule the roles need, creators' Create included, in topic order."""
        out: list[Acl] = []
        for spec in self.topics:
            out += [Acl(role, "Write", "topic", spec.name) for role in spec.writers]
            out += [Acl(role, "Read", "topic", spec.name) for role in spec.readers]
            if spec.kind in SYSTEM_KINDS:
                out.append(Acl(COORDINATOR, "Create", "topic", spec.name))
            elif spec.kind == "check":
                out += [Acl(role, "Create", "topic", spec.name) for role in spec.readers
                        if role.startswith("producer:")]
        for group in self.groups:
            out.append(Acl(group.members, "Read", "group", group.name))
        # Without it the coordinator cannot tell whether the broker creates topics (it then
        # assumes Kafka's default, that it does).
        out.append(Acl(COORDINATOR, "DescribeConfigs", "cluster"))
        return list(dict.fromkeys(out))


def topic_spec(kind: str, name: str, *, writers: Sequence[str] = (), readers: Sequence[str] = (),
               partitions: int = DEFAULT_PARTITIONS, replication_factor: int = -1,
               retention_ms: int | None = None, max_message_bytes: int | None = None
               ) -> TopicSpec:
    """The topic ``name`` of ``kind`` with its kind's defaults (retention: the kind's unless
    ``retention_ms`` is given; -1 keeps records forever)."""
    created_by, key, default_retention = _KINDS[kind]
    if partitions < 1:
        raise ConfigError("partitions must be at least 1")
    if replication_factor == 0 or replication_factor < -1:
        raise ConfigError("replication factor must be -1 (the broker's) or at least 1")
    configs: dict[str, str] = dict(_KIND_CONFIGS.get(kind, {}))
    retention = retention_ms if retention_ms is not None else default_retention
    if retention is not None:
        configs["retention.ms"] = str(retention)
    if max_message_bytes is not None:
        if max_message_bytes < 1024:
            raise ConfigError("max message bytes must be at least 1024")
        configs["max.message.bytes"] = str(max_message_bytes)
    return TopicSpec(validate_topic(name), kind, created_by, tuple(writers), tuple(readers), key,
                     partitions, replication_factor, configs)


def _consumer_topics(prefix: str, group: str) -> tuple[str, str]:
    return f"{prefix}{RETRY_PREFIX}{group}", f"{prefix}{DLQ_PREFIX}{group}"


def deployment(topics: Topics, *, producer_groups: Sequence[str] = (),
               real_topics: Sequence[str] = (), consumer_groups: Sequence[str] = (),
               **options: Any) -> Deployment:
    """Everything a deployment with these groups and real topics needs. ``options``:
    ``partitions``, ``replication_factor``, ``retention_ms``, ``max_message_bytes`` (of every
    topic). Every consumer group is taken to read every real topic."""
    groups = list(dict.fromkeys(producer_groups))
    consumers = list(dict.fromkeys(consumer_groups))
    producers = tuple(f"producer:{g}" for g in groups) or ("producer:*",)
    readers = tuple(f"consumer:{c}" for c in consumers)
    # The coordinator reads back what it writes: after a restart its sink looks for the
    # records a replayed micro-batch already wrote (txstream/readback/replay.py).
    own = (COORDINATOR, OPERATOR)
    specs = [
        topic_spec("half", topics.half, writers=producers, readers=(COORDINATOR,), **options),
        topic_spec("end", topics.end, writers=(*producers, OPERATOR), readers=(COORDINATOR,),
                   **options),
        topic_spec("discard", topics.discard, writers=(COORDINATOR,), readers=own, **options),
        topic_spec("dead-letter", topics.dead_letter, writers=(COORDINATOR,), readers=own,
                   **options),
        topic_spec("history", topics.history, writers=(COORDINATOR,), readers=own, **options),
    ]
    group_specs = []
    for g in groups:
        check = topics.check(g)
        specs.append(topic_spec("check", check, writers=(COORDINATOR,),
                                readers=(f"producer:{g}", COORDINATOR), **options))
        group_specs.append(GroupSpec(f"{check}.checkers", f"producer:{g}", (check,)))
    for t in dict.fromkeys(real_topics):
        specs.append(topic_spec("real", t, writers=(COORDINATOR,),
                                readers=(*readers, COORDINATOR), **options))
    for c in consumers:
        retry, dlq = _consumer_topics(topics.prefix, c)
        role = f"consumer:{c}"
        specs.append(topic_spec("retry", retry, writers=(role,), readers=(role,), **options))
        specs.append(topic_spec("consumer-dlq", dlq, writers=(role,), **options))
        group_specs.append(GroupSpec(c, role, (*dict.fromkeys(real_topics), retry)))
    return Deployment(tuple(specs), tuple(group_specs))


def coordinator_topics(topics: Topics, partitions: int = DEFAULT_PARTITIONS) -> list[TopicSpec]:
    """The topics the coordinator needs before it starts: half, end, discard, dead letter,
    history."""
    return [s for s in deployment(topics, partitions=partitions).topics if s.kind in SYSTEM_KINDS]


def create_command(settings: KafkaSettings, topics: Topics, *flags: str) -> str:
    """The command an operator runs to create the topics."""
    words = ["txstream topics create --bootstrap-servers", settings.bootstrap_servers]
    if topics.prefix:
        words += ["--topic-prefix", topics.prefix]
    return " ".join([*words, *flags])


# --- admin calls ---------------------------------------------------------------------------


@dataclass(frozen=True)
class TopicState:
    """A topic as the broker describes it; ``configs``: what it tells of ours."""

    name: str
    present: bool
    partitions: int | None = None
    configs: Mapping[str, str] = field(default_factory=dict)


@contextmanager
def admin_errors(settings: KafkaSettings) -> Iterator[None]:
    """A Kafka error of an admin request in the block as one clear line: BrokerUnavailable if
    it may pass (retriable, a connection), ConfigError if the broker refused."""
    try:
        yield
    except KafkaError as exc:
        what = f"{type(exc).__name__}: {exc}"
        if getattr(exc, "retriable", False) or "Connection" in type(exc).__name__:
            raise BrokerUnavailable(f"Kafka at {settings.bootstrap_servers} did not answer "
                                    f"an admin request ({what})") from None
        raise ConfigError(f"Kafka at {settings.bootstrap_servers} refused an admin request "
                          f"({what})") from None


@contextmanager
def admin_client(settings: KafkaSettings) -> Iterator[Admin]:
    """An admin client, closed after; a Kafka error in the block becomes one clear line."""
    admin = make_admin(settings)
    try:
        with admin_errors(settings):
            yield admin
    finally:
        admin.close()


_SHOWN_CONFIGS = ("retention.ms", "retention.bytes", "max.message.bytes",
                  "message.timestamp.type", "cleanup.policy")


def topic_states(admin: Admin, names: Sequence[str], with_configs: bool = False
                 ) -> dict[str, TopicState]:
    """Which of ``names`` exist, with their partitions (a metadata request that never
    auto-creates) and, if asked, their retention and size limit."""
    from kafka.admin import ConfigResource, ConfigResourceType

    described = {t["name"]: t for t in admin.describe_topics(list(names))}
    out: dict[str, TopicState] = {}
    for name in names:
        meta = described.get(name)
        if meta and meta["error_code"] == 0:
            out[name] = TopicState(name, True, len(meta["partitions"]))
        else:
            out[name] = TopicState(name, False)
    present = [n for n in names if out[n].present]
    if with_configs and present:
        try:
            # Every config, not the two we show: tansu drops the connection when keys are named.
            answer = admin.describe_configs(
                [ConfigResource(ConfigResourceType.TOPIC, n) for n in present],
                config_filter="all")
        except Exception as exc:  # not allowed or not supported: the configs stay untold
            log.info("the broker does not tell the topics' configs: %s", exc)
            return out
        for name in present:
            found = answer.get("topic", {}).get(name, {})
            configs = {k: str(found[k]["value"]) for k in _SHOWN_CONFIGS if k in found}
            out[name] = TopicState(name, True, out[name].partitions, configs)
    return out


def create_topics(admin: Admin, specs: Sequence[TopicSpec]) -> dict[str, str | None]:
    """Create ``specs`` in one request. Per topic: None (created), :data:`EXISTS`, or the
    broker's error."""
    if not specs:
        return {}
    request = {s.name: {"num_partitions": s.partitions,
                        "replication_factor": s.replication_factor,
                        "configs": dict(s.configs)} for s in specs}
    answer = admin.create_topics(request, raise_errors=False)
    out: dict[str, str | None] = {}
    for result in answer["topics"]:
        code = result["error_code"]
        if code == 0:
            out[result["name"]] = None
        elif for_code(code) is TopicAlreadyExistsError:
            out[result["name"]] = EXISTS
        else:
            error = for_code(code).__name__
            out[result["name"]] = f"{error}: {result['error_message']}" \
                if result.get("error_message") else error
    return out


def broker_auto_create(admin: Admin) -> bool | None:
    """The broker's ``auto.create.topics.enable``, or None when it does not tell."""
    from kafka.admin import ConfigResource, ConfigResourceType

    try:
        brokers = admin.describe_cluster()["brokers"]
        resources = [ConfigResource(ConfigResourceType.BROKER, str(brokers[0]["broker_id"]))]
        # Every config: tansu drops the connection when keys are named.
        answer = admin.describe_configs(resources, config_filter="all")
    except Exception as exc:  # not allowed (no DescribeConfigs ACL) or not supported
        log.info("the broker does not tell whether it creates topics: %s", exc)
        return None
    for configs in answer.get("broker", {}).values():
        entry = configs.get("auto.create.topics.enable")
        if entry is not None and entry.get("value") is not None:
            return str(entry["value"]).strip().lower() == "true"
    return None


def topics_to_create(missing: Sequence[str], auto_create: bool | None, command: str
                     ) -> list[str]:
    """The rule: txstream creates missing topics itself only where the broker would too
    (``auto.create.topics.enable``; not told: Kafka's default, true). A cluster that turned it
    off provisions its topics on purpose: then say which are missing, and how to create them."""
    if not missing:
        return []
    if auto_create is False:
        raise ConfigError(f"topics missing and the broker does not create topics: "
                          f"{', '.join(missing)} ({command})")
    return list(missing)


def ensure_topics(settings: KafkaSettings, specs: Sequence[TopicSpec], command: str
                  ) -> list[str]:
    """Create those of ``specs`` that are missing, by :func:`topics_to_create`'s rule; returns
    the names created. ConfigError (one line, naming ``command``) when they may not or could
    not be created."""
    with admin_client(settings) as admin:
        states = topic_states(admin, [s.name for s in specs])
        missing = [s for s in specs if not states[s.name].present]
        if not missing:
            return []
        # Looked up at call time: tests make the broker answer "off" here.
        allowed = topics_to_create([s.name for s in missing], broker_auto_create(admin), command)
        results = create_topics(admin, [s for s in missing if s.name in allowed])
    failed = {n: e for n, e in results.items() if e not in (None, EXISTS)}
    if failed:
        why = "; ".join(f"{n}: {e}" for n, e in failed.items())
        raise ConfigError(f"cannot create topics {', '.join(failed)} ({why}); create them with "
                          f"{command}")
    created = [n for n, e in results.items() if e is None]
    if created:
        log.info("created topics %s", ", ".join(created))
    return created


def ensure_check_topic(settings: KafkaSettings, topics: Topics, group: str,
                       partitions: int = DEFAULT_PARTITIONS) -> bool:
    """Create producer group ``group``'s check topic if missing, whatever the broker's
    auto-create rule: the coordinator writes back-checks there and the group's producers
    subscribe to it, whoever starts first. A broker that refuses is logged, not raised: the
    producer still sends. True when this call created it."""
    name = topics.check(group)
    spec = topic_spec("check", name, writers=(COORDINATOR,),
                      readers=(f"producer:{group}", COORDINATOR), partitions=partitions)
    try:
        with admin_client(settings) as admin:
            if topic_states(admin, [name])[name].present:
                return False
            error = create_topics(admin, [spec]).get(name, "no answer from the broker")
    except Exception as exc:  # not allowed, not supported, or the broker went away
        error = f"{type(exc).__name__}: {exc}"
    if error is None:
        log.info("created check topic %s", name)
        return True
    if error != EXISTS:
        log.warning("check topic %s of producer group %s is missing and could not be created "
                    "(%s): back-checks of this group fail until it exists; create it with %s",
                    name, group, error, create_command(settings, topics, "--group", group))
    return False
