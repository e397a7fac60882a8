"""The batch job's shortcuts (mqbatch.spark.batch, issue 24: write once) against the pipeline's
definition: records/ = deduplicate(records(decoded)), quarantine/ = quarantine(decoded),
report.json = build_report(decoded), on landing zones that take each of its routes. The route
taken is checked too, so that a landing zone meant for a shortcut cannot pass by the long way."""

from __future__ import annotations

import pytest

from mqbatch.wire import codec
from mqbatch_testing.spark import T0_MS, health, landed, sample, write_landing

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
    write_landing(landing, "r1", 0, rows())
    opts = JobOptions(reorder_window=2, **options)
    taken = {"moved": 0, "decoded_again": 0, "derived": 0}

    def spy(name, fn):
        def wrapped(*a, **k):
            taken[name] += 1
            return fn(*a, **k)

        monkeypatch.setattr(batch, fn.__name__, wrapped)

    spy("moved", batch._move)
    spy("decoded_again", batch.job_decode)
    spy("derived", batch._record_outcomes)
    seconds: dict = {}
    got = batch.run_batch(spark, str(landing), str(tmp_path / "out"), opts, seconds)
    want, want_records, want_quarantine = _definition(spark, str(landing), opts)

    assert got.pop("skipped_landing_entries") == {"count": 0, "by_reason": {}, "entries": []}
    assert got == want
    order = ("device", "boot", "seq", "received_at", "sub_index")
    assert _rows(spark.read.parquet(str(tmp_path / "out" / "records")), *order) == _rows(want_records, *order)
    q_order = ("segment", "offset", "sub_index")
    assert _rows(spark.read.parquet(str(tmp_path / "out" / "quarantine")), *q_order) == _rows(want_quarantine, *q_order)
    assert (taken["moved"] == 1, taken["decoded_again"] == 1, taken["derived"] == 1) == route, taken
    assert list(seconds) == ["files.scan", "decode to records", "aggregates", "records/", "quarantine/", "build_report"]
    assert not (tmp_path / "out" / "_staging").exists()
    # the cases cover what they say: repeats where the route rewrites, quarantine where it decodes again
    assert (got["records"]["duplicates"] + got["records"]["key_collisions"] > 0) == (not route[0])
    assert (got["quarantine"]["rows"] > 0) == route[1]
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
