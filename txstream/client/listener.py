"""The callbacks applications implement, and the states they return (RocketMQ's names).

``LocalTransactionState`` is :class:`txstream.message.Decision` itself, not a copy: the value a
listener returns is the value that travels in the end event.
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from enum import Enum

from txstream.message import Decision, Message

__all__ = [
    "LocalTransactionState",
    "TransactionListener",
    "ConsumeStatus",
    "MessageListener",
    "call_for_state",
]

log = logging.getLogger(__name__)

LocalTransactionState = Decision


class TransactionListener(ABC):
    """RocketMQ's ``TransactionListener``.

    ``execute_local_transaction`` runs in the thread that called
    ``send_message_in_transaction``, once the half message is stored. ``check_local_transaction``
    runs on the producer's check executor when the coordinator asks about a transaction whose
    outcome it does not know (possibly one started by another producer of the group, or by a
    process that crashed): it must answer from durable local state, not from memory alone.

    Raising, or returning ``None``, counts as ``UNKNOW``: the coordinator asks again later.
    """

    @abstractmethod
    def execute_local_transaction(self, msg: Message, arg: object) -> LocalTransactionState:
        """Run the local transaction for ``msg`` (``arg`` is what the sender passed)."""

    @abstractmethod
    def check_local_transaction(self, msg: Message) -> LocalTransactionState:
        """Say how the local transaction of ``msg.transaction_id`` ended."""


class ConsumeStatus(str, Enum):
    """RocketMQ's ``ConsumeConcurrentlyStatus``."""

    CONSUME_SUCCESS = "CONSUME_SUCCESS"
    RECONSUME_LATER = "RECONSUME_LATER"


MessageListener = Callable[[Sequence[Message]], ConsumeStatus]


def call_for_state(
    fn: Callable[[], object], what: str, transaction_id: str
) -> tuple[Decision, str | None]:
    """Run a listener callback; return its state and, when it did not give one, why.

    Anything but a state (an exception, ``None``, a stray value) becomes ``UNKNOW`` with a
    remark, because a wrong COMMIT or ROLLBACK cannot be undone while UNKNOW only costs a check.
    """
    try:
        result = fn()
    except Exception as exc:
        log.warning("%s failed for transaction %s: %r", what, transaction_id, exc, exc_info=True)
        return Decision.UNKNOW, f"{what} exception: {exc!r}"[:1000]
    if isinstance(result, Decision):
        return result, None
    if isinstance(result, str):
        try:
            return Decision(result), None
        except ValueError:
            pass
    log.warning("%s returned %r for transaction %s; counted as UNKNOW", what, result,
                transaction_id)
    return Decision.UNKNOW, f"{what} returned {result!r}"[:1000]
