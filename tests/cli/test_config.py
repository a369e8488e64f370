"""Flags, environment variables and defaults of ``txstream run`` (and demo, bench)."""

from __future__ import annotations

import argparse

import pytest

from txstream.errors import ConfigError
from txstream.state.policy import Policy
from txstream.streaming.cli.options import add_run_arguments, config_from_args
from txstream.streaming.engine.config import RunConfig
from txstream.streaming.engine.spark_settings import DEFAULT_DRIVER_MEMORY


def _parse(argv: list[str]) -> RunConfig:
    parser = argparse.ArgumentParser()
    add_run_arguments(parser)
    args = parser.parse_args(argv)
    return config_from_args(args, "127.0.0.1:9092")


def test_jit_comes_from_the_flag_the_environment_or_the_default(
        monkeypatch: pytest.MonkeyPatch) -> None:
    assert _parse([]).jit == "c1"
    assert _parse(["--jit", "tiered"]).jit == "tiered"
    monkeypatch.setenv("TXSTREAM_JIT", "tiered")
    assert _parse([]).jit == "tiered"
    assert _parse(["--jit", "c1"]).jit == "c1"


def test_driver_memory_comes_from_the_flag_the_environment_or_the_default(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Not Spark's 1g: a million pending transactions kept ~600 MB of it live.
    assert _parse([]).driver_memory == DEFAULT_DRIVER_MEMORY == "2g"
    assert _parse(["--driver-memory", "4g"]).driver_memory == "4g"
    monkeypatch.setenv("TXSTREAM_DRIVER_MEMORY", "1536m")
    assert _parse([]).driver_memory == "1536m"
    assert _parse(["--driver-memory", "3G"]).driver_memory == "3G"
    assert _parse(["--driver-memory", "1024"]).driver_memory == "1024"  # MiB, as Spark reads it
    # Refused before a JVM starts, with the reason: Spark would fail later, or not start at all.
    for bad in ("2 gigs", "2x", "256m", "0g", ""):
        with pytest.raises(ConfigError, match="driver memory"):
            _parse(["--driver-memory", bad])


def test_timer_lead_comes_from_the_flag_the_environment_or_the_default(
        monkeypatch: pytest.MonkeyPatch) -> None:
    assert _parse([]).policy.timer_lead == Policy().timer_lead == 500
    assert _parse(["--timer-lead", "0"]).policy.timer_lead == 0  # off
    monkeypatch.setenv("TXSTREAM_TIMER_LEAD", "250ms")
    assert _parse([]).policy.timer_lead == 250
    assert _parse(["--timer-lead", "1s"]).policy.timer_lead == 1000
    with pytest.raises(ConfigError, match="--timer-lead"):
        _parse(["--timer-lead=-1s"])
    with pytest.raises(ValueError, match="timer_lead"):
        Policy(timer_lead=-1)


def test_the_source_reads_lost_partitions_again_only_when_asked(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The data-loss error offers fail_on_data_loss=false: ``txstream run`` sets it with
    ``--no-fail-on-data-loss`` or ``TXSTREAM_FAIL_ON_DATA_LOSS=false``, and fails by default."""
    from txstream.streaming.engine.query import source_options

    assert source_options(_parse([]), None, 2).fail_on_data_loss is True
    assert source_options(_parse(["--no-fail-on-data-loss"]), None, 2).fail_on_data_loss is False
    monkeypatch.setenv("TXSTREAM_FAIL_ON_DATA_LOSS", "false")
    assert _parse([]).fail_on_data_loss is False
