"""RocketMQ's ``Validators.checkMessage``: refuse a message before anything is sent."""

from __future__ import annotations

from txstream.errors import ConfigError, InvalidMessage
from txstream.message import (
    CHECK_IMMUNITY_PROPERTY,
    MAX_BODY_BYTES,
    Message,
    immunity_seconds,
)
from txstream.topics import Topics, validate_topic
from txstream.wire import RESERVED_HEADERS

__all__ = ["validate_message"]


def validate_message(msg: object, topics: Topics, max_body: int = MAX_BODY_BYTES) -> Message:
    """Return ``msg`` if it can be sent as a transactional message; else raise
    :class:`InvalidMessage` saying what is wrong."""
    if not isinstance(msg, Message):
        raise InvalidMessage(f"expected a client.Message, got {type(msg).__name__}")
    try:
        validate_topic(msg.topic)
    except ConfigError as exc:
        raise InvalidMessage(f"invalid topic: {exc}") from None
    # Writing straight into the coordinator's own topics would bypass the transaction.
    if msg.topic in topics.system() or msg.topic.startswith(topics.check_prefix):
        raise InvalidMessage(f"topic {msg.topic!r} is a txstream system topic")
    if not isinstance(msg.body, (bytes, bytearray)):
        raise InvalidMessage(f"message body must be bytes, got {type(msg.body).__name__}")
    size = len(msg.body)
    if size == 0:
        raise InvalidMessage("message body is empty")
    if size > max_body:
        raise InvalidMessage(f"message body of {size} bytes exceeds the limit of {max_body}")
    for name in ("tags", "keys"):
        value = getattr(msg, name)
        if value is not None and not isinstance(value, str):
            raise InvalidMessage(f"message {name} must be text, got {type(value).__name__}")
    if msg.tags is not None and "||" in msg.tags:
        raise InvalidMessage(f"tag {msg.tags!r} contains '||', which subscriptions split on")
    if not isinstance(msg.properties, dict):
        raise InvalidMessage("message properties must be a dict of text to text")
    if CHECK_IMMUNITY_PROPERTY in msg.properties:
        # Set as Java users set it (putUserProperty, or straight into the dict): it is the
        # message's check immunity, written as its own header.
        try:
            msg.set_check_immunity_time(immunity_seconds(msg.properties[CHECK_IMMUNITY_PROPERTY]))
        except ValueError as exc:
            raise InvalidMessage(str(exc)) from None
        del msg.properties[CHECK_IMMUNITY_PROPERTY]
    for name, value in msg.properties.items():
        if not isinstance(name, str) or not name or not isinstance(value, str):
            raise InvalidMessage(f"property {name!r}: names must be non-empty text, values text")
        if name in RESERVED_HEADERS:
            raise InvalidMessage(f"property name {name!r} is reserved by txstream")
    return msg
