"""The users' test kit (``txstream.testing.TransactionTestDriver``): an application's listener
and producers against the coordinator's real code in memory. What it promises a user: a
committed message is visible once, through a producer killed after its local transaction and a
coordinator killed mid-batch or moved to a new checkpoint; a rolled-back one never; an unknown
one is discarded with its reason after the answered checks; and a listener that answers a
check wrongly is caught. The example users copy (``examples/``) runs here too."""

from __future__ import annotations

import runpy
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from txstream.client import LocalTransactionState, TransactionListener
from txstream.errors import ClientStateError, TxStreamError
from txstream.kafka.clients import _PLUGGED
from txstream.kafka.memory_registry import lookup
from txstream.message import Message
from txstream.testing import ProducerKilled, TransactionTestDriver

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "test_listener_with_testing_kit.py"
COMMIT, ROLLBACK = LocalTransactionState.COMMIT_MESSAGE, LocalTransactionState.ROLLBACK_MESSAGE
UNKNOW = LocalTransactionState.UNKNOW


class Recording(TransactionListener):
    """Decides by the body (``commit``, ``rollback``, anything else unknown), keeps the
    decision in ``database`` and answers checks from it; ``forgets``: answers every check
    ROLLBACK, the defect of a listener that does not look its transactions up."""

    def __init__(self, database: dict[str, LocalTransactionState], forgets: bool = False
                 ) -> None:
        self.database, self.forgets, self.checks = database, forgets, 0

    def execute_local_transaction(self, msg: Message, arg: object) -> LocalTransactionState:
        state = {b"commit": COMMIT, b"rollback": ROLLBACK}.get(msg.body, UNKNOW)
        self.database[msg.transaction_id or ""] = state
        return state

    def check_local_transaction(self, msg: Message) -> LocalTransactionState:
        self.checks += 1
        if self.forgets:
            return ROLLBACK
        return self.database.get(msg.transaction_id or "", ROLLBACK)


def _killed_after_local_transaction(driver: TransactionTestDriver, listener: Recording
                                    ) -> None:
    producer = driver.producer("app", listener)
    driver.kill_producer_after_local_transaction(producer)
    with pytest.raises(ProducerKilled):
        driver.send(producer, Message(topic="orders", body=b"commit"))
    with pytest.raises(ClientStateError, match="shut down"):  # a dead process sends nothing
        driver.send(producer, Message(topic="orders", body=b"commit"))


def test_the_example_users_copy_passes() -> None:
    namespace = runpy.run_path(str(EXAMPLE))
    namespace["test_orders_survive_a_producer_and_a_coordinator_crash"]()


@pytest.mark.parametrize("forgets", [False, True])
def test_a_producer_killed_after_its_local_transaction_is_settled_by_another_producers_check(
        forgets: bool) -> None:
    database: dict[str, LocalTransactionState] = {}
    with TransactionTestDriver(transaction_timeout_s=6) as driver:
        _killed_after_local_transaction(driver, Recording(database))
        other = Recording(database, forgets=forgets)
        driver.producer("app", other)
        driver.advance(5)
        assert driver.visible("orders") == [] and other.checks == 0  # before the timeout
        driver.advance(5)
        assert other.checks == 1
        # A listener that forgets its database rolls a committed order back: the kit shows it.
        assert [m.body for m in driver.visible("orders")] == ([] if forgets else [b"commit"])


@pytest.mark.parametrize("transactions", [True, False], ids=["transactional", "ordered"])
@pytest.mark.parametrize("crash", ["mid-batch", "between batches", "new checkpoint"])
def test_a_coordinator_crash_releases_each_committed_message_once(crash: str,
                                                                  transactions: bool) -> None:
    database: dict[str, LocalTransactionState] = {}
    with TransactionTestDriver(transactions=transactions) as driver:
        producer = driver.producer("app", Recording(database))
        for body in (b"commit", b"rollback", b"commit"):
            driver.send(producer, Message(topic="orders", body=body))
        if crash == "new checkpoint":
            driver.advance(1)
            driver.new_checkpoint()
        else:
            driver.crash_coordinator(mid_batch=crash == "mid-batch")
        for body in (b"commit", b"rollback"):
            driver.send(producer, Message(topic="orders", body=body))
        driver.advance(30)
        assert [m.body for m in driver.visible("orders")] == [b"commit"] * 3
        assert driver.coordinator_restarts == 1
        ids = [m.transaction_id for m in driver.visible("orders")]
        assert len(set(ids)) == 3


def test_an_unknown_transaction_is_discarded_with_its_reason_after_the_answered_checks() -> None:
    listener = Recording({})
    with TransactionTestDriver(check_interval_s=60, check_max=3) as driver:
        producer = driver.producer("app", listener)
        sent = driver.send(producer, Message(topic="orders", body=b"later"))
        driver.advance(60)
        assert driver.discarded() == [] and listener.checks == 1
        driver.advance(600)
        [discarded] = driver.discarded()
        assert discarded.transaction_id == sent.transaction_id
        assert discarded.check_times == 3 and "3 answered checks" in discarded.reason
        assert discarded.message.body == b"later" and listener.checks == 3
        assert driver.visible("orders") == []


def test_a_group_with_no_producer_alive_is_checked_but_never_answers() -> None:
    listener = Recording({})
    with TransactionTestDriver(check_max=2) as driver:
        producer = driver.producer("app", listener)
        driver.send(producer, Message(topic="orders", body=b"later"))
        driver.kill_producer(producer)
        with pytest.raises(ClientStateError, match="shut down"):
            driver.send(producer, Message(topic="orders", body=b"commit"))
        driver.advance(3600)
        check_topic = driver.topics.check("app")
        requests = sum(len(driver.broker.records(check_topic, p))
                       for p in range(driver.broker.partition_count(check_topic) or 0))
        assert requests >= 2 and listener.checks == 0
        assert driver.discarded() == [] and driver.visible("orders") == []


def test_a_producer_of_another_driver_is_refused_and_a_closed_driver_leaves_nothing() -> None:
    with TransactionTestDriver() as first, TransactionTestDriver() as second:
        producer = first.producer("app", Recording({}))
        with pytest.raises(TxStreamError, match="not a producer of this driver"):
            second.kill_producer(producer)
        name = first.broker.name
    assert lookup(name) is None
    assert "memory://" in _PLUGGED  # the boundary keeps the scheme's factory: other brokers


def test_without_the_coordinators_packages_the_kit_says_what_to_install() -> None:
    code = textwrap.dedent("""
        import importlib.abc, sys
        class Refuse(importlib.abc.MetaPathFinder):  # a producer application's install
            def find_spec(self, name, path, target=None):
                if name.split(".")[0] in ("pyspark", "pyarrow"):
                    raise ModuleNotFoundError(f"No module named {name!r}")
        sys.meta_path.insert(0, Refuse())
        try:
            import txstream.testing
        except Exception as exc:
            print(type(exc).__name__, exc)
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, check=True)
    assert done.stdout.strip() == (
        "ConfigError txstream.testing needs the coordinator's dependencies, not installed here "
        "(no pyspark, pyarrow): pip install 'txstream[coordinator]'")
