"""``--transactions auto|on|off`` (docs/decisions/0032-transactions.md): the flag and its
variable, and the probe's answer kept in the checkpoint, so a later start does not probe
again."""

from __future__ import annotations

import argparse
import json

import pytest

from txstream.errors import ConfigError, TransactionsUnavailable
from txstream.kafka.transactions import Isolation
from txstream.streaming.cli.options import add_run_arguments, config_from_args
from txstream.streaming.engine.config import RunConfig
from txstream.streaming.engine.transactions import (
    TRANSACTIONS_FILE,
    choose,
    transactional_id_of,
)


class Store:
    def __init__(self) -> None:
        self.files: dict[str, str] = {}

    def read_text(self, name: str) -> str | None:
        return self.files.get(name)

    def write_text(self, name: str, text: str) -> None:
        self.files[name] = text


class Probe:
    def __init__(self, isolates: bool) -> None:
        self.isolates, self.calls = isolates, 0

    def __call__(self) -> Isolation:
        self.calls += 1
        return Isolation(self.isolates, "the broker isolates transactions" if self.isolates
                         else "the broker does not isolate transactions (tansu)")


def _config(*argv: str) -> RunConfig:
    parser = argparse.ArgumentParser()
    add_run_arguments(parser)
    return config_from_args(parser.parse_args(list(argv)), "127.0.0.1:9092")


def test_the_flag_and_its_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    assert _config().transactions == "auto"
    assert _config("--transactions", "off").transactions == "off"
    monkeypatch.setenv("TXSTREAM_TRANSACTIONS", "on")
    assert _config().transactions == "on"
    assert _config("--transactions", "off").transactions == "off"  # the flag beats it
    monkeypatch.setenv("TXSTREAM_TRANSACTIONS", "sometimes")
    with pytest.raises(ConfigError, match="transactions must be one of"):
        _config()


def test_auto_probes_once_per_checkpoint_and_keeps_the_answer() -> None:
    store, probe = Store(), Probe(isolates=True)
    first = choose("auto", "k:9092", store, probe)
    again = choose("auto", "k:9092", store, probe)
    assert probe.calls == 1
    assert first.on and again.on and first.transactional_id == again.transactional_id
    assert first.transactional_id and first.transactional_id.startswith("txstream-")
    assert "kept in the checkpoint" in again.line and "\n" not in again.line
    kept = json.loads(store.files[TRANSACTIONS_FILE])
    assert kept["probe"] == {"servers": "k:9092", "isolates": True,
                             "reason": "the broker isolates transactions"}
    # Another broker behind the same checkpoint is asked again.
    assert not choose("auto", "t:9092", store, Probe(isolates=False)).on


def test_a_new_checkpoint_takes_the_coordinators_transactional_id() -> None:
    """Its tasks then fence the old checkpoint's and abort what a killed one left open
    (case 22 of tests/sim/test_sim_defects.py); a checkpoint that kept an id of its own keeps
    it."""
    base = transactional_id_of("p_RMQ_SYS_TRANS_HALF_TOPIC")
    assert base == "txstream-p_RMQ_SYS_TRANS_HALF_TOPIC"
    old, new = Store(), Store()
    assert choose("on", "k:9092", old, Probe(True), base).transactional_id == base
    assert choose("on", "k:9092", new, Probe(True), base).transactional_id == base
    kept = Store()
    kept.files[TRANSACTIONS_FILE] = json.dumps({"transactional_id": "txstream-0123"})
    assert choose("on", "k:9092", kept, Probe(True), base).transactional_id == "txstream-0123"


def test_auto_on_a_broker_that_does_not_isolate_says_why_in_one_line() -> None:
    store, probe = Store(), Probe(isolates=False)
    choice = choose("auto", "t:9092", store, probe)
    assert not choice.on and choice.transactional_id is None
    assert choice.line == ("transactions off: the broker does not isolate transactions (tansu): "
                           "releases are acknowledged before their notes are sent")
    choose("auto", "t:9092", store, probe)
    assert probe.calls == 1


def test_on_refuses_a_broker_that_does_not_isolate() -> None:
    with pytest.raises(TransactionsUnavailable, match="--transactions on, but the broker does "
                                                      "not isolate"):
        choose("on", "t:9092", Store(), Probe(isolates=False))
    assert choose("on", "k:9092", Store(), Probe(isolates=True)).on


def test_off_never_probes() -> None:
    store, probe = Store(), Probe(isolates=True)
    choice = choose("off", "k:9092", store, probe)
    assert not choice.on and probe.calls == 0 and not store.files
    assert "--transactions off" in choice.line


def test_a_probe_that_cannot_tell_turns_auto_off_and_is_not_kept() -> None:
    def failing() -> Isolation:
        raise TransactionsUnavailable("cannot create the transactions probe topic p")

    store = Store()
    assert not choose("auto", "k:9092", store, failing).on
    assert TRANSACTIONS_FILE not in store.files
    with pytest.raises(TransactionsUnavailable):
        choose("on", "k:9092", store, failing)


def test_the_sink_gets_the_id_only_when_on() -> None:
    from txstream.streaming.engine.query import resolve_transactions

    off = RunConfig(transactions="off")
    assert resolve_transactions(None, off) == (off, None)
    made = RunConfig(transactions="on", transactional_id="txstream-abc")
    assert resolve_transactions(None, made) == (made, None)  # chosen before: kept
