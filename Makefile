# The two commands of the README: `make run` and `make test`. Both set up everything first.
VENV ?= .venv
PY := $(VENV)/bin/python
PYTEST_ARGS ?=

.PHONY: setup run test test-fast soak lint demo demo-recovery bench clean

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml bench/pyproject.toml deploy/kafka/pom.xml \
		deploy/spark-kafka/pom.xml scripts/setup.sh
	bash scripts/setup.sh $(VENV)
	touch $@

run: setup
	$(VENV)/bin/txstream run

demo: setup
	$(VENV)/bin/txstream demo

# The coordinator SIGKILLed mid-batch under traffic and restarted: the verdict, and a picture.
demo-recovery: setup
	$(VENV)/bin/txstream demo --recovery

# xdist workers, each with its own broker and Spark session (tests/conftest.py). The Spark
# tests mostly wait on timers and brokers: 4 finish soonest on 2 cores (3 leave them idle, 5
# slow every test down); the fast tier is all CPU.
WORKERS ?= 4
FAST_WORKERS ?= 2
# Schedules of the simulation in the fast tier (make test plays 1,000): a sample, to keep the
# tier near a minute on 2 cores (README has its time).
FAST_SIM_SEEDS ?= 50

# Everything that needs neither Spark nor a broker (the simulation included): ~1 min on 2 cores.
test-fast: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy
	TXSTREAM_SIM_SEEDS=$${TXSTREAM_SIM_SEEDS:-$(FAST_SIM_SEEDS)} $(PY) -m pytest -n $(FAST_WORKERS) -m fast $(PYTEST_ARGS)

# Every test (what CI runs), on $(WORKERS) workers; the tests that share one resource run in
# one group, one after another (tests/conftest.py).
test: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy
	$(PY) -m pytest -n $(WORKERS) --dist loadgroup --durations=25 $(PYTEST_ARGS)

# The fault-injection soak (tests/system/test_soak.py), 10 minutes of faults by default.
soak: setup
	TXSTREAM_SOAK_SECONDS=$${TXSTREAM_SOAK_SECONDS:-600} TXSTREAM_SOAK_NODES=$${TXSTREAM_SOAK_NODES:-3} $(PY) -m pytest -m soak $(PYTEST_ARGS)

bench: setup
	$(VENV)/bin/txstream bench

clean:
	rm -rf $(VENV) checkpoints/*/ .pytest_cache .hypothesis
