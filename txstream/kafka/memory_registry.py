"""Where in-memory brokers are found by name: ``KafkaSettings(bootstrap_servers=
"memory://NAME")`` makes txstream's clients talk to the broker registered as NAME
(:mod:`txstream.kafka.memory`). The only global state of the in-memory Kafka."""

from __future__ import annotations

from typing import TYPE_CHECKING

from txstream.kafka.settings import KafkaSettings

if TYPE_CHECKING:
    from txstream.kafka.memory import MemoryBroker

__all__ = ["MEMORY_SCHEME", "register", "unregister", "lookup", "broker_name"]

MEMORY_SCHEME = "memory://"

_REGISTRY: dict[str, MemoryBroker] = {}


def register(broker: MemoryBroker) -> None:
    """Find ``broker`` by its name from now on, and hand txstream's Kafka boundary the
    clients of ``memory://`` settings (:func:`txstream.kafka.clients.plug_clients`)."""
    from txstream.kafka.clients import plug_clients
    from txstream.kafka.memory_clients import MemoryClients

    if _REGISTRY.get(broker.name, broker) is not broker:
        raise ValueError(f"another memory broker is registered as {broker.name}")
    _REGISTRY[broker.name] = broker
    plug_clients(MEMORY_SCHEME, MemoryClients())


def unregister(name: str) -> None:
    _REGISTRY.pop(name, None)


def lookup(name: str) -> MemoryBroker | None:
    return _REGISTRY.get(name)


def broker_name(settings: KafkaSettings) -> str:
    return settings.bootstrap_servers[len(MEMORY_SCHEME):]
