"""How an application tests its transaction listener with ``txstream.testing``: copy this file.

The listener below keeps its local transactions in a dict (the application's database). The
test sends three orders, kills a producer between its local transaction and its end event, and
kills the coordinator in the middle of a micro-batch; every committed order is still visible
exactly once, the rolled-back one never. It runs in well under a second: no Spark, no broker.
"""

from __future__ import annotations

from txstream.client import LocalTransactionState, TransactionListener
from txstream.message import Message
from txstream.testing import ProducerKilled, TransactionTestDriver


class OrderListener(TransactionListener):
    """Commits an order unless its body says "reject"; answers checks from its database."""

    def __init__(self, database: dict[str, LocalTransactionState]) -> None:
        self.database = database

    def execute_local_transaction(self, msg: Message, arg: object) -> LocalTransactionState:
        state = (LocalTransactionState.ROLLBACK_MESSAGE if msg.body == b"reject"
                 else LocalTransactionState.COMMIT_MESSAGE)
        self.database[msg.transaction_id or ""] = state  # the local transaction commits here
        return state

    def check_local_transaction(self, msg: Message) -> LocalTransactionState:
        # An id the database does not know never ran its local transaction: roll it back.
        return self.database.get(msg.transaction_id or "", LocalTransactionState.ROLLBACK_MESSAGE)


def test_orders_survive_a_producer_and_a_coordinator_crash() -> None:
    database: dict[str, LocalTransactionState] = {}
    with TransactionTestDriver(check_interval_s=60, transaction_timeout_s=6) as driver:
        producer = driver.producer("orders-app", OrderListener(database))
        driver.send(producer, Message(topic="orders", body=b"order-1"))
        driver.send(producer, Message(topic="orders", body=b"reject"))

        # This producer dies after its local transaction committed, before its end event.
        driver.kill_producer_after_local_transaction(producer)
        try:
            driver.send(producer, Message(topic="orders", body=b"order-2"))
        except ProducerKilled:
            pass
        # Another producer of the group answers the back-check.
        driver.producer("orders-app", OrderListener(database))

        driver.crash_coordinator(mid_batch=True)
        driver.advance(seconds=10)  # past the transaction timeout: the check is answered

        assert sorted(m.body for m in driver.visible("orders")) == [b"order-1", b"order-2"]
        assert driver.coordinator_restarts == 1
        assert driver.discarded() == []
