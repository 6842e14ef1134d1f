# mq-stream-gateway: the README's commands. Every target sets up what it needs first.
PY := .venv/bin/python

.PHONY: setup test demo bench fuzz lint devstack-up devstack-down clean

setup:
	@bash tools/setup.sh

test: setup
	$(PY) -m pytest

lint: setup
	.venv/bin/ruff check gateway plugins tests benchmarks
	.venv/bin/mypy

demo: setup
	$(PY) -m gateway.demo

bench: setup
	$(PY) benchmarks/run.py

fuzz: setup
	$(PY) tests/fuzz/run_fuzz.py --seconds $${FUZZ_SECONDS:-120}

devstack-up: setup
	.venv/bin/mqgw devstack up

devstack-down:
	.venv/bin/mqgw devstack down

clean:
	rm -rf .venv .cache .devstack .pytest_cache .mypy_cache .ruff_cache
