"""What the job leaves on disk: private at rest (issue 23.4: every folder 0700, every file
0600, whatever the umask) and tables every tool reads right (issue 26.9: every Parquet
output's timestamps INT64 TIMESTAMP_MICROS adjusted to UTC, read by pyarrow as
timestamp[us, tz=UTC], not Spark's legacy INT96 that pyarrow, pandas and DuckDB read as
zone-less nanoseconds). Both checkers are shown failing on a broken tree first."""

from __future__ import annotations

import os
import pathlib
import shutil
import stat

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from test_spark_job import expected_report, scenario_files

from mqbatch_testing.spark import write_landing

pytestmark = pytest.mark.spark
UTC_MICROS = pa.timestamp("us", tz="UTC")


def not_private(root: pathlib.Path) -> list[str]:
    """Every folder under root (itself included) that is not 0700, every file not 0600."""
    bad = []
    for path in [root, *root.rglob("*")]:
        mode = stat.S_IMODE(os.lstat(path).st_mode)
        if stat.S_ISLNK(os.lstat(path).st_mode):
            continue
        want = 0o700 if path.is_dir() else 0o600
        if mode != want:
            bad.append(f"{path.relative_to(root)}: {mode:o} (want {want:o})")
    return bad


def not_utc_micros(root: pathlib.Path) -> list[str]:
    """Every timestamp column of every Parquet file under root that pyarrow does not read as
    timestamp[us, tz=UTC] or whose Parquet logical type is not adjusted to UTC."""
    bad, files = [], sorted(p for p in root.rglob("*.parquet") if not p.name.startswith("."))
    for f in files:
        pf = pq.ParquetFile(f)
        for field in pf.schema_arrow:
            if pa.types.is_timestamp(field.type) and field.type != UTC_MICROS:
                bad.append(f"{f.relative_to(root)}: {field.name} is {field.type}")
        for i in range(len(pf.schema)):
            col = pf.schema.column(i)
            if col.physical_type == "INT96":
                bad.append(f"{f.relative_to(root)}: {col.path} is INT96")
            elif "Timestamp" in str(col.logical_type) and "isAdjustedToUTC=true" not in str(col.logical_type):
                bad.append(f"{f.relative_to(root)}: {col.path} is {col.logical_type}")
    return bad if files else [f"no Parquet file under {root}"]


def test_the_checkers_fail_on_a_world_readable_tree_and_int96_timestamps(tmp_path):
    old = os.umask(0o022)
    try:
        (tmp_path / "t" / "sub").mkdir(parents=True)
        table = pa.table({"t": pa.array([0], pa.timestamp("us", tz="UTC"))})
        pq.write_table(table, tmp_path / "t" / "sub" / "ok.parquet")
        assert not_utc_micros(tmp_path / "t") == []
        pq.write_table(table, tmp_path / "t" / "old.parquet", use_deprecated_int96_timestamps=True)
        pq.write_table(pa.table({"t": pa.array([0], pa.timestamp("us"))}), tmp_path / "t" / "naive.parquet")
    finally:
        os.umask(old)
    problems = not_utc_micros(tmp_path / "t")
    assert any("old.parquet: t is INT96" in p for p in problems), problems
    assert any("naive.parquet: t is timestamp[us]" in p for p in problems), problems
    assert not_utc_micros(tmp_path / "empty") != []  # nothing to check is a failure, not a pass
    assert {p.split(":")[0] for p in not_private(tmp_path / "t")} == {
        ".",
        "sub",
        "sub/ok.parquet",
        "old.parquet",
        "naive.parquet",
    }


def _landing(directory: pathlib.Path) -> None:
    for segment, rows in enumerate(scenario_files()):
        write_landing(directory, "r1", segment, rows)


@pytest.fixture(scope="module")
def outputs(spark, tmp_path_factory):
    """Batch and stream outputs of the scenario, written under umask 022 (what Python writes;
    the tests' shared JVM kept the umask it started with: the tree is tightened after the commit)."""
    import mqbatch.spark as S

    d = tmp_path_factory.mktemp("outputs")
    _landing(d / "landing")
    old = os.umask(0o022)
    try:
        S.run_batch(spark, str(d / "landing"), str(d / "batch"), S.JobOptions(reorder_window=3))
        S.run_stream(spark, str(d / "landing"), str(d / "stream"), S.JobOptions(reorder_window=3))
    finally:
        os.umask(old)
    return d


def test_batch_and_stream_outputs_are_private_and_utc_micros_whatever_the_umask(outputs):
    for out in ("batch", "stream"):
        assert not_private(outputs / out) == [], out
        for table in ("records", "quarantine"):
            assert not_utc_micros(outputs / out / table) == [], (out, table)
    assert not_utc_micros(outputs / "stream" / "_decoded") == []
    assert (outputs / "stream" / "_checkpoint" / "landing").is_dir()  # checked by not_private above
    records = pq.read_table(outputs / "batch" / "records")
    assert records.schema.field("device_time").type == UTC_MICROS
    assert records.schema.field("received_at").type == UTC_MICROS


def test_records_read_from_pandas_and_exploded_as_docs_spark_md_shows(outputs, spark):
    """docs/spark.md "Reading the outputs elsewhere": pandas and Spark, one row per reading."""
    import pandas as pd
    from pyspark.sql import functions as F

    out = str(outputs / "batch")
    df = pd.read_parquet(f"{out}/records")
    assert str(df["device_time"].dt.tz) == "UTC" and str(df["received_at"].dt.tz) == "UTC"
    assert len(df) == expected_report(False)["records"]["unique"]
    rows = df.explode("readings", ignore_index=True).dropna(subset=["readings"])
    per_reading = pd.concat(
        [rows.drop(columns="readings").reset_index(drop=True), pd.json_normalize(list(rows["readings"]))], axis=1
    )
    assert len(per_reading) == sum(len(r) for r in df["readings"]) > len(df)
    assert {"channel", "name", "value", "scaled"} <= set(per_reading.columns)

    one_per_reading = (
        spark.read.parquet(f"{out}/records")
        .select("device", "boot", "seq", "device_time", F.explode("readings").alias("r"))
        .select("device", "boot", "seq", "device_time", "r.*")
    )
    got = sorted((r.device, r.boot, r.seq, r.channel, r.value) for r in one_per_reading.collect())
    want = sorted(
        (row.device, row.boot, row.seq, row.channel, row.value) for row in per_reading.itertuples(index=False)
    )
    assert got == want


def test_records_read_from_duckdb_as_docs_spark_md_shows(outputs):
    duckdb = pytest.importorskip("duckdb", reason="duckdb is not installed (not a dependency of mqbatch)")
    out = str(outputs / "batch")
    n = duckdb.sql(
        f"SELECT count(*) FROM (SELECT device, unnest(readings, recursive := true) "
        f"FROM read_parquet('{out}/records/**/*.parquet', hive_partitioning = true))"
    ).fetchone()[0]
    assert n == sum(len(r) for r in pq.read_table(f"{out}/records").column("readings").to_pylist())


def test_the_html_report_is_written_when_the_stream_says_so_and_a_failure_is_one_line(outputs, tmp_path, capsys):
    """commands.report.HtmlReport, what `mqbatch spark --stream` and `fleet run --spark-out`
    use: a write per REPORT_WRITTEN line of the job (no other line), 0600; an output it
    cannot render is one line on stderr, not an exception."""
    from mqbatch.commands.report import HtmlReport
    from mqbatch.spark.lines import REPORT_WRITTEN

    out = tmp_path / "copy"
    shutil.copytree(outputs / "stream", out)
    html = HtmlReport(str(out), "test", REPORT_WRITTEN)
    html.on_line(b"batch 0: 2 files (0 quarantined)\n")
    html.close()
    assert not (out / "report.html").exists()
    html = HtmlReport(str(out), "test", REPORT_WRITTEN)
    html.on_line(f"{REPORT_WRITTEN} ({out})\n".encode())
    html.close()
    assert stat.S_IMODE(os.stat(out / "report.html").st_mode) == 0o600
    assert "<html" in (out / "report.html").read_text().lower()
    assert f"test: HTML report {out / 'report.html'}" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    assert HtmlReport(str(tmp_path / "empty"), "test").write() is None
    err = capsys.readouterr().err
    assert err.startswith("test: no HTML report: ") and err.count("\n") == 1, err
