"""RocketMQ's transaction example, driven from a test: the example scripts of ``examples/``
(loaded by path, as a user runs them) against a coordinator running elsewhere."""

from __future__ import annotations

import importlib.util
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType

from tests.support.kafka_helpers import wait_until
from txstream.kafka import KafkaSettings, read_topic
from txstream.topics import Topics
from txstream.wire import H, header_dict

__all__ = ["SeedRun", "load_example"]

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def load_example(name: str) -> ModuleType:
    """The example scripts are not a package: load them by path, as a user runs them."""
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@dataclass
class SeedRun:
    """The example's producer and consumer against the coordinator of ``topics``."""

    kafka: KafkaSettings
    topics: Topics
    real_topic: str = field(default_factory=lambda: f"TranTest_{uuid.uuid4().hex[:8]}")
    received: list[str] = field(default_factory=list)
    sent: list[object] = field(default_factory=list)
    lines: list[str] = field(default_factory=list)

    def discarded(self) -> list[str]:
        return sorted(r.value.decode() for r in read_topic(self.kafka, self.topics.discard))

    def discard_reasons(self) -> list[str]:
        return [header_dict(r.headers)[H.DISCARD_REASON]
                for r in read_topic(self.kafka, self.topics.discard)]

    def run(self, check_interval_s: float, timeout_s: float = 150.0) -> None:
        """Send the ten messages, answer the checks, and wait until 1, 4, 7 were received
        and 0, 3, 6, 9 discarded, then a few check intervals more (anything else would
        show by then)."""
        producer_example = load_example("transaction_producer")
        consumer_example = load_example("transaction_consumer")
        suffix = self.real_topic.rsplit("_", 1)[-1]
        stop, started = threading.Event(), threading.Event()
        consumer = threading.Thread(target=consumer_example.run, kwargs=dict(
            bootstrap_servers=self.kafka.bootstrap_servers, topic=self.real_topic,
            topic_prefix=self.topics.prefix, group=f"consumer_test_clustering_{suffix}",
            stop=stop, out=self.lines.append, started=started,
            on_message=lambda m: self.received.append(m.body.decode())))
        producer = threading.Thread(target=lambda: self.sent.extend(producer_example.run(
            self.kafka.bootstrap_servers, topic=self.real_topic,
            topic_prefix=self.topics.prefix, group=f"please_rename_unique_group_name_{suffix}",
            stop=stop, out=self.lines.append)))
        consumer.start()
        assert started.wait(30)
        producer.start()
        try:
            wait_until(lambda: len(self.discarded()) >= 4 and len(self.received) >= 3,
                       timeout_s=timeout_s)
            time.sleep(3 * check_interval_s)
        finally:
            stop.set()
            producer.join(30)
            consumer.join(30)
