"""The benchmark's CPU counters: steal, and the CPU a span used (``bench.cpu``)."""

from __future__ import annotations

import os
import time

from bench.cpu import CpuMeter, cpu_times, steal_pct

# /proc/stat's counters, in 1/100 s: user nice system idle iowait irq softirq steal ...


def test_steal_is_the_share_of_cpu_time_given_to_other_machines() -> None:
    before = [100, 0, 10, 500, 0, 0, 0, 40, 0, 0]
    after = [150, 0, 20, 520, 0, 0, 0, 60, 0, 0]
    assert steal_pct(before, after) == 20.0  # 20 of 100 jiffies
    assert steal_pct(None, after) is None and steal_pct(before, before) is None
    assert cpu_times() is not None and len(cpu_times() or []) >= 8  # Linux, as CI is


def test_a_span_is_charged_the_busy_time_between_its_ends_and_not_idle_or_stolen() -> None:
    meter = CpuMeter()
    meter.sample(at_ms=1_000, counters=[100, 0, 0, 900, 0, 0, 0, 0])
    # One second later: 2 s busy (user, system, irq, softirq), idle and steal also moved.
    meter.sample(at_ms=2_000, counters=[250, 0, 30, 950, 0, 10, 10, 80])
    use = meter.use(1_500, 2_000, transactions=1_000)  # the second half of that second
    assert use == {"us_per_tx": 1_000.0, "cores": 2.0}  # 1 s over 1,000 tx, 2 CPUs busy


def test_a_span_the_meter_did_not_see_on_both_sides_has_no_figure() -> None:
    meter = CpuMeter()
    meter.sample(at_ms=1_000, counters=[100, 0, 0, 900, 0, 0, 0, 0])
    meter.sample(at_ms=2_000, counters=[200, 0, 0, 900, 0, 0, 0, 0])
    assert meter.use(500, 1_500, 10) is None  # began before the first sample
    assert meter.use(1_500, 1_500, 10) is None  # empty


def test_an_idle_span_has_cores_but_no_cost_per_transaction() -> None:
    meter = CpuMeter()
    meter.sample(at_ms=1_000, counters=[100, 0, 0, 900, 0, 0, 0, 0])
    meter.sample(at_ms=2_000, counters=[200, 0, 0, 900, 0, 0, 0, 0])
    assert meter.use(1_000, 2_000, 0) == {"us_per_tx": None, "cores": 1.0}


def test_the_meter_sees_a_busy_core() -> None:
    with CpuMeter(interval_s=0.05) as meter:
        time.sleep(0.1)
        start = time.time() * 1000
        n = 0
        while time.time() * 1000 - start < 400:  # one core busy for 0.4 s
            n += 1
        end = time.time() * 1000
        time.sleep(0.1)
        use = meter.use(start, end, transactions=1)
    assert use is not None
    # About one core; less when the hypervisor steals some of it, more with other work.
    assert 0.3 <= use["cores"] <= (os.cpu_count() or 1) + 0.5
