"""``txstream topics create|check``: the topics a deployment needs, made or verified, with the
consumer groups and ACLs it needs (:mod:`txstream.kafka.provision`).

    txstream topics check  --bootstrap-servers B [--group G]... [--real-topic T]...
                           [--consumer-group C]...
    txstream topics create ... [--partitions 2] [--replication-factor -1] [--retention 7d]
                           [--max-message-bytes N]

One line per topic (``topic NAME STATUS ...``), then one per consumer group (``group ...``) and
one per ACL (``acl FLAGS``: the flags of ``kafka-acls.sh --add``).
"""

from __future__ import annotations

import argparse
from typing import Any

from txstream.errors import ConfigError
from txstream.kafka.provision import (
    EXISTS,
    Deployment,
    TopicSpec,
    TopicState,
    admin_client,
    create_topics,
    deployment,
    topic_states,
)
from txstream.streaming.cli.options import add_kafka_arguments, settings_of, topics_of
from txstream.streaming.engine.config import parse_duration_ms

__all__ = ["add_parser", "topics_command", "deployment_of", "describe_needs"]


def _add_arguments(p: argparse.ArgumentParser) -> None:
    add_kafka_arguments(p)
    p.add_argument("--group", action="append", default=[], metavar="G",
                   help="a producer group: its check topic (repeatable)")
    p.add_argument("--real-topic", action="append", default=[], metavar="T",
                   help="a topic messages are released to (repeatable)")
    p.add_argument("--consumer-group", action="append", default=[], metavar="C",
                   help="a push consumer group: its retry and dead-letter topics (repeatable)")
    p.add_argument("--partitions", type=int, default=2, help="partitions of a new topic (2)")
    p.add_argument("--replication-factor", type=int, default=-1,
                   help="replicas of a new topic (default -1: the broker's default)")
    p.add_argument("--retention", default=None,
                   help="retention.ms of every new topic, as a duration (7d, 72h) or -1 "
                        "(forever); default per kind: half/end/history/retry 7d, check 1d, "
                        "discard/dead letters 30d, real topics the broker's")
    p.add_argument("--max-message-bytes", type=int, default=None,
                   help="max.message.bytes of every new topic (default: the broker's)")
    p.add_argument("--principal", action="append", default=[], metavar="ROLE=PRINCIPAL",
                   help="the principal of a role in the ACL lines, e.g. "
                        "coordinator=User:txstream (repeatable; default User:<role>)")


def add_parser(sub: Any) -> None:
    p = sub.add_parser("topics", help="create or verify the topics a deployment needs",
                       description="Create (create) or verify (check) every topic the "
                                   "coordinator and the clients use; both print the consumer "
                                   "groups and ACLs a deployment needs.")
    actions = p.add_subparsers(dest="action", required=True)
    for action, text in (("create", "create the missing topics, leave existing ones alone"),
                         ("check", "report each topic present or missing; exit 1 if any is "
                                   "missing")):
        a = actions.add_parser(action, help=text, description=text)
        _add_arguments(a)
        a.set_defaults(func=topics_command)


def _retention_ms(text: str | None) -> int | None:
    if text is None:
        return None
    if text.strip() in ("-1", "forever"):
        return -1
    try:
        return parse_duration_ms(text)
    except ConfigError as exc:
        raise ConfigError(f"--retention: {exc}") from None


def _principals(pairs: list[str]) -> dict[str, str]:
    out = {}
    for pair in pairs:
        role, sep, principal = pair.partition("=")
        if not sep or not role or not principal:
            raise ConfigError(f"--principal wants ROLE=PRINCIPAL, got {pair!r}")
        out[role] = principal
    return out


def deployment_of(args: argparse.Namespace) -> Deployment:
    return deployment(topics_of(args), producer_groups=args.group, real_topics=args.real_topic,
                      consumer_groups=args.consumer_group, partitions=args.partitions,
                      replication_factor=args.replication_factor,
                      retention_ms=_retention_ms(args.retention),
                      max_message_bytes=args.max_message_bytes)


def _details(spec: TopicSpec, state: TopicState | None) -> str:
    """Partitions and configs: the broker's where it told, else (to be created) ours."""
    if state is None or not state.present:
        parts = [f"partitions={spec.partitions}", *(f"{k}={v}" for k, v in spec.configs.items())]
        return "  ".join(parts)
    parts = [f"partitions={state.partitions}"]
    for name, value in state.configs.items():
        wanted = spec.configs.get(name)
        parts.append(f"{name}={value}" + (f" (wanted {wanted})" if wanted not in (None, value)
                                          else ""))
    return "  ".join(parts)


def _line(spec: TopicSpec, status: str, details: str) -> str:
    return f"topic {spec.name}  {status}  ({spec.kind})  {details}".rstrip()


def describe_needs(needs: Deployment, principals: dict[str, str] | None = None) -> list[str]:
    """The consumer groups and ACL lines of a deployment."""
    lines = [f"group {g.name}  joined by {g.members}  subscribes {', '.join(g.topics)}"
             for g in needs.groups]
    lines.append("# the coordinator and txstream history read with assign(): no consumer group")
    lines.append("# acl lines: kafka-acls.sh --bootstrap-server HOST:PORT --add FLAGS; "
                 "User:<role> is that role's principal (--principal ROLE=PRINCIPAL); brokers "
                 "before Kafka 3.0 also want IdempotentWrite on the cluster for every writer")
    lines += [f"acl {acl.flags(principals)}" for acl in needs.acls()]
    return lines


def topics_command(args: argparse.Namespace) -> int:
    needs = deployment_of(args)
    principals = _principals(args.principal)
    names = [s.name for s in needs.topics]
    with admin_client(settings_of(args)) as admin:
        before = topic_states(admin, names, with_configs=True)
        missing = [s for s in needs.topics if not before[s.name].present]
        created = create_topics(admin, missing) if args.action == "create" else {}
        made = [n for n, error in created.items() if error in (None, EXISTS)]
        after = topic_states(admin, made, with_configs=True) if made else {}
    failed = 0
    for spec in needs.topics:
        state = before[spec.name]
        error = created.get(spec.name, "no answer from the broker")
        if state.present or error == EXISTS:
            status = "exists, left alone" if args.action == "create" else "present"
            state = after.get(spec.name, state)
        elif args.action == "check":
            status, failed = "MISSING", failed + 1
        elif error is None:
            status, state = "created", after.get(spec.name, state)
        else:
            status, failed = f"FAILED ({error})", failed + 1
        print(_line(spec, status, _details(spec, state)), flush=True)
    for line in describe_needs(needs, principals):
        print(line, flush=True)
    return 1 if failed else 0
