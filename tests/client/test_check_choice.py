"""The rule for which back-check requests a producer answers (txstream/client/check_choice.py):
pure, no broker, no clock."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from txstream.client.check_choice import CheckChoice, Fetched, Verdict
from txstream.message import Message
from txstream.outputs import CheckRequest

A, E, S, T, M = (Verdict.ANSWER, Verdict.EXPIRED, Verdict.SUPERSEDED, Verdict.TAKEN,
                 Verdict.MALFORMED)
GRACE = 10_000


def req(txid: str, number: int, valid_until: int | None = None, ts: int | None = 0) -> Fetched:
    msg = Message("TopicTest", b"x", transaction_id=txid, msg_id=txid, producer_group="g")
    return Fetched(CheckRequest(msg, number, valid_until), ts)


def verdicts(choice: CheckChoice, *fetched: Fetched, now: int = 0) -> list[Verdict]:
    return list(choice.choose(fetched, now).verdicts)


def test_a_request_is_answered_once_and_only_a_higher_number_after_it() -> None:
    c = CheckChoice(GRACE)
    assert verdicts(c, req("a", 2)) == [A]
    assert verdicts(c, req("a", 2)) == [T]  # read again
    assert verdicts(c, req("a", 1)) == [T]  # an older one, read later
    assert verdicts(c, req("a", 3), req("b", 1)) == [A, A]


def test_an_older_request_of_a_transaction_in_the_same_fetch_is_superseded() -> None:
    c = CheckChoice(GRACE)
    assert verdicts(c, req("a", 1), req("b", 1), req("a", 2)) == [S, A, A]
    assert verdicts(c, req("c", 5), req("c", 4)) == [A, S]


def test_expiry_is_judged_on_the_newest_request_timestamp_read() -> None:
    c = CheckChoice(GRACE)
    # b's timestamp, read in the same fetch, shows a past a's validity by more than the grace.
    assert verdicts(c, req("a", 1, valid_until=1_000, ts=0),
                    req("b", 1, valid_until=30_000, ts=11_001)) == [E, A]
    assert c.coordinator_ms == 11_001
    # Exactly at valid_until + grace it still holds; a later fetch is judged on what was read.
    assert verdicts(c, req("c", 1, valid_until=1_001)) == [A]
    assert verdicts(c, req("d", 1, valid_until=1_000, ts=500)) == [E]
    assert c.coordinator_ms == 11_001  # an older timestamp does not move it back
    assert verdicts(c, req("e", 1, valid_until=None, ts=0)) == [A]  # says nothing: holds


def test_the_producers_clock_decides_nothing() -> None:
    for now in (-10**12, 0, 10**12):  # far behind, equal, far ahead
        c = CheckChoice(GRACE)
        assert verdicts(c, req("a", 1, valid_until=2_000, ts=0), now=now) == [A]
        assert verdicts(c, req("b", 1, valid_until=25_000, ts=20_000), now=now) == [A]
        assert verdicts(c, req("c", 1, valid_until=9_999, ts=0), now=now) == [E]


def test_malformed_records_are_not_answered_and_do_not_move_the_clock() -> None:
    c = CheckChoice(GRACE)
    choice = c.choose([Fetched(None, 10**15), req("a", 1, valid_until=5, ts=0)], 0)
    assert list(choice.verdicts) == [M, A]
    assert c.coordinator_ms == 0 and choice.answered() == [1]
    # Records without a timestamp (None, or Kafka's -1) say nothing of the coordinator's time.
    c2 = CheckChoice(GRACE)
    assert c2.choose([req("a", 1, ts=None), req("b", 1, ts=-1)], 7).clock_difference_ms is None
    assert c2.coordinator_ms is None


def test_the_clock_difference_is_the_producers_time_minus_the_newest_timestamp() -> None:
    c = CheckChoice(GRACE)
    assert c.choose([req("a", 1, ts=1_000), req("b", 1, ts=4_000)], 100_000
                    ).clock_difference_ms == 96_000
    assert c.choose([req("c", 1, ts=50_000)], 20_000).clock_difference_ms == -30_000


def test_reset_forgets_the_numbers_taken_but_not_the_coordinators_time() -> None:
    c = CheckChoice(GRACE)
    assert verdicts(c, req("a", 1, valid_until=100_000, ts=90_000)) == [A]
    c.reset()
    assert verdicts(c, req("a", 1, valid_until=100_000, ts=90_000)) == [A]
    assert verdicts(c, req("b", 1, valid_until=1_000, ts=0)) == [E]


def test_the_memory_of_numbers_is_bounded_oldest_first() -> None:
    c = CheckChoice(GRACE, capacity=2)
    assert verdicts(c, req("a", 1), req("b", 1), req("c", 1)) == [A, A, A]
    assert verdicts(c, req("a", 1), req("c", 1)) == [A, T]  # a was forgotten, c was not


# --- the rule's cases, generated -----------------------------------------------------------

seconds = st.integers(0, 60).map(lambda s: s * 1000)  # coarse: boundaries are met often
fetched_st = st.builds(
    req,
    st.sampled_from(["a", "b", "c", "d"]),
    st.integers(1, 6),
    st.one_of(st.none(), seconds),
    st.one_of(st.none(), st.just(-1), seconds),
)
step_st = st.one_of(st.just("reset"), st.lists(st.one_of(fetched_st, st.just(Fetched(None, 5))),
                                               max_size=8))


@settings(max_examples=300, deadline=None)
@given(st.lists(step_st, max_size=12), st.integers(-10**12, 10**12))
def test_generated_fetches_follow_the_rule_whatever_the_producers_clock(
    steps: list[object], skew: int
) -> None:
    """A request is answered exactly when: it is well formed; its valid_until (if any) plus the
    grace is not older than the newest timestamp read so far, this fetch included; no higher
    number of its transaction is in the fetch; and its number is above every number answered
    for its transaction since the last reset. The producer's clock changes no verdict."""
    c, shifted = CheckChoice(GRACE), CheckChoice(GRACE)
    answered: dict[str, int] = {}
    newest_ts: int | None = None
    for step in steps:
        if step == "reset":
            c.reset()
            shifted.reset()
            answered.clear()
            continue
        assert isinstance(step, list)
        got = c.choose(step, 0).verdicts
        assert shifted.choose(step, skew).verdicts == got
        stamps = [f.timestamp_ms for f in step if f.request is not None
                  and f.timestamp_ms is not None and f.timestamp_ms >= 0]
        if stamps:
            newest_ts = max([*stamps, *([newest_ts] if newest_ts is not None else [])])
        top: dict[str, int] = {}
        for f in step:
            if f.request is not None:
                tx = f.request.message.transaction_id or ""
                top[tx] = max(top.get(tx, 0), f.request.check_times)
        for f, verdict in zip(step, got, strict=True):
            r = f.request
            if r is None:
                assert verdict is M
                continue
            tx = r.message.transaction_id or ""
            expired = (r.valid_until is not None and newest_ts is not None
                       and newest_ts > r.valid_until + GRACE)
            answer = (not expired and r.check_times == top[tx]
                      and r.check_times > answered.get(tx, 0))
            assert (verdict is A) == answer, (f, verdict)
            if expired:
                assert verdict is E
            if answer:
                answered[tx] = r.check_times
