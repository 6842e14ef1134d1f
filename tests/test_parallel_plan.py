"""``make test``'s parallel plan (tests/support/parallel.py), run for real: an inner
pytest on two xdist workers (``--dist loadgroup``, as tools/run_tests.sh runs it) over
made-up tests records which worker ran each test and when.

- the tests using the Spark session share one worker (one Spark JVM per run);
- the tests of a module with a module-scoped fixture share one worker (it starts once);
- the longest units start first, and the unit queued behind each worker's first is short.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CONFTEST = '''
import json, os, time
from pathlib import Path
import pytest
from tests.support import parallel

KNOWN = json.loads(os.environ["PLAN_KNOWN"])

@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    parallel.plan(items, parallel.worker_count(config), known=KNOWN)

@pytest.fixture(scope="session")
def spark_session():
    return "spark"

@pytest.fixture(autouse=True)
def _record(request):
    out = Path(os.environ["PLAN_OUT"]) / f"{os.getpid()}-{time.monotonic_ns()}.json"
    out.write_text(json.dumps({"test": request.node.name,
                               "worker": os.environ.get("PYTEST_XDIST_WORKER", "none"),
                               "at": time.time()}))
    yield
'''

SPARK_TESTS = '''
def test_spark_a(spark_session): pass
def test_spark_b(spark_session): pass
def test_spark_c(spark_session): pass
'''

SHARED_MODULE = '''
import pytest

@pytest.fixture(scope="module")
def network():
    return object()

def test_shared_a(network): pass
def test_shared_b(network): pass
def test_shared_c(network): pass
'''

OTHERS = '''
import time
import pytest

@pytest.mark.parametrize("n", range(12))
def test_short(n): pass

def test_long_one(): time.sleep(1.0)
def test_long_two(): time.sleep(1.0)
'''


def test_spark_and_module_fixture_tests_share_a_worker_and_long_ones_start_first(
    tmp_path: Path,
) -> None:
    inner = tmp_path / "inner"
    inner.mkdir()
    (inner / "conftest.py").write_text(CONFTEST)
    (inner / "test_spark_use.py").write_text(SPARK_TESTS)
    (inner / "test_shared_fixture.py").write_text(SHARED_MODULE)
    (inner / "test_others.py").write_text(OTHERS)
    out = tmp_path / "out"
    out.mkdir()
    known = {
        "test_others.py::test_long_one": 30.0,
        "test_others.py::test_long_two": 20.0,
        "test_shared_fixture.py::test_shared_a": 1.0,
    }
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "PLAN_OUT": str(out),
        "PLAN_KNOWN": json.dumps(known),
    }
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-n", "2",
         "--dist", "loadgroup", "--no-loadscope-reorder", "-o", "markers=spark", str(inner)],
        capture_output=True, text=True, env=env, cwd=inner, timeout=300, check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    runs = sorted((json.loads(p.read_text()) for p in out.iterdir()), key=lambda r: r["at"])
    worker = {r["test"]: r["worker"] for r in runs}
    assert len(worker) == 20, worker
    assert len({worker[f"test_spark_{x}"] for x in "abc"}) == 1, worker
    assert len({worker[f"test_shared_{x}"] for x in "abc"}) == 1, worker
    # The two long ones start at once, one on each worker; each worker's next is short.
    first = {w: [r["test"] for r in runs if r["worker"] == w][:2] for w in ("gw0", "gw1")}
    assert {tests[0] for tests in first.values()} == {"test_long_one", "test_long_two"}, first
    assert all(tests[1].startswith("test_short") for tests in first.values()), first
