"""The ``txstream`` command line: one thin module per command over the engine and the client.

Commands of other installed distributions join through the entry-point group
``txstream.commands``: each entry names a function that adds its subparser (the benchmark,
``txstream bench``, comes this way from the development checkout's ``bench`` package).

The client commands (``produce``, ``consume``, ``history``, ``resolve``, ``topics``) work in a
light install, without the ``coordinator`` extra: no command module imports Spark, pandas,
pyarrow, numpy or the broker binary at module level. The commands that need them call
:func:`txstream.extras.require_coordinator` first.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from importlib.metadata import entry_points

from txstream.errors import TxStreamError
from txstream.extras import COORDINATOR_MODULES, missing_extra

__all__ = ["main", "build_parser", "PLUGIN_GROUP"]

PLUGIN_GROUP = "txstream.commands"

def build_parser() -> argparse.ArgumentParser:
    from txstream.streaming.cli import (
        broker,
        console,
        consume,
        dead_letters,
        demo,
        history,
        pending,
        produce,
        resolve,
        run,
        topics,
    )

    parser = argparse.ArgumentParser(
        prog="txstream",
        description="RocketMQ-style transactional messages on Spark Structured Streaming.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    for command in (run, broker, demo, produce, consume, pending, resolve, history, topics,
                    dead_letters, console):
        command.add_parser(sub)
    for plugin in entry_points(group=PLUGIN_GROUP):
        try:
            plugin.load()(sub)
        except ImportError as exc:  # a plugin of the coordinator's side in a light install
            if (exc.name or "").partition(".")[0] not in COORDINATOR_MODULES:
                raise
            logging.getLogger(__name__).info("command %s not loaded: %s", plugin.name, exc)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    from txstream.streaming.cli.logs import configure_logging

    logging.getLogger().setLevel(logging.WARNING)
    configure_logging("text")
    logging.getLogger("kafka").setLevel(logging.CRITICAL)
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except TxStreamError as exc:
        # One clear line, no stack trace wall: these are the user's to fix (config, broker).
        print(f"txstream: {exc}", file=sys.stderr)
        return 2
    except ImportError as exc:
        # A path require_coordinator did not foresee still ends in the same one line.
        root = (exc.name or "").partition(".")[0]
        if root not in COORDINATOR_MODULES:
            raise
        print(f"txstream: {missing_extra(f'txstream {args.command}', [root])}",
              file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
