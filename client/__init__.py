"""RocketMQ's transactional-message client API, over Kafka and the txstream coordinator.

>>> from client import Message, TransactionProducer, TransactionListener, LocalTransactionState
>>> producer = TransactionProducer("my_group", "127.0.0.1:9092", MyListener()).start()
>>> result = producer.send_message_in_transaction(Message("TopicTest", b"hello", tags="TagA"))
>>> producer.shutdown()

A thin layer over :mod:`txstream.message` (the message model), :mod:`txstream.wire` (the record
format) and :mod:`txstream.kafka` (client construction).
"""

from __future__ import annotations

from client.consume_from import ConsumeFromWhere
from client.consumer import PushConsumer
from client.dedup import DedupCache
from client.executor import BoundedExecutor, RejectedExecution
from client.listener import (
    ConsumeStatus,
    LocalTransactionState,
    MessageListener,
    TransactionListener,
)
from client.producer import SendStatus, TransactionProducer, TransactionSendResult
from client.retry import DLQ_PREFIX, RETRY_PREFIX, Subscription
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
from txstream.topics import Topics

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
