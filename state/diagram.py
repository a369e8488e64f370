"""The life of a transaction as a Mermaid state diagram, drawn from :data:`TRANSITIONS`.

``docs/architecture.md`` embeds the diagram between two markers; a test fails when the page
and the table disagree. ``python -m txstream.state.diagram docs/architecture.md`` redraws it in
place.
"""

from __future__ import annotations

import sys
from pathlib import Path

from txstream.state.lifecycle import MAY_REACH, TRANSITIONS
from txstream.state.transaction import Status

__all__ = ["state_diagram", "embed", "BEGIN", "END"]

BEGIN = "<!-- state diagram: drawn by `python -m txstream.state.diagram docs/architecture.md` -->"
END = "<!-- end of state diagram -->"


def _name(status: Status | None) -> str:
    return "[*]" if status is None else status.value


def state_diagram() -> str:
    """Every move of the table as an edge ``before --> after: TRIGGERS / action``; an action
    that may reach several statuses (a check may discard) has an edge to each."""
    edges: dict[tuple[str, str, str], list[str]] = {}
    for (before, trigger), (after, action) in TRANSITIONS.items():
        for reached in sorted(MAY_REACH.get(action, frozenset({after})),
                              key=lambda s: "" if s is None else s.value):
            key = (_name(before), _name(reached), action.value)
            edges.setdefault(key, []).append(trigger.value)
    lines = ["stateDiagram-v2"]
    for (source, target, verb), triggers in edges.items():
        lines.append(f"    {source} --> {target}: {', '.join(triggers)} / {verb}")
    return "\n".join(lines)


def embed(page: str) -> str:
    """``page`` with the diagram between :data:`BEGIN` and :data:`END` drawn anew."""
    head, found, rest = page.partition(BEGIN)
    _, found_end, tail = rest.partition(END)
    if not found or not found_end:
        raise ValueError("the page has no state diagram markers")
    return f"{head}{BEGIN}\n```mermaid\n{state_diagram()}\n```\n{END}{tail}"


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m txstream.state.diagram PAGE.md", file=sys.stderr)
        return 2
    path = Path(argv[0])
    path.write_text(embed(path.read_text()))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
