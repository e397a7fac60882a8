"""Issue 23.5: the job uses the device-id rule of `fleet add` (mqbatch.wire.device_id):
`.`, `..`, hidden, punctuation-first and upper-case ids are quarantined with a reason, on
the JVM fast path too; every landing entry the job skips (hidden names, empty directories
such as a folder named landing-*.parquet, fifos) is counted in report.json."""

from __future__ import annotations

import os

import pytest

from mqbatch.fleet.provision import FleetError, check_device_id
from mqbatch.wire import records
from mqbatch.wire.device_id import is_device_id
from mqbatch_testing.spark import T0_MS, landed, sample, write_landing

IDS = [".", "..", "...", "_x", "-x", ".hidden", "a", "Dev-A", "dev.1", "x_", "a" * 64, "a" * 65, "", "a b", "é", "a/b"]


def _fleet_accepts(device: str) -> bool:
    try:
        check_device_id(device)
    except FleetError:
        return False
    return True


def _job_accepts(device: str) -> bool:
    try:
        records.device_from_topic(f"mqbatch/{device}/telemetry")
    except records.RecordError:
        return False
    return True


@pytest.mark.parametrize("device", IDS)
def test_the_jobs_device_id_rule_is_the_fleets(device):
    assert _job_accepts(device) == _fleet_accepts(device) == is_device_id(device)


@pytest.mark.spark
def test_refused_device_ids_are_quarantined_and_skipped_entries_counted(spark, tmp_path):
    import mqbatch.spark as S

    landing = tmp_path / "landing"
    bad_ids, good_ids = [".", "..", "_x", "-x", "Dev-A"], ["ok-1", "ok.2"]
    rows = [
        landed(f"mqbatch/{d}/telemetry", [sample(1, s)[0] for s in range(3)], T0_MS + 10_000 + i)
        for i, d in enumerate(bad_ids + good_ids)
    ]
    write_landing(landing, "r1", 0, rows)
    (landing / "landing-spark-output.parquet").mkdir()  # a folder with a landing-like name, empty
    (landing / "nested" / "deeper").mkdir(parents=True)  # a tree with nothing in it: one entry
    (landing / ".landing-r1-00000001.parquet.tmp").write_bytes(b"being written")
    (landing / "_wal").mkdir()
    (landing / "_wal" / "segment-0").write_bytes(b"wal")
    os.mkfifo(landing / "a-fifo")
    report = S.run_batch(spark, str(landing), str(tmp_path / "out"), S.JobOptions())

    assert report["quarantine"]["by_reason"] == {records.DEVICE_ID_INVALID: len(bad_ids)}
    rejected = spark.read.parquet(str(tmp_path / "out" / "quarantine")).collect()
    assert sorted(r.topic for r in rejected) == sorted(f"mqbatch/{d}/telemetry" for d in bad_ids)
    details = {r.topic.split("/")[1]: r.detail for r in rejected}
    assert "upper case" in details["Dev-A"] and "must start with a letter or digit" in details[".."]
    assert sorted(report["devices"]) == good_ids and report["records"]["unique"] == 6

    skipped = report["skipped_landing_entries"]
    assert skipped["count"] == 5
    assert skipped["by_reason"] == {"EMPTY_DIRECTORY": 2, "HIDDEN_NAME": 2, "NOT_A_REGULAR_FILE": 1}
    assert {(os.path.relpath(e["entry"], landing), e["reason"]) for e in skipped["entries"]} == {
        ("landing-spark-output.parquet", "EMPTY_DIRECTORY"),
        ("nested", "EMPTY_DIRECTORY"),
        (".landing-r1-00000001.parquet.tmp", "HIDDEN_NAME"),
        ("_wal", "HIDDEN_NAME"),
        ("a-fifo", "NOT_A_REGULAR_FILE"),
    }


def test_received_span_reads_any_timestamp_the_file_check_accepts(tmp_path):
    """The stream's look-back bound comes from the landing files' received_at on the driver
    (files.received_span). A file with zone-less nanoseconds next to one in UTC microseconds
    (both pass check_file) gives one span in UTC microseconds; comparing the two kinds of
    Python datetimes failed (TypeError) and would have stopped the stream at that batch."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from mqbatch.ingest import landing
    from mqbatch.spark import files

    base = landing.to_table([landing.Landed("mqbatch/dev-a/telemetry", b"\x00", [], received_at_us=5)], "r1", 0)
    at = base.schema.get_field_index("received_at")
    utc = base.set_column(at, "received_at", pa.array([2_000_000], pa.timestamp("us", tz="UTC")))
    naive = base.set_column(at, "received_at", pa.array([1_000_000_000], pa.timestamp("ns")))
    pq.write_table(utc, tmp_path / "a.parquet")
    pq.write_table(naive, tmp_path / "b.parquet")
    paths = [str(tmp_path / "a.parquet"), str(tmp_path / "b.parquet")]
    assert files.split_files(paths) == (paths, [])  # both readable landing files
    assert files.received_span(paths) == (1_000_000, 2_000_000)
    assert files.received_span([]) is None
