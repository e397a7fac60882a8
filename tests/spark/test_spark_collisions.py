"""Issue 23: the job never drops a record as a duplicate when its content differs from the
record it keeps. A flipped bit in a device's boot counter made a reboot reuse its boot
number: the job kept the older records and removed the newer ones as "duplicates".
Now a record is a duplicate only when its (device, boot, seq) AND its content
(pipeline.content_hash: format, kind, synced, device time, readings; for a binary record
exactly its bytes) equal a kept one; a key collision (same key, other content) is kept in
records/ and counted per device (`key_collisions`) and in the totals."""

from __future__ import annotations

import datetime
import json
import os
import pathlib
import shutil

import pytest
from pyspark.sql import functions as F

from mqbatch.wire import records
from mqbatch_testing.spark import T0_MS, landed, sample, write_landing

pytestmark = pytest.mark.spark
A, B = "mqbatch/dev-a/telemetry", "mqbatch/dev-b/telemetry"


def rec(boot, seq, t_ms, temperature):
    return records.encode_binary("sample", boot, seq, t_ms, [(1, temperature), (3, 3300)])


# -- the smallest case: one collision, one duplicate ----------------------------------------


def small_landing(directory):
    """Two landing files. dev-a boot 1 seq 0 arrives twice with other readings (a collision),
    seq 1 twice with the same bytes (a resend: a duplicate)."""
    first = [rec(1, 0, T0_MS, 2000), rec(1, 1, T0_MS + 1000, 2001)]
    other = rec(1, 0, T0_MS, 2500)  # same key as first[0], other temperature
    write_landing(directory, "r1", 0, [landed(A, first, T0_MS + 5_000)])
    write_landing(directory, "r1", 1, [landed(A, [other], T0_MS + 9_000), landed(A, [first[1]], T0_MS + 9_001)])


def check_small(report, spark, out):
    a = report["devices"]["dev-a"]
    assert (a["received"], a["unique"], a["duplicates"], a["key_collisions"]) == (4, 3, 1, 1)
    assert report["records"] == {"received": 4, "unique": 3, "duplicates": 1, "key_collisions": 1}
    assert (a["missing"], a["pending_gaps"], a["out_of_order"], a["boots"]) == (0, 0, 0, 1)
    rows = spark.read.parquet(str(out / "records")).collect()
    assert sorted((r.seq, r.readings[0].value) for r in rows) == [(0, 2000), (0, 2500), (1, 2001)]
    assert json.loads((out / "report.json").read_text()) == report


def test_a_key_collision_is_kept_and_counted_a_resend_is_a_duplicate(spark, tmp_path):
    import mqbatch.spark as S

    small_landing(tmp_path / "landing")
    report = S.run_batch(spark, str(tmp_path / "landing"), str(tmp_path / "out"), S.JobOptions())
    check_small(report, spark, tmp_path / "out")


def test_the_check_fails_for_a_dedup_on_the_key_alone(spark, tmp_path, monkeypatch):
    """The instrument can fail: with every record's content hash equal (de-duplication on
    (device, boot, seq) only, main before this fix) the collision is dropped as a duplicate."""
    import mqbatch.spark as S
    from mqbatch.spark import pipeline

    monkeypatch.setattr(pipeline, "content_hash", lambda: F.lit(0).cast("long"))
    small_landing(tmp_path / "landing")
    report = S.run_batch(spark, str(tmp_path / "landing"), str(tmp_path / "out"), S.JobOptions())
    assert report["records"] == {"received": 4, "unique": 2, "duplicates": 2, "key_collisions": 0}
    with pytest.raises(AssertionError):
        check_small(report, spark, tmp_path / "out")


# -- the case: a reboot reused boot 5, plus resends, across micro-batches -------------


def reboot_landing(directory):
    """dev-a boot 5: seqs 0..99 (file 0); then the reboot that reused boot 5: seqs 0..81 with
    other times and values (file 1), and resends: 10 records of the first boot and 5 of the
    second landed again. dev-b: 20 records, 3 of them resent, no collision."""
    first = [rec(5, s, T0_MS + s * 1000, 2000 + s) for s in range(100)]
    second = [rec(5, s, T0_MS + 3_600_000 + s * 1000, 1500 + s) for s in range(82)]
    b = [sample(1, s)[0] for s in range(20)]
    file0 = [landed(A, first[i : i + 10], T0_MS + 100_000 + i) for i in range(0, 100, 10)]
    file0 += [landed(B, b, T0_MS + 30_000)]
    file1 = [landed(A, second[i : i + 10], T0_MS + 3_700_000 + i) for i in range(0, 82, 10)]
    file1 += [landed(A, first[40:50], T0_MS + 3_800_000), landed(A, second[0:5], T0_MS + 3_800_001)]
    file1 += [landed(B, b[5:8], T0_MS + 3_800_002)]
    write_landing(directory, "r1", 0, file0)
    write_landing(directory, "r1", 1, file1)


def check_reboot(report, spark, out):
    a, b = report["devices"]["dev-a"], report["devices"]["dev-b"]
    assert (a["received"], a["unique"], a["duplicates"], a["key_collisions"]) == (197, 182, 15, 82)
    assert (b["received"], b["unique"], b["duplicates"], b["key_collisions"]) == (23, 20, 3, 0)
    assert report["records"] == {"received": 220, "unique": 202, "duplicates": 18, "key_collisions": 82}
    assert (a["missing"], a["pending_gaps"], a["boots"]) == (0, 0, 1)  # seqs 0..99 all arrived, once counted
    rows = spark.read.parquet(str(out / "records")).where("device = 'dev-a'").collect()
    assert len(rows) == 182
    seq3 = sorted(r.device_time for r in rows if r.seq == 3)
    assert len(seq3) == 2 and seq3[1] - seq3[0] == datetime.timedelta(hours=1)
    assert {r.readings[0].value for r in rows if r.seq == 3} == {2003, 1503}  # both contents kept
    assert json.loads((out / "report.json").read_text()) == report


def arrive(source, landing) -> None:
    """A recorder's landing file appears in `landing` whole (copied under a hidden name, then
    renamed), as the stream expects of a new file."""
    landing.mkdir(exist_ok=True)
    shutil.copy(source, landing / ".tmp")
    os.replace(landing / ".tmp", landing / source.name)


def test_stream_keeps_both_records_of_a_key_collision_across_micro_batches(spark, tmp_path):
    """The colliding records arrive in a later micro-batch than the records they collide with
    (the stream compares them with records/ already written)."""
    import mqbatch.spark as S

    reboot_landing(tmp_path / "all")
    landing, out = tmp_path / "landing", tmp_path / "out"
    arrive(tmp_path / "all" / "landing-r1-00000000.parquet", landing)
    S.run_stream(spark, str(landing), str(out), S.JobOptions())
    arrive(tmp_path / "all" / "landing-r1-00000001.parquet", landing)
    report = S.run_stream(spark, str(landing), str(out), S.JobOptions())
    assert len(list((out / "_batches").glob("*.json"))) == 2
    check_reboot(report, spark, out)
    batch = S.run_batch(spark, str(tmp_path / "all"), str(tmp_path / "batch"), S.JobOptions())
    check_reboot(batch, spark, tmp_path / "batch")


def _with_every_reading(decoded_rows):
    """stream._decoded_rows as mqbatch before 2026-11-27 wrote them: every reading kept."""

    def rows(decoded):
        every = decoded_rows(decoded.withColumn("_every", F.col("readings")))
        return every.withColumn("readings", F.col("_every")).drop("_every")

    return rows


def _as_an_older_mqbatch_wrote_it(out):
    """The stream's outputs as mqbatch before the narrow look-back left them: commits without
    stream.KEYED and _decoded/ files without the content column (rewritten in place), and
    no seen state."""
    import pyarrow.parquet as pq

    from mqbatch.spark import seen, stream
    from mqbatch.spark.pipeline import CONTENT

    for commit in (out / "_batches").glob("*.json"):
        data = json.loads(commit.read_text())
        assert data.pop(stream.KEYED) is True  # (this code marks every batch it commits)
        assert data.pop(seen.SEEN_FROM) is not None  # nor a seen state (mqbatch.spark.seen)
        assert data.pop(seen.SEEN_MARKS) is not None  # nor its marks
        commit.write_text(json.dumps(data))
    shutil.rmtree(out / stream.SEEN)
    for f in (out / "_decoded").rglob("*.parquet"):
        table = pq.read_table(f)
        assert CONTENT in table.column_names
        pq.write_table(table.drop_columns([CONTENT]), f)


@pytest.mark.parametrize("older", [False, True], ids=["this-version", "after-an-upgrade"])
def test_stream_finds_earlier_copies_in_decoded_or_in_records_of_an_older_version(spark, tmp_path, monkeypatch, older):
    """A later micro-batch looks for earlier copies of its records in the narrow content
    column of _decoded/ (commits marked KEYED); a batch an older mqbatch committed has no such
    column, and its records/ files are hashed instead: either way the resends of the second
    file are dropped and both records of each collision kept (check_reboot). The instrument
    fails: with the fallback to records/ left out, the older batch's copies are not found."""
    import mqbatch.spark as S
    from mqbatch.spark import stream

    reboot_landing(tmp_path / "all")
    landing, out = tmp_path / "landing", tmp_path / "out"
    arrive(tmp_path / "all" / "landing-r1-00000000.parquet", landing)
    if older:  # an older mqbatch kept every reading in _decoded/
        with monkeypatch.context() as m:
            m.setattr(stream, "_decoded_rows", _with_every_reading(stream._decoded_rows))
            S.run_stream(spark, str(landing), str(out), S.JobOptions())
        _as_an_older_mqbatch_wrote_it(out)
    else:
        S.run_stream(spark, str(landing), str(out), S.JobOptions())
    arrive(tmp_path / "all" / "landing-r1-00000001.parquet", landing)
    report = S.run_stream(spark, str(landing), str(out), S.JobOptions())
    check_reboot(report, spark, out)
    commits = [json.loads(c.read_text()) for c in sorted((out / "_batches").glob("*.json"))]
    # the first batch read back through its records/ (older) or its _decoded/ content column
    assert [bool(c.get(stream.KEYED)) for c in commits] == [not older, True]
    assert commits[1].get("seen_from_us") is not None  # after an upgrade: the state built anew


def _spy_look_back(monkeypatch):
    """The committed batches each _look_back call opened (their bN tags), one list per call."""
    from mqbatch.spark import stream

    looked: list[list[str]] = []
    real = stream._look_back

    def spy(out, since_us, from_batch=0):
        narrow, old = real(out, since_us, from_batch)
        looked.append(sorted({pathlib.Path(f).name[:11] for f in narrow + old}))
        return narrow, old

    monkeypatch.setattr(stream, "_look_back", spy)
    return looked


def _stream_files(spark, tmp_path, files, after=lambda i: None):
    """Each list of landed rows arrives as one landing file and one micro-batch (after(i)
    is called when micro-batch i is done); returns out."""
    import mqbatch.spark as S

    landing, out = tmp_path / "landing", tmp_path / "out"
    for i, rows in enumerate(files):
        write_landing(tmp_path / "all", "r1", i, rows)
        arrive(tmp_path / "all" / f"landing-r1-{i:08d}.parquet", landing)
        S.run_stream(spark, str(landing), str(out), S.JobOptions())
        after(i)
    return out


def test_stream_looks_back_as_far_as_the_watermark_and_opens_no_older_batch(spark, tmp_path, monkeypatch):
    """A copy received more than --watermark (1 hour) after the earlier ones is not looked
    for (kept again: the bound the watermark buys); one within it is dropped. A micro-batch
    opens the files of no committed batch whose latest landed row is older than its bound
    (received_max_us in the commit): batch 2 reads only batch 1's. Batch 0 (nothing before
    it) and batch 1 (whose only earlier arrival landed 2 h before) do not look back at all
    (the seen state: mqbatch.spark.seen)."""
    looked = _spy_look_back(monkeypatch)
    r0, r1 = rec(1, 0, T0_MS, 2000), rec(1, 1, T0_MS + 1000, 2001)
    hour = 3_600_000
    files = [
        [landed(A, [r0], T0_MS + 5_000)],
        [landed(A, [r0, r1], T0_MS + 5_000 + 2 * hour)],  # r0 again, 2 h later: beyond the watermark
        [landed(A, [r0, r1], T0_MS + 5_000 + 2 * hour + hour // 2)],  # both again, 30 min later
    ]
    out = _stream_files(spark, tmp_path, files)
    rows = spark.read.parquet(str(out / "records")).collect()
    assert sorted(r.seq for r in rows) == [0, 0, 1]  # r0 kept twice (2 h apart), r1 once
    assert looked == [["b0000000001"]]  # batch 2 only, and only batch 1 of the two before it


def test_stream_looks_back_only_when_a_record_may_be_a_copy_and_then_as_far_as_any(spark, tmp_path, monkeypatch):
    """A micro-batch whose records all have seqs above those its devices sent before cannot
    hold a copy: it opens no earlier batch (the look-back's cost grows with the history).
    A resend of a record two batches old is still found: the seen state holds every committed
    batch's keys, not the last one's (dev-b sent nothing in batch 1: a state of the last batch
    only keeps its copy, and the instrument fails), and the batch that may hold a copy opens
    both earlier batches."""
    looked = _spy_look_back(monkeypatch)
    r = [rec(1, s, T0_MS + 1000 * s, 2000 + s) for s in range(4)]
    out = _stream_files(
        spark,
        tmp_path,
        [
            [landed(A, r[:2], T0_MS + 5_000), landed(B, [r[0]], T0_MS + 5_000)],
            [landed(A, r[2:], T0_MS + 9_000)],  # seqs above: no copy possible
            [landed(B, [r[0]], T0_MS + 12_000)],  # a resend of dev-b's record of batch 0
        ],
    )
    assert looked == [["b0000000000", "b0000000001"]]  # batch 2 only
    rows = spark.read.parquet(str(out / "records")).collect()
    assert sorted((r.device, r.seq) for r in rows) == [("dev-a", s) for s in range(4)] + [("dev-b", 0)]
    report = json.loads((out / "report.json").read_text())
    assert report["records"]["duplicates"] == 1
    assert len(list((out / "_seen").iterdir())) == 1  # the newest commit's state only


def test_stream_looks_back_for_a_late_file_beyond_what_the_seen_state_covers(spark, tmp_path, monkeypatch):
    """The state forgets a (device, boot) whose last arrival is older than the watermark
    (it stays one row per active device). A late landing file whose rows landed before that
    (its look-back reaches further back than the state covers) looks back: its copy of
    dev-b's record is found in batch 0. Trusting the state there keeps the copy. That batch
    builds the state anew from what it read, so a later resend of dev-a's record is found."""
    looked = _spy_look_back(monkeypatch)
    hour = 3_600_000
    b0, a0 = rec(1, 0, T0_MS, 2000), rec(1, 0, T0_MS + 2 * hour, 2100)
    out = _stream_files(
        spark,
        tmp_path,
        [
            [landed(B, [b0], T0_MS + 5_000)],
            [landed(A, [a0], T0_MS + 2 * hour + 5_000)],  # dev-b's row leaves the state
            [landed(B, [b0], T0_MS + hour // 2)],  # a late file: dev-b's resend landed 30 min after b0
            [landed(A, [a0], T0_MS + 2 * hour + 9_000)],  # dev-a's resend: only batch 2's look-back saw a0
        ],
    )
    # batch 2, back to batch 0; batch 3 through the state batch 2 built from its look-back
    # (a state built from batch 2's own records only keeps a0's copy: the instrument fails)
    assert looked == [["b0000000000", "b0000000001"], ["b0000000001"]]
    rows = spark.read.parquet(str(out / "records")).collect()
    assert sorted((r.device, r.seq) for r in rows) == [("dev-a", 0), ("dev-b", 0)]


def test_stream_deduplicates_within_a_micro_batch_only_when_two_arrivals_share_a_key(spark, tmp_path, monkeypatch):
    """De-duplication sorts a micro-batch by key (a shuffle): a batch whose arrivals all have
    keys of their own skips it; one with a resend inside it drops the resend (the test fails
    if every batch is de-duplicated, and, with the check always saying "no repeat", on the
    copy kept)."""
    from mqbatch.spark import stream

    calls = []
    real = stream.deduplicate
    monkeypatch.setattr(stream, "deduplicate", lambda arrivals: calls.append(1) or real(arrivals))
    r = [rec(1, s, T0_MS + 1000 * s, 2000 + s) for s in range(3)]
    files = [[landed(A, r[:2], T0_MS + 5_000)], [landed(A, [r[2]], T0_MS + 9_000), landed(A, [r[2]], T0_MS + 9_500)]]
    out = _stream_files(spark, tmp_path, files, after=lambda i: calls.append(f"batch {i}"))
    assert calls == ["batch 0", 1, "batch 1"]  # batch 1 only
    rows = spark.read.parquet(str(out / "records")).collect()
    assert sorted(r.seq for r in rows) == [0, 1, 2]


def test_a_resend_is_compared_only_with_earlier_arrivals_of_its_device_boot_and_seqs(spark, tmp_path, monkeypatch):
    """A micro-batch that may hold a copy reads the history's files, but joins only the earlier
    arrivals of its suspect (device, boot)s within their seqs lo..hi (seen.suspects): a resend
    of dev-a's boot-1 seqs 2..7 (landed over batches 0 and 1) and a key collision in each of
    dev-a's boots. dev-b's new seqs, above what it sent, are no suspect. Every copy is found,
    both collisions kept. Fails with a range narrower than the batch's seqs (copies kept), and
    if the filter is not applied (the 19 earlier arrivals joined instead of 7)."""
    from mqbatch.spark import stream

    seen_by_filter = []
    real = stream._of_suspects

    def spy(spark_, earlier, suspects):
        rows = real(spark_, earlier, suspects)
        seen_by_filter.append((sorted(zip(*suspects.to_pydict().values())), rows.count()))
        return rows

    monkeypatch.setattr(stream, "_of_suspects", spy)
    a1 = [rec(1, s, T0_MS + 1000 * s, 2000 + s) for s in range(10)]
    a2 = [rec(2, s, T0_MS + 20_000 + 1000 * s, 2100 + s) for s in range(3)]
    b1 = [rec(1, s, T0_MS + 1000 * s, 2200 + s) for s in range(8)]
    out = _stream_files(
        spark,
        tmp_path,
        [
            [landed(A, a1[:6], T0_MS + 6_000), landed(B, b1[:6], T0_MS + 6_000), landed(A, a2, T0_MS + 23_000)],
            [landed(A, a1[6:], T0_MS + 30_000)],
            [
                landed(A, a1[2:8], T0_MS + 40_000),  # the resend: seqs 2..7
                landed(A, [rec(1, 3, T0_MS + 3000, 9003)], T0_MS + 40_000),  # a collision: seq 3, other content
                landed(A, [rec(2, 1, T0_MS + 21_000, 9101)], T0_MS + 40_000),  # a collision in boot 2
                landed(B, b1[6:], T0_MS + 40_000),  # new seqs: no suspect
            ],
        ],
    )
    assert seen_by_filter == [([("dev-a", 1, 2, 7, 0), ("dev-a", 2, 1, 1, 0)], 7)]  # (from batch 0: within a minute)
    rows = spark.read.parquet(str(out / "records")).collect()
    got = sorted((r.device, r.boot, r.seq, r.readings[0].value) for r in rows)
    want = sorted(
        [("dev-a", 1, s, 2000 + s) for s in range(10)]
        + [("dev-a", 1, 3, 9003)]
        + [("dev-a", 2, s, 2100 + s) for s in range(3)]
        + [("dev-a", 2, 1, 9101)]
        + [("dev-b", 1, s, 2200 + s) for s in range(8)]
    )
    assert got == want
    report = json.loads((out / "report.json").read_text())
    assert (report["records"]["duplicates"], report["records"]["key_collisions"]) == (6, 2)


def test_a_recent_resend_looks_back_from_a_mark_an_old_one_over_the_watermark(spark, tmp_path, monkeypatch):
    """Micro-batches 30 s of landing time apart, dev-a's seqs 2k, 2k+1 in batch k. The marks
    (seen.MARK_EVERY_US: a minute) are set by batches 0, 2, 4 and 6, each with the highest seq
    before it. Batch 6 resends batch 5's seqs 10, 11: mark 4 (seq 7) is below them, so it
    reads batches 4 and 5 only. Batch 7 resends batch 0's seqs 0, 1: below every mark, so it
    reads every batch within the watermark. Both copies are dropped. Fails if the newest mark
    is taken whatever its seq (batch 6 reads nothing and keeps its copy)."""
    looked = _spy_look_back(monkeypatch)
    r = [rec(1, s, T0_MS + 1000 * s, 2000 + s) for s in range(14)]
    files = [[landed(A, r[2 * k : 2 * k + 2], T0_MS + 30_000 * k)] for k in range(6)]
    files.append([landed(A, r[10:12], T0_MS + 180_000), landed(A, r[12:14], T0_MS + 180_000)])
    files.append([landed(A, r[0:2], T0_MS + 210_000)])
    out = _stream_files(spark, tmp_path, files)
    assert looked == [["b0000000004", "b0000000005"], [f"b{b:010d}" for b in range(7)]]
    rows = spark.read.parquet(str(out / "records")).collect()
    assert sorted(x.seq for x in rows) == list(range(14))
    report = json.loads((out / "report.json").read_text())
    assert report["records"]["duplicates"] == 4
    commit = json.loads((out / "_batches" / f"{7:010d}.json").read_text())
    # marks of batches 6, 4, 2, 0 made; the one of batch 2 thinned out (seen.refreshed: its
    # minute and batch 6's differ in the last bit only, so slot 2 kept batch 0's)
    assert [b for b, _ in commit["seen_marks"]] == [6, 4, 0]


def test_the_look_back_lists_its_files_without_a_spark_job(spark, tmp_path, monkeypatch):
    """Spark lists more than 32 paths with a Spark job of a task per path (0.57 s for 128 on 2
    cores); the look-back's files are local, so _earlier_copies lists them on the driver: no
    Spark job runs while it builds its DataFrame from 40 files, and the session's setting is
    as it was after. The instrument: the same read outside _listed_here runs one."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from mqbatch.spark import stream

    files = []
    for i in range(40):
        path = tmp_path / f"b{i:010d}-part.parquet"
        pq.write_table(pa.table({"device": ["dev-a"], "boot": [1], "seq": [i]}), path)
        files.append(str(path))
    monkeypatch.setattr(stream, "_look_back", lambda out, since_us, from_batch=0: (files, []))
    tracker = spark.sparkContext.statusTracker()

    def jobs_of(group, build):
        spark.sparkContext.setJobGroup(group, group)
        try:
            df = build()
        finally:
            spark.sparkContext.setLocalProperty("spark.jobGroup.id", None)
        return df, list(tracker.getJobIdsForGroup(group))

    before = spark.conf.get(stream.PARALLEL_LISTING)
    df, jobs = jobs_of("look-back-listing", lambda: stream._earlier_copies(spark, tmp_path, 0))
    assert jobs == [] and spark.conf.get(stream.PARALLEL_LISTING) == before
    # the control: the same read (a given schema, so no job infers one) outside _listed_here
    schema = "device string, boot bigint, seq bigint"
    _, plain = jobs_of("plain-listing", lambda: spark.read.schema(schema).parquet(*files))
    assert plain, "a read of 40 paths ran no listing job: the test no longer shows what it guards"


def test_the_streams_report_takes_shuffle_partitions_by_its_history(spark, tmp_path, monkeypatch):
    """The stream's report de-duplicates the whole history's arrival keys in a persisted
    repartition (pipeline.build_report). With the micro-batches' few shuffle partitions (two,
    as `bench fleet` starts the job) a partition of an 18-million-record history did not fit
    a 1 GB driver: the report ran out of heap, and so did every restart (docs/scale.md, the
    30-minute run). It now runs with at least one partition per REPORT_BYTES_PER_PARTITION of
    _decoded/, never fewer than the session has; the session's setting is as it was after."""
    import mqbatch.spark as S
    from mqbatch.spark import stream

    small_landing(tmp_path / "landing")
    out = tmp_path / "out"
    spark.conf.set("spark.sql.shuffle.partitions", "2")
    S.run_stream(spark, str(tmp_path / "landing"), str(out), S.JobOptions())
    history = sum(f.stat().st_size for f in (out / "_decoded").rglob("*.parquet"))
    seen_partitions = []
    real = stream.build_report

    def build_report(decoded, *args, **kwargs):
        seen_partitions.append(int(decoded.sparkSession.conf.get("spark.sql.shuffle.partitions")))
        return real(decoded, *args, **kwargs)

    monkeypatch.setattr(stream, "build_report", build_report)
    monkeypatch.setattr(stream, "REPORT_BYTES_PER_PARTITION", history // 5)
    report = stream._report_of(spark, out, [], S.JobOptions(), str(tmp_path / "landing"))
    check_small(report, spark, out)  # (the same report as the stream wrote)
    monkeypatch.setattr(stream, "REPORT_BYTES_PER_PARTITION", history * 10)  # a small history: as set
    stream._report_of(spark, out, [], S.JobOptions(), None)
    assert seen_partitions == [-(-history // (history // 5)), 2]
    assert spark.conf.get("spark.sql.shuffle.partitions") == "2"
    # beside the stream (its own session, the commits up to the newest): tasks of task_bytes each
    aside = spark.newSession()
    aside.conf.set("spark.sql.shuffle.partitions", "2")
    newest = max(int(p.stem) for p in (out / "_batches").glob("*.json"))
    report = stream._report_of(aside, out, [], S.JobOptions(), str(tmp_path / "landing"), newest, history // 7)
    check_small(report, spark, out)
    assert seen_partitions[2:] == [-(-history // (history // 7))]
    assert aside.conf.get("spark.sql.files.maxPartitionBytes") == str(history // 7)
