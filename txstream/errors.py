"""The one exception hierarchy of txstream: catch ``TxStreamError`` to catch them all."""

from __future__ import annotations

__all__ = [
    "TxStreamError",
    "ConfigError",
    "MalformedRecord",
    "InvalidMessage",
    "BrokerUnavailable",
    "ClientStateError",
    "SendFailed",
    "ReadFailed",
]


class TxStreamError(Exception):
    """Root of every error txstream raises on purpose."""


class ConfigError(TxStreamError, ValueError):
    """A configuration value (flag, environment variable, argument) is invalid."""


class MalformedRecord(TxStreamError, ValueError):
    """A Kafka record cannot be decoded as a txstream event; ``reason`` says why, ``code``
    says so for programs (one of ``txstream.refusals.Code``)."""

    def __init__(self, reason: str, code: str = "MALFORMED_HEADERS") -> None:
        super().__init__(reason)
        self.reason = reason
        self.code = code


class InvalidMessage(TxStreamError, ValueError):
    """A message was refused before anything was sent (empty topic, body too big, ...)."""


class BrokerUnavailable(TxStreamError, ConnectionError):
    """The Kafka broker could not be reached within the configured time."""


class ClientStateError(TxStreamError, RuntimeError):
    """A client was used in the wrong state (not started, already shut down, no listener)."""


class SendFailed(TxStreamError, RuntimeError):
    """The broker did not acknowledge a record."""


class ReadFailed(TxStreamError, RuntimeError):
    """Records could not be read from Kafka as planned (broker down, records lost)."""
