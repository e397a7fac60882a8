"""The one local SparkSession shared by every Spark test (session scope: the JVM
starts once, ~15 s). Registered in tests/conftest.py (`pytest_plugins`).

Fixture `spark`: local[2], 2 shuffle partitions, no UI, UTC session time zone.
Python workers run this interpreter (the venv) and can import `mqbatch` and the
modules of spark_jobs/ (PYTHONPATH is set before the JVM starts)."""
from __future__ import annotations

import os
import sys

import pytest

from mqbatch.paths import ROOT

SPARK_JOBS = ROOT / "spark_jobs"


def spark_env() -> dict:
    """Environment for Spark with the venv's Python and spark_jobs/ importable."""
    env = dict(os.environ)
    env["PYSPARK_PYTHON"] = sys.executable
    env["PYSPARK_DRIVER_PYTHON"] = sys.executable
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(SPARK_JOBS), env.get("PYTHONPATH")) if p)
    return env


@pytest.fixture(scope="session")
def spark(tmp_path_factory):
    os.environ.update(spark_env())
    if str(SPARK_JOBS) not in sys.path:
        sys.path.insert(0, str(SPARK_JOBS))
    from pyspark.sql import SparkSession
    warehouse = tmp_path_factory.mktemp("spark-warehouse")
    session = (SparkSession.builder.master("local[2]").appName("mqbatch-tests")
               .config("spark.sql.shuffle.partitions", "2")
               .config("spark.default.parallelism", "2")
               .config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false")
               .config("spark.sql.session.timeZone", "UTC")
               .config("spark.sql.warehouse.dir", str(warehouse))
               .config("spark.driver.memory", "1g")
               .config("spark.sql.streaming.schemaInference", "false")
               .getOrCreate())
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()
