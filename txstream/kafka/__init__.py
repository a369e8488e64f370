"""The Kafka module: settings, clients (made, cached, closed), reading partitions to their end
(:class:`EndProbe` for where they end, :func:`read_range` with a :class:`PatientConsumer` for
their records) and a group member that commits what it finished
(:class:`txstream.kafka.group.CommittingConsumer`).

Settings come from Kafka client properties by Kafka's names (:mod:`txstream.kafka.properties`:
a properties file, ``-X key=value``), the ``TXSTREAM_*`` variables and named flags; OAUTHBEARER
tokens from :mod:`txstream.kafka.oauth`.

Every Kafka client txstream makes, in the client library, the Spark source and sink, the CLI
and the benchmark, comes from here, so settings reach all of them the same way. Its types are
the Protocols of :mod:`txstream.kafka.protocols` (``Producer``, ``Consumer``, ``Admin``,
``ConsumerRecord``, ``TopicPartition``, ...), and kafka-python's errors are
:mod:`txstream.kafka.errors`: kafka-python itself is imported only inside this package.
"""

from txstream.kafka.clients import (
    PATIENT_AFTER_S,
    PATIENT_FETCH_WAIT_MS,
    TopicTrackingProducer,
    cached_client,
    client_id,
    close_quietly,
    drop_cached_client,
    make_admin,
    make_consumer,
    make_producer,
    wait_for_broker,
)
from txstream.kafka.patience import PatientConsumer
from txstream.kafka.properties import parse_properties, read_properties
from txstream.kafka.protocols import (
    Admin,
    Consumer,
    ConsumerRecord,
    OffsetAndMetadata,
    OffsetAndTimestamp,
    Producer,
    RecordMetadata,
    SendFuture,
    TopicPartition,
)
from txstream.kafka.reading import (
    EndProbe,
    TopicReader,
    Unreadable,
    fetch_ends,
    partition_ends,
    read_range,
    read_topic,
    topic_ids,
)
from txstream.kafka.settings import KafkaSettings

__all__ = [
    "KafkaSettings",
    "Producer",
    "Consumer",
    "Admin",
    "ConsumerRecord",
    "RecordMetadata",
    "SendFuture",
    "TopicPartition",
    "OffsetAndMetadata",
    "OffsetAndTimestamp",
    "make_producer",
    "make_consumer",
    "make_admin",
    "wait_for_broker",
    "client_id",
    "parse_properties",
    "read_properties",
    "TopicTrackingProducer",
    "cached_client",
    "drop_cached_client",
    "close_quietly",
    "PATIENT_AFTER_S",
    "PATIENT_FETCH_WAIT_MS",
    "PatientConsumer",
    "EndProbe",
    "TopicReader",
    "Unreadable",
    "fetch_ends",
    "partition_ends",
    "topic_ids",
    "read_range",
    "read_topic",
]
