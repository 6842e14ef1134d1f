"""Every shell and YAML snippet of the getting-started pages (docs/getting-started/) works
as written, against the real Kafka and Mosquitto of the session fixtures.

* Each page's ``sh`` blocks are run, top to bottom, as ONE bash script (``set -euo
  pipefail``), in a sandbox laid out like the root of a clone: a copy of ``examples/``
  and the project's ``.venv``. The gateways the pages start are real ``mqgw run``
  processes, the clients ``mosquitto_pub``/``mosquitto_sub``/``mosquitto_rr`` and Kafka's
  own console tools. A line the sandbox cannot run as it stands is in ``NOT_RUN`` with
  what is checked instead; the test fails when such a line is no longer on any page.
* The environment gives the brokers' addresses exactly as ``mqgw devstack up`` prints
  them (``MQGW_KAFKA_BOOTSTRAP``, ``MQGW_MQTT_HOST``, ``MQGW_MQTT_PORT``: the fixtures run
  the same ``KafkaBroker`` and ``MosquittoBroker``), and free ports for the variables the
  example configurations read, so pages run side by side on xdist workers.
* Each ``text`` block (shown output) must appear in the script's output line for line,
  unless it abbreviates with ``…``.
* Each ``yaml`` block is the whole content of a file under ``examples/`` (found by its
  content), and that file passes ``mqgw run --check``.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from gateway.devstack import KafkaBroker, MosquittoBroker
from gateway.devstack.ports import free_ports
from gateway.runtime.cli import build_parser
from gateway.runtime.cli import main as mqgw_main

ROOT = Path(__file__).resolve().parents[2]
PAGES = ROOT / "docs" / "getting-started"
#: A page starts one or two gateways and a few JVM console tools: tens of seconds on a
#: busy 2-core machine; its own waits are bounded by `timeout 60` in the page.
SCRIPT_TIMEOUT_S = 300

FENCE = re.compile(r"^```(\w*)\n(.*?)^```\n", re.M | re.S)

#: Lines that are not run in the sandbox, and what is checked instead.
#:   "setup":    the suite already ran set-up; the Makefile must have the target.
#:   "devstack": the session fixtures are the brokers `mqgw devstack up` would start (the
#:               same classes); the command line must parse with mqgw's own parser.
#:   "parse":    Spark's start-up alone takes longer than this test's budget; the command
#:               line must parse (the job itself: tests/analytics/).
NOT_RUN = {
    "make setup": "setup",
    "export $(mqgw devstack up | grep '^MQGW_')": "devstack",
    "mqgw devstack status": "devstack",
    "mqgw devstack down": "devstack",
    'mqgw analytics traffic --bootstrap "$MQGW_KAFKA_BOOTSTRAP" --out var/analytics --once '
    "--console": "parse",
}

#: What each page's run must print (beyond its ``text`` blocks): the outcome its prose
#: promises, seen from outside the gateway.
EXPECTED = {
    "index.md": [],
    "mq-administrator.md": [
        "configuration OK: gateway mqgw-demo",
        "DEST(sink:kafka)",
        "STOCK.STREAM                     #                              TOPIC     sink:kafka",
        "all well",
        "Reason : 2334",
        "DestQName : 'STOCK.STREAM'",
    ],
    "developer.md": [
        'mq/STOCK.STREAM/IBM {"price": 102.0}',
        "MsgType : 1",
        "ReplyToQ : 'MQGW.REPLY'",
        "'IBM'",
    ],
    "data-engineer.md": [
        'mq.topic:IBM,',
        '\tIBM\t{"price": 101.5}',
        '\tACME\t{"price": 7.25}',
        "Processed a total of ",  # the page's two, and any an earlier page published
    ],
    "operator.md": [
        "GW2(child,active)",
        "GW1(parent,active)",
        "S1.STREAM                            GW1                      GW1: kafka, mqtt",
        "all well",
        "mqgw_neighbour_active",
    ],
}


def blocks(page: Path) -> list[tuple[str, str]]:
    return [(m.group(1), m.group(2)) for m in FENCE.finditer(page.read_text(encoding="utf-8"))]


def page_names() -> list[str]:
    return sorted(p.name for p in PAGES.glob("*.md"))


def test_every_page_is_covered() -> None:
    assert set(page_names()) == set(EXPECTED), "a getting-started page without expectations"
    lines = {line.strip() for p in PAGES.glob("*.md") for kind, body in blocks(p)
             if kind == "sh" for line in body.splitlines()}
    assert set(NOT_RUN) <= lines, f"NOT_RUN lines no page has: {set(NOT_RUN) - lines}"


def check_not_run(line: str) -> None:
    how = NOT_RUN[line]
    if how == "setup":
        assert re.search(r"(?m)^setup:", (ROOT / "Makefile").read_text(encoding="utf-8"))
        return
    argv = line.removeprefix("export $(").split("|")[0].replace('"', "").split()
    assert argv[0] == "mqgw", line
    args = [a.replace("$MQGW_KAFKA_BOOTSTRAP", "127.0.0.1:9092") for a in argv[1:]]
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        build_parser().parse_args(args)  # SystemExit(2) on anything it does not accept


def script_of(page: Path) -> str:
    lines = ["set -euo pipefail"]
    for kind, body in blocks(page):
        if kind != "sh":
            continue
        for line in body.splitlines():
            if line.strip() in NOT_RUN:
                check_not_run(line.strip())
                continue
            lines.append(line)
    return "\n".join(lines) + "\n"


def sandbox(tmp_path: Path) -> Path:
    """A directory laid out like the clone's root, as far as the pages use it."""
    root = tmp_path / "clone"
    root.mkdir()
    shutil.copytree(ROOT / "examples", root / "examples",
                    ignore=shutil.ignore_patterns("data", "__pycache__"))
    (root / ".venv").symlink_to(ROOT / ".venv")
    return root


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    """A fresh directory with a short path: the embedded queue manager's socket path
    (``<data_dir>/qm.sock``) must stay under 108 bytes, which pytest's own are not."""
    path = Path(tempfile.mkdtemp(prefix="mqgw-gs-"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.mark.slow
@pytest.mark.subprocess
@pytest.mark.kafka
@pytest.mark.mqtt
@pytest.mark.mosquitto_clients
@pytest.mark.parametrize("name", page_names())
def test_page_runs_as_written(
    name: str, short_tmp: Path, kafka_broker: KafkaBroker, mqtt_broker: MosquittoBroker
) -> None:
    page = PAGES / name
    script = script_of(page)
    root = sandbox(short_tmp)
    ports = free_ports(5)
    env = {
        **os.environ,
        "MQGW_KAFKA_BOOTSTRAP": kafka_broker.bootstrap,
        "MQGW_MQTT_HOST": mqtt_broker.host,
        "MQGW_MQTT_PORT": str(mqtt_broker.port),
        "MQGW_METRICS_PORT": str(ports[0]),
        "MQGW_GW1_PORT": str(ports[1]),
        "MQGW_GW2_PORT": str(ports[2]),
        "MQGW_GW1_METRICS_PORT": str(ports[3]),
        "MQGW_GW2_METRICS_PORT": str(ports[4]),
    }
    proc = subprocess.Popen(
        ["bash", "-c", script], cwd=root, env=env, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True, errors="replace", start_new_session=True,
    )
    try:
        out, _ = proc.communicate(timeout=SCRIPT_TIMEOUT_S)
    finally:
        # a failed step leaves the page's background gateways: end the whole group
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    logs = "".join(f"\n--- {p.name}\n{p.read_text(errors='replace')[-3000:]}"
                   for p in sorted(root.glob("*.log")))
    assert proc.returncode == 0, f"{name}: exit {proc.returncode}\n{out}{logs}"
    for expected in EXPECTED[name]:
        assert expected in out, f"{name}: {expected!r} not in the output\n{out}"
    for kind, body in blocks(page):
        if kind == "text" and "…" not in body:
            for line in body.splitlines():
                assert line in out.splitlines(), f"{name}: shown output {line!r} not printed\n{out}"


def yaml_snippets() -> list[tuple[str, int, str]]:
    """(page, index, body) of every YAML block of the getting-started pages."""
    return [
        (name, i, body)
        for name in page_names()
        for i, (kind, body) in enumerate(blocks(PAGES / name))
        if kind == "yaml"
    ]


def test_the_pages_show_yaml_to_check() -> None:
    """The check below has something to check (a page rewritten without its YAML
    would otherwise leave it passing on nothing)."""
    assert yaml_snippets(), "no YAML block in docs/getting-started/"


@pytest.mark.parametrize(("name", "index", "body"), yaml_snippets(),
                         ids=[f"{name}-{index}" for name, index, _ in yaml_snippets()])
def test_yaml_snippets_are_shipped_files_that_pass_the_check(
    name: str, index: int, body: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    shipped = {p.read_text(encoding="utf-8"): p for p in (ROOT / "examples").rglob("*.yaml")}
    assert body in shipped, f"{name}: YAML block {index} is not a file under examples/"
    copy = sandbox(tmp_path) / shipped[body].relative_to(ROOT)
    assert mqgw_main(["run", "--config", str(copy), "--check"]) == 0, capsys.readouterr()
    assert "configuration OK" in capsys.readouterr().out
