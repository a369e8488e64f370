"""The tests, in folders that mirror the code (a folder per room of txstream), plus the
system tests, the project's own checks, the simulation (sim/) and the shared helpers
(support/). The tiers and the shared fixtures: conftest.py."""
