"""Helpers the tests share (imported as tests.support.NAME): Kafka, processes, clusters, the
soak's parts."""
