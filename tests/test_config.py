"""Flags, environment variables and defaults of ``txstream run`` (and demo, bench)."""

from __future__ import annotations

import argparse

import pytest

from state.policy import Policy
from streaming.config import RunConfig, add_run_arguments, config_from_args
from txstream.errors import ConfigError


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
