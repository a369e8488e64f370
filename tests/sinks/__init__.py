"""The txstream-records sink (txstream/sinks): delivery, refused releases, Kafka transactions."""
