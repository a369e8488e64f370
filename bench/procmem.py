"""Memory of a process tree from /proc: the Spark JVM and every Python process under it."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["descendants", "tree_rss_mb", "tree_cpu_s", "thread_cpu_s", "spark_jvm_pid",
           "live_heap_mb"]


def _children() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                # The command name may hold spaces and parentheses: fields start after the last ')'.
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        kids.setdefault(ppid, []).append(int(name))
    return kids


def descendants(pid: int) -> list[int]:
    """``pid`` and every process below it."""
    kids = _children()
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(kids.get(p, ()))
    return out


def _rss_kb(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def tree_rss_mb(pid: int) -> float:
    """Summed RSS of ``pid`` and its descendants, in MiB (shared pages count once per process)."""
    return sum(_rss_kb(p) for p in descendants(pid)) / 1024


def live_heap_mb(pid: int) -> float | None:
    """What the JVM's heap holds after a full collection, in MiB (None: no ``jcmd``). Its RSS
    is the heap's high-water mark instead: G1 keeps what a peak (loading a backlog) made it
    commit, so RSS shows the peak, this what is held."""
    import re
    import subprocess

    try:
        subprocess.run(["jcmd", str(pid), "GC.run"], capture_output=True, timeout=120,
                       check=True)
        info = subprocess.run(["jcmd", str(pid), "GC.heap_info"], capture_output=True,
                              text=True, timeout=60, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    used = re.search(r"heap\s+total \d+K, used (\d+)K", info)
    return int(used.group(1)) / 1024 if used else None


def _cpu_ticks(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        # utime, stime, cutime, cstime: the last two hold the time of reaped children.
        return sum(int(x) for x in fields[11:15])
    except (OSError, ValueError, IndexError):
        return 0


def thread_cpu_s(pid: int) -> tuple[float, dict[str, float]]:
    """CPU seconds so far of process ``pid`` (every thread it ever ran) and of its live
    threads, summed by thread name."""
    tick = os.sysconf("SC_CLK_TCK")
    by_name: dict[str, float] = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            stat = (task / "stat").read_text()
        except OSError:  # the thread ended between listing and reading
            continue
        name = stat[stat.index("(") + 1:stat.rindex(")")]
        fields = stat.rsplit(")", 1)[1].split()
        by_name[name] = by_name.get(name, 0.0) + (int(fields[11]) + int(fields[12])) / tick
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / tick, by_name


def tree_cpu_s(pid: int) -> float:
    """CPU seconds (user + system) used so far by ``pid`` and its descendants.

    On a shared machine wall time mixes in other people's work; CPU time is this tree's own.
    """
    return sum(_cpu_ticks(p) for p in descendants(pid)) / os.sysconf("SC_CLK_TCK")


def spark_jvm_pid() -> int | None:
    """The pid of the JVM this Python driver launched (the Python workers run below it)."""
    from pyspark import SparkContext

    gateway = SparkContext._gateway
    proc = getattr(gateway, "proc", None)
    return int(proc.pid) if proc is not None else None
