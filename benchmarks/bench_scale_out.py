"""Scale-out (issue 31): the same workload on 1 gateway, then on 2 (and 4) owning a share each.

The workload: 2 streams, N persistent 1 KiB MQRFH2 publications each, every one
delivered to Kafka (acks=all) and to MQTT (QoS 1) by the sinks of the stream's owner.
Configurations, each a set of ``mqgw run`` processes as an operator runs them
(docs/scaling.md; examples/scale-out is the 2-gateway one with its ports):

* **1 gateway** owning both streams (a Kafka and an MQTT sink instance, each
  subscribed to both streams);
* **2 gateways**, GW1 owning S1 and GW2 owning S2, joined as ``kind: gateway``
  neighbours over a channel pair, each servicing both stream queues (the one it does
  not own receives what the owner forwards to its own MQ subscribers: none here) with
  a Kafka and an MQTT sink instance for its own stream;
* **4 gateways** on the same 2 cores (info): the same total publications over 4
  streams, one per gateway, GW1 the others' neighbour.

Publishers are processes of their own (benchmarks/scale_out_publisher.py), one per
stream, putting to ``<stream>.PUBLISH`` (an alias of the stream queue at its owner)
through the owner's local socket, so a gateway's CPU is its own work. All publishers
start together (t0); the run ends when every gateway's ``/metrics`` counts every
publication acknowledged by each of its sinks (``mqgw_messages_out``, polled every
0.25 s). Printed per run: publications per second, and the CPU seconds each process
took in that window (/proc: the gateways, Kafka's JVM, Mosquitto; the publishers
report their own), so where the two cores went is visible.

The raw baseline, in the same run: the same publisher processes putting the same
messages to a local queue nobody reads (``BENCH.RAW``) on the 2 running gateways: the
rate MQ takes them in without a broker. Then the summary rows: 2 gateways vs 1 (goal
>= 1.6x) and 4 gateways vs 1 (info).

Run: .venv/bin/python -m benchmarks.bench_scale_out [--messages N] [--repeat R] [--quick]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from benchmarks.summary import Row, record
from gateway.devstack import KafkaBroker, MosquittoBroker
from gateway.devstack.ports import free_ports
from gateway.runtime.cli import main as mqgw_main

#: Bound of one configuration's delivery (start-up not included).
TIME_LIMIT_S = 300.0
#: Bound of a configuration's start-up: processes, plugins, neighbours.
START_LIMIT_S = 120.0
CLK_TCK = os.sysconf("SC_CLK_TCK")
ROOT = Path(__file__).resolve().parents[1]


@dataclass
class Node:
    """One gateway of a configuration."""

    name: str
    owns: list[str]
    neighbours: list[str]
    port: int
    metrics_port: int
    root: Path
    proc: subprocess.Popen[bytes] | None = None

    @property
    def dir(self) -> Path:
        return self.root / self.name.lower()

    @property
    def log(self) -> Path:
        return self.dir / "gateway.log"


@dataclass
class RunResult:
    gateways: int
    publications: int
    seconds: float
    cpu: dict[str, float] = field(default_factory=dict)

    @property
    def rate(self) -> float:
        return self.publications / self.seconds


def streams_of(count: int) -> list[str]:
    return [f"S{i + 1}.STREAM" for i in range(count)]


def node_mqsc(node: Node, streams: list[str], depth: int) -> str:
    """Stream queues deep enough for the whole run, the publishers' alias for each
    owned stream, a raw queue, and a channel pair per neighbour."""
    lines = [f"DEFINE QLOCAL({s}) DEFPSIST(YES) MAXDEPTH({depth}) REPLACE" for s in streams]
    lines += [f"DEFINE QALIAS({s.removesuffix('.STREAM')}.PUBLISH) TARGET({s}) REPLACE"
              for s in node.owns]
    lines.append(f"DEFINE QLOCAL(BENCH.RAW) DEFPSIST(YES) MAXDEPTH({depth}) REPLACE")
    for other in node.neighbours:
        lines += [
            f"DEFINE QLOCAL({other}) USAGE(XMITQ) DEFPSIST(YES) REPLACE",
            f"DEFINE CHANNEL({node.name}.TO.{other}) CHLTYPE(SDR) CONNAME('{other}') "
            f"XMITQ({other}) REPLACE",
            f"DEFINE CHANNEL({other}.TO.{node.name}) CHLTYPE(RCVR) REPLACE",
        ]
    return "\n".join(lines) + "\n"


def node_config(node: Node, nodes: dict[str, Node], streams: list[str], batch: int,
                kafka: str, mqtt: tuple[str, int], run: str) -> dict[str, Any]:
    config: dict[str, Any] = {
        "id": f"bench-{run}-{node.name.lower()}",
        "queue_manager": {
            "name": node.name, "data_dir": "qm", "mqsc_file": "node.mqsc",
            "listener_port": node.port,
            "address_book": {n: f"127.0.0.1:{nodes[n].port}" for n in node.neighbours},
        },
        "broker": {"store": "pubsub.db", "batch_size": batch,
                   "streams": [{"name": s} for s in streams]},
        "neighbours": [{"q_mgr": n, "kind": "gateway", "streams": streams,
                        "probe_timeout": 2.0} for n in node.neighbours],
        "metrics": {"port": node.metrics_port},
        "logging": {"format": "text", "level": "warning"},
        "plugins": [
            {"name": "kafka", "plugin": "kafka", "config": {
                "bootstrap_servers": kafka,
                "outbound": {"topic_template": f"bench-{run}.{{stream}}",
                             "routes": [{"stream": s, "topic": "#"} for s in node.owns]}}},
            {"name": "mqtt", "plugin": "mqtt", "config": {
                "host": mqtt[0], "port": mqtt[1],
                "outbound": {"prefix": f"bench-{run}",
                             "topics": [f"$SYS/STREAM/{s}/#" for s in node.owns]}}},
        ],
    }
    return config


def plan(gateways: int, stream_count: int, root: Path) -> dict[str, Node]:
    """``gateways`` nodes, streams dealt round robin, GW1 every other node's neighbour."""
    names = [f"GW{i + 1}" for i in range(gateways)]
    ports = free_ports(2 * gateways)
    streams = streams_of(stream_count)
    nodes = {}
    for i, name in enumerate(names):
        neighbours = ([n for n in names if n != name] if name == "GW1"
                      else ["GW1"] if gateways > 1 else [])
        nodes[name] = Node(name, streams[i::gateways], neighbours, ports[2 * i],
                           ports[2 * i + 1], root)
    return nodes


# ------------------------------------------------------------- process helpers -----


def proc_cpu(pid: int) -> float:
    """CPU seconds (user + system) ``pid`` has used, from /proc (0 once it is gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0.0
    fields = stat[stat.rindex(")") + 2:].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        return str(resp.read().decode())


_OUT = re.compile(r'^mqgw_messages_out_total\{([^}]*)\} ([0-9.e+]+)$', re.M)
_UP = re.compile(r'^mqgw_plugin_up\{plugin="([^"]*)"\} ([0-9.]+)$', re.M)


def delivered(port: int) -> float:
    """Publications the gateway's sinks acknowledged, summed over sinks and streams."""
    return sum(float(v) for _labels, v in _OUT.findall(scrape(port)))


def plugins_up(port: int) -> bool:
    ups = _UP.findall(scrape(port))
    return len(ups) == 2 and all(float(v) == 1.0 for _n, v in ups)


def neighbours_active(node: Node) -> bool:
    if not node.neighbours:
        return True
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        mqgw_main(["neighbours", "list", "--json", "--data-dir", str(node.dir)])
    states = {json.loads(ln)["q_mgr"]: json.loads(ln)["state"]
              for ln in buf.getvalue().splitlines() if ln.strip()}
    return all(states.get(n) == "active" for n in node.neighbours)


def wait_for(what: str, predicate: Any, nodes: dict[str, Node], limit: float) -> None:
    deadline = time.monotonic() + limit
    while True:
        for node in nodes.values():
            if node.proc is not None and node.proc.poll() is not None:
                raise RuntimeError(f"{node.name} exited:\n{node.log.read_text()[-3000:]}")
        try:
            if predicate():
                return
        except OSError:
            pass  # /metrics not up yet
        if time.monotonic() > deadline:
            tails = "\n".join(f"== {n.name}\n{n.log.read_text()[-2000:]}" for n in nodes.values())
            raise RuntimeError(f"{what} not within {limit:.0f} s\n{tails}")
        time.sleep(0.25)


def start_nodes(nodes: dict[str, Node], streams: list[str], batch: int, depth: int,
                kafka: str, mqtt: MosquittoBroker, run: str) -> None:
    for node in nodes.values():
        node.dir.mkdir(parents=True)
        (node.dir / "node.mqsc").write_text(node_mqsc(node, streams, depth))
        config = node_config(node, nodes, streams, batch, kafka, (mqtt.host, mqtt.port), run)
        (node.dir / "gateway.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
        with node.log.open("ab") as log:
            node.proc = subprocess.Popen(
                [sys.executable, "-m", "gateway.runtime.cli", "run", "--config",
                 str(node.dir / "gateway.yaml")],
                cwd=node.dir, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
    wait_for("every gateway's plugins up",
             lambda: all(plugins_up(n.metrics_port) for n in nodes.values()), nodes,
             START_LIMIT_S)
    wait_for("every neighbour active",
             lambda: all(neighbours_active(n) for n in nodes.values()), nodes, START_LIMIT_S)


def stop_nodes(nodes: dict[str, Node]) -> None:
    for node in nodes.values():
        if node.proc is not None and node.proc.poll() is None:
            node.proc.terminate()
    for node in nodes.values():
        if node.proc is not None:
            try:
                node.proc.wait(timeout=40)
            except subprocess.TimeoutExpired:
                node.proc.kill()
                node.proc.wait()


@dataclass
class Publishers:
    """One publisher process per (node, queue, stream), started together."""

    procs: list[subprocess.Popen[str]]

    @classmethod
    def spawn(cls, jobs: list[tuple[Node, str, str]], count: int) -> Publishers:
        procs = [subprocess.Popen(
            [sys.executable, "-m", "benchmarks.scale_out_publisher", "--qm-dir",
             str(node.dir / "qm"), "--queue", queue, "--stream", stream,
             "--count", str(count)],
            cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
            for node, queue, stream in jobs]
        for p in procs:
            assert p.stdout is not None
            line = p.stdout.readline()
            if line.strip() != "READY":
                raise RuntimeError(f"publisher did not start: {line!r}")
        return cls(procs)

    def go(self) -> None:
        for p in self.procs:
            assert p.stdin is not None
            p.stdin.write("GO\n")
            p.stdin.flush()

    def results(self) -> list[dict[str, float]]:
        out = []
        for p in self.procs:
            assert p.stdout is not None
            line = p.stdout.readline()
            if p.wait(timeout=TIME_LIMIT_S) != 0 or not line.strip():
                raise RuntimeError(f"publisher failed (exit {p.returncode})")
            out.append(json.loads(line))
        return out


def services_cpu(kafka: KafkaBroker, mqtt: MosquittoBroker) -> dict[str, float]:
    out = {}
    for name, svc in (("kafka", kafka), ("mosquitto", mqtt)):
        if svc.process is not None:
            out[name] = proc_cpu(svc.process.pid)
    return out


def run_config(gateways: int, stream_count: int, per_stream: int, batch: int, work: Path,
               kafka: KafkaBroker, mqtt: MosquittoBroker, tag: str) -> RunResult:
    """One configuration, started, measured and stopped."""
    run = f"{tag}-{gateways}gw-{os.getpid()}-{int(time.time())}"
    root = work / run
    nodes = plan(gateways, stream_count, root)
    streams = streams_of(stream_count)
    try:
        start_nodes(nodes, streams, batch, per_stream + 1000, kafka.bootstrap, mqtt, run)
        jobs = [(node, s.removesuffix(".STREAM") + ".PUBLISH", s)
                for node in nodes.values() for s in node.owns]
        publishers = Publishers.spawn(jobs, per_stream)
        expected = {n.name: 2 * per_stream * len(n.owns) for n in nodes.values()}
        before = {n.name: proc_cpu(n.proc.pid) for n in nodes.values() if n.proc}
        svc0 = services_cpu(kafka, mqtt)
        t0 = time.perf_counter()
        publishers.go()
        wait_for("every publication delivered to both sinks",
                 lambda: all(delivered(n.metrics_port) >= expected[n.name]
                             for n in nodes.values()), nodes, TIME_LIMIT_S)
        took = time.perf_counter() - t0
        cpu = {n.name: proc_cpu(n.proc.pid) - before[n.name]
               for n in nodes.values() if n.proc}
        cpu.update({k: v - svc0[k] for k, v in services_cpu(kafka, mqtt).items()})
        pubs = publishers.results()
        cpu["publishers"] = sum(p["cpu"] for p in pubs)
        put_s = max(p["seconds"] for p in pubs)
        over = {n.name: delivered(n.metrics_port) - expected[n.name] for n in nodes.values()}
        if any(over.values()):
            raise RuntimeError(f"sinks acknowledged more than published: {over}")
        result = RunResult(gateways, per_stream * stream_count, took, cpu)
        print(f"  {gateways} gateway(s), {stream_count} streams: {result.publications:,} "
              f"publications in {took:.2f} s = {result.rate:,.0f} msg/s (each to Kafka and "
              f"MQTT); publishers done after {put_s:.2f} s", flush=True)
        cores = os.cpu_count() or 1
        print("    CPU s: " + ", ".join(f"{k} {v:.1f}" for k, v in cpu.items())
              + f"; total {sum(cpu.values()):.1f} of {cores} cores x {took:.1f} s = "
              f"{sum(cpu.values()) / (cores * took):.0%} busy (our processes)", flush=True)
        print("    CPU ms per 1,000 publications: " + ", ".join(
            f"{k} {v / result.publications * 1e6:.0f}" for k, v in cpu.items()), flush=True)
        return result
    finally:
        stop_nodes(nodes)


def raw_baseline(per_stream: int, work: Path, kafka: KafkaBroker, mqtt: MosquittoBroker,
                 ) -> tuple[float, float]:
    """(msg/s, publishers' CPU s): the publishers putting to BENCH.RAW, nobody reading,
    on 2 running gateways (the MQ side alone)."""
    run = f"raw-{os.getpid()}-{int(time.time())}"
    nodes = plan(2, 2, work / run)
    streams = streams_of(2)
    try:
        start_nodes(nodes, streams, 256, 2 * per_stream + 1000, kafka.bootstrap, mqtt, run)
        jobs = [(node, "BENCH.RAW", s) for node in nodes.values() for s in node.owns]
        publishers = Publishers.spawn(jobs, per_stream)
        t0 = time.perf_counter()
        publishers.go()
        pubs = publishers.results()
        took = time.perf_counter() - t0
        return 2 * per_stream / took, sum(p["cpu"] for p in pubs)
    finally:
        stop_nodes(nodes)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=20000,
                        help="publications per stream (2 streams)")
    parser.add_argument("--repeat", type=int, default=1, help="runs of each configuration")
    parser.add_argument("--batch-size", type=int, default=256, help="broker.batch_size")
    parser.add_argument("--no-four", action="store_true", help="skip the 4-gateway run")
    parser.add_argument("--quick", action="store_true",
                        help="a smoke run: 1,000 publications per stream (its ratio is noise: "
                        "about a second per configuration)")
    args = parser.parse_args(argv)
    n = 1000 if args.quick else args.messages
    print(f"2 streams x {n:,} persistent 1 KiB publications, MQ -> Kafka (acks=all) and "
          f"MQ -> MQTT (QoS 1); batch_size {args.batch_size}; {os.cpu_count()} CPUs; "
          f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
    with tempfile.TemporaryDirectory(prefix="mqgw-bench-scale-") as d:
        work = Path(d)
        with KafkaBroker(work / "kafka") as kafka, MosquittoBroker(work / "mosquitto") as mqtt:
            # JVM warm-up and topic creation paths: a small run first, not counted
            run_config(1, 2, min(n, 1000), args.batch_size, work, kafka, mqtt, "warmup")
            raw_rate, raw_cpu = raw_baseline(n, work, kafka, mqtt)
            print(f"  raw: publishers alone into a local queue on 2 gateways: "
                  f"{raw_rate:,.0f} msg/s (publishers' CPU {raw_cpu:.1f} s)", flush=True)
            rates: dict[int, list[float]] = {1: [], 2: [], 4: []}
            for r in range(args.repeat):
                rates[1].append(run_config(1, 2, n, args.batch_size, work, kafka, mqtt,
                                           f"r{r}").rate)
                rates[2].append(run_config(2, 2, n, args.batch_size, work, kafka, mqtt,
                                           f"r{r}").rate)
                if not args.no_four:
                    rates[4].append(run_config(4, 4, n // 2, args.batch_size, work, kafka,
                                               mqtt, f"r{r}").rate)
    one, two = statistics.median(rates[1]), statistics.median(rates[2])
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    per_run = ", ".join(f"{b / a:.2f}x" for a, b in zip(rates[1], rates[2], strict=True))
    print(f"scale-out: 1 gateway {one:,.0f} msg/s, 2 gateways {two:,.0f} msg/s = "
          f"{two / one:.2f}x (goal >= 1.6x; run by run {per_run}); raw publishers "
          f"{raw_rate:,.0f} msg/s; load average {load}", flush=True)
    quick = "; --quick: windows of about a second, a smoke run, not a measurement"
    record(Row("2 streams MQ -> Kafka + MQTT, 2 gateways", two, one, 1.6,
               note="vs 1 gateway owning both" + (quick if args.quick else "")))
    if rates[4]:
        four = statistics.median(rates[4])
        print(f"  4 gateways on {os.cpu_count()} cores: {four:,.0f} msg/s = {four / one:.2f}x "
              "of 1 gateway", flush=True)
        record(Row("4 streams MQ -> Kafka + MQTT, 4 gateways", four, one, None, kind="info",
                   note="vs 1 gateway owning 2 streams, same publications"
                   + (quick if args.quick else "")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
