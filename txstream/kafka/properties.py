"""Kafka client properties: the Java properties format, and Kafka's names in kafka-python's terms.

A user configures a Kafka client the way Kafka's own tools take it: a properties file and
``key=value`` pairs, with Kafka's names (Java's or librdkafka's). This module reads that format
(:func:`parse_properties`, as ``java.util.Properties.load``), brings names to one spelling
(:func:`canonical`), checks them (:func:`check_properties`) and turns them into kafka-python's
keyword arguments for one kind of client (:func:`client_options`).

A name maps to kafka-python when its dots made underscores are a config key of a kafka-python
client (``linger.ms`` is ``linger_ms``), its value converted to the type of that key's default;
a few common names that differ are translated (``ssl.ca.location``, ``sasl.jaas.config``, ...).
"""

from __future__ import annotations

import difflib
import functools
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from txstream.errors import ConfigError
from txstream.options import parse_bool

__all__ = ["KINDS", "FIELDS", "SECRETS", "OAUTH", "parse_properties", "read_properties",
           "canonical", "canonical_name", "resolve_stores", "is_secret", "check_properties",
           "client_options"]

KINDS = ("producer", "consumer", "admin")

# The Kafka names of KafkaSettings' own fields.
FIELDS = {"bootstrap.servers": "bootstrap_servers", "security.protocol": "security_protocol",
          "sasl.mechanism": "sasl_mechanism", "sasl.username": "sasl_username",
          "sasl.password": "sasl_password", "ssl.ca.location": "ssl_cafile",
          "ssl.certificate.location": "ssl_certfile", "ssl.key.location": "ssl_keyfile",
          "request.timeout.ms": "request_timeout_ms"}

# Other spellings of one setting (librdkafka's, kafka-python's dotted) -> the one kept.
_ALIASES = {"metadata.broker.list": "bootstrap.servers", "sasl.mechanisms": "sasl.mechanism",
            "sasl.plain.username": "sasl.username", "sasl.plain.password": "sasl.password",
            "ssl.cafile": "ssl.ca.location", "ssl.certfile": "ssl.certificate.location",
            "ssl.keyfile": "ssl.key.location", "ssl.password": "ssl.key.password",
            "ssl.crlfile": "ssl.crl.location", "ssl.ciphers": "ssl.cipher.suites"}

# Kafka names whose kafka-python keyword is not the name with underscores.
_RENAMED = {"ssl.key.password": "ssl_password", "ssl.crl.location": "ssl_crlfile",
            "ssl.cipher.suites": "ssl_ciphers",
            "ssl.endpoint.identification.algorithm": "ssl_check_hostname"}

SECRETS = frozenset({"sasl.password", "sasl.jaas.config", "ssl.key.password",
                     "ssl.keystore.password", "ssl.truststore.password",
                     "sasl.oauthbearer.client.secret"})

OAUTH = ("sasl.oauthbearer.token.endpoint.url", "sasl.oauthbearer.client.id",
         "sasl.oauthbearer.client.secret", "sasl.oauthbearer.scope")

# Names taken by txstream itself rather than handed to kafka-python as they are.
_OWN = frozenset({*OAUTH, "client.id", "sasl.oauthbearer.method",
                  "sasl.login.callback.handler.class"})

# kafka-python options whose default is None but which take text, or a number.
_TEXT = frozenset({"compression_type", "proxy_url", "socks5_proxy", "sasl_kerberos_domain_name",
                   "sasl_kerberos_name", "ssl_crlfile", "ssl_password", "ssl_ciphers",
                   "group_id", "group_instance_id", "transactional_id"})
_INT = frozenset({"receive_buffer_bytes", "send_buffer_bytes"})

_ALL = "txstream's producers need every in-sync replica to store a record (acks=all)"
# kafka-python keyword -> (is the value allowed?, why not). Each would break a guarantee.
_REFUSED: dict[str, tuple[Any, str]] = {
    "acks": (lambda v: str(v).strip().lower() in ("all", "-1"),
             f"{_ALL}: less can lose a half message or a released message"),
    "enable_idempotence": (lambda v: parse_bool(v, "enable.idempotence"),
                           "retried sends must not write a record twice (exactly-once output)"),
    "retries": (lambda v: v > 0, "an idempotent producer retries (retries > 0)"),
    "max_in_flight_requests_per_connection": (
        lambda v: 1 <= v <= 5, "an idempotent producer keeps order with at most 5 requests in "
                               "flight"),
    "enable_auto_commit": (lambda v: not parse_bool(v, "enable.auto.commit"),
                           "txstream commits a consumer's offsets only after the work is done"),
    "auto_offset_reset": (lambda v: str(v).strip().lower() == "earliest",
                          "txstream's readers start from the earliest offset; another reset "
                          "skips records"),
    "group_id": (lambda v: False, "txstream names its consumer groups itself"),
    "group_instance_id": (lambda v: False, "every consumer txstream makes would share it"),
    "transactional_id": (lambda v: False, "txstream's producers are idempotent, not "
                                          "transactional: the coordinator makes transactions"),
}

_WS = " \t\f"
_ESCAPES = {"t": "\t", "n": "\n", "r": "\r", "f": "\f"}


def parse_properties(text: str, source: str = "properties") -> dict[str, str]:
    """``text`` read as ``java.util.Properties.load`` reads a file: ``key=value``,
    ``key: value`` or ``key value``; ``#``/``!`` comment lines; a line ending in an odd number
    of backslashes goes on on the next (its leading blanks dropped); ``\\t \\n \\r \\f``,
    ``\\uXXXX`` and ``\\c`` (any other character, as itself) in keys and values."""
    out: dict[str, str] = {}
    for line in _logical_lines(text):
        key, value = _split(line)
        out[_unescape(key, source)] = _unescape(value, source)
    return out


def _logical_lines(text: str) -> list[str]:
    lines, current, continuing = [], "", False
    for natural in re.split(r"\r\n|\r|\n", text):
        stripped = natural.lstrip(_WS)
        if not continuing and (not stripped or stripped[0] in "#!"):
            continue  # blank or comment: never continued
        trailing = len(stripped) - len(stripped.rstrip("\\"))
        if trailing % 2:
            current, continuing = current + stripped[:-1], True
            continue
        lines.append(current + stripped)
        current, continuing = "", False
    if continuing and current:
        lines.append(current)
    return lines


def _split(line: str) -> tuple[str, str]:
    """The raw key and value of a logical line (leading blanks already gone)."""
    i, escaped = 0, False
    while i < len(line):
        c = line[i]
        if escaped:
            escaped = False
        elif c == "\\":
            escaped = True
        elif c in "=:" or c in _WS:
            break
        i += 1
    j = i
    while j < len(line) and line[j] in _WS:
        j += 1
    if j < len(line) and line[j] in "=:":
        j += 1  # one separator; a second is part of the value
    while j < len(line) and line[j] in _WS:
        j += 1
    return line[:i], line[j:]


def _unescape(text: str, source: str) -> str:
    out, i = [], 0
    while i < len(text):
        c = text[i]
        if c != "\\" or i + 1 == len(text):
            out.append(c if c != "\\" else "")
            i += 1
            continue
        c = text[i + 1]
        if c == "u":
            digits = text[i + 2:i + 6]
            if not re.fullmatch(r"[0-9a-fA-F]{4}", digits):
                raise ConfigError(f"{source}: malformed \\uXXXX escape")
            out.append(chr(int(digits, 16)))
            i += 6
        else:
            out.append(_ESCAPES.get(c, c))
            i += 2
    return "".join(out)


def read_properties(path: str | os.PathLike[str]) -> dict[str, str]:
    """A properties file (UTF-8, or ISO-8859-1 as Java reads it when it is not UTF-8)."""
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise ConfigError(f"cannot read Kafka properties file {path}: {exc.strerror}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        text = data.decode("iso-8859-1")
    return parse_properties(text, str(path))


def canonical_name(name: str) -> str:
    name = name.strip()
    return _ALIASES.get(name, name)


def is_secret(name: str) -> bool:
    """Whether a property's value must never be shown."""
    name = canonical_name(name)
    return name in SECRETS or name.endswith((".password", ".secret", "jaas.config"))


def canonical(props: Mapping[str, Any], where: str = "") -> dict[str, Any]:
    """One source's properties with one name per setting: aliases resolved, a secret's
    ``<name>.file`` read, ``sasl.jaas.config`` taken apart. Two names for one setting in
    one source are refused."""
    out: dict[str, Any] = {}
    given: dict[str, str] = {}
    suffix = f" ({where})" if where else ""
    for raw, value in props.items():
        name = canonical_name(raw)
        if name.endswith(".file") and canonical_name(name[:-5]) in SECRETS:
            name, value = canonical_name(name[:-5]), _read_secret(raw, value)
        values = _jaas(value, raw) if name == "sasl.jaas.config" else {name: value}
        for key, item in values.items():
            if key in given:
                raise ConfigError(f"{given[key]} and {raw.strip()} set the same Kafka setting"
                                  f"{suffix}: give one")
            given[key], out[key] = raw.strip(), item
    return out


def _read_secret(name: str, path: Any) -> str:
    try:
        return Path(str(path)).read_text(encoding="utf-8").rstrip("\r\n")
    except OSError as exc:
        raise ConfigError(f"{name}: cannot read {path}: {exc.strerror}") from None


_JAAS_MODULES = {"PlainLoginModule": {"username": "sasl.username", "password": "sasl.password"},
                 "ScramLoginModule": {"username": "sasl.username", "password": "sasl.password"},
                 "OAuthBearerLoginModule": {"clientId": "sasl.oauthbearer.client.id",
                                            "clientSecret": "sasl.oauthbearer.client.secret",
                                            "scope": "sasl.oauthbearer.scope"}}


def _jaas(value: Any, name: str) -> dict[str, str]:
    """``sasl.jaas.config`` of Kafka's PLAIN, SCRAM and OAUTHBEARER login modules (the values
    never appear in an error: they hold the password)."""
    text = str(value).strip()
    head = re.match(r"([\w.$]+)\s+(required|requisite|sufficient|optional)\b", text)
    module = head.group(1).rsplit(".", 1)[-1] if head else ""
    if head is None or module not in _JAAS_MODULES:
        raise ConfigError(f"{name}: kafka-python takes the PLAIN, SCRAM and OAUTHBEARER login "
                          f"modules only, not {module or 'this value'}")
    options = {k: (v[1:-1].replace('\\"', '"').replace("\\\\", "\\") if v.startswith('"') else v)
               for k, v in re.findall(r'([\w.]+)\s*=\s*("(?:[^"\\]|\\.)*"|[^\s;"]+)',
                                      text[head.end():])}
    return {target: options[key] for key, target in _JAAS_MODULES[module].items()
            if key in options}


def resolve_stores(props: Mapping[str, Any]) -> dict[str, Any]:
    """Java's ``ssl.truststore.*``/``ssl.keystore.*`` as kafka-python takes them: PEM files
    only (a PEM keystore holds the certificate and its key, as kafka-python's certfile may)."""
    out = dict(props)
    for store, target in (("ssl.truststore", "ssl.ca.location"),
                          ("ssl.keystore", "ssl.certificate.location")):
        location, kind = out.pop(f"{store}.location", None), out.pop(f"{store}.type", None)
        out.pop(f"{store}.password", None)  # a PEM store has none (its key's is ssl.key.password)
        for inline in ("certificates", "key", "certificate.chain"):
            if f"{store}.{inline}" in out:
                raise ConfigError(f"{store}.{inline}: kafka-python reads certificates from "
                                  f"files: use {store}.location with {store}.type=PEM")
        if location is None:
            continue
        kind = str(kind or "JKS").strip().upper()
        if kind != "PEM":
            raise ConfigError(f"{store}.location: kafka-python cannot read a {kind} store; "
                              f"convert it to PEM (keytool, openssl) and set {store}.type=PEM")
        if target in out:
            raise ConfigError(f"{store}.location and {target} set the same file: give one")
        out[target] = location
    return out


@functools.cache
def _defaults(kind: str) -> dict[str, Any]:
    from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer

    client = {"producer": KafkaProducer, "consumer": KafkaConsumer, "admin": KafkaAdminClient}
    return dict(client[kind].DEFAULT_CONFIG)


@functools.cache
def _known_names() -> tuple[str, ...]:
    keys = {k for kind in KINDS for k in _defaults(kind)}
    return tuple(sorted({k.replace("_", ".") for k in keys} | set(FIELDS) | set(_ALIASES)
                        | set(_RENAMED) | _OWN))


def _keyword(name: str) -> str | None:
    """kafka-python's keyword for a (canonical) property name, or None if none has it."""
    key = _RENAMED.get(name) or name.replace(".", "_")
    return key if any(key in _defaults(kind) for kind in KINDS) else None


def _shown(name: str, value: Any) -> str:
    return "(hidden)" if is_secret(name) else repr(value)


def _convert(name: str, key: str, value: Any) -> Any:
    if not isinstance(value, str):
        return value  # given typed, in code
    text = value.strip()
    default = next(_defaults(k)[key] for k in KINDS if key in _defaults(k))
    try:
        if name == "ssl.endpoint.identification.algorithm":
            if text.lower() not in ("", "https", "none"):
                raise ValueError
            return text.lower() == "https"
        if key == "acks":
            return "all" if text.lower() == "all" else int(text)
        if key == "api_version":
            return tuple(int(part) for part in text.split("."))
        if key == "compression_type":
            return None if text.lower() == "none" else text
        if isinstance(default, bool):
            return parse_bool(text, name)
        if isinstance(default, int) or key in _INT:
            return int(text)
        if isinstance(default, float):
            number = float(text)
            return int(number) if number.is_integer() else number
        if isinstance(default, str) or key in _TEXT:
            return text
    except (ValueError, ConfigError):
        kind = "true or false" if isinstance(default, bool) else "a valid value"
        if isinstance(default, int | float) and not isinstance(default, bool):
            kind = "a number"
        raise ConfigError(f"Kafka property {name} must be {kind}, got "
                          f"{_shown(name, value)}") from None
    raise ConfigError(f"Kafka property {name} takes a Python object in kafka-python; it cannot "
                      "be given as a property")


def check_properties(props: Mapping[str, Any], sasl_mechanism: str | None = None) -> None:
    """Refuse what no kafka-python client knows, what does not convert, and what would break
    a guarantee of txstream; one line each, secrets never shown."""
    for name, value in props.items():
        if not isinstance(value, str | int | float | bool):
            raise ConfigError(f"Kafka property {name} must be text, a number or a boolean")
        if name in FIELDS:
            raise ConfigError(f"Kafka property {name} sets a KafkaSettings field: build the "
                              "settings with KafkaSettings.from_properties()")
        if name in _OWN:
            _check_own(name, value)
            continue
        key = _keyword(name)
        if key is None:
            close = difflib.get_close_matches(name, _known_names(), n=3, cutoff=0.75)
            hint = f" (did you mean {', '.join(close)}?)" if close else ""
            raise ConfigError(f"unknown Kafka client property {name}{hint}")
        converted = _convert(name, key, value)
        allowed, why = _REFUSED.get(key, (None, ""))
        if allowed is not None and not allowed(converted):
            shown = "(hidden)" if is_secret(name) else str(value).strip()
            raise ConfigError(f"Kafka property {name}={shown} is refused: {why}")
    if str(sasl_mechanism or "").upper() == "OAUTHBEARER":
        missing = [n for n in OAUTH[:3] if not props.get(n)]
        if missing:
            raise ConfigError(f"sasl.mechanism=OAUTHBEARER needs {', '.join(missing)} "
                              "(the client-credentials flow)")


def _check_own(name: str, value: Any) -> None:
    text = str(value).strip()
    if name == "sasl.oauthbearer.method" and text.lower() not in ("oidc", "default"):
        raise ConfigError(f"sasl.oauthbearer.method: txstream supports oidc, got {text!r}")
    if name == "sasl.login.callback.handler.class" and \
            not text.endswith("OAuthBearerLoginCallbackHandler"):
        raise ConfigError("sasl.login.callback.handler.class: txstream supports Kafka's "
                          "OAuthBearerLoginCallbackHandler (the client-credentials flow) only")


def client_options(props: Mapping[str, Any], kind: str) -> dict[str, Any]:
    """kafka-python keyword arguments of checked properties for a client of ``kind``
    (producer, consumer or admin): a property no such client takes is left out."""
    out: dict[str, Any] = {}
    for name, value in props.items():
        key = None if name in _OWN else _keyword(name)
        if key is not None and key in _defaults(kind):
            out[key] = _convert(name, key, value)
    return out
