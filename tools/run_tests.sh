#!/usr/bin/env bash
# The Makefile's test commands, timed step by step (README, "The two commands").
#
#   tools/run_tests.sh lint                 ruff + mypy --strict (make lint, after set-up)
#   tools/run_tests.sh test  [pytest args]  set-up, lint, then every test (make test, CI)
#   tools/run_tests.sh quick [pytest args]  set-up, then the quick tests (make test-quick)
#
# Tests run on MQGW_TEST_WORKERS pytest-xdist workers (default 4: the suite mostly waits
# on brokers, timeouts and fsyncs, so four share two cores well; 0 runs them in this
# process). `make test` ends with the 20 slowest tests and the wall times of set-up, lint
# and tests, measured apart (tests/conftest.py prints them from MQGW_TEST_TIMES).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }

lint() {
    .venv/bin/ruff check gateway plugins analytics examples tests benchmarks
    .venv/bin/mypy
}

# The quick loop: unit and in-process tests (real Kafka and Mosquitto included), none of
# the subprocess gateways, networks of processes, fault suites, Spark or the browser.
QUICK_MARKS="not (faults or slow or spark or browser or subprocess)"

mode="${1:-}"
shift || true
case "$mode" in
lint)
    lint
    exit 0
    ;;
test | quick) ;;
*)
    echo "usage: tools/run_tests.sh lint | test [pytest args] | quick [pytest args]" >&2
    exit 2
    ;;
esac

start="$(now)"
t="$(now)"
bash tools/setup.sh
setup_s="$(since "$t")"
lint_s=0
if [[ "$mode" == test ]]; then
    t="$(now)"
    lint
    lint_s="$(since "$t")"
fi

workers="${MQGW_TEST_WORKERS:-4}"
args=(--durations=20)
if [[ "$workers" != 0 ]]; then
    args+=(-n "$workers" --dist loadgroup --no-loadscope-reorder)
fi
if [[ "$mode" == test ]]; then
    args+=(--junitxml=.cache/test-junit.xml)
else
    args+=(-m "$QUICK_MARKS")
fi
export MQGW_TEST_TIMES="mode=$mode setup=$setup_s lint=$lint_s start=$start workers=$workers"
exec .venv/bin/python -m pytest "${args[@]}" "$@"
