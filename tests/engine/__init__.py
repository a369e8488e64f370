"""The coordinator (txstream/streaming/engine): the session, the query, the operator, metrics
and health."""
