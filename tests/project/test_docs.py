"""The documents that are drawn from the code, and the links between documents."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from txstream.state.diagram import BEGIN, END, embed, state_diagram

REPO = Path(__file__).resolve().parents[2]
ARCHITECTURE = REPO / "docs" / "architecture.md"
PAGES = [REPO / "README.md", REPO / "PERFORMANCE.md", *sorted((REPO / "docs").rglob("*.md"))]
_LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def test_the_architecture_page_shows_the_transition_table() -> None:
    page = ARCHITECTURE.read_text()
    drawn = page.split(BEGIN, 1)[1].split(END, 1)[0]
    assert state_diagram() in drawn
    # `python -m txstream.state.diagram docs/architecture.md` changes nothing:
    assert embed(page) == page


def test_the_diagram_has_an_edge_for_every_move_of_the_table() -> None:
    from txstream.state.lifecycle import TRANSITIONS

    lines = state_diagram().splitlines()[1:]
    for (before, trigger), (after, action) in TRANSITIONS.items():
        source = "[*]" if before is None else before.value
        target = "[*]" if after is None else after.value
        assert any(line.strip().startswith(f"{source} --> {target}:") and trigger.value in line
                   and line.endswith(f"/ {action.value}") for line in lines), (before, trigger)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_relative_links_resolve(page: Path) -> None:
    for target in _LINK.findall(page.read_text()):
        if "://" in target or target.startswith("mailto:"):
            continue
        assert (page.parent / target).exists(), f"{page.name}: broken link {target}"


DECISIONS = sorted((REPO / "docs" / "decisions").glob("0*.md"))
_STATUS = re.compile(r"^Status: (accepted|superseded by \[\d{4}\]\(\d{4}-[a-z0-9-]+\.md\))$")


@pytest.mark.parametrize("record", DECISIONS, ids=lambda p: p.name[:4])
def test_each_decision_record_says_its_status_and_date_and_is_in_the_index(record: Path) -> None:
    title, blank, status, date = record.read_text().splitlines()[:4]
    assert title.startswith(f"# {record.name[:4]}. ") and blank == ""
    assert _STATUS.match(status), status
    assert re.fullmatch(r"Date: \d{4}-\d{2}-\d{2}", date), date
    index = (REPO / "docs" / "decisions" / "README.md").read_text()
    assert f"]({record.name})" in index, f"{record.name} is not in docs/decisions/README.md"


def _layout_block() -> dict[str, set[str]]:
    """The modules ``docs/architecture.md`` names per folder, in its "Where each part lives"
    block: a line at the margin names a folder (``txstream/kafka/``), the lines under it its
    modules (``reading.py``)."""
    page = ARCHITECTURE.read_text()
    block = page.split("## Where each part lives", 1)[1].split("```", 2)[1]
    named: dict[str, set[str]] = {}
    folder = None
    for line in block.splitlines():
        words = line.split()
        if not words:
            continue
        if not line.startswith(" ") and words[0].endswith("/"):
            folder = words[0]
            named.setdefault(folder, set())
            words = words[1:]
        if folder is not None:
            names = (w.strip(",;:()") for w in words)
            named[folder].update(n for n in names if n.endswith(".py"))
    return named


def test_the_architecture_page_names_every_module_where_it_lives() -> None:
    package = REPO / "txstream"
    actual: dict[str, set[str]] = {}
    for path in package.rglob("*.py"):  # rglob follows no links: walk the linked rooms too
        actual.setdefault(f"txstream/{path.parent.relative_to(package)}/".replace("/./", "/"),
                          set()).add(path.name)
    for room in ("state", "sources", "sinks", "streaming/engine", "streaming/cli"):
        for path in (package / room).glob("*.py"):
            actual.setdefault(f"txstream/{room}/", set()).add(path.name)
    actual = {f: {m for m in ms if m not in ("__init__.py", "__main__.py")}
              for f, ms in actual.items()}
    actual = {f: ms for f, ms in actual.items() if ms}
    named = {f: ms for f, ms in _layout_block().items() if f.startswith("txstream/")}
    assert sorted(named) == sorted(actual)
    for folder, modules in actual.items():
        assert named[folder] == modules, (folder, sorted(modules - named[folder]),
                                          sorted(named[folder] - modules))


def test_the_wait_for_a_short_partition_is_the_one_decision_0021_states() -> None:
    from txstream.readback.bodies import SHORT_SETTLE_S

    text = (REPO / "docs" / "decisions" / "0021-bodies-read-back.md").read_text()
    assert f"`SHORT_SETTLE_S` ({SHORT_SETTLE_S:.0f} s;" in text


def test_the_producer_renewal_is_the_one_the_configuration_page_states() -> None:
    from txstream.client.producer import RENEW_AFTER_S

    text = (REPO / "docs" / "configuration.md").read_text()
    assert f"acknowledged for {RENEW_AFTER_S:.0f} s (or three `send_timeout_s`" in text


def test_the_sinks_stall_is_the_one_decision_0032_states() -> None:
    from txstream.sinks.delivery import STALL_S
    from txstream.sinks.kafka_sink import SinkOptions

    text = " ".join((REPO / "docs" / "decisions" / "0032-transactions.md").read_text().split())
    assert f"`STALL_S` ({STALL_S:.0f} s," in text
    assert f"the flush timeout ({SinkOptions.flush_timeout_s:.0f} s)" in text


def test_the_readme_says_how_many_schedules_make_test_fast_plays() -> None:
    root = Path(__file__).resolve().parents[2]
    [seeds] = re.findall(r"^FAST_SIM_SEEDS \?= (\d+)$", (root / "Makefile").read_text(), re.M)
    for doc in ("README.md", "CONTRIBUTING.md"):
        line = next(x for x in (root / doc).read_text().splitlines() if "`make test-fast`" in x
                    and x.startswith("|"))
        assert f"{seeds} simulated schedules" in line, (doc, line)


def test_the_readme_says_on_how_many_workers_each_tier_runs() -> None:
    root = Path(__file__).resolve().parents[2]
    makefile = (root / "Makefile").read_text()
    rows = [x for x in (root / "README.md").read_text().splitlines() if x.startswith("|")]
    for target, variable in (("make test-fast", "FAST_WORKERS"), ("make test", "WORKERS")):
        [workers] = re.findall(rf"^{variable} \?= (\d+)$", makefile, re.M)
        line = next(x for x in rows if x.startswith(f"| `{target}` |"))
        assert f"on {workers} workers" in line, (target, line)
