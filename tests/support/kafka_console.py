"""Kafka's own console producer and consumer (the ``kafka-tools`` jar) as outside
clients of the gateway: records with headers in, records with headers and keys out."""

from __future__ import annotations

import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from gateway.devstack import console_tool_command


def console_produce(
    bootstrap: str, topic: str, records: Sequence[tuple[Mapping[str, str], str]]
) -> None:
    """Kafka's console producer: one record per (headers, value) (``parse.headers``)."""
    lines = "".join(",".join(f"{k}:{v}" for k, v in headers.items()) + "\t" + value + "\n"
                    for headers, value in records)
    proc = subprocess.run(
        console_tool_command("kafka-console-producer", "--bootstrap-server", bootstrap,
                             "--topic", topic, "--reader-property", "parse.headers=true"),
        input=lines.encode(), capture_output=True, timeout=90, check=False)
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")[-2000:]


@dataclass
class ConsoleRecord:
    headers: dict[str, str]
    key: str
    value: str


def console_records(bootstrap: str, topic: str, count: int, timeout_s: float
                    ) -> list[ConsoleRecord]:
    """Kafka's console consumer: up to ``count`` records of ``topic`` from the beginning,
    with headers and key, within ``timeout_s``."""
    proc = subprocess.run(
        console_tool_command(
            "kafka-console-consumer", "--bootstrap-server", bootstrap,
            "--topic", topic, "--from-beginning", "--max-messages", str(count),
            "--timeout-ms", str(int(timeout_s * 1000)),
            "--formatter-property", "print.headers=true",
            "--formatter-property", "print.key=true",
            "--formatter-property", "key.separator=|",
            "--formatter-property", "headers.separator=,",
            "--formatter-property", "headers.key.separator=:",
        ),
        capture_output=True, timeout=timeout_s + 60, check=False,
    )
    out = []
    for line in proc.stdout.decode(errors="replace").splitlines():
        if not line:
            continue
        headers, key, value = line.split("|", 2)
        pairs = (h.split(":", 1) for h in headers.split(",") if ":" in h)
        out.append(ConsoleRecord({k: v for k, v in pairs}, key, value))
    return out
