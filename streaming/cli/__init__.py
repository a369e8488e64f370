"""The ``txstream`` command line: one thin module per command over the engine and the client.

Commands of other installed distributions join through the entry-point group
``txstream.commands``: each entry names a function that adds its subparser (the benchmark,
``txstream bench``, comes this way from the development checkout's ``bench`` package).
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from importlib.metadata import entry_points

from txstream.errors import TxStreamError

__all__ = ["main", "build_parser", "PLUGIN_GROUP"]

PLUGIN_GROUP = "txstream.commands"


def build_parser() -> argparse.ArgumentParser:
    from streaming.cli import admin, broker, demo, pending, run, shell

    parser = argparse.ArgumentParser(
        prog="txstream",
        description="RocketMQ-style transactional messages on Spark Structured Streaming.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    for command in (run, broker, demo, shell, pending, admin):
        command.add_parser(sub)
    for plugin in entry_points(group=PLUGIN_GROUP):
        plugin.load()(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("kafka").setLevel(logging.CRITICAL)
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except TxStreamError as exc:
        # One clear line, no stack trace wall: these are the user's to fix (config, broker).
        print(f"txstream: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
