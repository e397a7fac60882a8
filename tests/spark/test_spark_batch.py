"""The batch job (run_batch) against the pipeline's definition: records/ =
deduplicate(records(decoded)), quarantine/ = quarantine(decoded), report.json =
build_report(decoded), on landing zones of each kind a job may meet: clean, a resend, a key
collision, quarantined rows, JSON records, a partial batch, a record without received_at,
an empty file."""

from __future__ import annotations

import dataclasses

import pytest

from mqbatch.wire import codec
from mqbatch_testing.spark import T0_MS, health, landed, sample, write_rows

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


# name: (rows, options)
CASES = {
    "clean": (_clean, {}),
    "resend": (_resend, {}),
    "collision": (_collision, {}),
    "quarantined": (_quarantined, {}),
    "json": (_json, {}),
    "partial": (_partial_batch, {"partial": True}),
    "no received_at": (_no_received_at, {}),
    "empty": (_empty, {}),
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


FLAGGED = "decode and flag copies (to staging)"  # run_batch's step when the decode pass flags the copies


@pytest.mark.parametrize("flagged", [False, True], ids=["keys apart", "flagged while decoding"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_batch_job_equals_the_pipelines_definition(spark, tmp_path, case, flagged, monkeypatch):
    """Both ways of de-duplicating: the keys apart (few devices), and the copies flagged in the
    decode pass (pipeline.flags_in_decode; with rows the Python decoders take, the keys apart
    after all)."""
    from mqbatch.spark import RECORD_COLUMNS, JobOptions, pipeline, run_batch

    monkeypatch.setattr(pipeline, "flags_in_decode", lambda spark, landed, *paths_and_rows: flagged)  # (tested below)
    rows, options = CASES[case]
    landing = tmp_path / "landing"
    write_rows(landing, rows())
    opts = JobOptions(reorder_window=2, **options)
    seconds: dict = {}
    got = run_batch(spark, str(landing), str(tmp_path / "out"), opts, seconds)
    want, want_records, want_quarantine = _definition(spark, str(landing), opts)
    python_rows = case in ("quarantined", "json", "partial", "no received_at")  # rows the fast path does not take
    assert (FLAGGED in seconds) == flagged, seconds
    assert ("deduplicate (keys)" in seconds) == (not flagged or python_rows), seconds

    assert got.pop("skipped_landing_entries") == {"count": 0, "by_reason": {}, "entries": []}
    assert got == want
    order = ("device", "boot", "seq", "received_at", "sub_index")
    records_dir = tmp_path / "out" / "records"
    if any(records_dir.rglob("*.parquet")):
        written = spark.read.parquet(str(records_dir)).select(*RECORD_COLUMNS, "date")
    else:  # an empty landing zone: no data file under records/ (nothing to infer a schema from)
        written = want_records.limit(0)
    assert _rows(written, *order) == _rows(want_records, *order)
    q_order = ("segment", "offset", "sub_index")
    assert _rows(spark.read.parquet(str(tmp_path / "out" / "quarantine")), *q_order) == _rows(want_quarantine, *q_order)
    assert not (tmp_path / "out" / "_staging").exists()
    if case == "clean":
        assert got["devices"]["dev-a"]["dropped_on_device"] == 7
    if case == "partial":
        assert got["batches"].get(codec.PARTIAL) == 1
    if case == "empty":
        assert want_records.count() == 0


@pytest.mark.parametrize("overwrite", ["static", "dynamic"])
def test_a_rerun_over_other_dates_replaces_records(spark, tmp_path, overwrite):
    """Batch outputs are overwritten: a second run over another landing zone (other dates)
    leaves only its own records/ (no date partition of the first run survives), also when
    the user's session sets spark.sql.sources.partitionOverwriteMode=dynamic (which keeps
    the partitions a write does not touch)."""
    from mqbatch.spark import JobOptions, run_batch

    key = "spark.sql.sources.partitionOverwriteMode"
    before = spark.conf.get(key)
    spark.conf.set(key, overwrite)
    try:
        out, opts = tmp_path / "out", JobOptions(reorder_window=2)
        write_rows(tmp_path / "day1", _clean())
        run_batch(spark, str(tmp_path / "day1"), str(out), opts)
        day1 = sorted(p.name for p in (out / "records").glob("date=*"))
        later = [dataclasses.replace(r, received_at_us=r.received_at_us + 3 * 86_400_000_000) for r in _clean()]
        write_rows(tmp_path / "day4", later)
        got = run_batch(spark, str(tmp_path / "day4"), str(out), opts)
    finally:
        spark.conf.set(key, before)
    day4 = sorted(p.name for p in (out / "records").glob("date=*"))
    assert day1 and day4 and not set(day4) & set(day1), (day1, day4)
    assert spark.read.parquet(str(out / "records")).count() == got["records"]["unique"] == 13
    assert not (out / "_staging").exists()


def test_the_decode_pass_flags_copies_without_a_shuffle_of_its_own(spark, tmp_path, monkeypatch):
    """run_batch's flagged staging rows: one Exchange in the plan, the landed rows' shuffle by
    topic alone (below the decoder), none for the window of _dedup_flags. Fails if the
    window's key does not start with the topic, or if run_batch does not shuffle the landed
    rows by topic (the decoded rows would be shuffled by the window's key instead)."""
    import re

    from mqbatch.spark import JobOptions, pipeline, run_batch

    write_rows(tmp_path / "landing", _resend())
    monkeypatch.setattr(pipeline, "flags_in_decode", lambda spark, landed, *paths_and_rows: True)
    real, plans = pipeline.staged_rows, []

    def spy(rows, part, flagging):
        staged = real(rows, part, flagging)
        plans.append((part, flagging, staged._jdf.queryExecution().executedPlan().toString()))
        return staged

    monkeypatch.setattr(pipeline, "staged_rows", spy)
    run_batch(spark, str(tmp_path / "landing"), str(tmp_path / "out"), JobOptions())
    assert [p[:2] for p in plans] == [(0, True)], plans
    plan = plans[0][2]
    assert plan.count("Exchange") == 1 and re.search(r"Exchange hashpartitioning\(topic#\d+, \d+\)", plan), plan
    assert "Window" in plan, plan


@pytest.mark.parametrize("counted", ["by a Spark job", "on the driver"])
def test_flags_in_decode_wants_many_topics_none_too_busy_and_the_fast_path(spark, monkeypatch, tmp_path, counted):
    """The decode pass flags the copies only with the JVM fast path, TOPICS_PER_PARTITION
    topics per partition (the larger of the shuffle partitions and the default parallelism)
    and no topic above a partition's share of the landed rows. The rows per topic counted by
    a Spark job (no local files), or on the driver from the local files' topic column, a
    topic's rows over two files, with no Spark job."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from mqbatch.spark import files, jvm, pipeline

    key = "spark.sql.shuffle.partitions"
    parts = max(int(spark.conf.get(key)), spark.sparkContext.defaultParallelism)
    need = pipeline.TOPICS_PER_PARTITION * parts
    made = iter(range(1000))

    def landed(n, busy=1):
        rows = [f"mqbatch/dev-{i}/telemetry" for i in range(n)] * 3 + ["mqbatch/dev-0/telemetry"] * 3 * (busy - 1)
        df = spark.createDataFrame([(t,) for t in rows], "topic string")
        if counted == "by a Spark job":
            return (df,)
        folder = tmp_path / f"landing-{next(made)}"
        folder.mkdir()
        rows, half = sorted(rows), len(rows) // 2  # each file holds some topics whole (dev-0 the first)
        for i, part in enumerate((rows[:half], rows[half:])):
            pq.write_table(pa.table({"topic": pa.array(part, pa.string())}), folder / f"{i}.parquet")
        return df, [str(f) for f in sorted(folder.iterdir())]

    sc = spark.sparkContext
    sc.setJobGroup(f"flags-{counted}", "test")
    try:
        assert pipeline.flags_in_decode(spark, *landed(need))
        assert not pipeline.flags_in_decode(spark, *landed(need - 1))
        assert not pipeline.flags_in_decode(spark, *landed(need * 2, busy=need * 2))  # one device: over half the rows
        assert not pipeline.flags_in_decode(spark, *landed(0))
        before = spark.conf.get(key)
        spark.conf.set(key, "1")  # fewer than the default parallelism: that counts
        try:
            assert not pipeline.flags_in_decode(spark, *landed(pipeline.TOPICS_PER_PARTITION * 1 + 2))
        finally:
            spark.conf.set(key, before)
        jobs = len(sc.statusTracker().getJobIdsForGroup(f"flags-{counted}"))
    finally:
        sc.setLocalProperty("spark.jobGroup.id", None)
    assert (jobs == 0) == (counted == "on the driver"), jobs
    if counted == "on the driver":  # more rows than the driver reads: a Spark job counts them, the same
        monkeypatch.setattr(files, "DRIVER_TOPIC_ROWS", 2)
        sc.setJobGroup("flags-many-rows", "test")
        try:
            assert pipeline.flags_in_decode(spark, *landed(need))
            assert not pipeline.flags_in_decode(spark, *landed(need - 1))
        finally:
            sc.setLocalProperty("spark.jobGroup.id", None)
        assert sc.statusTracker().getJobIdsForGroup("flags-many-rows")
    monkeypatch.setattr(jvm, "registered", lambda spark, name=None: False)  # no fast path: part 1's decoders
    assert not pipeline.flags_in_decode(spark, *landed(need * 2))


def test_the_launch_conf_is_read_once_and_keeps_what_the_user_set(spark, monkeypatch):
    """pipeline.launch_conf copies the SparkConf once per context (getConf() is ~40 py4j
    calls, and the stream sized its batches three times per micro-batch), and a setting the
    user made at launch still wins: the test session's spark.sql.shuffle.partitions is not
    re-sized (a runtime value stays as it is)."""
    from mqbatch.spark import JobOptions, pipeline

    sc_type = type(spark.sparkContext)
    real, calls = sc_type.getConf, []
    monkeypatch.setattr(sc_type, "getConf", lambda self: calls.append(1) or real(self))
    monkeypatch.delattr(spark.sparkContext, "_mqbatch_launch_conf", raising=False)
    key = "spark.sql.shuffle.partitions"
    assert "spark.sql.shuffle.partitions" in pipeline.launch_conf(spark)  # (the fixture sets it)
    spark.conf.set(key, "3")
    try:
        for _ in range(3):
            pipeline.size_shuffle(spark, [])
            pipeline.size_arrow_batches(spark, JobOptions())
        assert spark.conf.get(key) == "3"
    finally:
        spark.conf.set(key, "2")
    assert len(calls) == 1


def _fleet(seed=5):
    """Eight devices, up to three boots each, PUBLISHes of 1-5 records in a shuffled order, some
    landed again later (resends), latencies spread over seconds, unsynchronised samples, health
    records with dropped_total and released_unconfirmed (0x87) readings, a key collision."""
    import random

    from mqbatch.wire import records

    rng = random.Random(seed)
    rows = []
    for d in range(8):
        topic = f"mqbatch/dev-{d}/telemetry"
        for boot in range(1, rng.randint(2, 4)):
            seqs = rng.sample(range(60), rng.randint(5, 40))
            for i in range(0, len(seqs), 5):
                subs = []
                for seq in seqs[i : i + rng.randint(1, 5)]:
                    if rng.random() < 0.2:
                        readings = [(0x82, rng.randint(0, 9)), (0x87, rng.randint(0, 30))]
                        subs.append(records.encode_binary("health", boot, seq, _at(boot, seq), readings))
                    else:
                        subs.append(sample(boot, seq, synced=rng.random() < 0.8)[0])
                rows.append(landed(topic, subs, _at(boot, seqs[i]) + rng.randint(0, 20_000)))
                if rng.random() < 0.2:  # a resend of the same PUBLISH
                    rows.append(dataclasses.replace(rows[-1], received_at_us=rows[-1].received_at_us + 7_000_000))
    rows.append(_batch("mqbatch/dev-0/telemetry", 1, [3], late_ms=9000, temperature=999))  # a collision (or not)
    return rows


@pytest.mark.parametrize("case", sorted(CASES) + ["fleet"])
def test_the_reports_one_jvm_pass_equals_its_three_spark_aggregates(spark, tmp_path, monkeypatch, case):
    """build_report with the JVM (per-boot figures, each boot's released and each device's
    latency percentiles in one pass: pipeline._boot_figures(by_device=True)) gives the same
    report as without it (boot_quality in Python workers, latency_percentiles and
    released_per_boot as Spark aggregates), and runs fewer Spark jobs."""
    from mqbatch.spark import JobOptions, files, jvm, pipeline

    rows, options = CASES[case] if case in CASES else (_fleet, {})
    write_rows(tmp_path / "landing", rows())
    paths, bad = files.scan(str(tmp_path / "landing"))
    opts = JobOptions(reorder_window=5, **options)
    decoded = pipeline.job_decode(spark, pipeline.read_landing(spark, paths), opts).persist()
    sc = spark.sparkContext
    try:
        decoded.count()
        jobs = {}
        reports = {}
        for way in ("jvm", "spark"):
            if way == "spark":
                monkeypatch.setattr(jvm, "registered", lambda spark, name=None: False)
            sc.setJobGroup(f"report-{case}-{way}", "test")
            try:
                reports[way] = pipeline.build_report(decoded, opts, bad_files=bad)
            finally:
                sc.setLocalProperty("spark.jobGroup.id", None)
            jobs[way] = len(sc.statusTracker().getJobIdsForGroup(f"report-{case}-{way}"))
    finally:
        decoded.unpersist()
    assert reports["jvm"] == reports["spark"]
    assert jobs["jvm"] < jobs["spark"], jobs
    if case == "fleet":
        devices = reports["jvm"]["devices"]
        assert sum(d["latency_ms"] is not None for d in devices.values()) == 8, devices
        assert sum(d["accounting"]["released_unconfirmed"] for d in devices.values()) > 0
        assert reports["jvm"]["records"]["duplicates"] > 0
        assert sum(d["out_of_order"] for d in devices.values()) > 0
