"""The batch job's shortcuts (mqbatch.spark.batch, issue 24: write once) against the pipeline's
definition: records/ = deduplicate(records(decoded)), quarantine/ = quarantine(decoded),
report.json = build_report(decoded), on landing zones that take each of its routes. The route
taken is checked too, so that a landing zone meant for a shortcut cannot pass by the long way."""

from __future__ import annotations

import dataclasses

import pytest
from test_jvm_decode import write_rows

from mqbatch.wire import codec
from mqbatch_testing.spark import T0_MS, health, landed, sample

pytestmark = pytest.mark.spark

A, B = "mqbatch/dev-a/telemetry", "mqbatch/dev-b/telemetry"


def _at(boot, seq):
    return T0_MS + boot * 100_000 + seq * 1000


def _batch(topic, boot, seqs, late_ms=300, fmt="binary", temperature=2150):
    subs = [sample(boot, s, fmt=fmt, temperature=temperature)[0] for s in seqs]
    return landed(topic, subs, _at(boot, seqs[-1]) + late_ms)


def _clean():
    """Two devices, two boots, in order, one health record with dropped_total: every record
    valid, no key twice."""
    return [
        _batch(A, 1, [0, 1, 2]),
        _batch(B, 4, [0, 1]),
        _batch(A, 1, [3, 4]),
        landed(A, [sample(2, 0)[0], health(2, 1, 7)[0]], _at(2, 1) + 300),
        _batch(B, 4, [2, 3, 4, 5]),
    ]


def _resend():  # a batch landed twice (a resend after a lost PUBACK): one (device, boot) repeats
    rows = _clean()
    return rows + [landed(A, [], _at(1, 4) + 5000, props=rows[2].user_properties, payload=rows[2].payload)]


def _collision():  # the same key with another content (a device that reused its seqs): both kept
    return _clean() + [_batch(B, 4, [1], late_ms=9000, temperature=999)]


def _quarantined():  # a bad topic and a bad record among valid ones: a second decode pass
    bad_record = landed(A, [sample(3, 0)[0], b"\x09junk"], _at(3, 0) + 300)
    return _clean() + [_batch("not/telemetry", 1, [9]), bad_record]


def _json():  # records the Python decoders take (JSON), valid, no repeat
    return [_batch(A, 1, [0, 1], fmt="json"), _batch(A, 1, [2, 3]), _batch(B, 2, [0], fmt="json")]


def _no_received_at():  # a valid record whose landed row has no received_at (another writer's file)
    rows = _clean()
    return rows + [dataclasses.replace(_batch(A, 1, [5, 6]), received_at_us=None)]


def _empty():  # a landing file of no rows
    return []


def _partial_batch():
    """A batch whose batch-size says 3 but holds 2 records: with JobOptions(partial=True) its
    records are kept with batch status `partial`, which outcome rows derived from records/
    cannot know (the long way for the outcomes)."""
    short = landed(
        B,
        [],
        _at(5, 1) + 300,
        props=[("batch-format", "v1"), ("batch-size", "3")],
        payload=codec.encode_payload([sample(5, 0)[0], sample(5, 1)[0]]),
    )
    return _clean() + [short]


# name: (rows, options, route): route = (records/ moved into place, decoded again, outcomes derived)
CASES = {
    "clean": (_clean, {}, (True, False, True)),
    "resend": (_resend, {}, (False, False, True)),
    "collision": (_collision, {}, (False, False, True)),
    "quarantined": (_quarantined, {}, (True, True, True)),
    "json": (_json, {}, (True, False, True)),
    "partial": (_partial_batch, {"partial": True}, (True, True, False)),
    "no received_at": (_no_received_at, {}, (True, False, True)),
    "empty": (_empty, {}, (True, False, True)),
}


def _rows(df, *order):
    if "date" in df.columns:  # a partition column: read back from records/ as a date
        df = df.withColumn("date", df["date"].cast("string"))
    return [r.asDict(recursive=True) for r in df.orderBy(*order).collect()]


def _definition(spark, landing, opts):
    """What the batch job must produce, by the pipeline's plain steps (no shortcut)."""
    from mqbatch.spark import files, pipeline

    paths, bad = files.scan(landing)
    decoded = pipeline.job_decode(spark, pipeline.read_landing(spark, paths), opts)
    report = pipeline.build_report(decoded, opts, bad_files=bad)
    recs = pipeline.record_output(pipeline.deduplicate(pipeline.records(decoded)))
    return report, recs, pipeline.quarantine(decoded)


@pytest.mark.parametrize("case", sorted(CASES))
def test_batch_job_equals_the_pipelines_definition_on_each_route(spark, tmp_path, monkeypatch, case):
    from mqbatch.spark import JobOptions, batch

    rows, options, route = CASES[case]
    landing = tmp_path / "landing"
    write_rows(landing, rows())
    opts = JobOptions(reorder_window=2, **options)
    taken = {"moved": 0, "decoded_again": 0, "derived": 0}

    def spy(name, fn):
        def wrapped(*a, **k):
            taken[name] += 1
            return fn(*a, **k)

        monkeypatch.setattr(batch, fn.__name__, wrapped)

    decode_to = batch.job_decode_to

    def counting_parts(*a, **k):
        taken["python"] = decode_to(*a, **k)["python"]

    monkeypatch.setattr(batch, "job_decode_to", counting_parts)
    spy("moved", batch._move)
    spy("decoded_again", batch.job_decode)
    spy("derived", batch._record_outcomes)
    seconds: dict = {}
    got = batch.run_batch(spark, str(landing), str(tmp_path / "out"), opts, seconds)
    want, want_records, want_quarantine = _definition(spark, str(landing), opts)

    assert got.pop("skipped_landing_entries") == {"count": 0, "by_reason": {}, "entries": []}
    assert got == want
    order = ("device", "boot", "seq", "received_at", "sub_index")
    # (with records/'s schema: an empty landing zone leaves no data file to infer it from, as before)
    written = batch._read_records(spark, str(tmp_path / "out" / "records"))
    assert _rows(written, *order) == _rows(want_records, *order)
    q_order = ("segment", "offset", "sub_index")
    assert _rows(spark.read.parquet(str(tmp_path / "out" / "quarantine")), *q_order) == _rows(want_quarantine, *q_order)
    assert (taken["moved"] == 1, taken["decoded_again"] == 1, taken["derived"] == 1) == route, taken
    assert list(seconds) == ["files.scan", "decode to records", "aggregates", "records/", "quarantine/", "build_report"]
    assert not (tmp_path / "out" / "_staging").exists()
    # the cases cover what they say: repeats where the route rewrites, quarantine where it decodes again
    assert (got["records"]["duplicates"] + got["records"]["key_collisions"] > 0) == (not route[0])
    assert (got["quarantine"]["rows"] > 0) == route[1]
    if case in ("json", "no received_at", "partial"):  # a second part, the Python decoders' rows, was written
        assert taken["python"], taken
    if case == "clean":
        assert got["devices"]["dev-a"]["dropped_on_device"] == 7  # read from the readings of records/
    if case == "partial":
        assert got["batches"].get(codec.PARTIAL) == 1


def test_records_whose_outcome_rows_cannot_be_derived_are_counted_not_plain(spark):
    """The guard of the derived outcome rows (batch._counts): a valid record whose landed_first
    is not "sub-message 0", whose batch status is not ok, or that has a stage sends the job the
    long way; today's decoders give such rows only with partial=True (the route test above)."""
    from pyspark.sql import Observation

    from mqbatch.spark import DECODED_SCHEMA, batch

    def row(landed_first, sub_index, status=codec.OK, stage=None, reason=None):
        values = dict.fromkeys(DECODED_SCHEMA.fieldNames())
        values.update(landed_first=landed_first, sub_index=sub_index, batch_status=status, stage=stage, reason=reason)
        return values

    rows = [
        row(True, 0),  # plain
        row(False, 3),  # plain
        row(False, 0),  # sub-message 0 but not the landed row's first row
        row(True, 2),  # the landed row's first row but not sub-message 0
        row(True, 0, status=codec.PARTIAL),
        row(False, 1, stage="record"),
        row(True, None, status=codec.DISCARDED, stage="batch", reason="MALFORMED_BATCH_COUNT_MISMATCH"),  # not a record
    ]
    observation = Observation("counts")
    spark.createDataFrame(rows, DECODED_SCHEMA).observe(observation, *batch._counts()).collect()
    assert observation.get == {"rows": 7, "records": 6, "not_plain": 4}


def test_counts_spark_does_not_deliver_send_the_job_the_long_way(spark, tmp_path, monkeypatch):
    """Without the decode pass's counts (a dropped listener event: observed() gives None after
    its wait) nothing is derived: the landing zone is decoded again for every outcome row."""
    from mqbatch.spark import JobOptions, batch

    write_rows(tmp_path / "landing", _clean())
    monkeypatch.setattr(batch, "observed", lambda observation: None)
    again = []
    decode = batch.job_decode
    monkeypatch.setattr(batch, "job_decode", lambda *a, **k: again.append(1) or decode(*a, **k))
    opts = JobOptions(reorder_window=2)
    got = batch.run_batch(spark, str(tmp_path / "landing"), str(tmp_path / "out"), opts)
    got.pop("skipped_landing_entries")
    assert again == [1] and got == _definition(spark, str(tmp_path / "landing"), opts)[0]


def test_a_rerun_replaces_records_and_ignores_what_a_killed_run_staged(spark, tmp_path):
    """Batch outputs are overwritten: a second run over another landing zone (other dates)
    leaves only its own records/, also when it moves its staged files into place (the route
    without repeats); files a killed run left in _staging/records never reach records/, also
    when the session overwrites partitions dynamically (a user's setting: Spark then keeps
    the date partitions a write does not replace)."""
    from mqbatch.spark import JobOptions, batch

    key = "spark.sql.sources.partitionOverwriteMode"
    before = spark.conf.get(key)
    spark.conf.set(key, "dynamic")
    try:
        _rerun(spark, tmp_path, batch, JobOptions)
    finally:
        spark.conf.set(key, before)


def _rerun(spark, tmp_path, batch, JobOptions):

    out, opts = tmp_path / "out", JobOptions(reorder_window=2)
    write_rows(tmp_path / "day1", _clean())
    batch.run_batch(spark, str(tmp_path / "day1"), str(out), opts)
    day1 = sorted(p.name for p in (out / "records").glob("date=*"))
    stale = out / "_staging" / "records" / "date=1999-01-01"  # as a killed run leaves it
    stale.mkdir(parents=True)
    (stale / "part-stale.parquet").write_bytes(next((out / "records").glob("date=*/*.parquet")).read_bytes())
    later = [dataclasses.replace(r, received_at_us=r.received_at_us + 3 * 86_400_000_000) for r in _clean()]
    write_rows(tmp_path / "day4", later)
    got = batch.run_batch(spark, str(tmp_path / "day4"), str(out), opts)
    day4 = sorted(p.name for p in (out / "records").glob("date=*"))
    assert day4 and not set(day4) & set(day1 + ["date=1999-01-01"]), (day1, day4)
    assert spark.read.parquet(str(out / "records")).count() == got["records"]["unique"] == 13
    assert not (out / "_staging").exists()


def test_a_failed_move_keeps_the_earlier_records(spark, tmp_path):
    """batch._move renames the old records/ aside first: a rename that fails puts it back."""
    from mqbatch.spark import batch

    old, new = tmp_path / "records", tmp_path / "_staging" / "records"
    old.mkdir()
    (old / "kept").write_text("earlier")
    with pytest.raises(OSError, match=r"could not move .* \(the earlier .* is kept\)"):
        batch._move(spark, str(new), str(old))  # nothing staged: the rename fails
    assert (old / "kept").read_text() == "earlier"
    new.mkdir(parents=True)
    (new / "part").write_text("new")
    batch._move(spark, str(new), str(old))
    assert sorted(p.name for p in old.iterdir()) == ["part"] and not new.exists()
