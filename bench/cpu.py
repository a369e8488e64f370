"""The machine's CPU counters: how much of it the hypervisor took, and how much a phase used.

Wall-clock figures on this virtual machine move with its speed (the hypervisor's steal took
10-29 % of the CPU in some sessions). CPU time per transaction does not count the stolen
part, so it compares the raw pipe, the coordinator and the ceiling even when the VM slowed
between them. It is the whole machine's (broker, JVM, Python workers, the benchmark), as the
wall-clock figures are: the benchmark runs on a machine of its own.
"""

from __future__ import annotations

import bisect
import threading
import time

__all__ = ["cpu_times", "steal_pct", "busy_seconds", "CpuMeter"]

# /proc/stat's per-CPU counters: user nice system idle iowait irq softirq steal (guest time
# is already inside user). Busy is what ran on the CPU for this machine: not idle, not
# waiting, not stolen.
_BUSY = (0, 1, 2, 5, 6)
_TICKS_PER_S = 100  # USER_HZ: Linux reports /proc/stat in 1/100 s on every architecture


def cpu_times() -> list[int] | None:
    """The machine's CPU time counters (``/proc/stat``, all CPUs), or None where there are
    none."""
    try:
        with open("/proc/stat") as f:
            return [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None


def steal_pct(before: list[int] | None, after: list[int] | None) -> float | None:
    """The share of CPU time the hypervisor gave to other machines between two
    :func:`cpu_times` (its 8th counter, steal). A virtual machine's speed moves with it: a run
    with much steal had less than its cores, whatever its code."""
    if not before or not after or len(before) < 8 or len(after) < 8:
        return None
    total = sum(after) - sum(before)
    return round(100 * (after[7] - before[7]) / total, 1) if total > 0 else None


def busy_seconds(counters: list[int]) -> float:
    """CPU seconds the machine spent running (all CPUs) in one :func:`cpu_times` reading."""
    return sum(counters[i] for i in _BUSY if i < len(counters)) / _TICKS_PER_S


class CpuMeter:
    """Samples the machine's busy CPU time in the background, so that the CPU of a span known
    only afterwards (the first to the last visible record) can be read off.

    Between two samples the counter is interpolated linearly; the counters tick every 10 ms
    and a sample is taken every ``interval_s``, so spans of a few seconds are measured to
    within a few percent.
    """

    def __init__(self, interval_s: float = 0.1) -> None:
        self.interval_s = interval_s
        self._times_ms: list[float] = []
        self._busy_s: list[float] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="cpu-meter", daemon=True)

    def __enter__(self) -> CpuMeter:
        self.sample()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.sample()

    def sample(self, at_ms: float | None = None, counters: list[int] | None = None) -> None:
        with self._lock:  # read and stamped together, so that the samples stay in order
            counters = counters if counters is not None else cpu_times()
            if counters is None:
                return
            self._times_ms.append(time.time() * 1000 if at_ms is None else at_ms)
            self._busy_s.append(busy_seconds(counters))

    def _busy_at(self, at_ms: float) -> float | None:
        times, busy = self._times_ms, self._busy_s
        i = bisect.bisect_left(times, at_ms)
        if i < len(times) and times[i] == at_ms:
            return busy[i]
        if i == 0 or i == len(times):  # outside what was sampled: no honest answer
            return None
        t0, t1 = times[i - 1], times[i]
        return busy[i - 1] + (busy[i] - busy[i - 1]) * (at_ms - t0) / (t1 - t0)

    def use(self, start_ms: float, end_ms: float, transactions: int
            ) -> dict[str, float | None] | None:
        """The CPU used from ``start_ms`` to ``end_ms`` (wall clock): ``us_per_tx``, CPU
        microseconds per transaction (None without transactions), and ``cores``, CPUs busy on
        average. None if the span is empty or was not sampled on both sides."""
        if end_ms <= start_ms:
            return None
        self.sample()  # the span may end after the last background sample
        with self._lock:
            start, end = self._busy_at(start_ms), self._busy_at(end_ms)
        if start is None or end is None:
            return None
        busy = end - start
        return {"us_per_tx": round(busy * 1e6 / transactions, 1) if transactions > 0 else None,
                "cores": round(busy * 1000 / (end_ms - start_ms), 2)}
