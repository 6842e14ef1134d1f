"""The Spark ohlc job, run once as its own process (``mqgw analytics ohlc --once``).

Why a process: gateway/ never imports analytics, and Spark's JVM must not outlive the
demo; the job runs in its own process group, which is stopped as a whole.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path


@dataclass
class JobRun:
    """One ``mqgw analytics ohlc --once`` process: outcome, wall time, log."""

    argv: list[str]
    log_path: Path
    pgid: int = 0
    returncode: int | None = None
    seconds: float = 0.0


def mqgw_command() -> list[str]:
    """``mqgw`` next to this interpreter (the venv's), else ``python -m`` the CLI."""
    script = Path(sys.executable).with_name("mqgw")
    if script.is_file() and os.access(script, os.X_OK):
        return [str(script)]
    return [sys.executable, "-m", "gateway.runtime.cli"]


def _kill_group(pgid: int) -> None:
    """Stop the job: SIGTERM to ``mqgw`` (it stops its queries and cleans up), then
    SIGTERM and SIGKILL to its whole process group (Spark's JVM is in it)."""
    steps = ((os.kill, signal.SIGTERM, 15.0), (os.killpg, signal.SIGTERM, 5.0),
             (os.killpg, signal.SIGKILL, 5.0))
    for send, sig, wait_s in steps:
        try:
            send(pgid, sig)
        except ProcessLookupError:
            if not _group_alive(pgid):
                return
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            if not _group_alive(pgid):
                return
            time.sleep(0.1)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


async def run_ohlc_job(bootstrap: str, work: Path, timeout: float, job: JobRun) -> JobRun:
    """Run the ohlc job once as a process (gateway/ never imports analytics), echoing its
    progress lines; Spark's own log goes to ``job.log_path``. Killed on timeout/cancel.

    Its JVM's temporary files go under ``work`` (``java.io.tmpdir``), not /tmp.
    """
    started = time.monotonic()
    tmp = work / "tmp"
    tmp.mkdir(exist_ok=True)
    env = dict(os.environ)
    env["JAVA_TOOL_OPTIONS"] = (env.get("JAVA_TOOL_OPTIONS", "")
                                + f" -Djava.io.tmpdir={tmp}").strip()
    env["TMPDIR"] = str(tmp)
    with job.log_path.open("wb") as log_file:
        proc = await asyncio.create_subprocess_exec(
            *job.argv,
            stdout=asyncio.subprocess.PIPE,
            stderr=log_file,
            stdin=asyncio.subprocess.DEVNULL,
            cwd=work,
            env=env,
            start_new_session=True,
        )
        job.pgid = proc.pid
        assert proc.stdout is not None
        try:
            async with asyncio.timeout(timeout):
                async for raw in proc.stdout:
                    line = raw.decode(errors="replace").rstrip()
                    log_file.write(raw)
                    log_file.flush()
                    if line:
                        print(f"    spark | {line}", flush=True)
                job.returncode = await proc.wait()
        except (TimeoutError, asyncio.CancelledError) as exc:
            await asyncio.to_thread(_kill_group, proc.pid)
            await proc.wait()
            if isinstance(exc, asyncio.CancelledError):
                raise
            print(f"    spark | no result after {timeout:.0f} s: stopped")
        finally:
            job.seconds = time.monotonic() - started
        if _group_alive(proc.pid):  # a JVM that outlived its driver
            await asyncio.to_thread(_kill_group, proc.pid)
    return job


def log_tail(path: Path, lines: int = 25) -> str:
    """The last ``lines`` lines of a log file; "" when it cannot be read."""
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    return "\n".join(text[-lines:])
