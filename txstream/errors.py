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
    "SendInDoubt",
    "ReadFailed",
    "TransactionsUnavailable",
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
    """The broker did not acknowledge a record. The client's producer raises it as itself only
    when the record was not stored (refused, or never sent), else :class:`SendInDoubt`."""


class SendInDoubt(SendFailed):
    """A record was sent but its acknowledgement never came (a timeout, a lost connection):
    the broker may have stored it all the same. For a half message, ``transaction_id`` and
    ``msg_id`` name it: if it was stored, the coordinator back-checks it."""

    def __init__(self, message: str, *, transaction_id: str | None = None,
                 msg_id: str | None = None) -> None:
        super().__init__(message)
        self.transaction_id = transaction_id
        self.msg_id = msg_id


class ReadFailed(TxStreamError, RuntimeError):
    """Records could not be read from Kafka as planned (broker down, records lost)."""


class TransactionsUnavailable(TxStreamError, RuntimeError):
    """Kafka transactions were asked for (``--transactions on``) and the broker does not
    isolate them, or whether it does could not be found out."""
