"""Every default of ``txstream run`` is written once, in code (``Policy``, ``RunConfig``, ...):
``--help`` shows it from there (``options.run_defaults``), and the documents that repeat it are
held to it here: docs/configuration.md's tables, and any page that names a flag or a Policy
field with its value, as "`--check-backoff-max` (16)", "(`--orphan-end-timeout`, 60 s)" or
"`Policy.check_backoff_max` (16)"."""

from __future__ import annotations

import argparse
import dataclasses
import re
from pathlib import Path

import pytest

from txstream.state.policy import Policy
from txstream.streaming.cli.options import (
    _POLICY_FLAGS,
    add_run_arguments,
    duration_text,
    run_defaults,
)
from txstream.streaming.engine.config import parse_duration_ms

REPO = Path(__file__).resolve().parents[2]
CONFIGURATION = REPO / "docs" / "configuration.md"
PAGES = [REPO / "README.md", REPO / "PERFORMANCE.md", *sorted((REPO / "docs").rglob("*.md"))]
DURATIONS = {name for name, kind, _ in _POLICY_FLAGS if kind == "duration"} | {
    "trigger", "key-window", "health-lag-growing", "health-timer-overdue",
    "broker-outage-limit"}


def _same(flag: str, written: str) -> bool:
    """Whether a page's ``written`` value is the flag's default ("60 s" is "1m")."""
    default = run_defaults()[flag]
    if flag in DURATIONS:
        return parse_duration_ms(written.replace(" ", "")) == parse_duration_ms(default)
    return written.replace(",", "") == default


def _run_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser()
    add_run_arguments(parser)
    return parser


def _run_tables() -> dict[str, str]:
    """docs/configuration.md's `txstream run` tables: flag → its default cell."""
    section = CONFIGURATION.read_text().split("## `txstream run`", 1)[1].split("\n## ", 1)[0]
    defaults: dict[str, str] = {}
    column = None
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("| flag |"):
            column = cells.index("default")
        elif line.startswith("| `--") and column is not None:
            for flag in re.findall(r"`(--[a-z-]+)", cells[0]):
                defaults[flag[2:]] = cells[column].strip("`")
    return defaults


def test_every_policy_field_has_a_flag_and_a_shown_default() -> None:
    flags = {name.replace("-", "_") for name, _, _ in _POLICY_FLAGS}
    assert flags == {f.name for f in dataclasses.fields(Policy)}
    policy = Policy()
    for name, kind, _ in _POLICY_FLAGS:
        value = getattr(policy, name.replace("-", "_"))
        shown = run_defaults()[name]
        assert (parse_duration_ms(shown) if kind == "duration" else int(shown)) == value


def test_help_shows_each_default_from_the_table() -> None:
    helps = {a.option_strings[0][2:]: a.help or "" for a in _run_parser()._actions
             if a.option_strings and a.option_strings[0].startswith("--")}
    for flag, default in run_defaults().items():
        assert f"default {default}" in helps[flag], flag


def test_the_flags_default_to_what_help_says() -> None:
    # With no flag and no variable given, the run's config has the shown defaults.
    from txstream.streaming.cli.options import config_from_args

    config = config_from_args(_run_parser().parse_args([]), "127.0.0.1:9092")
    policy_flags = {name for name, _, _ in _POLICY_FLAGS}
    for flag in policy_flags:
        value = getattr(config.policy, flag.replace("-", "_"))
        assert _same(flag, duration_text(value) if flag in DURATIONS else str(value)), flag
    assert _same("key-window", duration_text(config.key_window_ms))
    assert _same("trigger", duration_text(config.trigger_ms))
    for flag in ("buckets", "key-shards", "shuffle-partitions", "max-offsets-per-trigger",
                 "max-message-bytes", "state-store", "jit", "driver-memory", "metrics-host"):
        assert _same(flag, str(getattr(config, flag.replace("-", "_")))), flag


def test_the_configuration_page_lists_every_run_flag_with_its_default() -> None:
    documented = _run_tables()
    flags = {a.option_strings[0][2:] for a in _run_parser()._actions
             if a.option_strings and a.option_strings[0].startswith("--")} - {"help"}
    assert flags <= set(documented), f"not in docs/configuration.md: {flags - set(documented)}"
    wrong = {flag: (documented[flag], default) for flag, default in run_defaults().items()
             if not _same(flag, documented[flag])}
    assert not wrong, f"docs/configuration.md's default differs from the code's: {wrong}"


_FLAG_OR_FIELD = re.compile(r"`(?:--([a-z-]+)|Policy\.([a-z_]+))`\)?(?: \(|, )"
                            r"(\d[\d,.]*(?: ?(?:ms|min|s|m|h|d)\b|[gGmM]\b)?)")


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_a_page_that_gives_a_default_gives_the_codes(page: Path) -> None:
    # Pages may say a default next to its flag or Policy field, where this test reads it;
    # elsewhere they name the flag and leave the number to docs/configuration.md.
    defaults = run_defaults()
    text = page.read_text()
    if page == CONFIGURATION:  # other commands have flags of the same names, with their own
        text = re.sub(r"\n## Other commands\n.*?(?=\n## |\Z)", "", text, flags=re.S)
    for flag, field, value in _FLAG_OR_FIELD.findall(text):
        name = flag or field.replace("_", "-")
        if name in defaults:
            assert _same(name, value), f"{page.name}: {name} ({value}), the code's {defaults[name]}"


def test_the_page_check_reads_the_forms_it_promises() -> None:
    found = _FLAG_OR_FIELD.findall(
        "up to `--check-backoff-max` (16) intervals; (`--orphan-end-timeout`, 60 s); "
        "`Policy.resolved_retention` (120 s); `--check-max 3` is an example")
    assert found == [("check-backoff-max", "", "16"), ("orphan-end-timeout", "", "60 s"),
                     ("", "resolved_retention", "120 s")]
    cap, wait = run_defaults()["check-backoff-max"], run_defaults()["orphan-end-timeout"]
    assert _same("check-backoff-max", cap) and not _same("check-backoff-max", f"{cap}0")
    in_seconds = f"{parse_duration_ms(wait) // 1000} s"
    assert _same("orphan-end-timeout", in_seconds) and not _same("orphan-end-timeout", "1 ms")
