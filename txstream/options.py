"""Typed options as text: the one codec for the Spark source's and sink's options.

Spark hands a data source its options as a ``{name: text}`` map. :func:`to_options` writes a
frozen dataclass of options that way (the engine, building the query) and :func:`parse_options`
reads it back (the data source, on the driver), checking every value once, with the field's
type: ``int``, ``float``, ``bool``, ``str``, optional ones, and nested dataclasses as JSON.
A field's metadata may give a ``minimum``.
"""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from collections.abc import Mapping
from typing import Any, TypeVar

from txstream.errors import ConfigError

__all__ = ["parse_bool", "parse_options", "to_options"]

T = TypeVar("T")

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


def parse_bool(text: str | bool, name: str = "value") -> bool:
    """``true/false``, ``yes/no``, ``on/off`` or ``1/0`` (any case); else ConfigError."""
    if isinstance(text, bool):
        return text
    value = str(text).strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ConfigError(f"{name} must be true or false, got {text!r}")


def _base(hint: Any) -> tuple[Any, bool]:
    """The type an option holds, and whether it may be None."""
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        return args[0], True
    return hint, False


def _parse(kind: Any, text: str, name: str) -> Any:
    if kind is bool:
        return parse_bool(text, f"option {name}")
    if kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            raise ConfigError(f"option {name} must be a number, got {text!r}") from None
    if dataclasses.is_dataclass(kind):
        try:
            return kind(**json.loads(text))
        except (ValueError, TypeError) as exc:
            raise ConfigError(f"option {name} is not {kind.__name__} JSON: {exc}") from None
    return text


def parse_options(cls: type[T], options: Mapping[str, str]) -> T:
    """An instance of the options dataclass ``cls`` from Spark's option map; a missing or
    empty option keeps the field's default."""
    hints = typing.get_type_hints(cls)
    values: dict[str, Any] = {}
    for field in dataclasses.fields(cls):  # type: ignore[arg-type]
        text = options.get(field.name)
        if text is None or str(text).strip() == "":
            continue
        kind, _ = _base(hints[field.name])
        value = _parse(kind, str(text), field.name)
        minimum = field.metadata.get("minimum")
        if minimum is not None and value < minimum:
            raise ConfigError(f"option {field.name} must be at least {minimum}, got {value}")
        values[field.name] = value
    return cls(**values)


def _text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if dataclasses.is_dataclass(value):
        return json.dumps(dataclasses.asdict(value), sort_keys=True)  # type: ignore[arg-type]
    return str(value)


def to_options(options: Any) -> dict[str, str]:
    """The option map :func:`parse_options` reads back as ``options`` (None fields left out)."""
    return {field.name: _text(getattr(options, field.name))
            for field in dataclasses.fields(options)
            if getattr(options, field.name) is not None}
