"""``mqgw devstack up|status|down``: real Kafka and Mosquitto on loopback, by hand.

``up`` starts both as detached processes in a fresh temporary directory and records
their pids in ``<state-dir>/state.json`` (default ``.devstack/``, or ``$MQGW_DEVSTACK_DIR``);
``down`` stops exactly those pids and removes the directory. The heavy modules are
imported inside the commands so ``mqgw --help`` stays fast.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gateway.devstack.certs import DevCertificates
    from gateway.devstack.kafka import SecureListeners
    from gateway.devstack.mosquitto import MosquittoOptions
    from gateway.devstack.state import ServiceStatus, StackState, StackStatus


def _default_state_dir() -> Path:
    return Path(os.environ.get("MQGW_DEVSTACK_DIR", ".devstack"))


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "devstack",
        help="start/stop a local Kafka broker and Mosquitto on 127.0.0.1",
        description=(
            "Run a single-node Kafka (KRaft) and a Mosquitto broker on free 127.0.0.1 ports, "
            "from the jars and packages `make setup` installed."
        ),
    )
    parser.add_argument(
        "--state-dir",
        type=Path,
        default=None,
        help="where the state file lives (default: $MQGW_DEVSTACK_DIR or ./.devstack)",
    )
    actions = parser.add_subparsers(dest="devstack_action", metavar="ACTION", required=True)

    up = actions.add_parser("up", help="start Kafka and Mosquitto (detached) and print addresses")
    up.add_argument(
        "--only", choices=("kafka", "mqtt"), default=None, help="start just one service"
    )
    up.add_argument("--kafka-heap", default="1g", help="Kafka JVM max heap (default 1g)")
    up.add_argument(
        "--secure",
        action="store_true",
        help="also start Kafka's TLS/SASL listeners (SSL, SASL_SSL, EXPIRED) and Mosquitto's "
        "TLS listeners (password, client certificate) with throw-away certificates and users "
        "(written to kafka-secure.txt and mqtt-secure.txt in the stack's directory)",
    )
    up.set_defaults(func=_up, exit_codes=(
        (0, "started (or already up): addresses printed"),
        (1, "a service did not start (logs kept) or the state file is unreadable"),
    ))

    status = actions.add_parser("status", help="show what `up` started and whether it answers")
    status.add_argument("--json", action="store_true", help="machine-readable output")
    status.set_defaults(func=_status, exit_codes=(
        (0, "every service runs and answers"),
        (1, "a service is dead or not answering, or the state file is unreadable"),
        (3, "not running (no state file)"),
    ))

    down = actions.add_parser("down", help="stop what `up` started (by pid) and clean up")
    down.add_argument(
        "--keep-logs", action="store_true", help="keep the temporary directory with the logs"
    )
    down.set_defaults(func=_down, exit_codes=(
        (0, "stopped (or nothing to stop)"),
        (1, "a process did not stop (state file kept) or the state file is unreadable"),
    ))


def _state_dir(args: argparse.Namespace) -> Path:
    given: Path | None = args.state_dir
    return given if given is not None else _default_state_dir()


def _probe(name: str, address: str) -> bool:
    host, _, port = address.rpartition(":")
    if name == "kafka":
        from gateway.devstack.kafka import metadata_brokers

        try:
            return bool(metadata_brokers(address, timeout=10.0))
        except Exception:  # any client failure means "not answering"
            return False
    from gateway.devstack.mosquitto import mqtt_handshake

    return mqtt_handshake(host, int(port))


def _print_env(services: dict[str, str]) -> None:
    if "kafka" in services:
        print(f"MQGW_KAFKA_BOOTSTRAP={services['kafka']}")
    if "mqtt" in services:
        host, _, port = services["mqtt"].rpartition(":")
        print(f"MQGW_MQTT_HOST={host}")
        print(f"MQGW_MQTT_PORT={port}")


def _secure_listeners(work_dir: Path) -> SecureListeners:
    """Throw-away certificates and users for ``up --secure`` (docs/security.md)."""
    import secrets

    from gateway.devstack.certs import make_dev_certificates
    from gateway.devstack.kafka import SecureListeners

    return SecureListeners(
        make_dev_certificates(work_dir / "certs"),
        plain_users={"mqgw": secrets.token_hex(12)},
        scram_users={"mqgw-scram": secrets.token_hex(12)},
    )


def _describe_secure(
    work_dir: Path, service: str, ports: dict[str, int], users: list[str],
    certs: DevCertificates,
) -> None:
    """Write a service's secured listeners, users and certificate paths to
    ``<service>-secure.txt`` (0600) in the stack's directory, and say where it is."""
    lines = [f"listener {name} 127.0.0.1:{port}" for name, port in ports.items()]
    lines += users
    lines += [f"ca_file {certs.ca_cert}", f"cert_file {certs.client_cert}",
              f"key_file {certs.client_key}"]
    path = work_dir / f"{service}-secure.txt"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    path.chmod(0o600)
    for name, port in ports.items():
        print(f"{service:<6} {name:<12} 127.0.0.1:{port}")
    print(f"{service:<6} TLS users and certificates: {path}")


def _secure_mosquitto(secure: SecureListeners | None) -> MosquittoOptions | None:
    """With ``--secure``: Mosquitto's TLS+password and TLS+client-certificate listeners
    (same certificates and PLAIN user as Kafka's), besides the anonymous one."""
    if secure is None:
        return None
    from gateway.devstack.mosquitto import MosquittoOptions, SecureListener

    c = secure.certificates
    return MosquittoOptions(
        listeners=(SecureListener("tls-password", c.server_cert, c.server_key, c.ca_cert),
                   SecureListener("tls-cert", c.server_cert, c.server_key, c.ca_cert,
                                  require_certificate=True)),
        users=dict(secure.plain_users),
    )


def _up(args: argparse.Namespace) -> int:
    from gateway.devstack.errors import DevstackError
    from gateway.devstack.kafka import KafkaBroker, KafkaOptions
    from gateway.devstack.mosquitto import MosquittoBroker
    from gateway.devstack.process import ServiceProcess
    from gateway.devstack.state import ServiceRecord, StackState, read_state, write_state

    state_dir = _state_dir(args)
    try:
        existing = read_state(state_dir)
    except DevstackError as exc:
        print(f"devstack: {exc}", file=sys.stderr)
        return 1
    if existing is not None:
        if all(s.running() for s in existing.services):
            print(f"devstack: already up (state {state_dir / 'state.json'})")
            _print_env({s.name: s.address for s in existing.services})
            return 0
        print("devstack: a previous stack is partly dead; stopping what is left of it")
        for line in _stop_recorded(existing, keep_logs=True):
            print(f"  {line}")
        print(f"devstack: its logs are kept in {existing.work_dir}")

    work_dir = Path(tempfile.mkdtemp(prefix="mqgw-devstack-"))
    started: list[tuple[ServiceProcess, str]] = []
    try:
        secure = _secure_listeners(work_dir) if getattr(args, "secure", False) else None
        if args.only in (None, "mqtt"):
            mqtt = MosquittoBroker(
                work_dir / "mosquitto", _secure_mosquitto(secure), detach=True
            ).start()
            assert mqtt.process is not None
            started.append((mqtt.process, f"{mqtt.host}:{mqtt.port}"))
            if secure is not None:
                _describe_secure(work_dir, "mqtt", mqtt.ports, [
                    f"user {u} password {p}" for u, p in secure.plain_users.items()
                ], secure.certificates)
        if args.only in (None, "kafka"):
            kafka = KafkaBroker(
                work_dir / "kafka",
                KafkaOptions(heap_max=args.kafka_heap, secure=secure),
                detach=True,
            ).start()
            assert kafka.process is not None
            started.append((kafka.process, kafka.bootstrap))
            if secure is not None:
                _describe_secure(work_dir, "kafka", kafka.listener_ports, [
                    *(f"plain user {u} password {p}" for u, p in secure.plain_users.items()),
                    *(f"scram user {u} password {p}" for u, p in secure.scram_users.items()),
                ], secure.certificates)
    except DevstackError as exc:
        for proc, _ in started:
            proc.stop()
        print(f"devstack: {exc}", file=sys.stderr)
        print(f"devstack: logs kept in {work_dir}", file=sys.stderr)
        return 1

    names = {"kafka": "kafka", "mosquitto": "mqtt"}
    records = [ServiceRecord.of(proc, addr) for proc, addr in started]
    for rec in records:
        rec.name = names[rec.name]
    path = write_state(state_dir, StackState(work_dir=str(work_dir), services=records))
    for rec in records:
        print(f"{rec.name:<6} {rec.address:<22} pid {rec.pid:<8} log {rec.log_path}")
    _print_env({r.name: r.address for r in records})
    print(f"state: {path}  (stop with: mqgw devstack down)")
    return 0


def _status(args: argparse.Namespace) -> int:
    from gateway.devstack.errors import DevstackError
    from gateway.devstack.state import read_state

    state_dir = _state_dir(args)
    try:
        state = read_state(state_dir)
    except DevstackError as exc:
        print(f"devstack: {exc}", file=sys.stderr)
        return 1
    if state is None:
        if args.json:
            nothing: StackStatus = {"running": False, "services": []}
            print(json.dumps(nothing))
        else:
            print(f"devstack: not running (no {state_dir / 'state.json'})")
        return 3
    rows: list[ServiceStatus] = []
    for svc in state.services:
        running = svc.running()
        rows.append(
            {
                "name": svc.name,
                "address": svc.address,
                "pid": svc.pid,
                "running": running,
                "answering": running and _probe(svc.name, svc.address),
                "log": svc.log_path,
            }
        )
    healthy = all(r["running"] and r["answering"] for r in rows)
    if args.json:
        status: StackStatus = {"running": healthy, "work_dir": state.work_dir, "services": rows}
        print(json.dumps(status))
    else:
        for r in rows:
            word = "up" if r["answering"] else "running, not answering" if r["running"] else "dead"
            print(f"{r['name']:<6} {r['address']:<22} pid {r['pid']:<8} {word}  log {r['log']}")
    return 0 if healthy else 1


def _stop_recorded(state: StackState, *, keep_logs: bool) -> list[str]:
    messages = []
    for svc in state.services:
        if svc.running():
            svc.process().stop()
            outcome = "still running!" if svc.running() else "stopped"
        else:
            outcome = "was not running"
        messages.append(f"{svc.name:<6} pid {svc.pid:<8} {outcome}")
    if not keep_logs:
        shutil.rmtree(state.work_dir, ignore_errors=True)
    return messages


def _down(args: argparse.Namespace) -> int:
    from gateway.devstack.errors import DevstackError
    from gateway.devstack.state import clear_state, read_state

    state_dir = _state_dir(args)
    try:
        state = read_state(state_dir)
    except DevstackError as exc:
        print(f"devstack: {exc}", file=sys.stderr)
        return 1
    if state is None:
        print("devstack: nothing to stop")
        return 0
    messages = _stop_recorded(state, keep_logs=args.keep_logs)
    for line in messages:
        print(line)
    if any(svc.running() for svc in state.services):
        print("devstack: some processes did not stop; state file kept", file=sys.stderr)
        return 1
    clear_state(state_dir)
    if args.keep_logs:
        print(f"logs kept in {state.work_dir}")
    return 0
