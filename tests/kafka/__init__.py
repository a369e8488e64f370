"""The Kafka toolkit (txstream/kafka): clients, settings, provisioning, transactions, the
in-memory broker."""
