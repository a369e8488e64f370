"""The in-memory broker's admin client (:mod:`txstream.kafka.memory`): kafka-python's
``KafkaAdminClient`` as txstream calls it (:class:`txstream.kafka.protocols.Admin`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from txstream.kafka.errors import UnknownTopicOrPartitionError, for_code
from txstream.kafka.memory import MemoryBroker, UnsupportedByMemoryBroker
from txstream.kafka.memory_registry import MEMORY_SCHEME

__all__ = ["MemoryAdmin"]

MIN_ISR = "min.insync.replicas"


class MemoryAdmin:
    """kafka-python's ``KafkaAdminClient``, the calls txstream makes, answering in its shapes
    (those tansu gives, where Kafka and tansu differ in detail)."""

    BROKER_ID = 1

    def __init__(self, broker: MemoryBroker, **configs: Any) -> None:
        from kafka import KafkaAdminClient
        from kafka.errors import KafkaConfigurationError

        extra = set(configs) - set(KafkaAdminClient.DEFAULT_CONFIG)
        if extra:
            raise KafkaConfigurationError(f"Unrecognized configs: {extra}")
        self.config = {**KafkaAdminClient.DEFAULT_CONFIG, **configs}
        self._broker = broker
        self._closed = False

    def _up(self) -> MemoryBroker:
        self._broker.check_up("answer to an admin request")
        return self._broker

    def list_topics(self) -> list[str]:
        return self._up().topic_names()

    def describe_topics(self, topics: Sequence[str] | None = None) -> list[dict[str, Any]]:
        broker = self._up()
        return [self._described(broker, name)
                for name in (broker.topic_names() if topics is None else topics)]

    def _described(self, broker: MemoryBroker, name: str) -> dict[str, Any]:
        count = broker.partition_count(name)
        if count is None:
            return {"error_code": 3, "name": name, "topic_id": None, "is_internal": False,
                    "partitions": [], "authorized_operations": None}
        node = self.BROKER_ID
        replicas = list(range(node, node + broker.replicas))
        parts = [{"error_code": 0, "partition_index": p, "leader_id": node, "leader_epoch": 0,
                  "replica_nodes": replicas,
                  "isr_nodes": replicas[:broker.in_sync(name, p)], "offline_replicas": []}
                 for p in range(count)]
        return {"error_code": 0, "name": name, "topic_id": broker.topic_id(name),
                "is_internal": False, "partitions": parts, "authorized_operations": None}

    def create_topics(self, new_topics: Mapping[str, Mapping[str, Any]],
                      timeout_ms: int | None = None, validate_only: bool = False,
                      raise_errors: bool = True, wait_for_metadata: bool = False
                      ) -> dict[str, Any]:
        """``new_topics`` as kafka-python's dict form: {name: {num_partitions,
        replication_factor, configs}}."""
        broker = self._up()
        results = []
        for name, spec in new_topics.items():
            partitions = int(spec.get("num_partitions", -1))
            replication = int(spec.get("replication_factor", -1))
            partitions = broker.default_partitions if partitions == -1 else partitions
            code, message = 0, None
            if broker.partition_count(name) is not None:
                code, message = 36, "Topic with this name already exists."
            elif partitions < 1:
                code, message = 37, "Number of partitions must be larger than 0."
            elif replication not in (-1, 1):
                code, message = 38, "Replication factor must be -1 or 1 (one broker)."
            elif not validate_only:
                broker.create_topic(name, partitions, dict(spec.get("configs") or {}))
            if code and raise_errors:
                raise for_code(code)(message)
            results.append({"name": name, "topic_id": None if code else broker.topic_id(name),
                            "error_code": code, "error_message": message,
                            "topic_config_error_code": 0, "num_partitions": partitions,
                            "replication_factor": 1})
        return {"topics": results}

    def delete_topics(self, topics: Sequence[str], timeout_ms: int | None = None,
                      raise_errors: bool = True) -> dict[str, Any]:
        broker = self._up()
        results = []
        for name in topics:
            present = broker.partition_count(name) is not None
            if present:
                broker.delete_topic(name)
            elif raise_errors:
                raise UnknownTopicOrPartitionError(name)
            results.append({"name": name, "topic_id": None, "error_code": 0 if present else 3,
                            "error_message": None})
        return {"topics": results}

    def describe_cluster(self) -> dict[str, Any]:
        self._up()
        return {"cluster_id": f"memory-{self._broker.name}", "controller_id": self.BROKER_ID,
                "brokers": [{"broker_id": self.BROKER_ID, "host": MEMORY_SCHEME.rstrip(":/"),
                             "port": 0, "rack": None}],
                "authorized_operations": None}

    def describe_configs(self, config_resources: Sequence[Any], include_synonyms: bool = False,
                         config_filter: str = "modified") -> dict[str, Any]:
        """Topics: the configs they were given (``config_filter="all"``: with
        ``min.insync.replicas``, the broker's default, as many as the replicas); the broker:
        ``auto.create.topics.enable`` (unless made like tansu, which tells nothing)."""
        from kafka.admin import ConfigResourceType

        broker = self._up()
        out: dict[str, Any] = {}
        for resource in config_resources:
            if resource.resource_type == ConfigResourceType.TOPIC:
                found = (broker.topic_configs(resource.name)
                         if broker.partition_count(resource.name) is not None else {})
                if config_filter == "all" and broker.replicas > 1:  # defaults told too
                    found = {MIN_ISR: str(broker.replicas), **found}
                out.setdefault("topic", {})[resource.name] = {
                    k: _config_entry(v) for k, v in found.items()}
            elif resource.resource_type == ConfigResourceType.BROKER:
                told = ({"auto.create.topics.enable": _config_entry(
                    str(broker.auto_create).lower())} if broker.tells_broker_configs else {})
                out.setdefault("broker", {})[str(resource.name)] = told
            else:
                raise UnsupportedByMemoryBroker(f"describe_configs of {resource.resource_type}")
        return out

    def close(self) -> None:
        self._closed = True

    def __enter__(self) -> MemoryAdmin:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _config_entry(value: str) -> dict[str, Any]:
    return {"value": value, "read_only": False, "config_source": "DEFAULT_CONFIG",
            "is_sensitive": False, "synonyms": [], "config_type": "STRING",
            "documentation": ""}
