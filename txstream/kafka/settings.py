"""Where the Kafka broker is and how to talk to it: one picklable value for every client."""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from typing import Any

from txstream.errors import ConfigError

__all__ = ["KafkaSettings"]

_SECURITY = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")


@dataclass(frozen=True)
class KafkaSettings:
    """Where the broker is and how to talk to it. Picklable: it travels to Spark workers."""

    bootstrap_servers: str = "127.0.0.1:9092"
    security_protocol: str = "PLAINTEXT"
    sasl_mechanism: str | None = None
    sasl_username: str | None = None
    sasl_password: str | None = None
    ssl_cafile: str | None = None
    ssl_certfile: str | None = None
    ssl_keyfile: str | None = None
    request_timeout_ms: int = 30_000
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.bootstrap_servers or not all(
            ":" in s for s in self.bootstrap_servers.split(",")
        ):
            raise ConfigError(
                "bootstrap servers must be HOST:PORT[,HOST:PORT...], "
                f"got {self.bootstrap_servers!r}"
            )
        if self.security_protocol not in _SECURITY:
            raise ConfigError(f"security protocol must be one of {', '.join(_SECURITY)}")
        if self.security_protocol.startswith("SASL") and not self.sasl_mechanism:
            raise ConfigError("a SASL security protocol needs --sasl-mechanism")

    @classmethod
    def from_option(cls, raw: str | None) -> KafkaSettings:
        """The ``kafka`` option of the Spark source and sink: JSON of :meth:`as_dict`."""
        if not raw:
            raise ConfigError("option kafka (JSON of KafkaSettings.as_dict()) is required")
        try:
            return cls(**json.loads(raw))
        except (ValueError, TypeError) as exc:
            raise ConfigError(f"option kafka is not KafkaSettings JSON: {exc}") from None

    @classmethod
    def from_env(cls, **overrides: Any) -> KafkaSettings:
        """Settings from ``TXSTREAM_*`` environment variables, then ``overrides``."""
        env = {
            "bootstrap_servers": os.environ.get("TXSTREAM_BOOTSTRAP_SERVERS"),
            "security_protocol": os.environ.get("TXSTREAM_SECURITY_PROTOCOL"),
            "sasl_mechanism": os.environ.get("TXSTREAM_SASL_MECHANISM"),
            "sasl_username": os.environ.get("TXSTREAM_SASL_USERNAME"),
            "sasl_password": os.environ.get("TXSTREAM_SASL_PASSWORD"),
            "ssl_cafile": os.environ.get("TXSTREAM_SSL_CAFILE"),
            "ssl_certfile": os.environ.get("TXSTREAM_SSL_CERTFILE"),
            "ssl_keyfile": os.environ.get("TXSTREAM_SSL_KEYFILE"),
        }
        values = {k: v for k, v in env.items() if v}
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)

    def client_kwargs(self) -> dict[str, Any]:
        """Keyword arguments common to kafka-python's producer, consumer and admin client."""
        kw: dict[str, Any] = {
            "bootstrap_servers": self.bootstrap_servers.split(","),
            "security_protocol": self.security_protocol,
            "request_timeout_ms": self.request_timeout_ms,
        }
        if self.sasl_mechanism:
            kw["sasl_mechanism"] = self.sasl_mechanism
            kw["sasl_plain_username"] = self.sasl_username
            kw["sasl_plain_password"] = self.sasl_password
        for name in ("ssl_cafile", "ssl_certfile", "ssl_keyfile"):
            if getattr(self, name):
                kw[name] = getattr(self, name)
        kw.update(self.extra)
        return kw

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)
