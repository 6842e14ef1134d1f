# mq-stream-gateway: the README's commands. Every target sets up what it needs first
# (tools/setup.sh: idempotent, well under 2 s when nothing is missing).
PY := .venv/bin/python
PYTEST_ARGS ?=
DEMO_ARGS ?=
BENCH_ARGS ?=

.PHONY: setup test test-quick docs demo bench fuzz lint devstack-up devstack-status devstack-down clean

setup:
	@bash tools/setup.sh

# Set-up, lint and strict typing first (fast), then the whole suite against the real
# services (Kafka, Mosquitto, Spark start on demand) on 4 pytest-xdist workers
# (MQGW_TEST_WORKERS=N to change; 0: one process). Ends with the 20 slowest tests and
# the wall times of set-up, lint and tests (tools/run_tests.sh). CI runs exactly this.
test:
	@bash tools/run_tests.sh test $(PYTEST_ARGS)

# The inner loop: unit and in-process tests only (tools/run_tests.sh says which), no lint.
test-quick:
	@bash tools/run_tests.sh quick $(PYTEST_ARGS)

lint: setup
	@bash tools/run_tests.sh lint

# The documentation site (mkdocs.yml, Material theme) into site/, in strict mode: a broken
# link or anchor, or a page missing from the nav, fails it (make test builds it too).
docs: setup
	.venv/bin/mkdocs build --strict --site-dir site

demo: setup
	$(PY) -m examples.demo $(DEMO_ARGS)

# BENCH_ARGS=--quick: small counts (a smoke run); --only pubsub,latency picks some.
bench: setup
	$(PY) benchmarks/run.py $(BENCH_ARGS)

fuzz: setup
	$(PY) -m tests.fuzz.run_fuzz --seconds $${FUZZ_SECONDS:-120}

devstack-up: setup
	.venv/bin/mqgw devstack up

devstack-status:
	.venv/bin/mqgw devstack status

devstack-down:
	.venv/bin/mqgw devstack down

clean:
	rm -rf .venv .cache .devstack .pytest_cache .mypy_cache .ruff_cache fuzz-out site
