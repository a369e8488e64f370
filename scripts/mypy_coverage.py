"""How much of the product mypy checks: lines of the .py files [tool.mypy] files names, over
lines of every .py file under txstream/ (through its links to state/, sources/, sinks/,
streaming/; tests/ and bench/ are not the product).

    .venv/bin/python scripts/mypy_coverage.py [REPO]
"""

from __future__ import annotations

import os
import sys
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def python_files(path: Path) -> set[Path]:
    """The .py files at ``path`` (a file, or a folder walked through its links)."""
    if path.is_file():
        return {path.resolve()}
    return {(Path(folder) / name).resolve()
            for folder, _, names in os.walk(path, followlinks=True)
            for name in names if name.endswith(".py")}


def lines(files: set[Path]) -> int:
    return sum(len(f.read_bytes().splitlines()) for f in files)


def coverage(repo: Path = REPO) -> tuple[int, int]:
    """(lines mypy checks, lines of the product)."""
    config = tomllib.loads((repo / "pyproject.toml").read_text())["tool"]["mypy"]
    product = python_files(repo / "txstream")
    checked = set().union(*(python_files(repo / f) for f in config["files"])) & product
    return lines(checked), lines(product)


def main() -> int:
    checked, total = coverage(Path(sys.argv[1]) if len(sys.argv) > 1 else REPO)
    print(f"mypy checks {checked} of {total} product lines: {100 * checked / total:.1f} %")
    return 0


if __name__ == "__main__":
    sys.exit(main())
