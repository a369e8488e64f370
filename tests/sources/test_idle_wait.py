"""The source's wait while its input is quiet (sources.idle): when, how long, never past a
due timer."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from txstream.sources.idle import IDLE_WAIT_MS, QUIET_AFTER_MS, idle_wait_ms


def test_no_wait_until_the_input_has_been_quiet_long_enough() -> None:
    assert idle_wait_ms(None, None, 10_000) == 0  # something new at the last ask
    assert idle_wait_ms(10_000, None, 10_000 + QUIET_AFTER_MS - 1) == 0
    assert idle_wait_ms(10_000, None, 10_000 + QUIET_AFTER_MS) == IDLE_WAIT_MS
    assert idle_wait_ms(10_000, None, 99_000, wait_ms=0) == 0  # the wait turned off


def test_the_wait_ends_when_the_next_timer_is_due() -> None:
    now = 50_000
    assert idle_wait_ms(0, now + 30, now) == 30
    assert idle_wait_ms(0, now - 5, now) == 0  # overdue: ask at once
    assert idle_wait_ms(0, now + 10 * IDLE_WAIT_MS, now) == IDLE_WAIT_MS


@given(quiet_since=st.one_of(st.none(), st.integers(0, 10**7)),
       due=st.one_of(st.none(), st.integers(0, 2 * 10**7)), now=st.integers(0, 2 * 10**7),
       wait=st.integers(0, 5_000))
def test_the_wait_is_bounded(quiet_since: int | None, due: int | None, now: int,
                             wait: int) -> None:
    got = idle_wait_ms(quiet_since, due, now, wait_ms=wait)
    assert 0 <= got <= wait
    if due is not None:
        assert now + got <= max(now, due)
    if quiet_since is None or now - quiet_since < QUIET_AFTER_MS:
        assert got == 0


def test_the_decision_record_states_the_waits_of_the_code() -> None:
    from pathlib import Path

    record = (Path(__file__).resolve().parents[2] / "docs" / "decisions"
              / "0028-idle-wait.md").read_text()
    assert f"`QUIET_AFTER_MS` ({QUIET_AFTER_MS} ms)" in record
    assert f"`IDLE_WAIT_MS` ({IDLE_WAIT_MS} ms)" in record
