"""``mqgw qm`` against a running ``mqgw run`` process and on its stopped data directory.

Proves, in both states (the module runs every test twice: stopped, then running): each
sub-command works and says with ``-v`` which way it went; ``mqsc`` shows CURDEPTH,
QSTATUS, CHSTATUS, the broker's subscriptions (SUB) and neighbours (PUBSUB); ``put`` and
``get`` move lines of text; ``browse`` prints the MQMD and every header of a dead-letter
message (MQDLH fields, the MQRFH2 folders inside) and leaves it there; ``mqgw mqsc`` no
longer fails with AMQ8118E on ``mqgw run``'s layout; ``mqgw --version``. The stopped
state starts from a SIGKILLed gateway, so a stale socket is left behind and must not
confuse the commands.
"""

from __future__ import annotations

import asyncio
import os
import pwd
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from gateway import __version__
from gateway.devstack.ports import free_port
from gateway.mq.embedded.admin import open_admin
from gateway.mq.embedded.qm_protocol import SOCKET_NAME
from gateway.mq.embedded.qmgr import EmbeddedQueueManager
from gateway.mq.port import PutOptions
from gateway.wire.dlh import wrap_for_dlq
from gateway.wire.formats import FMT_RF_HEADER_2, FMT_STRING
from gateway.wire.mqmd import MQMD
from gateway.wire.rfh2 import MQRFH2, encode_rfh2

PYTHON = sys.executable
ROOT = Path(__file__).resolve().parents[2]
DLQ = "SYSTEM.DEAD.LETTER.QUEUE"


class Gateway:
    """One gateway directory; ``ensure(mode)`` starts or stops its ``mqgw run``."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.port = free_port()
        self.config = root / "gateway.yaml"
        (root / "queues.mqsc").write_text(
            "DEFINE QLOCAL(SUB.Q) REPLACE\nDEFINE QLOCAL(CLI.STOPPED) REPLACE\n"
            "DEFINE QLOCAL(CLI.RUNNING) REPLACE\n")
        self.config.write_text(f"""
id: gw-qm-cli
queue_manager:
  data_dir: qm
  mqsc_file: queues.mqsc
broker:
  store: pubsub.db
  streams: [{{name: STOCK.STREAM}}]
metrics: {{port: {self.port}}}
logging: {{format: json, level: info}}
plugins:
  - name: mem
    plugin: memory
    config:
      subscribe: ["$SYS/STREAM/STOCK.STREAM/prices/#"]
""")
        self.proc: subprocess.Popen[bytes] | None = None
        self.log = root / "gateway.log"

    @property
    def data_dir(self) -> Path:
        return self.root / "qm"

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [PYTHON, "-m", "gateway.runtime.cli", "run", "--config", str(self.config)],
            stdout=subprocess.DEVNULL, stderr=self.log.open("ab"), cwd=self.root,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, self.log.read_text()[-3000:]
            try:
                url = f"http://127.0.0.1:{self.port}/healthz"
                with urllib.request.urlopen(url, timeout=2) as r:
                    if r.status == 200 and (self.data_dir / SOCKET_NAME).exists():
                        return
            except OSError:
                pass
            time.sleep(0.05)
        raise AssertionError("gateway did not become healthy: " + self.log.read_text()[-3000:])

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc is None:
            return
        self.proc.send_signal(sig)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.proc = None

    def ensure(self, mode: str) -> None:
        if mode == "running" and self.proc is None:
            self.start()
        elif mode == "stopped" and self.proc is not None:
            self.stop()


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    gw = Gateway(tmp_path_factory.mktemp("qmcli"))
    gw.start()  # creates the data directory and the broker's subscription
    gw.stop(signal.SIGKILL)  # ... and leaves a stale socket behind
    assert (gw.data_dir / SOCKET_NAME).exists()
    try:
        yield gw
    finally:
        gw.stop()


@pytest.fixture(scope="module", params=["stopped", "running"])
def mode(request: pytest.FixtureRequest, gateway: Gateway) -> str:
    gateway.ensure(request.param)
    return str(request.param)


def mqgw(where: Gateway | Path, *args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    cwd = where.root if isinstance(where, Gateway) else where
    return subprocess.run(
        [PYTHON, "-m", "gateway.runtime.cli", *args], input=stdin, capture_output=True,
        text=True, timeout=60, cwd=cwd, env={**os.environ, "PYTHONPATH": str(ROOT)},
    )


def _how(mode: str) -> str:
    return "is running: connected through" if mode == "running" else "is not running: opened"


def test_mqsc_displays_depth_status_subscriptions(gateway: Gateway, mode: str) -> None:
    q = f"CLI.{mode.upper()}"
    script = (f"DEFINE QLOCAL({q}) REPLACE\nDISPLAY QLOCAL({q}) CURDEPTH\n"
              "DISPLAY QSTATUS(SUB.Q)\nDISPLAY SUB(*)\n")
    r = mqgw(gateway, "qm", "mqsc", "-v", "-c", str(gateway.config), stdin=script)
    assert r.returncode == 0, r.stdout + r.stderr
    assert _how(mode) in r.stderr
    assert "Starting MQSC for queue manager QM1." in r.stdout
    assert f"QUEUE({q})" in r.stdout and "CURDEPTH(0)" in r.stdout
    assert "AMQ8450I: Display queue status details." in r.stdout
    assert "TOPICSTR(prices/#)" in r.stdout and "STREAM(STOCK.STREAM)" in r.stdout
    assert "All valid MQSC commands were processed." in r.stdout
    # a script file; no channels run and no neighbours are joined: MQ's "not found"
    (gateway.root / "status.mqsc").write_text("DISPLAY CHSTATUS(*)\nDISPLAY PUBSUB\n")
    r = mqgw(gateway, "qm", "mqsc", "-c", str(gateway.config), "status.mqsc")
    assert r.returncode == 10, r.stdout + r.stderr
    assert "AMQ8420I: Channel Status not found." in r.stdout
    assert "AMQ8147E: IBM MQ object * not found." in r.stdout


def test_put_then_get(gateway: Gateway, mode: str) -> None:
    q = f"CLI.{mode.upper()}"
    r = mqgw(gateway, "qm", "put", "-v", "--data-dir", str(gateway.data_dir), q,
             stdin="first line\nsecond line\n")
    assert r.returncode == 0, r.stderr
    assert "2 message(s) put" in r.stdout and _how(mode) in r.stderr
    r = mqgw(gateway, "qm", "browse", "-c", str(gateway.config), q)
    assert f"UserIdentifier : '{pwd.getpwuid(os.getuid()).pw_name[:12]}'" in r.stdout
    assert "PutApplName : 'mqgw qm put'" in r.stdout
    r = mqgw(gateway, "qm", "get", "-v", "-c", str(gateway.config), q, "--wait", "0.2")
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[1:] == ["message <first line>", "message <second line>",
                                         "no more messages"]
    assert _how(mode) in r.stderr


async def _dead_letter(data_dir: Path, dest_q: str = "NO.SUCH.Q",
                       body: bytes = b"undeliverable tick") -> None:
    rfh2 = MQRFH2(format=FMT_STRING, coded_char_set_id=1208)
    rfh2.add_folder("usr", {"Colour": "Blue"})
    md = MQMD(format=FMT_RF_HEADER_2, coded_char_set_id=1208, persistence=1)
    dl_md, dl_body = wrap_for_dlq(md, encode_rfh2(rfh2) + body, 2085,
                                  dest_q, "QM1", "test_qm_cli")
    session = await open_admin(data_dir)
    try:
        await session.conn.put1(DLQ, dl_md, dl_body, PutOptions(set_all_context=True))
    finally:
        await session.close()


def test_browse_decodes_a_dead_letter(gateway: Gateway, mode: str) -> None:
    asyncio.run(_dead_letter(gateway.data_dir))
    r = mqgw(gateway, "qm", "browse", "-v", "-c", str(gateway.config), DLQ)
    assert r.returncode == 0, r.stderr
    assert _how(mode) in r.stderr
    out = r.stdout
    assert "****Message descriptor****" in out and "Format : 'MQDEAD'" in out
    assert "****MQDLH at offset 0****" in out
    assert "Reason : 2085" in out and "DestQName : 'NO.SUCH.Q'" in out
    assert "DestQMgrName : 'QM1'" in out and "PutApplName : 'test_qm_cli'" in out
    assert "****MQRFH2 at offset 172****" in out
    assert "Folder usr: <usr><Colour>Blue</Colour></usr>" in out
    assert "'undeliverable ti'" in out  # the payload's hex+text lines
    assert "No more messages (1 browsed)" in out
    # browse left it there; get removes it
    r = mqgw(gateway, "qm", "get", "-c", str(gateway.config), DLQ)
    assert "undeliverable tick" in r.stdout and "no more messages" in r.stdout


def test_dlq_handler_retries_to_a_queue_that_now_exists_and_discards_by_rule(
    gateway: Gateway, mode: str
) -> None:
    """The issue's acceptance case: a runmqdlq rules table retries a message whose queue
    has been defined since it was dead-lettered, and discards one its DESTQ rule names."""
    target = f"LATE.{mode.upper()}"
    asyncio.run(_dead_letter(gateway.data_dir, target, b"retry me"))
    asyncio.run(_dead_letter(gateway.data_dir, "TEST.JUNK", b"throw me away"))
    rules = gateway.root / "rules.dlq"
    rules.write_text(
        "* runmqdlq syntax\n"
        "INPUTQ(' ') RETRYINT(1) WAIT(NO)\n"
        "DESTQ(TEST.*) ACTION(DISCARD)\n"
        "REASON(MQRC_UNKNOWN_OBJECT_NAME) ACTION(RETRY) RETRY(3)\n")
    r = mqgw(gateway, "qm", "mqsc", "-c", str(gateway.config),
             stdin=f"DEFINE QLOCAL({target}) REPLACE\n")
    assert r.returncode == 0, r.stdout + r.stderr
    # a dry run says what it would do and changes nothing
    r = mqgw(gateway, "qm", "dlq", "-c", str(gateway.config), "--rules", str(rules),
             "--dry-run")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "RETRY" in r.stdout and "DISCARD" in r.stdout
    r = mqgw(gateway, "qm", "browse", "-c", str(gateway.config), DLQ)
    assert "No more messages (2 browsed)" in r.stdout
    # the real run: one pass
    r = mqgw(gateway, "qm", "dlq", "-v", "-c", str(gateway.config), "--rules", str(rules),
             "--once")
    assert r.returncode == 0, r.stdout + r.stderr
    assert _how(mode) in r.stderr
    assert "retried 1" in r.stdout and "discarded 1" in r.stdout and "failed 0" in r.stdout
    r = mqgw(gateway, "qm", "browse", "-c", str(gateway.config), DLQ)
    assert "No more messages (0 browsed)" in r.stdout
    # the retried message arrived without its MQDLH, its RFH2 and payload intact
    r = mqgw(gateway, "qm", "browse", "-c", str(gateway.config), target)
    assert "No more messages (1 browsed)" in r.stdout
    assert "Format : 'MQHRF2'" in r.stdout and "MQDLH" not in r.stdout
    assert "Folder usr: <usr><Colour>Blue</Colour></usr>" in r.stdout
    assert "'retry me'" in r.stdout


def test_dlq_handler_refuses_a_bad_rules_table(gateway: Gateway, mode: str) -> None:
    rules = gateway.root / "bad.dlq"
    rules.write_text("REASON(MQRC_UNKNOWN_OBJECT_NAME) ACTION(RETRY)\nACTION(EXPLODE)\n")
    r = mqgw(gateway, "qm", "dlq", "-c", str(gateway.config), "--rules", str(rules), "--once")
    assert r.returncode == 2
    assert "line 2" in r.stderr and "Traceback" not in r.stderr


def test_mqgw_mqsc_on_the_run_layout(gateway: Gateway, mode: str) -> None:
    r = mqgw(gateway, "mqsc", "QM1", "--data-dir", str(gateway.data_dir),
             stdin="DISPLAY QLOCAL(SUB.Q) CURDEPTH\n")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "AMQ8118E" not in r.stderr and "QUEUE(SUB.Q)" in r.stdout
    r = mqgw(gateway, "mqsc", "QM9", "--data-dir", str(gateway.data_dir), stdin="DIS QMGR\n")
    assert r.returncode == 20 and "AMQ8118E" in r.stderr


def test_unreachable_data_directory(tmp_path: Path) -> None:
    r = mqgw(tmp_path, "qm", "get", "--data-dir", str(tmp_path / "nowhere"), "Q")
    assert r.returncode == 2 and "no queue manager in" in r.stderr


def test_version(tmp_path: Path) -> None:
    r = mqgw(tmp_path, "--version")
    assert r.returncode == 0 and r.stdout.strip() == f"mqgw {__version__}"


async def _fill(data_dir: Path) -> None:
    qm = EmbeddedQueueManager("QMB", data_dir)
    qm.run_mqsc("DEFINE QLOCAL(KEEP.Q)\n")
    try:
        conn = await qm.connect()
        for i in range(3):
            await conn.put1("KEEP.Q", MQMD(format=FMT_STRING, persistence=1), f"kept {i}".encode())
        await conn.put1("KEEP.Q", MQMD(format=FMT_STRING, persistence=0), b"not on disk")
    finally:
        await qm.close()


def test_cold_backup_restores(tmp_path: Path) -> None:
    """docs/operations.md's procedure: copy the stopped data directory, restore the copy
    elsewhere, read it with mqgw qm: the persistent messages are all there."""
    live = tmp_path / "live" / "qm"
    asyncio.run(_fill(live))
    backup = tmp_path / "backup.tar"
    shutil.make_archive(str(backup.with_suffix("")), "tar", live.parent)
    restored = tmp_path / "restored"
    shutil.unpack_archive(backup, restored)
    r = mqgw(tmp_path, "qm", "get", "-v", "--data-dir", str(restored / "qm"), "KEEP.Q")
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[1:] == ["message <kept 0>", "message <kept 1>",
                                         "message <kept 2>", "no more messages"]
    assert "queue manager QMB is not running: opened" in r.stderr
