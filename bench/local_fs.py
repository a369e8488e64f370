"""What writing one checkpoint file costs, with Hadoop's local file system and without its forks.

``python -m bench.local_fs [--files 200] [--rounds 3]``

Every micro-batch writes a few small files through Hadoop's ``file:`` file system: the offsets
and commit logs' entries and a delta per state partition, each with its ``.crc``. This writes
``--files`` such files (a 200-byte body, then rename into place, as Spark's checkpoint file
manager does) in the local Spark session's JVM, through Hadoop's ``LocalFileSystem`` and through
``streaming/local_fs.py``'s, alternately for ``--rounds`` rounds, and prints milliseconds per
file (py4j's calls, ~5 per file, are in both).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from streaming.local_fs import NO_FORK_FS_CLASS
from streaming.session import build_session

__all__ = ["write_files"]

_CLASSES = {"hadoop": "org.apache.hadoop.fs.LocalFileSystem", "no-fork": NO_FORK_FS_CLASS}


def write_files(spark: Any, class_name: str, where: Path, files: int) -> float:
    """Milliseconds per file: ``files`` times create, write, close, rename via ``class_name``."""
    jvm = spark.sparkContext._jvm
    hadoop = jvm.org.apache.hadoop.fs
    conf = jvm.org.apache.hadoop.conf.Configuration(spark.sparkContext._jsc.hadoopConfiguration())
    conf.set("fs.file.impl", class_name)
    conf.setBoolean("fs.file.impl.disable.cache", True)
    fs = hadoop.Path(where.as_uri()).getFileSystem(conf)
    assert fs.getClass().getName() == class_name, fs.getClass().getName()
    body = bytes(200)
    began = time.perf_counter()
    for i in range(files):
        tmp = hadoop.Path((where / f".{i}.tmp").as_uri())
        out = fs.create(tmp, True)
        out.write(body)
        out.close()
        fs.rename(tmp, hadoop.Path((where / str(i)).as_uri()))
    took = (time.perf_counter() - began) * 1000 / files
    fs.close()
    return took


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.local_fs", description=__doc__)
    parser.add_argument("--files", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    spark = build_session(app_name="txstream-bench-local-fs")
    times: dict[str, list[float]] = {name: [] for name in _CLASSES}
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for r in range(args.rounds):
                for name, class_name in _CLASSES.items():
                    where = Path(tmp) / f"{name}-{r}"
                    where.mkdir()
                    times[name].append(write_files(spark, class_name, where, args.files))
    finally:
        spark.stop()
    for name, values in times.items():
        print(f"{name:8s} {statistics.median(values):6.2f} ms per file "
              f"(rounds: {', '.join(f'{v:.2f}' for v in values)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
