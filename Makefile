# The two commands of the README: `make run` and `make test`. Both set up everything first.
VENV ?= .venv
PY := $(VENV)/bin/python
PYTEST_ARGS ?=

.PHONY: setup run test soak lint demo bench clean

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml bench/pyproject.toml scripts/setup.sh
	bash scripts/setup.sh $(VENV)
	touch $@

run: setup
	$(VENV)/bin/txstream run

demo: setup
	$(VENV)/bin/txstream demo

test: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy
	$(PY) -m pytest $(PYTEST_ARGS)

# The fault-injection soak (tests/test_soak.py), 10 minutes of faults by default.
soak: setup
	TXSTREAM_SOAK_SECONDS=$${TXSTREAM_SOAK_SECONDS:-600} $(PY) -m pytest -m soak $(PYTEST_ARGS)

bench: setup
	$(VENV)/bin/txstream bench

clean:
	rm -rf $(VENV) checkpoints/*/ .pytest_cache .hypothesis
