"""The batch job (`mqbatch spark`): every landing file, outputs overwritten, so a rerun gives
the same result. A short chain of named steps, each ending with one progress line:

    files.scan          the readable landing files (the others are quarantined by name)
    decode to records   one pass over the landing zone: the valid records, written in records/'s
                        own form (columns, date partitions, order) to OUT/_staging/records; the
                        decoded rows are counted on the way (an Observation: no Spark job)
    aggregates          small jobs over the staged records at once: per (device, boot) the
                        arrivals, distinct seqs and the landed-row counts and spans the report
                        needs (_keys); the report's per-boot figures, latency and released
                        counts as if no seq repeats; an empty quarantine/ when every decoded row
                        is a plain record
    records/            the staged files moved into place when no two arrivals share a (device,
                        boot, seq): written once; else written again from them without the later
                        copies, de-duplicating only the (device, boot)s where a seq repeats (and
                        the per-boot figures and latency taken again, of the first arrivals)
    quarantine/         the decoded rows that are not records: a second decode pass, taken only
                        when the counts say there are such rows (or a record the outcome counts
                        of _keys cannot describe)
    build_report        report.json from the collected aggregates

Nothing is persisted in Spark's cache on the common path (valid records, no repeat), so memory
stays bounded by the decode step's Arrow batches whatever the landing zone holds.
Every folder it creates is 0700 and every file 0600 (private_output)."""

from __future__ import annotations

import pathlib

from py4j.protocol import Py4JJavaError
from pyspark import StorageLevel
from pyspark.sql import Column, DataFrame, Observation, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from mqbatch.spark import files as landing_files
from mqbatch.spark.options import JobOptions
from mqbatch.spark.pipeline import (
    ISO_US,
    KEY_FIRST,
    _account,
    _remove,
    _step,
    assemble_report,
    collect_together,
    deduplicate,
    first_arrivals,
    job_decode,
    job_decode_to,
    make_private,
    observed,
    outcome_counts,
    private_output,
    quarantine,
    read_landing,
    records,
    report_collects,
    size_shuffle,
    write_records,
    write_report,
)
from mqbatch.spark.schema import DECODED_SCHEMA, RECORD_COLUMNS
from mqbatch.wire import codec
from mqbatch.wire.records import DROPPED_TOTAL

STAGED = "_staging/records"  # under --out: the records as decoded, before records/ takes them


def _valid() -> Column:
    """A valid record's row (as records() selects them)."""
    return F.col("reason").isNull() & F.col("sub_index").isNotNull()


def run_batch(
    spark: SparkSession, landing: str, out: str, opts: JobOptions, seconds: dict | None = None, say=None
) -> dict:
    """The batch job over every landing file of `landing` into `out` (records/, quarantine/,
    report.json). `seconds`, if given, receives the wall-clock seconds of each step (the
    benchmark prints them); `say`, if given, is called with one progress line per step as it
    ends (`mqbatch spark` prints them on stderr)."""
    private_output(spark, out)
    out = out.rstrip("/")
    with _step(seconds, "files.scan", say):
        paths, bad_files = landing_files.scan(landing)
        size_shuffle(spark, paths)
    in_files = landing_files.row_count(paths)  # from the Parquet footers; None for URLs
    staged_dir = f"{out}/{STAGED}"
    held = rest = None
    try:
        _remove(spark, staged_dir)  # what a killed run left: never part of this one's records/
        with _step(seconds, "decode to records", say):
            counts = _stage(spark, read_landing(spark, paths), opts, staged_dir)
        plain = counts is not None and counts["rows"] == counts["records"] and not counts["not_plain"]
        staged = _read_records(spark, staged_dir)
        with _step(seconds, "aggregates", say):
            # independent small jobs at once (their tasks are few: one after the other they
            # leave cores idle): the keys, the report's aggregates as if no seq repeats (kept
            # when none does), and an empty quarantine/ when every decoded row is a plain record
            together = [lambda: _keys(staged), *report_collects(_with_dropped_total(staged), staged, opts)]
            if plain:
                together.append(lambda: _write_quarantine(spark.createDataFrame([], DECODED_SCHEMA), out))
            keys, boots, latency, released = collect_together(*together)[:4]
        repeats = [(k["device"], k["boot"]) for k in keys if k["n"] > k["seqs"]]
        with _step(seconds, "records/", say):
            if repeats:
                write_records(_without_later_copies(spark, staged, repeats), f"{out}/records", "overwrite")
                # the per-boot figures and latency again, of the first arrivals (KEY_FIRST)
                held = first_arrivals(_with_dropped_total(staged)).persist(StorageLevel.MEMORY_AND_DISK)
                boots, latency = collect_together(*report_collects(held.where(F.col("_first")), staged, opts)[:2])
            else:  # every arrival is the first of its key: the staged records are records/
                _move(spark, staged_dir, f"{out}/records")
        with _step(seconds, "quarantine/", say):
            if plain:
                outcomes = _record_outcomes(keys)
            else:
                outcomes, rest = _other_rows(spark, paths, opts, counts, keys, out)
        with _step(seconds, "build_report", say):
            report = assemble_report(outcomes, boots, latency, released, opts, bad_files)
    finally:
        for cached in (held, rest):
            if cached is not None:
                cached.unpersist()
        _remove(spark, staged_dir)
    _account(in_files, report["landed"])
    report["skipped_landing_entries"] = landing_files.skipped_report(landing)
    write_report(report, pathlib.Path(out))
    make_private(out)
    return report


def _counts() -> tuple[Column, ...]:
    """What the decode pass counts of its decoded rows. A valid record is `plain` when its
    outcome row is what _record_outcomes derives from records/ alone: landed_first exactly
    on sub-message 0, batch status ok, no stage."""
    plain = (
        F.col("landed_first").eqNullSafe(F.col("sub_index") == 0)
        & F.col("batch_status").eqNullSafe(F.lit(codec.OK))
        & F.col("stage").isNull()
    )
    return (
        F.count(F.lit(1)).alias("rows"),
        F.count(F.when(_valid(), 1)).alias("records"),
        F.count(F.when(_valid() & ~plain, 1)).alias("not_plain"),
    )


def _stage(spark: SparkSession, landed: DataFrame, opts: JobOptions, path: str) -> dict | None:
    """Decode the landed rows and write their valid records to `path` as records/ holds them
    (job_decode_to: one scan of the landing zone when every row takes the fast path, else a
    second part for the Python decoders' rows). Returns the decoded rows' _counts, or None
    when Spark did not deliver them (every count is then taken again from the rows)."""
    observations: list[Observation] = []

    def write(rows: DataFrame, part: int) -> None:
        observation = Observation(f"mqbatch-decoded-{part}")
        observations.append(observation)
        write_records(records(rows.observe(observation, *_counts())), path, "overwrite" if part == 0 else "append")

    job_decode_to(spark, landed, opts, write)
    got = [observed(o) for o in observations]
    counts: dict = {}
    for g in got:
        if g is None:
            return None
        for k, v in g.items():
            counts[k] = counts.get(k, 0) + int(v or 0)
    return counts


_RECORDS_SCHEMA = T.StructType(
    [DECODED_SCHEMA[c] for c in RECORD_COLUMNS if c != "latency_ms"]
    + [T.StructField("latency_ms", T.DoubleType()), T.StructField("date", T.StringType())]
)


def _read_records(spark: SparkSession, path: str) -> DataFrame:
    """Records as records/ holds them (also when there are none: no file to infer a schema from)."""
    return spark.read.schema(_RECORDS_SCHEMA).parquet(path)


def _keys(staged: DataFrame) -> list[dict]:
    """Per (device, boot) of the staged records: n arrivals, seqs (distinct), and per kind of
    row of the report's outcome counts (the landed row's first sub-message or a later one)
    how many and the span of received_at, formatted as outcome_counts formats it."""
    first = F.col("sub_index") == 0

    def span(where: Column, name: str) -> list[Column]:
        at = F.when(where, F.col("received_at"))
        return [
            F.count(F.when(where, 1)).alias(f"n_{name}"),  # rows (received_at may be null: counted too)
            F.date_format(F.min(at), ISO_US).alias(f"first_{name}"),
            F.date_format(F.max(at), ISO_US).alias(f"last_{name}"),
        ]

    per_boot = staged.groupBy("device", "boot").agg(
        F.count(F.lit(1)).alias("n"),
        F.count_distinct("seq").alias("seqs"),
        *span(first, "first"),
        *span(~first, "later"),
    )
    return [r.asDict() for r in per_boot.collect()]


def _record_outcomes(keys: list[dict]) -> list[dict]:
    """outcome_counts' rows of the valid records, from _keys (every valid record plain: _counts)."""
    rows = []
    for k in keys:
        for landed_first, name in ((True, "first"), (False, "later")):
            if k[f"n_{name}"]:
                rows.append(
                    {
                        "landed_first": landed_first,
                        "batch_status": codec.OK,
                        "stage": None,
                        "reason": None,
                        "device": k["device"],
                        "boot": k["boot"],
                        "is_sub": True,
                        "n": k[f"n_{name}"],
                        "first": k[f"first_{name}"],
                        "last": k[f"last_{name}"],
                    }
                )
    return rows


def _other_rows(
    spark: SparkSession, paths: list[str], opts: JobOptions, counts: dict | None, keys: list[dict], out: str
) -> tuple[list, DataFrame]:
    """When not every decoded row is a plain record: the landing zone decoded a second time,
    persisted while quarantine/ and the outcome rows are taken from it: only the rows that are
    not records when every record is plain (the records' outcome rows derived from `keys`),
    else every row (a record not plain, or counts Spark did not deliver). Returns (the
    outcome rows, the cached rows)."""
    decoded = job_decode(spark, read_landing(spark, paths), opts)
    everything = counts is None or bool(counts["not_plain"])
    cached = (decoded if everything else decoded.where(~_valid())).persist(StorageLevel.MEMORY_AND_DISK)
    _write_quarantine(cached, out)
    if everything:
        return outcome_counts(cached), cached
    return _record_outcomes(keys) + outcome_counts(cached), cached


def _write_quarantine(decoded: DataFrame, out: str) -> None:
    quarantine(decoded).write.mode("overwrite").parquet(f"{out}/quarantine")


def _without_later_copies(spark: SparkSession, staged: DataFrame, repeats: list[tuple]) -> DataFrame:
    """The staged records without the later copies of a record (deduplicate), shuffling only
    the records of the (device, boot)s where two arrivals share a seq (`repeats`; matched
    null-safe, as deduplicate's window groups them)."""
    flagged = F.broadcast(spark.createDataFrame(repeats, "_d string, _b long"))
    on = staged["device"].eqNullSafe(flagged["_d"]) & staged["boot"].eqNullSafe(flagged["_b"])
    kept = staged.join(flagged, on, "left_anti")
    copies = deduplicate(staged.join(flagged, on, "left_semi")).drop(KEY_FIRST)
    return kept.unionByName(copies)


def _with_dropped_total(rows: DataFrame) -> DataFrame:
    """records/ rows with the decoded column dropped_total (the health record's dropped_total
    reading; a record holds each channel at most once), which the report's per-boot figures read."""
    reading = F.expr(f"try_element_at(filter(readings, r -> r.channel = {DROPPED_TOTAL}), 1)")
    return rows.withColumn("dropped_total", reading.getField("value"))


def _move(spark: SparkSession, src: str, dst: str) -> None:
    """Replace directory dst by src (a rename on the Hadoop file system of `src`; on a local or
    HDFS out no byte is copied, an object store copies). The old dst is renamed aside first
    and put back if src cannot be moved, so a failure leaves the old records/, never none."""
    hadoop = spark.sparkContext._jvm.org.apache.hadoop.fs  # type: ignore[union-attr]
    s, d, aside = hadoop.Path(src), hadoop.Path(dst), hadoop.Path(f"{src}-replaced")
    fs = s.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration())
    fs.delete(aside, True)
    if fs.exists(d) and not _rename(fs, d, aside):
        raise OSError(f"mqbatch.spark: could not move {dst} aside to replace it")
    if not _rename(fs, s, d):
        if fs.exists(aside):
            _rename(fs, aside, d)
        raise OSError(f"mqbatch.spark: could not move {src} to {dst} (the earlier {dst} is kept)")
    fs.delete(aside, True)


def _rename(fs, src, dst) -> bool:
    """FileSystem.rename, False where it fails (some file systems raise instead, e.g. no src)."""
    try:
        return bool(fs.rename(src, dst))
    except Py4JJavaError:
        return False
