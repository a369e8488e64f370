"""The client library (txstream/client): the transaction producer, its back-checks, the push
consumer."""
