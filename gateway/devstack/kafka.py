"""A single-node Apache Kafka broker (KRaft: broker and controller in one JVM) on 127.0.0.1.

Runs from the jars ``make setup`` resolved (``tools/jvm/kafka/pom.xml``), in a work
directory of its own: ``server.properties``, ``log4j2.properties``, ``kraft-logs/`` (data)
and ``kafka.log`` (stdout and stderr of the JVM). Storage is formatted by the project
(``kafka.tools.StorageTool``) and readiness means a real Metadata request answered with
this broker in it, not a log line.
"""

from __future__ import annotations

import asyncio
import base64
import concurrent.futures
import os
import secrets
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING

from gateway.devstack.errors import ExecutableNotFoundError, ServiceStartError
from gateway.devstack.jars import kafka_broker_jars
from gateway.devstack.ports import LOOPBACK, free_ports, port_accepts
from gateway.devstack.process import ServiceProcess, log_tail, spawn

if TYPE_CHECKING:  # cryptography (certs) is in the dev extra only
    from gateway.devstack.certs import DevCertificates

#: Heap for a 2-core, 24 GB machine shared with Spark and the gateway: enough for
#: benchmarks with a few hundred MB in flight, small enough to leave room for the rest.
DEFAULT_HEAP = ("512m", "1g")
BROKER_MAIN = "kafka.Kafka"
STORAGE_TOOL_MAIN = "kafka.tools.StorageTool"

LOG4J2_PROPERTIES = """\
status = warn
appender.stdout.type = Console
appender.stdout.name = STDOUT
appender.stdout.layout.type = PatternLayout
appender.stdout.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = INFO
rootLogger.appenderRef.stdout.ref = STDOUT
logger.request.name = kafka.request.logger
logger.request.level = WARN
logger.authorizer.name = kafka.authorizer.logger
logger.authorizer.level = WARN
logger.clients.name = org.apache.kafka.clients
logger.clients.level = WARN
"""


def new_cluster_id() -> str:
    """A KRaft cluster id: base64url of 16 random bytes without padding (22 characters).

    Never starting with "-" (1 in 64 would): the storage tool's argument parser would take
    it for an option. Kafka's own ``Uuid.randomUuid()`` skips those for the same reason.
    """
    while True:
        cid = base64.urlsafe_b64encode(secrets.token_bytes(16)).rstrip(b"=").decode("ascii")
        if not cid.startswith("-"):
            return cid


def server_properties(
    *,
    port: int,
    controller_port: int,
    data_dir: Path,
    num_partitions: int = 1,
    extra_listeners: dict[str, tuple[str, int]] | None = None,
    extra_settings: dict[str, str] | None = None,
) -> str:
    """``server.properties`` for one node that is both broker and controller.

    Replication factors and ISR minimums are 1 (there is one node); the cleaner's dedupe
    buffer is shrunk from 128 MiB; the initial rebalance delay is 0 so consumer groups
    form at once in tests. ``extra_listeners`` (name -> (security protocol, port)) are
    added next to PLAINTEXT, which stays the inter-broker listener, with
    ``extra_settings`` (their TLS/SASL configuration, see :class:`SecureListeners`).
    """
    extra = extra_listeners or {}
    listeners = "".join(f",{name}://{LOOPBACK}:{p}" for name, (_, p) in extra.items())
    protocols = "".join(f",{name}:{proto}" for name, (proto, _) in extra.items())
    settings = {
        "process.roles": "broker,controller",
        "node.id": "1",
        "controller.quorum.voters": f"1@{LOOPBACK}:{controller_port}",
        "listeners": (
            f"PLAINTEXT://{LOOPBACK}:{port},CONTROLLER://{LOOPBACK}:{controller_port}"
            + listeners
        ),
        "advertised.listeners": f"PLAINTEXT://{LOOPBACK}:{port}" + listeners,
        "inter.broker.listener.name": "PLAINTEXT",
        "controller.listener.names": "CONTROLLER",
        "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT" + protocols,
        "log.dirs": str(data_dir),
        "num.partitions": str(num_partitions),
        "auto.create.topics.enable": "true",
        "delete.topic.enable": "true",
        "offsets.topic.replication.factor": "1",
        "offsets.topic.num.partitions": "1",
        "transaction.state.log.replication.factor": "1",
        "transaction.state.log.min.isr": "1",
        "transaction.state.log.num.partitions": "1",
        "share.coordinator.state.topic.replication.factor": "1",
        "share.coordinator.state.topic.min.isr": "1",
        "group.initial.rebalance.delay.ms": "0",
        "log.cleaner.dedupe.buffer.size": "1048577",
        "num.network.threads": "2",
        "num.io.threads": "4",
        **(extra_settings or {}),
    }
    return "".join(f"{key}={value}\n" for key, value in settings.items())


def find_java() -> str:
    """``$JAVA_HOME/bin/java`` if set, else ``java`` on PATH."""
    java_home = os.environ.get("JAVA_HOME")
    candidates = [str(Path(java_home) / "bin" / "java")] if java_home else []
    on_path = shutil.which("java")
    if on_path:
        candidates.append(on_path)
    for cand in candidates:
        if os.access(cand, os.X_OK):
            return cand
    raise ExecutableNotFoundError(
        "java", ["$JAVA_HOME/bin/java", "PATH"], "install OpenJDK 17+ (make setup checks this)"
    )


async def _metadata_brokers(bootstrap: str, timeout_ms: int) -> list[int]:
    from aiokafka.client import AIOKafkaClient  # heavy import, only when probing

    client = AIOKafkaClient(bootstrap_servers=bootstrap, request_timeout_ms=timeout_ms)
    try:
        await client.bootstrap()
        return sorted(b.nodeId for b in client.cluster.brokers())
    finally:
        await client.close()


#: Kafka's command-line tools (the kafka-tools jar on the devstack's classpath), by the
#: name of their shell script in a Kafka distribution.
CONSOLE_TOOLS = {
    "kafka-console-producer": "org.apache.kafka.tools.ConsoleProducer",
    "kafka-console-consumer": "org.apache.kafka.tools.consumer.ConsoleConsumer",
    "kafka-consumer-groups": "org.apache.kafka.tools.consumer.group.ConsumerGroupCommand",
}


def console_tool_command(tool: str, *args: str) -> list[str]:
    """The command line that runs one of Kafka's own console tools (``CONSOLE_TOOLS``)
    from the devstack's jars, as a separate process: clients this project did not write,
    for end-to-end tests and for trying the gateway by hand."""
    if tool not in CONSOLE_TOOLS:
        raise ValueError(f"unknown Kafka tool {tool!r}: one of {sorted(CONSOLE_TOOLS)}")
    classpath = str(kafka_broker_jars()[0].parent / "*")
    return [find_java(), "-Xmx256m", "-cp", classpath, CONSOLE_TOOLS[tool], *args]


def metadata_brokers(bootstrap: str, timeout: float = 5.0) -> list[int]:
    """Node ids from a real Metadata request to ``bootstrap`` (raises on failure).

    Runs its own event loop in a worker thread, so it is safe to call from code that is
    itself inside a running loop.
    """
    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="kafka-probe") as pool:
        future = pool.submit(asyncio.run, _metadata_brokers(bootstrap, int(timeout * 1000)))
        return future.result(timeout + 5.0)


def pem_keystore(cert: Path, key: Path, out: Path) -> Path:
    """Write ``out``: the private key (PKCS#8, as Kafka's PEM keystores need) followed by
    the certificate, for ``ssl.keystore.type=PEM`` (broker and Java console clients)."""
    from cryptography.hazmat.primitives import serialization  # dev extra, only for TLS

    private = serialization.load_pem_private_key(key.read_bytes(), password=None)
    pkcs8 = private.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(pkcs8 + cert.read_bytes())
    out.chmod(0o600)
    return out


@dataclass(frozen=True, slots=True)
class SecureListeners:
    """Extra TLS/SASL listeners for the broker (controller and inter-broker traffic stay
    PLAINTEXT on loopback; the PLAINTEXT listener stays too, for readiness and tooling).

    * ``SSL``: the CA-signed server certificate; clients must present a certificate
      signed by the same CA (ssl.client.auth=required).
    * ``SASL_SSL``: the same server certificate, no client certificate, SASL with PLAIN
      (``plain_users``, in the listener's JAAS config) and SCRAM-SHA-256/512
      (``scram_users``, both mechanisms, written by the storage format ``--add-scram``).
    * ``EXPIRED`` (``expired_listener``): TLS with the expired server certificate.
    * one SSL listener per ``tls_listeners`` entry (NAME -> (cert, key) PEM files), e.g.
      a certificate that does not name 127.0.0.1 for host-name checks.

    PEM files come from :func:`gateway.devstack.certs.make_dev_certificates`.
    """

    certificates: DevCertificates
    plain_users: dict[str, str] = field(default_factory=dict)
    scram_users: dict[str, str] = field(default_factory=dict)
    expired_listener: bool = True
    tls_listeners: dict[str, tuple[Path, Path]] = field(default_factory=dict)

    def listeners(self) -> dict[str, str]:
        """Listener name -> security protocol."""
        out = {"SSL": "SSL", "SASL_SSL": "SASL_SSL"}
        if self.expired_listener:
            out["EXPIRED"] = "SSL"
        out.update(dict.fromkeys(self.tls_listeners, "SSL"))
        return out

    def settings(self, tls_dir: Path) -> dict[str, str]:
        """server.properties entries for the listeners; keystores are written to ``tls_dir``."""
        certs = self.certificates
        keystore = pem_keystore(
            certs.server_cert, certs.server_key, tls_dir / "server-keystore.pem"
        )
        out = {
            "ssl.keystore.type": "PEM",
            "ssl.keystore.location": str(keystore),
            "ssl.truststore.type": "PEM",
            "ssl.truststore.location": str(certs.ca_cert),
            "ssl.endpoint.identification.algorithm": "",
            "listener.name.ssl.ssl.client.auth": "required",
            "listener.name.sasl_ssl.sasl.enabled.mechanisms": "PLAIN,SCRAM-SHA-256,SCRAM-SHA-512",
            "listener.name.sasl_ssl.plain.sasl.jaas.config": (
                "org.apache.kafka.common.security.plain.PlainLoginModule required"
                + "".join(f' user_{u}="{p}"' for u, p in self.plain_users.items())
                + ";"
            ),
        }
        for mechanism in ("scram-sha-256", "scram-sha-512"):
            out[f"listener.name.sasl_ssl.{mechanism}.sasl.jaas.config"] = (
                "org.apache.kafka.common.security.scram.ScramLoginModule required;"
            )
        others = dict(self.tls_listeners)
        if self.expired_listener:
            others["EXPIRED"] = (certs.expired_server_cert, certs.expired_server_key)
        for name, (cert, key) in others.items():
            store = pem_keystore(cert, key, tls_dir / f"{name.lower()}-keystore.pem")
            out[f"listener.name.{name.lower()}.ssl.keystore.type"] = "PEM"
            out[f"listener.name.{name.lower()}.ssl.keystore.location"] = str(store)
        return out

    def scram_arguments(self) -> list[str]:
        """``kafka-storage format`` arguments creating the SCRAM credentials."""
        args: list[str] = []
        for user, password in self.scram_users.items():
            for mechanism in ("SCRAM-SHA-256", "SCRAM-SHA-512"):
                args += ["--add-scram", f"{mechanism}=[name={user},password={password}]"]
        return args


@dataclass(slots=True)
class KafkaOptions:
    """Knobs for the local broker; the defaults suit tests and the demo."""

    heap_min: str = DEFAULT_HEAP[0]
    heap_max: str = DEFAULT_HEAP[1]
    num_partitions: int = 1
    startup_timeout: float = 120.0
    stop_timeout: float = 15.0
    #: Extra TLS/SASL listeners (None: the plaintext broker only).
    secure: SecureListeners | None = None


class KafkaBroker:
    """A running (after ``start()``) single-node KRaft broker; ``bootstrap`` is its address."""

    def __init__(
        self, work_dir: Path, options: KafkaOptions | None = None, *, detach: bool = False
    ) -> None:
        self.work_dir = work_dir
        self.options = options or KafkaOptions()
        self.detach = detach
        self.log_path = work_dir / "kafka.log"
        self.port = 0
        self.controller_port = 0
        self.cluster_id = ""
        self.process: ServiceProcess | None = None
        #: Port of each extra listener (``options.secure``), by listener name.
        self.listener_ports: dict[str, int] = {}

    @property
    def bootstrap(self) -> str:
        return f"{LOOPBACK}:{self.port}"

    def listener_address(self, name: str) -> str:
        """``127.0.0.1:<port>`` of an extra listener (``SSL``, ``SASL_SSL``, ...)."""
        return f"{LOOPBACK}:{self.listener_ports[name]}"

    def start(self) -> KafkaBroker:
        """Format storage, start the JVM and wait for a Metadata answer.

        Retries with fresh ports when another process took a probed port in between;
        raises ``ServiceStartError`` with the log tail otherwise.
        """
        jars = kafka_broker_jars()
        java = find_java()
        classpath = str(jars[0].parent / "*")  # expanded by java itself
        for attempt in range(3):
            try:
                self._start_once(java, classpath)
                return self
            except ServiceStartError as exc:
                self.stop()
                if attempt < 2 and "Address already in use" in exc.log_tail:
                    continue
                raise
        raise AssertionError("unreachable")

    def _jvm_options(self, heap: tuple[str, str]) -> list[str]:
        return [
            f"-Xms{heap[0]}",
            f"-Xmx{heap[1]}",
            "-XX:+UseG1GC",
            "-XX:MaxGCPauseMillis=20",
            "-XX:+ExitOnOutOfMemoryError",
            "-Djava.awt.headless=true",
            f"-Dlog4j2.configurationFile={self.work_dir / 'log4j2.properties'}",
            f"-Dkafka.logs.dir={self.work_dir / 'logs'}",
        ]

    def _start_once(self, java: str, classpath: str) -> None:
        self.work_dir.mkdir(parents=True, exist_ok=True)
        data_dir = self.work_dir / "kraft-logs"
        shutil.rmtree(data_dir, ignore_errors=True)
        secure = self.options.secure
        names = list(secure.listeners()) if secure is not None else []
        self.port, self.controller_port, *extra = free_ports(2 + len(names))
        self.listener_ports = dict(zip(names, extra, strict=True))
        self.cluster_id = new_cluster_id()
        config = self.work_dir / "server.properties"
        config.write_text(
            server_properties(
                port=self.port,
                controller_port=self.controller_port,
                data_dir=data_dir,
                num_partitions=self.options.num_partitions,
                extra_listeners=(
                    {n: (p, self.listener_ports[n]) for n, p in secure.listeners().items()}
                    if secure is not None
                    else None
                ),
                extra_settings=secure.settings(self.work_dir / "tls") if secure else None,
            ),
            encoding="utf-8",
        )
        (self.work_dir / "log4j2.properties").write_text(LOG4J2_PROPERTIES, encoding="utf-8")
        self._format_storage(java, classpath, config)
        self._spawn_broker(java, classpath, config)

    def _spawn_broker(self, java: str, classpath: str, config: Path) -> None:
        argv = [
            java,
            *self._jvm_options((self.options.heap_min, self.options.heap_max)),
            "-cp",
            classpath,
            BROKER_MAIN,
            str(config),
        ]
        self.process = spawn(
            "kafka", argv, log_path=self.log_path, cwd=self.work_dir, detach=self.detach
        )
        self._wait_ready()

    def restart(self) -> KafkaBroker:
        """Stop the JVM and start it again on the same ports with the same data.

        Clients see an outage they recover from (same address, same topics and
        offsets), which is what back-pressure tests need; ``start()`` would make a new,
        empty cluster on new ports.
        """
        config = self.work_dir / "server.properties"
        if not self.port or not config.exists():
            raise RuntimeError("restart() needs a broker that was started")
        self.stop()
        self._spawn_broker(find_java(), str(kafka_broker_jars()[0].parent / "*"), config)
        return self

    def _format_storage(self, java: str, classpath: str, config: Path) -> None:
        argv = [
            java,
            "-Xmx256m",
            "-XX:TieredStopAtLevel=1",
            "-XX:+UseSerialGC",
            f"-Dlog4j2.configurationFile={self.work_dir / 'log4j2.properties'}",
            "-cp",
            classpath,
            STORAGE_TOOL_MAIN,
            "format",
            "-t",
            self.cluster_id,
            "-c",
            str(config),
            *(self.options.secure.scram_arguments() if self.options.secure else []),
        ]
        log = self.work_dir / "storage-format.log"
        with log.open("wb") as out:
            try:
                rc = subprocess.run(
                    argv, stdout=out, stderr=subprocess.STDOUT, timeout=120, check=False
                ).returncode
            except subprocess.TimeoutExpired:
                rc = -1
        if rc != 0:
            raise ServiceStartError(
                "kafka", f"storage format exited with {rc}", log, log_tail(log), rc
            )

    def _wait_ready(self) -> None:
        assert self.process is not None
        deadline = time.monotonic() + self.options.startup_timeout
        last_error = "port never opened"
        while time.monotonic() < deadline:
            if not self.process.alive():
                rc = self.process.exit_code()
                raise ServiceStartError(
                    "kafka", f"JVM exited with {rc}", self.log_path, self.process.log_tail(), rc
                )
            if port_accepts(LOOPBACK, self.port):
                try:
                    if 1 in metadata_brokers(self.bootstrap):
                        return
                    last_error = "metadata listed no broker yet"
                except Exception as exc:  # any client error means "not ready yet"
                    last_error = f"metadata request failed: {exc!r}"
            time.sleep(0.25)
        raise ServiceStartError(
            "kafka",
            f"not ready after {self.options.startup_timeout:.0f} s ({last_error})",
            self.log_path,
            self.process.log_tail(),
            None,
        )

    def stop(self) -> None:
        """Stop the JVM (SIGTERM, then SIGKILL after ``stop_timeout``); idempotent."""
        if self.process is not None:
            self.process.stop(self.options.stop_timeout)

    def __enter__(self) -> KafkaBroker:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
