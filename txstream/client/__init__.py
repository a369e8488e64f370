"""RocketMQ's transactional-message client API, over Kafka and the txstream coordinator.

>>> from txstream.client import Message, TransactionProducer, TransactionListener,
LocalTransactionState
>>> producer = TransactionProducer("my_group", "127.0.0.1:9092", MyListener()).start()
>>> result = producer.send_message_in_transaction(Message("TopicTest", b"hello", tags="TagA"))
>>> producer.shutdown()

A thin layer over :mod:`txstream.message` (the message model), :mod:`txstream.wire` (the record
format) and :mod:`txstream.kafka` (client construction).
"""

from __future__ import annotations

from txstream.client.consume_from import ConsumeFromWhere
from txstream.client.consumer import PushConsumer
from txstream.client.dedup import DedupCache
from txstream.client.executor import BoundedExecutor, RejectedExecution
from txstream.client.listener import (
    ConsumeStatus,
    LocalTransactionState,
    MessageListener,
    TransactionListener,
)
from txstream.client.producer import SendStatus, TransactionProducer, TransactionSendResult
from txstream.client.retry import Subscription
from txstream.errors import (
    BrokerUnavailable,
    ClientStateError,
    ConfigError,
    InvalidMessage,
    SendFailed,
    SendInDoubt,
    TxStreamError,
)
from txstream.kafka import KafkaSettings
from txstream.message import MAX_BODY_BYTES, Message
from txstream.topics import DLQ_PREFIX, RETRY_PREFIX, Topics

__all__ = [
    "MAX_BODY_BYTES",
    "Message",
    "LocalTransactionState",
    "TransactionListener",
    "TransactionProducer",
    "TransactionSendResult",
    "SendStatus",
    "PushConsumer",
    "ConsumeFromWhere",
    "ConsumeStatus",
    "MessageListener",
    "Subscription",
    "RETRY_PREFIX",
    "DLQ_PREFIX",
    "BoundedExecutor",
    "RejectedExecution",
    "DedupCache",
    "KafkaSettings",
    "Topics",
    "TxStreamError",
    "ConfigError",
    "InvalidMessage",
    "BrokerUnavailable",
    "ClientStateError",
    "SendFailed",
    "SendInDoubt",
]
