"""What docs/wire-format.md tells a client writer, held to the code: the numbers it gives (integer
limits, the check topic's settings, the back-off, the check responder's memory), the header
orders it lists, and each rule it states where a client would otherwise guess."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest

from tests.support.tx_helpers import COMMIT, UNKNOWN, P, answer, end, only, registered
from txstream.client import TransactionProducer
from txstream.client.check_choice import REMEMBERED_TRANSACTIONS, CheckChoice, Fetched, Verdict
from txstream.errors import MalformedRecord
from txstream.kafka.provision import topic_spec
from txstream.message import Decision, EndEvent, Message
from txstream.outputs import CheckRequest, encode_check, encode_visible
from txstream.refusals import Code
from txstream.schema import EventKind, Kind
from txstream.sources.events import Malformed, parse_event
from txstream.state.effects import Release
from txstream.state.lifecycle import apply, on_timeout
from txstream.state.policy import Policy
from txstream.state.timing import check_spacing
from txstream.state.transaction import Transaction
from txstream.streaming.engine.records import Emit, output_rows
from txstream.topics import Topics
from txstream.wire import (
    INT_LIMIT,
    H,
    decode_end,
    decode_half,
    encode_end,
    encode_half,
    pack_headers,
    unpack_headers,
)

PAGE = (Path(__file__).resolve().parents[2] / "docs" / "wire-format.md").read_text()
FLAT = " ".join(PAGE.split())  # its prose, line breaks aside
TOPICS = Topics.with_prefix("t_")
T0 = 1_700_000_000_000


def _section(start: str, stop: str, text: str = FLAT) -> str:
    """The page's text (its prose on one line) from ``start`` to the next ``stop``."""
    assert start in text, start
    return text.split(start, 1)[1].split(stop, 1)[0]


def _header_list(start: str, stop: str) -> list[str]:
    """The header names a sentence of the page lists in order, ``*`` for the user properties."""
    items = re.findall(r"`([A-Za-z_]+)(?::[^`]*)?`|(the user properties|every user property)",
                       _section(start, stop))
    return [name or "*" for name, props in items]


def _written_headers(record_kind: str, record: object) -> list[str]:
    """The header names of ``record`` as the coordinator writes it (its record id added last),
    user properties (``u1``, ``u2``) shown as one ``*``."""
    row = output_rows([Emit(record_kind, record)], ["tag.1.2.3"], T0)[0]  # type: ignore[arg-type]
    out: list[str] = []
    for name, _ in unpack_headers(row.headers):
        shown = "*" if name.startswith("u") else name
        if not (shown == "*" and out and out[-1] == "*"):
            out.append(shown)
    return out


def _full_message() -> Message:
    """A half message with every optional header, as the coordinator decodes it."""
    headers = [(H.TRAN_MSG, b"true"), (H.REAL_TOPIC, b"orders"), (H.PGROUP, b"G"),
               (H.BORN_TIMESTAMP, str(T0).encode()), (H.UNIQ_KEY, b"M1"), (H.TAGS, b"a"),
               (H.KEYS, b"k"), ("u1", b"x"), ("u2", b"y"), (H.CHECK_IMMUNITY, b"30")]
    return decode_half(b"TX1", b"body", headers)


# --- numbers the page gives --------------------------------------------------------------------


def test_the_integer_limits_are_the_decoders() -> None:
    rules = _section("- **Headers**", "- **Names**")
    assert f"at most {2**63 - 1};" in rules
    assert f"`TRANSACTION_CHECK_TIMES` and `CHECK_IMMUNITY_TIME_IN_SECONDS` at most {INT_LIMIT}" \
        in rules
    assert "1 to 19 digits, leading zeros allowed" in rules

    def born(text: bytes) -> int | None:
        return decode_half(b"tx", b"v", [(H.TRAN_MSG, b"true"), (H.REAL_TOPIC, b"t"),
                                         (H.PGROUP, b"G"), (H.BORN_TIMESTAMP, text)]
                           ).born_timestamp

    assert born(str(2**63 - 1).encode()) == 2**63 - 1 and born(b"0" * 19) == 0
    assert born(b"007") == 7
    for bad in (str(2**63).encode(), b"0" * 20, b"-1", b"+1"):
        with pytest.raises(MalformedRecord) as info:
            born(bad)
        assert info.value.code == Code.INVALID_HEADER
    times = [(H.COMMIT_OR_ROLLBACK, b"UNKNOW"), (H.PGROUP, b"G"), (H.FROM_CHECK, b"true")]
    assert decode_end(b"tx", None, [*times, (H.CHECK_TIMES, str(INT_LIMIT).encode())]
                      ).check_times == INT_LIMIT
    with pytest.raises(MalformedRecord):
        decode_end(b"tx", None, [*times, (H.CHECK_TIMES, str(INT_LIMIT + 1).encode())])


def test_the_check_topic_settings_are_the_ones_txstream_creates() -> None:
    table = _section("| check topic setting | value |", "\n\n", PAGE)
    rows = dict(re.findall(r"^\| (.+?) \| (.+?) \|$", table, flags=re.M))
    spec = topic_spec("check", "RMQ_SYS_TRANS_CHECK_G")
    assert int(rows["partitions"]) == spec.partitions
    assert spec.replication_factor == -1 and rows["replication factor"] == "the broker's default"
    configs = {name.strip("`"): value.strip("`").split(" ")[0] for name, value in rows.items()
               if name.startswith("`")}
    assert configs == dict(spec.configs)
    assert "(1 day)" in rows["`retention.ms`"] and int(spec.configs["retention.ms"]) == 86_400_000


def test_the_back_off_the_page_shows_is_check_spacing() -> None:
    text = _section("With the defaults, `--check-interval`", "An answer")
    gaps = [int(s) for s in re.findall(r"(\d+) s\b", text.split("the gaps are", 1)[1])]
    policy = Policy()
    expected = [check_spacing(u, policy) // 1000 for u in range(1, len(gaps) + 1)]
    assert gaps == expected and len(gaps) >= 6
    assert gaps[-1] == gaps[-2] == policy.check_interval // 1000 * policy.check_backoff_max
    assert gaps[0] == policy.check_interval // 1000  # the first gap is the interval, not twice


def test_the_check_responders_memory_and_grace_are_the_clients() -> None:
    rule = _section("**Which requests to answer.**", "Commit offsets")
    assert f"up to {REMEMBERED_TRANSACTIONS} transactions" in rule
    grace = inspect.signature(TransactionProducer).parameters["check_grace_s"].default
    assert f"a grace ({grace:g} s in txstream's client)" in rule


# --- header orders the page lists --------------------------------------------------------------


def test_a_check_request_carries_the_headers_in_the_order_the_page_lists() -> None:
    listed = _header_list("as the coordinator read them, written anew in this order:",
                          "Absent optional")
    record = encode_check(_full_message(), 2, TOPICS, T0 + 60_000, T0)
    assert _written_headers(Kind.CHECK, record) == listed
    assert listed[-1] == H.RECORD_ID


def test_a_released_message_carries_the_headers_in_the_order_the_page_lists() -> None:
    listed = _header_list("original body; headers, in this order:", "There is no")
    record = encode_visible(_full_message())
    assert _written_headers(Kind.VISIBLE, record) == listed


def test_a_check_request_rebuilds_the_half_messages_headers() -> None:
    # The half message's own order, a name given twice, a padded number, an unknown reserved
    # name: the request carries each name once, in its own order, numbers in plain decimal.
    raw = [("u2", b"first"), (H.BORN_TIMESTAMP, b"007"), (H.PGROUP, b"G"), (H.TRAN_MSG, b"TRUE"),
           ("u1", b"x"), (H.REAL_TOPIC, b"orders"), ("u2", b"last"), (H.DLQ_CODE, b"X")]
    record = encode_check(decode_half(b"TX1", b"body", raw), 1, TOPICS)
    assert list(record.headers) == [
        (H.TRAN_MSG, b"true"), (H.REAL_TOPIC, b"orders"), (H.UNIQ_KEY, b"TX1"), (H.PGROUP, b"G"),
        (H.BORN_TIMESTAMP, b"7"), ("u2", b"last"), ("u1", b"x"), (H.CHECK_TIMES, b"1")]


# --- the rules a client would otherwise guess ---------------------------------------------------


def _parsed(kind: int, record: object) -> Message | EndEvent | Malformed:
    key, value, headers = record.key, record.value, record.headers  # type: ignore[attr-defined]
    return parse_event(kind, key, value, pack_headers(headers), 0, 0)


def test_the_topic_decides_what_a_record_is() -> None:
    half = encode_half(_full_message(), TOPICS)
    commit = encode_end(EndEvent("TX1", "G", Decision.COMMIT_MESSAGE), TOPICS)
    assert isinstance(_parsed(EventKind.HALF, half), Message)
    assert isinstance(_parsed(EventKind.END, commit), EndEvent)
    for kind, record in ((EventKind.HALF, commit), (EventKind.END, half)):
        refused = _parsed(kind, record)
        assert isinstance(refused, Malformed) and refused.code == Code.UNKNOWN_EVENT


@pytest.mark.parametrize(("headers", "code"), [
    ([(H.PGROUP, b"G")], Code.UNKNOWN_EVENT),
    ([(H.COMMIT_OR_ROLLBACK, b"MAYBE"), (H.PGROUP, b"G")], Code.UNKNOWN_EVENT),
    ([(H.COMMIT_OR_ROLLBACK, b"commit_message"), (H.PGROUP, b"G")], Code.UNKNOWN_EVENT),
    ([(H.COMMIT_OR_ROLLBACK, b"COMMIT_MESSAGE")], Code.MISSING_HEADER),
    ([(H.COMMIT_OR_ROLLBACK, b"COMMIT_MESSAGE"), (H.PGROUP, b"")], Code.MISSING_HEADER),
    ([(H.COMMIT_OR_ROLLBACK, b"UNKNOW"), (H.PGROUP, b"G"), (H.CHECK_TIMES, b"x")],
     Code.INVALID_HEADER),
    ([(H.COMMIT_OR_ROLLBACK, b"UNKNOW"), (H.PGROUP, b"G"), (H.BORN_TIMESTAMP, b"-1")],
     Code.INVALID_HEADER),
])
def test_an_end_events_refusal_codes(headers: list[tuple[str, bytes]], code: str) -> None:
    with pytest.raises(MalformedRecord) as info:
        decode_end(b"TX1", None, headers)
    assert info.value.code == code


@pytest.mark.parametrize(("value", "flag", "from_check"), [
    (None, b"TRUE", True), (b"", b"true", True), (b"", b"yes", False), (b"", b"", False)])
def test_an_empty_value_is_no_remark_and_only_true_is_true(value: bytes | None, flag: bytes,
                                                          from_check: bool) -> None:
    event = decode_end(b"TX1", value, [(H.COMMIT_OR_ROLLBACK, b"UNKNOW"), (H.PGROUP, b"G"),
                                       (H.FROM_CHECK, flag)])
    assert event.remark is None and event.from_check is from_check


def test_any_non_empty_value_is_the_remark_without_a_remark_header() -> None:
    event = decode_end(b"TX1", b"boom \xff", [(H.COMMIT_OR_ROLLBACK, b"UNKNOW"), (H.PGROUP, b"G")])
    assert event.remark == "boom \ufffd"


def test_tags_with_bars_keys_with_spaces_and_another_message_id_pass_through() -> None:
    headers = [(H.TRAN_MSG, b"true"), (H.REAL_TOPIC, b"orders"), (H.PGROUP, b"G"),
               (H.BORN_TIMESTAMP, str(T0).encode()), (H.TAGS, b"A||B"), (H.KEYS, b"k1 k2"),
               (H.UNIQ_KEY, b"M1")]
    released = encode_visible(decode_half(b"TX1", b"body", headers))
    out = dict(released.headers)
    assert released.key == b"k1 k2"  # the whole KEYS value, not its first key
    assert out[H.TAGS] == b"A||B" and out[H.UNIQ_KEY] == b"M1"
    assert out[H.TRANSACTION_ID] == b"TX1"
    no_id = decode_half(b"TX1", b"body", [*headers[:-1], (H.UNIQ_KEY, b""), (H.KEYS, b"")])
    assert no_id.msg_id == "TX1" and encode_visible(no_id).key is None


def test_check_times_counts_only_on_an_answer_and_a_decision_decides_whatever_it_answers(
) -> None:
    tx: Transaction | None = registered()
    for _ in range(3):
        assert tx is not None
        tx, _ = on_timeout(tx, tx.deadline, P)
    assert tx is not None and tx.checks_sent == 3 and tx.check_due is not None
    counted, _ = apply(tx, answer(UNKNOWN, 3), tx.check_due, P)
    assert counted is not None and counted.checks_answered == 1
    not_an_answer, _ = apply(tx, end(UNKNOWN, check_times=3), tx.check_due, P)
    assert not_an_answer is not None and not_an_answer.checks_answered == 0
    _, effects = apply(tx, answer(COMMIT, 1), tx.check_due, P)  # an old check's answer
    assert only(effects, Release)


def test_a_later_request_in_the_same_fetch_supersedes_an_earlier_one() -> None:
    msg = _full_message()
    fetched = [Fetched(CheckRequest(msg, n, None), T0 + n) for n in (1, 2)]
    choice = CheckChoice()
    assert choice.choose(fetched, T0).verdicts == (Verdict.SUPERSEDED, Verdict.ANSWER)
    assert choice.choose(fetched[:1], T0).verdicts == (Verdict.TAKEN,)  # a lower one, later


def test_the_codecs_the_page_allows_are_the_ones_the_coordinators_client_reads() -> None:
    import kafka.codec

    rule = _section("`compression.type`", "No Kafka transactions")
    allowed = re.findall(r"`(\w+)`", rule.split(";", 1)[0])
    assert allowed == ["none", "gzip", "snappy", "lz4", "zstd"]
    for codec in allowed[1:]:  # pinned in pyproject.toml (kafka-python reads none without)
        assert getattr(kafka.codec, f"has_{codec}")(), codec
