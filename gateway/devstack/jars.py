"""Where ``make setup`` put the JVM jars, and checks that they are the ones expected.

``tools/setup.sh`` resolves ``tools/jvm/<name>/pom.xml`` with Maven into
``.cache/jvm/<name>/lib`` and writes ``.cache/jvm/<name>/stamp`` (the pom's SHA-256, plus
``-spark-<version>`` for the connector). Reading the stamp here lets a stale cache fail with
"run make setup" instead of a ClassNotFoundException deep inside a JVM.

``spark_kafka_jars()`` is the public entry point for analytics code that builds its own
SparkSession: pass ``",".join(map(str, spark_kafka_jars()))`` as ``spark.jars``.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import os
from pathlib import Path

from gateway.devstack.errors import JarsMissingError

#: The repository root when the project is installed editable (the supported layout).
PROJECT_ROOT = Path(__file__).resolve().parents[2]

#: The four jars pyspark does not bundle but its Kafka source needs.
SPARK_KAFKA_ARTIFACTS: tuple[str, ...] = (
    "spark-sql-kafka-0-10_2.13",
    "spark-token-provider-kafka-0-10_2.13",
    "kafka-clients",
    "commons-pool2",
)


def jvm_cache_dir() -> Path:
    """``$MQGW_JVM_CACHE`` if set, else ``<project>/.cache/jvm``."""
    override = os.environ.get("MQGW_JVM_CACHE")
    return Path(override) if override else PROJECT_ROOT / ".cache" / "jvm"


def _pom_sha256(name: str) -> str | None:
    pom = PROJECT_ROOT / "tools" / "jvm" / name / "pom.xml"
    if not pom.is_file():  # installed without the repository: trust the stamp as written
        return None
    return hashlib.sha256(pom.read_bytes()).hexdigest()


def _resolved_jars(name: str, expected_stamp: str | None) -> list[Path]:
    base = jvm_cache_dir() / name
    lib = base / "lib"
    jars = sorted(lib.glob("*.jar"))
    if not jars:
        raise JarsMissingError(name, base, "no jars in lib/")
    stamp_file = base / "stamp"
    try:
        stamp = stamp_file.read_text(encoding="ascii").splitlines()[0].strip()
    except (OSError, IndexError):
        raise JarsMissingError(name, base, "no stamp file") from None
    if expected_stamp is not None and stamp != expected_stamp:
        raise JarsMissingError(
            name, base, f"stamp {stamp!r} does not match the pom (expected {expected_stamp!r})"
        )
    return jars


def kafka_broker_jars() -> list[Path]:
    """The Kafka broker's classpath (KRaft broker + controller, log4j2 binding)."""
    return _resolved_jars("kafka", _pom_sha256("kafka"))


def installed_pyspark_version() -> str | None:
    """The pyspark distribution's version, without importing pyspark (slow)."""
    try:
        return importlib.metadata.version("pyspark")
    except importlib.metadata.PackageNotFoundError:
        return None


def spark_kafka_jars() -> list[Path]:
    """The Spark Kafka connector jars for the installed pyspark, as absolute paths.

    Raises ``JarsMissingError`` when they are absent or were resolved for another Spark
    version (a connector must match its Spark exactly).
    """
    pom_hash = _pom_sha256("spark-kafka")
    version = installed_pyspark_version()
    expected = None if pom_hash is None or version is None else f"{pom_hash}-spark-{version}"
    jars = _resolved_jars("spark-kafka", expected)
    names = [j.name for j in jars]
    missing = [a for a in SPARK_KAFKA_ARTIFACTS if not any(n.startswith(a + "-") for n in names)]
    if missing:
        raise JarsMissingError("spark-kafka", jvm_cache_dir() / "spark-kafka", f"missing {missing}")
    return jars
