"""The half and end topics as the broker lists them: their partitions (created if missing,
listed again every few seconds to find partitions added) and their ids (KIP-516), which the
stream offset carries so that a batch planned before a topic was created again is not read
again from the new one (:mod:`txstream.readback.replay`)."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from txstream.kafka import topic_ids
from txstream.kafka.provision import create_command, ensure_topics, topic_spec
from txstream.sources.data_loss import TOPIC_IDS
from txstream.sources.kafka_io import SourceOptions, SourceReadError, consumer_for, metadata_calls
from txstream.topics import HALF_TOPIC, Topics

__all__ = ["TopicWatch"]


class TopicWatch:
    """The partitions of both topics and their ids, as last listed (driver side)."""

    # How often the partition lists are re-read, to pick up partitions added to a topic.
    PARTITION_REFRESH_MS = 10_000

    def __init__(self, options: SourceOptions, clock: Callable[[], int]) -> None:
        self.options = options
        self._clock = clock
        self._partitions: dict[str, list[int]] = {}
        self.listed_at: int | None = None
        self.ids: dict[str, str] = {}  # the topics' ids as of the last listing

    def _create_topics(self, missing: Sequence[str]) -> None:
        """Create the missing half/end topics by the coordinator's rule (the provisioning
        module's, which ``Coordinator.start`` applied already; here for queries started
        without it)."""
        kinds = {self.options.half_topic: "half", self.options.end_topic: "end"}
        half = self.options.half_topic
        prefix = half[:-len(HALF_TOPIC)] if half.endswith(HALF_TOPIC) else ""
        specs = [topic_spec(kinds[t], t, readers=("coordinator",),
                            partitions=self.options.topic_partitions) for t in missing]
        ensure_topics(self.options.kafka, specs,
                      create_command(self.options.kafka, Topics.with_prefix(prefix)))

    def partitions(self) -> dict[str, list[int]]:
        """The partitions of both topics (created if missing), re-read every few seconds."""
        now = self._clock()
        if (self._partitions and self.listed_at is not None
                and 0 <= now - self.listed_at < self.PARTITION_REFRESH_MS):
            return self._partitions
        consumer = consumer_for(self.options, "offsets")
        consumer.topics()  # a fresh metadata request: the cached one may predate new partitions
        missing = [t for t in self.options.topics if not consumer.partitions_for_topic(t)]
        if missing:
            self._create_topics(missing)
        deadline = time.monotonic() + self.options.read_timeout_ms / 1000
        found: dict[str, list[int]] = {}
        for topic in self.options.topics:
            parts = consumer.partitions_for_topic(topic)
            while not parts and time.monotonic() < deadline:
                time.sleep(0.05)  # a topic just created may take a moment to show in metadata
                consumer.topics()
                parts = consumer.partitions_for_topic(topic)
            if not parts:
                raise SourceReadError(f"topic {topic} has no partitions in the broker metadata")
            found[topic] = sorted(parts)
        self._partitions, self.listed_at = found, now
        self.ids = topic_ids(consumer, self.options.topics)
        return found

    def refresh_ids(self) -> None:
        """The topics' ids as of now: a batch about to be planned carries them in its offset,
        and its replay is refused from a topic created again since (:meth:`same_topics`), so
        they must be no older than the ends it was planned from. Asked only when the ends
        moved: once per planned batch, not at every call of Spark's."""
        consumer = consumer_for(self.options, "offsets")
        with metadata_calls(self.options):
            consumer.topics()
        self.ids = topic_ids(consumer, self.options.topics)

    def ids_of(self, start: Mapping[str, Any]) -> dict[str, str]:
        """The topics' ids for the next offset: the current ones, the start's where unknown."""
        return {**start.get(TOPIC_IDS, {}), **self.ids}

    def same_topics(self, end: Mapping[str, Any]) -> None:
        """Refuse to read a planned batch again (Spark replays the batch a crash left
        uncommitted) from a topic deleted and created again since it was planned: the records
        under its offsets are others now, and the replay would emit other records under the
        ids its first run wrote (:mod:`txstream.readback.replay`)."""
        planned = end.get(TOPIC_IDS) or {}
        if not planned:
            return
        ids = self.ids
        if not ids:  # a new planner (a restart): ask the broker
            consumer = consumer_for(self.options, "offsets")
            consumer.topics()  # fresh metadata: a kept client's may predate the new topic
            ids = topic_ids(consumer, self.options.topics)
        changed = sorted(t for t, i in planned.items() if ids.get(t) not in (None, i))
        if changed:
            raise SourceReadError(
                f"{', '.join(changed)} was deleted and created again since this micro-batch was "
                "planned: the records it read are gone, and the batch cannot run again. Start "
                "on a new checkpoint (txstream run --checkpoint-dir): the history topic's "
                "outcomes are read back first.")
