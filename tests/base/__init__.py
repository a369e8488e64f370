"""The base every room stands on (txstream/*.py): the wire codec, outputs, the timer schedule,
Apache Kafka on loopback."""
