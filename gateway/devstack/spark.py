"""SparkSession settings for local runs: ``local[2]``, no UI, loopback only, connector jars.

Kept free of pyspark imports (pyspark is an optional extra and slow to import); callers do
``SparkSession.builder.config(map=spark_session_conf(work_dir))`` or loop over the items.
"""

from __future__ import annotations

import sys
from pathlib import Path

from gateway.devstack.jars import spark_kafka_jars

#: Driver JVM options that shorten a cold start on two cores; not for benchmarks.
FAST_START_JAVA_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"


def spark_session_conf(
    work_dir: Path,
    *,
    app_name: str = "mqgw",
    master: str = "local[2]",
    shuffle_partitions: int = 2,
    driver_memory: str = "1g",
    fast_start: bool = False,
) -> dict[str, str]:
    """Spark configuration for a local session with the Kafka source available.

    ``work_dir`` receives Spark's scratch space, the SQL warehouse and Derby's files, so
    nothing lands in the current directory.
    """
    jars = spark_kafka_jars()
    java_options = f"-Dderby.system.home={work_dir / 'derby'}"
    if fast_start:
        java_options += " " + FAST_START_JAVA_OPTIONS
    return {
        "spark.master": master,
        "spark.app.name": app_name,
        "spark.jars": ",".join(str(j) for j in jars),
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.shuffle.partitions": str(shuffle_partitions),
        "spark.default.parallelism": "2",
        "spark.driver.host": "127.0.0.1",
        "spark.driver.bindAddress": "127.0.0.1",
        "spark.driver.memory": driver_memory,
        "spark.driver.extraJavaOptions": java_options,
        "spark.local.dir": str(work_dir / "local"),
        "spark.sql.warehouse.dir": str(work_dir / "warehouse"),
        "spark.sql.session.timeZone": "UTC",
        "spark.pyspark.python": sys.executable,
        "spark.pyspark.driver.python": sys.executable,
    }
