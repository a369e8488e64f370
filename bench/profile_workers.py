"""Profile a running coordinator's Python processes with py-spy, and print where time went.

    .venv/bin/python -m bench.profile_workers [--seconds 40] OUT_DIR [-- BENCH ARGS...]

(the options before OUT_DIR when bench arguments follow: argparse takes none after them)

Starts ``txstream bench --phases coordinator`` (or with the given bench arguments), waits for
Spark's Python workers to appear under the benchmark's JVM, samples every Python process there
(``py-spy record --subprocesses --format raw``) for ``--seconds``, and prints the functions
with the largest inclusive and self shares of the samples. The raw stacks stay in OUT_DIR.
"""

from __future__ import annotations

import argparse
import collections
import subprocess
import sys
import time
from pathlib import Path

from bench.procmem import descendants

__all__ = ["main", "summarize"]


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def _frame_name(frame: str) -> str:
    name, _, where = frame.partition(" (")
    return f"{name} ({where.split(':')[0].split('/')[-1]})" if where else name


def summarize(paths: list[Path], top: int = 40) -> str:
    """Inclusive and self shares per function over py-spy's raw (collapsed) stack files."""
    inclusive: collections.Counter[str] = collections.Counter()
    own: collections.Counter[str] = collections.Counter()
    total = 0
    for path in paths:
        for line in path.read_text().splitlines():
            stack, _, count = line.rpartition(" ")
            if not stack:
                continue
            n = int(count)
            total += n
            frames = [_frame_name(f) for f in stack.split(";")]
            for name in set(frames):
                inclusive[name] += n
            own[frames[-1]] += n
    lines = [f"{total} samples", "--- inclusive"]
    lines += [f"{100 * v / total:5.1f}% {k[:140]}" for k, v in inclusive.most_common(top)]
    lines += ["--- self"]
    lines += [f"{100 * v / total:5.1f}% {k[:140]}" for k, v in own.most_common(top // 2)]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--seconds", type=int, default=40)
    parser.add_argument("bench_args", nargs="*", help="after --: arguments for txstream bench")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    bench_args = args.bench_args or ["--phases", "coordinator", "--transactions", "60000",
                                     "--latency-seconds", "5"]
    err = args.out / "bench.err"
    bench = subprocess.Popen([sys.executable, "-m", "streaming.cli", "bench", *bench_args,
                              "--json"], stdout=(args.out / "bench.json").open("w"),
                             stderr=err.open("w"))
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline and bench.poll() is None:
        time.sleep(1)
        if any("pyspark.daemon pyspark.worker" in _cmdline(p) for p in descendants(bench.pid)):
            break
    time.sleep(5)  # past the first micro-batch's start-up
    under = [p for p in descendants(bench.pid) if p != bench.pid]
    # The Python processes whose parent is not Python (the JVM's children): py-spy follows
    # their forked workers itself (--subprocesses).
    roots = [p for p in under if "bin/python" in _cmdline(p).split(" ")[0]]
    roots = [p for p in roots if not any(p != q and p in descendants(q) for q in roots)]
    py_spy = str(Path(sys.executable).with_name("py-spy"))  # the venv's, from the dev extras
    spies = [subprocess.Popen([py_spy, "record", "--pid", str(p), "--subprocesses",
                               "--format", "raw", "--rate", "50", "--nonblocking",
                               "--duration", str(args.seconds), "-o", str(args.out / f"{p}.txt")],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
             for p in roots]
    for spy in spies:
        spy.wait()
    bench.wait(timeout=900)
    print(summarize(sorted(args.out.glob("[0-9]*.txt"))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
