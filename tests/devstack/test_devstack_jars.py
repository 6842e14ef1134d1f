"""Locating the jars `make setup` resolved, and refusing stale or missing ones."""

from __future__ import annotations

import hashlib
import importlib.metadata
from pathlib import Path

import pytest

from gateway.devstack import JarsMissingError, kafka_broker_jars, spark_kafka_jars
from gateway.devstack.jars import PROJECT_ROOT, SPARK_KAFKA_ARTIFACTS


def test_setup_resolved_kafka_broker_jars() -> None:
    jars = kafka_broker_jars()
    names = [j.name for j in jars]
    assert any(n.startswith("kafka_2.13-4.") for n in names), names
    assert any(n.startswith("log4j-slf4j-impl-") for n in names), "no SLF4J binding"
    assert all(j.is_file() and j.is_absolute() for j in jars)


def test_spark_connector_matches_installed_pyspark_exactly() -> None:
    version = importlib.metadata.version("pyspark")
    jars = spark_kafka_jars()
    names = sorted(j.name for j in jars)
    assert len(names) == len(SPARK_KAFKA_ARTIFACTS)
    assert f"spark-sql-kafka-0-10_2.13-{version}.jar" in names
    assert f"spark-token-provider-kafka-0-10_2.13-{version}.jar" in names


def _fake_cache(root: Path, name: str, stamp: str, jar_names: list[str]) -> None:
    lib = root / name / "lib"
    lib.mkdir(parents=True)
    for jar in jar_names:
        (lib / jar).write_bytes(b"PK")
    (root / name / "stamp").write_text(stamp + "\n")


def test_missing_cache_says_run_make_setup(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MQGW_JVM_CACHE", str(tmp_path))
    with pytest.raises(JarsMissingError, match="make setup") as info:
        kafka_broker_jars()
    assert info.value.cache_dir == tmp_path / "kafka"


def test_stale_stamp_is_rejected(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_cache(tmp_path, "kafka", "0" * 64, ["kafka_2.13-4.0.0.jar"])
    monkeypatch.setenv("MQGW_JVM_CACHE", str(tmp_path))
    with pytest.raises(JarsMissingError, match="does not match the pom"):
        kafka_broker_jars()


def test_connector_for_another_spark_version_is_rejected(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pom_hash = hashlib.sha256(
        (PROJECT_ROOT / "tools/jvm/spark-kafka/pom.xml").read_bytes()
    ).hexdigest()
    _fake_cache(
        tmp_path,
        "spark-kafka",
        f"{pom_hash}-spark-3.5.0",
        [f"{a}-3.5.0.jar" for a in SPARK_KAFKA_ARTIFACTS],
    )
    monkeypatch.setenv("MQGW_JVM_CACHE", str(tmp_path))
    with pytest.raises(JarsMissingError, match=r"spark-3\.5\.0"):
        spark_kafka_jars()


def test_connector_set_with_a_missing_artifact_is_rejected(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pom_hash = hashlib.sha256(
        (PROJECT_ROOT / "tools/jvm/spark-kafka/pom.xml").read_bytes()
    ).hexdigest()
    version = importlib.metadata.version("pyspark")
    _fake_cache(
        tmp_path,
        "spark-kafka",
        f"{pom_hash}-spark-{version}",
        [f"{a}-{version}.jar" for a in SPARK_KAFKA_ARTIFACTS if a != "commons-pool2"],
    )
    monkeypatch.setenv("MQGW_JVM_CACHE", str(tmp_path))
    with pytest.raises(JarsMissingError, match="commons-pool2"):
        spark_kafka_jars()
