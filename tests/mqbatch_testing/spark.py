"""The one local SparkSession shared by every Spark test (session scope: the JVM
starts once, ~15 s). Registered in tests/conftest.py (`pytest_plugins`).

Fixture `spark`: local[2], 2 shuffle partitions, no UI, UTC session time zone, the
decoder's JVM fast path on its class path (mqbatch.spark.jvm; the tests need a JDK).
Python workers run this interpreter (the venv) and can import `mqbatch` and the
modules of spark_jobs/ (PYTHONPATH is set before the JVM starts)."""

from __future__ import annotations

import dataclasses
import os
import pathlib
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from mqbatch.ingest import landing as landing_zone
from mqbatch.util.paths import ROOT
from mqbatch.wire import codec, records

SPARK_JOBS = ROOT / "spark_jobs"


def path_without_javac(directory: pathlib.Path) -> str:
    """A PATH of /usr/bin's tools (links) without javac (and without the venv)."""
    directory.mkdir()
    for tool in pathlib.Path("/usr/bin").iterdir():
        if not tool.name.startswith("javac"):
            (directory / tool.name).symlink_to(tool)
    return str(directory)


def clean_env() -> dict:
    """What a fresh login shell has: no venv, no Spark or Python variables; only the suite's
    JIT option for the JVM it starts (SPARK_SUBMIT_OPTS, tests/conftest.py: nothing the job
    finds Spark, Python or mqbatch by; without it one run took 61 s of CPU, idle)."""
    env = {"PATH": "/usr/bin:/bin", "HOME": os.environ.get("HOME", "/tmp"), "LANG": "C.UTF-8"}
    env["SPARK_SUBMIT_OPTS"] = os.environ["SPARK_SUBMIT_OPTS"]
    return env


def cds_archive(skip: bool = True) -> pathlib.Path | None:
    """This checkout's class-data archive (mqbatch.spark.cds; `make test` writes it first:
    spark-prepare). Without one: a failure when MQBATCH_REQUIRE_CDS is set (the Makefile's
    test targets set it), else a skip saying why (or, skip=False, None and a printed note)."""
    from mqbatch.spark import cds

    path = cds.written()
    if path is not None:
        return path
    why = f"no class-data archive at {cds.archive()} (`make spark-prepare` writes it)"
    if os.environ.get("MQBATCH_REQUIRE_CDS"):
        pytest.fail(f"{why}, and MQBATCH_REQUIRE_CDS is set")
    if skip:
        pytest.skip(why)
    print(f"{why}: not checked")
    return None


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

    from mqbatch.spark import jvm

    warehouse = tmp_path_factory.mktemp("spark-warehouse")
    session = (
        SparkSession.builder.master("local[2]")
        .appName("mqbatch-tests")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.default.parallelism", "2")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.warehouse.dir", str(warehouse))
        .config("spark.driver.memory", "1g")
        .config("spark.sql.streaming.schemaInference", "false")
        .config("spark.jars", str(jvm.jar()))  # the decoder's JVM fast path (mqbatch.spark.jvm)
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


# -- building landing zones for the job's tests -----------------------------------

T0_MS = 1_795_000_000_000  # 2026-11-18T11:06:40Z, device clock of the synthetic scenarios


def sample(boot: int, seq: int, synced: bool = True, fmt: str = "binary", temperature: int = 2150) -> tuple[bytes, int]:
    """(sub-payload, device time ms) of one sample record at T0 + 100 s * boot + 1 s * seq."""
    t = T0_MS + boot * 100_000 + seq * 1000
    enc = records.encode_json if fmt == "json" else records.encode_binary
    return enc("sample", boot, seq, t, [(1, temperature), (3, 3300)], synced=synced), t


def health(boot: int, seq: int, dropped_total: int) -> tuple[bytes, int]:
    t = T0_MS + boot * 100_000 + seq * 1000
    return records.encode_binary("health", boot, seq, t, [(0x80, 40_000), (0x82, dropped_total)]), t


def landed(topic: str, subs: list[bytes], received_ms: int, props=None, payload: bytes | None = None):
    """One landed PUBLISH carrying `subs` as a v1 batch (or the given props/payload verbatim)."""
    if props is None:
        props, payload = codec.encode_batch(subs)
    return landing_zone.Landed(topic, payload, list(props), received_at_us=received_ms * 1000)


def write_landing(directory, recorder: str, segment: int, rows) -> None:
    pathlib.Path(directory).mkdir(parents=True, exist_ok=True)
    landing_zone.write_parquet_atomic(
        landing_zone.to_table(rows, recorder, segment),
        pathlib.Path(directory),
        landing_zone.parquet_name(recorder, segment),
    )


def write_rows(directory, rows) -> str:
    """The landed rows as one landing file, landing-r1-00000000.parquet (received_at null where
    a row has None: a file another writer made), in `directory`; returns its path."""
    directory.mkdir(parents=True, exist_ok=True)
    table = landing_zone.to_table([dataclasses.replace(r, received_at_us=r.received_at_us or 0) for r in rows], "r1", 0)
    at = table.column("received_at").to_pylist()
    received = pa.array(
        [None if r.received_at_us is None else v for r, v in zip(rows, at)], table.schema.field("received_at").type
    )
    table = table.set_column(table.schema.get_field_index("received_at"), "received_at", received)
    pq.write_table(table, directory / "landing-r1-00000000.parquet")
    return str(directory)
