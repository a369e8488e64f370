"""The house's walls: every module of txstream imports only from its own room and the rooms
below it (docs/architecture.md, decision 0025), and only txstream/kafka/ imports kafka-python.
Read from the source, not by importing it."""

from __future__ import annotations

import ast
import os
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "txstream"

# Each room, and the rooms it may import from (besides itself). The base is txstream's own
# modules (message, wire, topics, ...): every room stands on it.
BELOW: dict[str, set[str]] = {
    "txstream": set(),
    "txstream.kafka": {"txstream"},
    "txstream.state": {"txstream"},
    "txstream.client": {"txstream", "txstream.kafka"},
    # Apache Kafka on loopback (beside tansu's txstream.broker): asks its cluster through the
    # Kafka module.
    "txstream.kafka_broker": {"txstream", "txstream.kafka"},
    # The console tells the core's words: its statuses and history note kinds.
    "txstream.console": {"txstream", "txstream.kafka", "txstream.state"},
    # Reading back what is on Kafka (held bodies, a replay's records, a predecessor's
    # releases): the operator and the sink share it, so it stands on the Kafka module alone.
    "txstream.readback": {"txstream", "txstream.kafka"},
    "txstream.sources": {"txstream", "txstream.kafka", "txstream.state"},
    "txstream.sinks": {"txstream", "txstream.kafka", "txstream.state", "txstream.readback"},
    "txstream.streaming.engine": {"txstream", "txstream.kafka", "txstream.state",
                                  "txstream.readback", "txstream.sources", "txstream.sinks"},
    "txstream.streaming.cli": {"txstream", "txstream.kafka", "txstream.state", "txstream.sources",
                               "txstream.readback", "txstream.sinks", "txstream.streaming.engine",
                               "txstream.client", "txstream.console", "txstream.kafka_broker"},
    # The users' test kit: the coordinator's own code and the client's, run in memory.
    "txstream.testing": {"txstream", "txstream.kafka", "txstream.state", "txstream.readback",
                         "txstream.sources", "txstream.sinks", "txstream.streaming.engine",
                         "txstream.client"},
}
# The pure core stands on pure modules only (mypy checks them with it).
CORE_MAY_IMPORT = {"txstream.message", "txstream.errors", "txstream.refusals"}


def room_of(module: str) -> str:
    return max((r for r in BELOW if module == r or module.startswith(r + ".")), key=len)


def modules() -> dict[str, Path]:
    """Every module under txstream/, through its links to the design's folders."""
    out = {}
    for folder, _, files in os.walk(PACKAGE, followlinks=True):
        for name in files:
            if name.endswith(".py"):
                path = Path(folder) / name
                parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
                out[".".join(p for p in parts if p != "__init__")] = path
    return out


def all_imports_of(path: Path) -> set[str]:
    """Modules named by absolute imports in the file (functions' local imports included)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
        elif isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
    return names


def imports_of(path: Path) -> set[str]:
    """Modules named by txstream imports in the file."""
    return {n for n in all_imports_of(path) if n == "txstream" or n.startswith("txstream.")}


MODULES = modules()


def test_every_room_is_found() -> None:
    assert {room_of(m) for m in MODULES} == set(BELOW)
    assert len(MODULES) > 100


@pytest.mark.parametrize("module", sorted(MODULES))
def test_no_import_runs_back_up_the_house(module: str) -> None:
    room = room_of(module)
    wrong = sorted(n for n in imports_of(MODULES[module])
                   if room_of(n) != room and room_of(n) not in BELOW[room])
    assert wrong == [], f"{module} ({room}) imports from rooms above it: {wrong}"


@pytest.mark.parametrize("module", sorted(m for m in MODULES if room_of(m) == "txstream.state"))
def test_the_core_imports_only_the_core_and_the_message_types(module: str) -> None:
    outside = sorted(n for n in imports_of(MODULES[module])
                     if room_of(n) != "txstream.state" and n not in CORE_MAY_IMPORT)
    assert outside == [], f"{module} imports {outside}"


@pytest.mark.parametrize("module", sorted(m for m in MODULES if room_of(m) != "txstream.kafka"))
def test_only_the_kafka_module_imports_kafka_python(module: str) -> None:
    # Everything else reaches Kafka through txstream.kafka's Protocols (txstream/kafka/
    # protocols.py) and its errors (txstream/kafka/errors.py), so a client of another kind
    # stands in behind them (the in-memory broker's; a transactional producer).
    found = sorted(n for n in all_imports_of(MODULES[module])
                   if n == "kafka" or n.startswith("kafka."))
    assert found == [], f"{module} imports kafka-python ({found}): use txstream.kafka"
