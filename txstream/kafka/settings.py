"""Where the Kafka broker is and how to talk to it: one picklable value for every client.

Settings are built from layers of Kafka client properties (Kafka's names, see
:mod:`txstream.kafka.properties`); a later layer wins, setting by setting:

1. the ``TXSTREAM_*`` environment variables (``env=True``);
2. a properties file: ``file=``, else the one ``TXSTREAM_KAFKA_CONFIG`` names (``env=True``);
3. ``properties=`` (a mapping of Kafka names to values: the command line's ``-X``);
4. fields given by keyword (``security_protocol=``, ...: the command line's named flags).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import InitVar, asdict, dataclass, field
from typing import Any

from txstream.errors import ConfigError
from txstream.kafka.properties import (
    FIELDS,
    canonical,
    check_properties,
    client_options,
    is_secret,
    read_properties,
    resolve_stores,
)

__all__ = ["KafkaSettings", "ENV_PROPERTIES"]

_SECURITY = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")

# The environment variables of the Kafka settings, and the property each gives.
ENV_PROPERTIES = {
    "TXSTREAM_BOOTSTRAP_SERVERS": "bootstrap.servers",
    "TXSTREAM_SECURITY_PROTOCOL": "security.protocol",
    "TXSTREAM_SASL_MECHANISM": "sasl.mechanism",
    "TXSTREAM_SASL_USERNAME": "sasl.username",
    "TXSTREAM_SASL_PASSWORD": "sasl.password",
    "TXSTREAM_SASL_PASSWORD_FILE": "sasl.password.file",
    "TXSTREAM_SSL_CAFILE": "ssl.ca.location",
    "TXSTREAM_SSL_CERTFILE": "ssl.certificate.location",
    "TXSTREAM_SSL_KEYFILE": "ssl.key.location",
}
_KAFKA_NAMES = {f: name for name, f in FIELDS.items()}
_NOT_PROPERTIES = ("properties", "extra", "client_role")


@dataclass(frozen=True, repr=False)
class KafkaSettings:
    """Where the broker is and how to talk to it. Picklable and JSON-able (:meth:`as_dict`):
    it travels to Spark workers.

    ``properties``: any other Kafka client property, by Kafka's name (``linger.ms``,
    ``sasl.oauthbearer.client.id``, ...), checked when the settings are made and given to the
    kinds of client that take it. ``extra``: kafka-python keyword arguments as they are, for
    every client. ``client_role``: named in the ``client.id`` of clients made with these
    settings when the code making one names no role (the command line: ``cli``). It is not a
    field: it stays with the object, out of :meth:`as_dict` and equality, so a component the
    settings travel to as JSON (the Spark source and sink) names its own.
    Secrets never show in ``repr``.
    """

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
    properties: dict[str, Any] = field(default_factory=dict)
    client_role: InitVar[str | None] = None

    def __post_init__(self, client_role: str | None) -> None:
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
        # One spelling per setting, so that equal settings compare (and cache) equal.
        props = resolve_stores(canonical(self.properties or {}))
        object.__setattr__(self, "properties", props)
        check_properties(props, self.sasl_mechanism)
        object.__setattr__(self, "client_role", client_role)

    def __repr__(self) -> str:
        shown = []
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name == "sasl_password" and value is not None:
                value = "***"
            elif f.name in ("properties", "extra"):
                value = {k: "***" if is_secret(k.replace("_", ".")) else v
                         for k, v in value.items()}
            shown.append(f"{f.name}={value!r}")
        shown.append(f"client_role={self.role!r}")
        return f"KafkaSettings({', '.join(shown)})"

    @property
    def role(self) -> str | None:
        """The ``client_role`` the settings were made with (kept by ``__post_init__``: an
        InitVar, not a field)."""
        role: str | None = self.__dict__.get("client_role")
        return role

    @classmethod
    def from_properties(cls, properties: Mapping[str, Any] | None = None, *,
                        file: str | os.PathLike[str] | None = None, env: bool = False,
                        **fields: Any) -> KafkaSettings:
        """Settings from Kafka client properties, layered as the module says: environment
        (if ``env``) < ``file`` < ``properties`` < ``fields`` (None fields are left out).

        ``KafkaSettings.from_properties({"sasl.mechanism": "PLAIN", "sasl.jaas.config":
        ...}, bootstrap_servers="kafka:9092")``; ``from_properties(file="client.properties")``.
        """
        layers = [(_env_layer(), "TXSTREAM_* variables")] if env else []
        if file is None and env:
            file = os.environ.get("TXSTREAM_KAFKA_CONFIG") or None
        return cls._layered(layers, properties, file, fields, {})

    def with_properties(self, properties: Mapping[str, Any] | None = None, *,
                        file: str | os.PathLike[str] | None = None,
                        **fields: Any) -> KafkaSettings:
        """These settings with ``file`` < ``properties`` < ``fields`` on top."""
        base = {**{_KAFKA_NAMES[k]: v for k, v in asdict(self).items() if k in _KAFKA_NAMES},
                **self.properties}
        keep = {"extra": self.extra, "client_role": self.role}
        return self._layered([(base, "")], properties, file, fields, keep)

    @classmethod
    def _layered(cls, layers: Sequence[tuple[Mapping[str, Any], str]],
                 properties: Mapping[str, Any] | None, file: str | os.PathLike[str] | None,
                 fields: dict[str, Any], keep: dict[str, Any]) -> KafkaSettings:
        unknown = sorted(set(fields) - set(_KAFKA_NAMES) - set(_NOT_PROPERTIES))
        if unknown:
            raise ConfigError(f"unknown KafkaSettings field(s) {', '.join(unknown)}")
        if "properties" in fields:
            raise ConfigError("give properties as the first argument, not properties=")
        given = {k: v for k, v in fields.items() if v is not None}
        named = list(layers)
        if file is not None:
            named.append((read_properties(file), str(file)))
        named.append((properties or {}, "properties"))
        named.append(({_KAFKA_NAMES[k]: v for k, v in given.items() if k in _KAFKA_NAMES}, ""))
        merged: dict[str, Any] = {}
        for layer, where in named:
            # Stores per source: a later ssl.ca.location replaces an earlier truststore.
            merged.update(resolve_stores(canonical(layer, where)))
        values = {FIELDS[name]: merged.pop(name) for name in list(merged) if name in FIELDS}
        if "request_timeout_ms" in values:
            values["request_timeout_ms"] = _int(values["request_timeout_ms"], "request.timeout.ms")
        keep.update({k: given[k] for k in ("extra", "client_role") if k in given})
        return cls(**values, properties=merged, **keep)

    @classmethod
    def from_option(cls, raw: str | None) -> KafkaSettings:
        """The ``kafka`` option of the Spark source and sink: JSON of :meth:`as_dict`."""
        if not raw:
            raise ConfigError("option kafka (JSON of KafkaSettings.as_dict()) is required")
        try:
            return cls(**json.loads(raw))
        except (ValueError, TypeError) as exc:
            if isinstance(exc, ConfigError):
                raise
            raise ConfigError(f"option kafka is not KafkaSettings JSON: {exc}") from None

    @classmethod
    def from_env(cls, **overrides: Any) -> KafkaSettings:
        """Settings from ``TXSTREAM_*`` environment variables (and the properties file
        ``TXSTREAM_KAFKA_CONFIG`` names, which beats them), then ``overrides``."""
        return cls.from_properties(env=True, **overrides)

    def client_kwargs(self, kind: str = "consumer") -> dict[str, Any]:
        """kafka-python keyword arguments for a ``kind`` of client (producer, consumer,
        admin): the fields, the properties it takes, then ``extra``."""
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
        kw.update(client_options(self.properties, kind))
        if str(self.sasl_mechanism).upper() == "OAUTHBEARER":
            from txstream.kafka.oauth import token_provider

            kw["sasl_oauth_token_provider"] = token_provider(self.properties)
        kw.update(self.extra)
        return kw

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @functools.cached_property
    def key(self) -> str:
        """The settings as one string, made once: what kept clients are found by (one key
        for the source, the sink and the read-backs, in place of a copy of it in each)."""
        return json.dumps(self.as_dict(), sort_keys=True, default=str)


def _env_layer() -> dict[str, str]:
    return {name: os.environ[var] for var, name in ENV_PROPERTIES.items() if os.environ.get(var)}


def _int(value: Any, name: str) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        raise ConfigError(f"Kafka property {name} must be a number, got {value!r}") from None
