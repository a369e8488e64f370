"""``txstream console``: the web console over the index of what the coordinator wrote.

Pages of the pending transactions, each transaction's timeline, search by transaction id,
message id and business key, the discards and dead letters, and their JSON. With an admin
token (``--admin-token`` or ``TXSTREAM_ADMIN_TOKEN``) an operator can commit or roll back a
pending transaction from its page, written as ``txstream resolve`` writes it.
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import logging
from typing import Any

from txstream.errors import ConfigError
from txstream.streaming.cli.operator_decision import send_decision
from txstream.streaming.cli.options import add_kafka_arguments, env, settings_of, topics_of
from txstream.streaming.cli.signals import interrupt_on_signals
from txstream.streaming.cli.transaction_trail import add_index_argument

__all__ = ["add_parser", "console_command"]


def add_parser(sub: Any) -> None:
    p = sub.add_parser("console", help="the web console: pending transactions, timelines, "
                                       "search, discards and dead letters")
    add_kafka_arguments(p)
    p.add_argument("--host", default=env("console-host") or "127.0.0.1",
                   help="address to listen on (env TXSTREAM_CONSOLE_HOST; default 127.0.0.1: "
                        "this machine only)")
    p.add_argument("--port", type=int, default=env("console-port") or 8080,
                   help="port to listen on (env TXSTREAM_CONSOLE_PORT; default 8080; 0: any "
                        "free one)")
    add_index_argument(p, env("index"), "$XDG_DATA_HOME/txstream/console-PREFIX.sqlite, "
                                        "else ./txstream-console.sqlite; :memory: for none")
    p.add_argument("--admin-token", default=None,
                   help="turns on the resolve buttons, for requests that carry it as "
                        "'Authorization: Bearer TOKEN' (prefer env TXSTREAM_ADMIN_TOKEN: a "
                        "flag is visible in the process list)")
    p.add_argument("--operator", default=None,
                   help="who a decision is written as when the request names nobody "
                        "(default: console)")
    p.set_defaults(func=console_command)


def _require_flask() -> None:
    if importlib.util.find_spec("flask") is None:
        raise ConfigError("txstream console needs the console's dependencies, not installed "
                          "here (no flask): pip install 'txstream[console]'")


def console_command(args: argparse.Namespace) -> int:
    _require_flask()
    from txstream.console.server import ConsoleServer, default_index_path

    settings, topics = settings_of(args), topics_of(args)
    token = args.admin_token or env("admin-token")
    if args.admin_token:
        logging.getLogger("txstream").warning(
            "--admin-token on the command line is visible in the process list: prefer "
            "TXSTREAM_ADMIN_TOKEN")
    logging.getLogger("console").setLevel(logging.INFO)  # the audit lines of decisions
    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # not a line per request
    index_path = args.index or default_index_path(topics)
    server = ConsoleServer(index_path, settings, topics, host=args.host, port=args.port,
                           admin_token=token,
                           resolver=functools.partial(send_decision, settings, topics),
                           operator=args.operator or "console")
    with interrupt_on_signals():
        try:
            print(f"txstream console on {server.url} (index {index_path}; topics "
                  f"{topics.history}, {topics.discard}, {topics.dead_letter}; admin actions "
                  f"{'on' if token else 'off'}). Ctrl-C stops it.", flush=True)
            server.serve_forever()  # Werkzeug's returns on Ctrl-C (KeyboardInterrupt)
        except KeyboardInterrupt:
            pass
        finally:
            print("stopping the console", flush=True)
            server.close()
    return 0
