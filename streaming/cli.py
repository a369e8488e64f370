"""The ``txstream`` command line. Each subcommand lives in its own module."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from txstream.errors import TxStreamError

__all__ = ["main", "build_parser"]


def build_parser() -> argparse.ArgumentParser:
    from streaming import admin, bench_cmd, broker_cmd, demo, pending, run, shell

    parser = argparse.ArgumentParser(
        prog="txstream",
        description="RocketMQ-style transactional messages on Spark Structured Streaming.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    run.add_parser(sub)
    broker_cmd.add_parser(sub)
    demo.add_parser(sub)
    shell.add_parser(sub)
    pending.add_parser(sub)
    admin.add_parser(sub)
    bench_cmd.add_parser(sub)
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


if __name__ == "__main__":
    sys.exit(main())
