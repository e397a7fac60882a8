"""The job's pipeline, a short chain of named DataFrame steps (docs/spark.md):

    files, bad  = files.scan(landing)         readable landing files; the others quarantined by name
    landed      = read_landing(spark, files)  the recorder's Parquet files, as landed
    decoded     = decode(landed, opts)        JVM fast path (Java, mqbatch.spark.jvm) for valid
                                              binary batches, mapInArrow + DECODE_ARROW for the rest
    bad rows    = quarantine(decoded)         malformed batches, bad topics, bad records, with reason
    arrivals    = records(decoded)            every valid record, duplicates included
    unique      = deduplicate(arrivals)       first arrival of each (device, boot, seq)
    report      = build_report(decoded, ...)  counts per reason, per-device quality

`decoded` is computed once and records/, quarantine/ and the report are derived from it:
run_batch writes the job's compact decoded rows (job_decode_to: one scan of the landing
zone when every row takes the fast path) once to OUT/_staging/decoded, with many devices
the later copies flagged in that pass (flags_in_decode), else de-duplicated on the arrival
keys only (first_arrivals); the stream persists them per micro-batch. Every Spark SQL step after decode uses null-safe arithmetic (try_*),
so bad data never fails the job under ANSI mode."""

from __future__ import annotations

import contextlib
import json
import math
import os
import pathlib
import time

from pyspark import StorageLevel
from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql import types as T
from pyspark.sql.pandas.types import from_arrow_schema

from mqbatch.spark import accounting, arrival, jvm
from mqbatch.spark import files as landing_files
from mqbatch.spark.decoder import decode_vectorised
from mqbatch.spark.lines import PROGRESS
from mqbatch.spark.options import JobOptions
from mqbatch.spark.schema import (
    ARRIVAL_ORDER,
    DECODED_SCHEMA,
    LANDED_COLUMNS,
    LANDING_SCHEMA,
    QUARANTINE_COLUMNS,
    RECORD_COLUMNS,
)
from mqbatch.spark.vdecode import NOT_FOR_RECORDS
from mqbatch.util.private import DIR_MODE, FILE_MODE, private_dir, write_private
from mqbatch.wire import codec

# The decoder the pipeline runs per Arrow batch: (pa.RecordBatch, JobOptions) -> pa.RecordBatch
# in DECODED_SCHEMA: the vectorised one (mqbatch.spark.vdecode, equal to the reference decode_arrow);
# the batch job calls it as (batch, opts, True) for its compact rows (decoder.compact).
DECODE_ARROW = decode_vectorised

BYTES_PER_SHUFFLE_PARTITION = 64 << 20
BYTES_PER_SPLIT = 16 << 20
# decoded rows per Arrow batch handed back to the JVM: one landed batch of 10,000
# PUBLISHes (spark.sql.execution.arrow.maxRecordsPerBatch) of 100 records decodes
# into 1,000,000 rows; returned whole it needs a JVM heap of that size (1 M records
# ran a 1 GB local driver out of memory). Slices keep executor memory bounded by this.
DECODED_ROWS_PER_BATCH = 16_384
# records per landed Arrow batch at most (size_arrow_batches): 1,000 landed rows at the
# default --max-batch-size 100 instead of Spark's default 10,000 (1,000,000 records)
DECODED_RECORDS_PER_BATCH = 100_000


# -- steps --------------------------------------------------------------------------


def read_landing(spark: SparkSession, paths: str | list[str]) -> DataFrame:
    """The landing rows of the given files, or of the readable files of a landing
    directory (files.scan; use it yourself to learn which files were quarantined)."""
    if isinstance(paths, str):
        paths = landing_files.scan(paths)[0]
    if not paths:
        return spark.createDataFrame([], LANDING_SCHEMA)
    return spark.read.schema(LANDING_SCHEMA).parquet(*paths)


def decode(landed: DataFrame, opts: JobOptions, compact_rows: bool = False, fast_path: bool | None = None) -> DataFrame:
    """The decoded rows (DECODED_SCHEMA) of the landed rows. With the JVM fast path
    (mqbatch.spark.jvm; fast_path None = when the session has it; with --hmac-keys it checks each
    batch's batch-hmac as batch_hmac.check does and takes only those that pass):
    valid batches of binary records are decoded by Java code inside the JVM, every other
    landed row by DECODE_ARROW in Python workers (mapInArrow), which names its reason;
    without it, every row goes through DECODE_ARROW. compact_rows (the batch job): valid
    record rows come back without the landed columns records/ does not need (decoder.compact).
    One lazy DataFrame: the two parts are a union, each scanning the landed rows
    (decode_to scans them once when every row takes the fast path)."""
    landed = landed.select(*LANDED_COLUMNS)
    if not _fast_path_on(landed, opts, fast_path):
        return _decode_python(landed, opts, compact_rows)
    fast = _fast_rows(landed, compact_rows, jvm.decoded(landed.sparkSession, opts)[0])
    return fast.unionByName(_python_rows(landed, opts, compact_rows))


def decode_to(
    landed: DataFrame, opts: JobOptions, write, compact_rows: bool = False, fast_path: bool | None = None
) -> dict:
    """The decode step as at most two Spark jobs: `write(rows, part)` is called with the
    fast path's rows (part 0) and then, only if that job met landed rows the fast path
    does not take, with the Python decoders' rows for those (part 1). So the landed rows
    are scanned once when all of them take the fast path. Without the fast path: one
    call with every row (part 0). Returns {"python": landed rows of part 1} (counted by
    the first job's decoder in a Spark accumulator; None without the fast path)."""
    landed = landed.select(*LANDED_COLUMNS)
    if not _fast_path_on(landed, opts, fast_path):
        write(_decode_python(landed, opts, compact_rows), 0)
        return {"python": None}
    decoded, not_fast = jvm.decoded(landed.sparkSession, opts, counting=True)  # its own accumulator
    write(_fast_rows(landed, compact_rows, decoded), 0)
    python = int(not_fast.value())
    if python:
        write(_python_rows(landed, opts, compact_rows), 1)
    return {"python": python}


def _fast_path_on(landed: DataFrame, opts: JobOptions, fast_path: bool | None) -> bool:
    if fast_path is False or not jvm.registered(landed.sparkSession):
        if fast_path:
            raise RuntimeError(
                "mqbatch.spark.decode(fast_path=True): the JVM fast path is not available "
                "(the session lacks its jar; see stderr)"
            )
        return False
    return True


def _fast_rows(landed: DataFrame, compact_rows: bool, decoded: Column) -> DataFrame:
    """The decoded rows (DECODED_SCHEMA) of the landed rows the fast path takes, by
    `decoded` (jvm.decoded: its result is column _j). One selectExpr of SQL text:
    building ~40 Column objects over py4j took 0.08 s per query."""
    # posexplode_outer + a filter on the position: with a plain posexplode Spark infers a
    # filter on size(records) and evaluates the decoder three times per landed row
    fast = (
        landed.select("*", decoded.alias("_j"))
        .select("*", F.posexplode_outer("_j.records").alias("_k", "_r"))
        .where(F.col("_k").isNotNull())
    )
    dropped = ("payload", "stage", "reason", "detail") + (NOT_FOR_RECORDS if compact_rows else ())
    sql = {name: name for name in LANDED_COLUMNS}
    sql.update(
        {
            "landed_first": "_k = 0",
            "batch_id": "_j.batch_id",
            "batch_status": f"'{codec.OK}'",
            "batch_count": "_j.count",
            "sub_index": "_k",
            "sub_payload": "substring(payload, _r.start + 1, _r.length)",
            "device": "_j.device",
            "record_format": "'binary'",
            "kind": "_r.kind",
            "synced": "_r.synced",
            "boot": "_r.boot",
            "seq": "_r.seq",
            "device_time": "timestamp_micros(_r.time_us)",
            "readings": "_r.readings",
            "dropped_total": "_r.dropped_total",
        }
    )
    return fast.selectExpr(
        *(
            f"CAST(NULL AS {f.dataType.simpleString()}) AS {f.name}"
            if f.name in dropped
            else f"{sql[f.name]} AS {f.name}"
            for f in DECODED_SCHEMA.fields
        )
    )


def _python_rows(landed: DataFrame, opts: JobOptions, compact_rows: bool) -> DataFrame:
    """The decoded rows of the landed rows the fast path does not take (the exact complement)."""
    return _decode_python(landed.where(~jvm.is_fast(landed.sparkSession, opts)), opts, compact_rows)


def _decode_python(landed: DataFrame, opts: JobOptions, compact_rows: bool) -> DataFrame:
    """mapInArrow: DECODE_ARROW per landed Arrow batch, its result in slices of DECODED_ROWS_PER_BATCH."""
    decoder = DECODE_ARROW

    def run(batches):
        for batch in batches:
            out = decoder(batch, opts, compact_rows) if compact_rows else decoder(batch, opts)
            for start in range(0, out.num_rows, DECODED_ROWS_PER_BATCH):
                yield out.slice(start, DECODED_ROWS_PER_BATCH)

    return landed.mapInArrow(run, DECODED_SCHEMA)


def quarantine(decoded: DataFrame) -> DataFrame:
    """Malformed batches, bad topics, bad records: the landed row, the reason, the detail."""
    return decoded.where(F.col("reason").isNotNull()).select(*QUARANTINE_COLUMNS)


def records(decoded: DataFrame) -> DataFrame:
    """Every valid record as it arrived (duplicates included), with its latency."""
    latency_us = F.try_subtract(F.unix_micros("received_at"), F.unix_micros("device_time"))
    return decoded.where(F.col("reason").isNull() & F.col("sub_index").isNotNull()).withColumn(
        "latency_ms", F.try_divide(latency_us, F.lit(1000.0))
    )


quarantine_rows, record_rows = quarantine, records  # the names before mqbatch.spark existed


CONTENT = "_content"  # the content hash of a valid record (content_hash)
KEY_FIRST = "_key_first"  # true on one kept record per (device, boot, seq): gaps and order count it
FIRST = "_first"  # true on the records records/ keeps: the first arrival of each (device, boot, seq, content)


def content_hash() -> Column:
    """A 64-bit hash of what a valid record says: format, kind, synced, device time and the
    readings (channel, raw value, and what the job derived from them). A binary record's bytes
    are exactly these fields (records.encode_binary: header + (channel, value) pairs; reserved
    bits are refused), so equal hashes mean equal bytes but for a 2^-64 chance; two JSON
    records that differ only in spacing or key order are the same record. Computed from
    the decoded columns, so records/ (which has no sub_payload) gives the same value."""
    return F.xxhash64("record_format", "kind", "synced", "device_time", "readings")


def _dedup_flags(keyed: DataFrame, within: tuple = ()) -> DataFrame:
    """`_first`: the first arrival of its (device, boot, seq, content): the record kept (a later
    arrival of the same content is a duplicate; another content under the same key is a key
    collision, kept too). KEY_FIRST: the first arrival of its (device, boot, seq). One window
    spec, (device, boot, seq) in arrival order, so one sort, as for the key alone: `_first`
    is "no earlier arrival of the key has this content" (the contents of the earlier
    arrivals, a list of a few values at most: the copies of one record). `within`: columns
    that the key determines put before it (("topic",): rows already partitioned by topic
    then need no other shuffle; a device has one topic, mqbatch/<device>/telemetry)."""
    key = Window.partitionBy(*within, "device", "boot", "seq").orderBy(*ARRIVAL_ORDER)
    earlier = F.collect_list(CONTENT).over(key.rowsBetween(Window.unboundedPreceding, -1))
    return keyed.withColumn(KEY_FIRST, F.row_number().over(key) == 1).withColumn(
        FIRST, F.col(KEY_FIRST) | ~F.array_contains(earlier, F.col(CONTENT))
    )


def deduplicate(arrivals: DataFrame) -> DataFrame:
    """The first arrival of each (device, boot, seq, content): true duplicates (a resend, same
    content) removed, key collisions (same key, other content) kept; with KEY_FIRST."""
    flagged = _dedup_flags(arrivals.withColumn(CONTENT, content_hash()))
    return flagged.where(F.col(FIRST)).drop(FIRST, CONTENT)


def record_output(unique: DataFrame) -> DataFrame:
    """records/ rows: RECORD_COLUMNS plus the partition column `date` (UTC date of received_at)."""
    return unique.select(*RECORD_COLUMNS, F.date_format("received_at", "yyyy-MM-dd").alias("date"))


def boot_quality(unique: DataFrame, opts: JobOptions) -> DataFrame:
    """Per (device, boot) of the unique records: unique, out-of-order, missing (older than
    the reorder window), pending (gaps still inside it), max seq, dropped on the device.

    One shuffle and one pass (jvm.boot_figures in the executors' JVM where the session has the
    jar, else arrival.boot_figures in Python workers: the same figures): the rows of a boot,
    sorted by arrival, are read once, and no window or join spans a boot (Spark buffers such
    a window's rows and, short of memory, spills them into many files whose readers each
    take a 1 MB heap buffer: 10 M records ran a 768 MB driver out of memory). The seqs of a
    boot's first arrivals are unique, so its absent seqs are max_seq + 1 - keys, of which
    `missing` are those at or below max_seq - window. Gaps and order count one record per
    (device, boot, seq) (KEY_FIRST); `key_collisions` are the kept records beyond it."""
    return _boot_figures(unique, opts, in_jvm=jvm.registered(unique.sparkSession, jvm.FIGURES_CLASS))


def _boot_figures(unique: DataFrame, opts: JobOptions, in_jvm: bool, by_device: bool = False) -> DataFrame:
    """boot_quality's rows, by the JVM pass (in_jvm: the caller found jvm.FIGURES_CLASS) or the
    Python one; by_device (the JVM pass only): a device's rows in
    one partition and jvm.DEVICE_EXTRAS on each boot's row too: its highest released_unconfirmed
    reading (RELEASED where `unique` carries it, else from its readings) and, on the device's
    last boot only, its latency percentiles (latency_percentiles' figures). One pass for what
    were three Spark jobs of the report."""
    key = F.col(KEY_FIRST) if KEY_FIRST in unique.columns else F.lit(True)
    extras = []
    if by_device:
        released = F.col(RELEASED) if RELEASED in unique.columns else accounting.released_value()
        latency = F.when(F.col("synced") & F.col("latency_ms").isNotNull(), F.col("latency_ms"))
        extras = [released.alias("released"), latency.alias("latency")]
    rows = (
        unique.where(F.col("device").isNotNull() & F.col("boot").isNotNull())  # (valid records have both)
        .select("device", "boot", "seq", key.alias("key"), "dropped_total", *extras, *ARRIVAL_ORDER)
        .repartition(*(["device"] if by_device else ["device", "boot"]))
        .sortWithinPartitions("device", "boot", *ARRIVAL_ORDER)
        .select(*arrival.IN_COLUMNS, *(["released", "latency"] if by_device else []))
    )
    if in_jvm:  # the same pass in the JVM: no Python worker
        figures = jvm.boot_figures(rows, opts.reorder_window, by_device)
    else:
        assert not by_device, "the per-device figures are the JVM pass's only"
        figures = rows.mapInArrow(arrival.boot_figures(opts.reorder_window), from_arrow_schema(arrival.SCHEMA))  # type: ignore[arg-type]
    limit = F.col("max_seq") - F.lit(opts.reorder_window)
    missing = F.when(limit >= 0, limit + 1 - F.col("old")).otherwise(F.lit(0)).cast("long")
    return figures.where(F.col("keys") > 0).select(  # (every boot of `unique` has a first arrival)
        "device",
        "boot",
        "unique",
        "out_of_order",
        missing.alias("missing"),
        (F.col("max_seq") + 1 - F.col("keys") - missing).alias("pending"),
        "max_seq",
        "dropped_on_device",
        (F.col("unique") - F.col("keys")).alias("key_collisions"),
        *(jvm.DEVICE_EXTRAS if by_device else ()),
    )


def latency_percentiles(unique: DataFrame) -> DataFrame:
    """Per device: p50/p95/p99 of latency_ms over unique records with a synchronised clock."""
    return (
        unique.where(F.col("synced") & F.col("latency_ms").isNotNull())
        .groupBy("device")
        .agg(
            F.percentile("latency_ms", F.array(F.lit(0.5), F.lit(0.95), F.lit(0.99))).alias("lat"),
            F.count("*").alias("latency_n"),
        )
    )


def outcome_counts(decoded: DataFrame) -> list:
    """One small aggregate of the decoded rows for the report: rows per (landed_first,
    batch_status, stage, reason, device, boot, is a record) with the received_at span."""
    iso = "yyyy-MM-dd'T'HH:mm:ss.SSSSSSXXX"
    return (
        decoded.groupBy(
            "landed_first",
            "batch_status",
            "stage",
            "reason",
            "device",
            "boot",
            F.col("sub_index").isNotNull().alias("is_sub"),
        )
        .agg(
            F.count("*").alias("n"),
            F.date_format(F.min("received_at"), iso).alias("first"),
            F.date_format(F.max("received_at"), iso).alias("last"),
        )
        .collect()
    )


def _tally(rows, key, where) -> dict:
    out: dict = {}
    for r in rows:
        if where(r):
            out[r[key]] = out.get(r[key], 0) + r["n"]
    return dict(sorted(out.items()))


def _devices(outcomes: list, boots: list, latency: list) -> dict:
    """Per-device quality from the three small collected aggregates (merged here, not in Spark)."""
    received = _tally(outcomes, "device", lambda r: r["reason"] is None and r["is_sub"])
    quarantined = _tally(outcomes, "device", lambda r: r["reason"] is not None and r["device"] is not None)
    lat = {r["device"]: r for r in latency}
    by_device: dict = {}  # boots grouped once: a scan of every boot per device is quadratic (10,000 devices: minutes)
    for b in boots:
        by_device.setdefault(b["device"], []).append(b.asDict() if hasattr(b, "asDict") else b)
    devices = {}
    for name in sorted(set(received) | set(quarantined) | set(by_device)):
        mine = by_device.get(name, [])
        n_received, n_unique = received.get(name, 0), sum(b["unique"] for b in mine)
        latency_row = lat.get(name)
        devices[name] = {
            "boots": len(mine),
            "received": n_received,
            "unique": n_unique,
            "duplicates": n_received - n_unique,
            "missing": sum(b["missing"] or 0 for b in mine),
            "pending_gaps": sum(b["pending"] or 0 for b in mine),
            "out_of_order": sum(b["out_of_order"] or 0 for b in mine),
            "dropped_on_device": sum(b["dropped_on_device"] or 0 for b in mine),
            "key_collisions": sum(b["key_collisions"] or 0 for b in mine),
            "quarantined": quarantined.get(name, 0),
            "latency_ms": None
            if latency_row is None
            else {
                "n": latency_row["latency_n"],
                "p50": round(latency_row["lat"][0], 3),
                "p95": round(latency_row["lat"][1], 3),
                "p99": round(latency_row["lat"][2], 3),
            },
        }
    return devices


def _collect_together(*collects) -> list:
    """Run the report's small Spark jobs at the same time (one driver thread each): each
    has a few tasks, so one at a time they leave the executors' cores idle while the driver
    plans the next; the results are the same, in the order given. InheritableThread: each
    thread's jobs keep the caller's local properties (its job group, which the benchmark
    counts jobs by). After every thread ended, the first failure in the order given is
    raised here; a thread that never ran its collect is a failure too (never a None result)."""
    from pyspark import InheritableThread

    missing = object()  # a result slot whose collect never ran
    results: list = [missing] * len(collects)
    errors: list = [None] * len(collects)

    def run(i, collect):
        try:
            results[i] = collect()
        except BaseException as e:  # raised again by the caller's thread
            errors[i] = e

    threads = [InheritableThread(target=run, args=(i, c), name=f"mqbatch-report-{i}") for i, c in enumerate(collects)]
    for t in threads:
        t.daemon = True  # a stop signal in the caller's thread does not wait for them
        t.start()
    for t in threads:
        t.join()
    for e in errors:  # the first failure in the order given
        if e is not None:
            raise e
    not_run = [i for i, r in enumerate(results) if r is missing]  # a thread that died in InheritableThread's set-up
    if not_run:
        raise RuntimeError(f"mqbatch.spark: report aggregates {not_run} did not run")
    return results


def build_report(
    decoded: DataFrame, opts: JobOptions, unique: DataFrame | None = None, bad_files: list | None = None
) -> dict:
    """report.json: deterministic (only data-derived values, sorted keys). `unique` is
    deduplicate(records(decoded)) when the caller already has it; `bad_files` the
    quarantined landing files (files.BadFile). Small aggregates are collected at once
    (_collect_together) and merged on the driver: the outcome counts, and with the jar one JVM
    pass for the per-boot figures, each boot's released and each device's latency
    (_boot_figures by device); without it boot_quality, latency_percentiles and
    released_per_boot apart. Without `unique`, the records are de-duplicated once, on their
    arrival keys only (first_arrivals, persisted while the aggregates run), for those that
    read them."""
    keys = None
    if unique is None:
        keys = first_arrivals(records(decoded)).persist(StorageLevel.MEMORY_AND_DISK)
        unique = keys.where(F.col(FIRST))
    try:
        if jvm.registered(decoded.sparkSession, jvm.FIGURES_CLASS):  # per boot, released, latency: one JVM pass
            outcomes, boots = _collect_together(
                lambda: outcome_counts(decoded), _boot_figures(unique, opts, in_jvm=True, by_device=True).collect
            )
            latency = [
                {"device": b["device"], "latency_n": b["latency_n"], "lat": [b["p50"], b["p95"], b["p99"]]}
                for b in boots
                if b["latency_n"] is not None
            ]
            if len({r["device"] for r in latency}) != len(latency):  # a device's rows in two tasks
                raise RuntimeError("mqbatch.spark: a device's latency figures came from two tasks: a bug of the job")
            released = [b for b in boots if b["released"] is not None]
        else:
            outcomes, boots, latency, released = _collect_together(
                lambda: outcome_counts(decoded),
                boot_quality(unique, opts).collect,
                latency_percentiles(unique).collect,
                accounting.released_per_boot(records(decoded)).collect,
            )
    finally:
        if keys is not None:
            keys.unpersist()
    devices = _devices(outcomes, boots, latency)
    accounting.add_accounting(devices, released)  # issue 22
    landed = [r for r in outcomes if r["landed_first"]]
    batches = _tally(outcomes, "batch_status", lambda r: r["landed_first"])
    by_reason = _tally(outcomes, "reason", lambda r: r["reason"] is not None)
    n_received = sum(d["received"] for d in devices.values())
    n_unique = sum(d["unique"] for d in devices.values())
    n_collisions = sum(d["key_collisions"] for d in devices.values())
    bad_files = sorted(
        (b.as_dict() if hasattr(b, "as_dict") else dict(b) for b in bad_files or []), key=lambda b: b["file"]
    )
    return {
        "options": opts.report_dict(),
        "landed": sum(batches.values()),
        "received_at": {
            "min": min((r["first"] for r in landed if r["first"]), default=None),
            "max": max((r["last"] for r in landed if r["last"]), default=None),
        },
        "batches": batches,
        "records": {
            "received": n_received,
            "unique": n_unique,
            "duplicates": n_received - n_unique,
            "key_collisions": n_collisions,
        },
        "quarantine": {
            "rows": sum(by_reason.values()),
            "by_reason": by_reason,
            "by_stage": _tally(outcomes, "stage", lambda r: r["reason"] is not None),
            "files": len(bad_files),
            "files_by_reason": dict(
                sorted(
                    {b["reason"]: sum(1 for x in bad_files if x["reason"] == b["reason"]) for b in bad_files}.items()
                )
            ),
        },
        "quarantined_files": bad_files,
        "devices": devices,
    }


def write_report(report: dict, out: pathlib.Path, name: str = "report.json") -> pathlib.Path:
    """OUT/report.json (or OUT/name), replaced atomically, 0600 (in a 0700 folder if it creates it)."""
    private_dir(out)
    return write_private(out / name, json.dumps(report, sort_keys=True, indent=2) + "\n")


# -- outputs private at rest and tables every tool reads right ----------------------------

# every Parquet output: INT64 TIMESTAMP_MICROS, isAdjustedToUTC (Spark's default is legacy
# INT96, which pyarrow, pandas and DuckDB read as zone-less nanoseconds)
PARQUET_TIMESTAMPS = ("spark.sql.parquet.outputTimestampType", "TIMESTAMP_MICROS")
# what Hadoop's file systems create: 0700 folders, 0600 files, whatever the JVM's umask
HADOOP_UMASK = ("fs.permissions.umask-mode", "077")


def private_output(spark: SparkSession, out: str) -> None:
    """Before the job writes under `out`: the session writes UTC microsecond timestamps and
    private files (Hadoop umask 077; a FileSystem Hadoop cached before keeps its own, so
    make_private tightens after the commit too), and a local `out` is a 0700 folder first,
    so nothing under it is readable by others even while it is written."""
    spark.conf.set(*PARQUET_TIMESTAMPS)
    spark.sparkContext._jsc.hadoopConfiguration().set(*HADOOP_UMASK)
    if "://" not in out:
        private_dir(out, tighten=True)


def make_private(path: str | pathlib.Path) -> None:
    """Every folder under a local `path` (itself included) 0700, every file 0600."""
    if "://" in str(path) or not os.path.isdir(path):
        return
    os.chmod(path, DIR_MODE)
    for root, dirs, files in os.walk(path):
        for d in dirs:
            os.chmod(os.path.join(root, d), DIR_MODE)
        for f in files:
            full = os.path.join(root, f)
            if not os.path.islink(full):
                os.chmod(full, FILE_MODE)


def launch_conf(spark: SparkSession) -> dict[str, str]:
    """The session's SparkConf as it was when its SparkContext started (what the user
    configured explicitly), read once per context: getConf() copies the whole conf over
    py4j, about 40 ms, and the stream asked three times per micro-batch. A started
    context's SparkConf does not change (runtime settings go to spark.conf)."""
    sc = spark.sparkContext
    conf = getattr(sc, "_mqbatch_launch_conf", None)
    if conf is None:
        conf = dict(sc.getConf().getAll())
        sc._mqbatch_launch_conf = conf  # type: ignore[attr-defined]
    return conf


def size_arrow_batches(spark: SparkSession, opts: JobOptions) -> int:
    """Landed rows per Arrow batch handed to the decoder (unless configured explicitly):
    at most DECODED_RECORDS_PER_BATCH records, so the Python worker's memory is bounded
    by that (about 0.75 KB per record at peak, docs/spark.md) and not by the landing zone;
    smaller batches also let the JVM and the Python worker of a task work at the same time."""
    key = "spark.sql.execution.arrow.maxRecordsPerBatch"
    if key in launch_conf(spark):
        return int(launch_conf(spark)[key])
    most = max(1, min(opts.max_batch_size, opts.max_payload_bytes))  # a sub-message takes >= 1 byte
    rows = max(1, min(10_000, DECODED_RECORDS_PER_BATCH // most))
    spark.conf.set(key, str(rows))
    return rows


def job_decode(spark: SparkSession, landed: DataFrame, opts: JobOptions, fast_path: bool | None = None) -> DataFrame:
    """The job's decode step as one lazy DataFrame (the stream's micro-batches): compact rows
    (decoder.compact), the JVM fast path when the session has it, Arrow batches sized to
    the options (size_arrow_batches)."""
    size_arrow_batches(spark, opts)
    return decode(landed, opts, compact_rows=True, fast_path=fast_path)


def job_decode_to(
    spark: SparkSession, landed: DataFrame, opts: JobOptions, write, fast_path: bool | None = None
) -> dict:
    """The batch job's decode step: as job_decode, written by `write(rows, part)` in at
    most two parts (decode_to: one scan of the landing zone when every row is fast)."""
    size_arrow_batches(spark, opts)
    return decode_to(landed, opts, write, compact_rows=True, fast_path=fast_path)


def size_shuffle(spark: SparkSession, paths: list[str]) -> None:
    """Shuffle partitions sized to the input (unless configured explicitly): one per
    64 MiB of landing files, at least the default parallelism, at most 200; file splits of
    at most 16 MiB."""
    if "spark.sql.shuffle.partitions" in launch_conf(spark):
        return
    size = sum(os.path.getsize(p) for p in paths if "://" not in p and os.path.isfile(p))
    n = max(spark.sparkContext.defaultParallelism, math.ceil(size / BYTES_PER_SHUFFLE_PARTITION))
    spark.conf.set("spark.sql.shuffle.partitions", str(min(n, 200)))
    # and file splits of at most BYTES_PER_SPLIT (unless configured): a task sorts at most that
    # much Parquet for records/ (Spark's default, 128 MiB of the staging copy, is about 7 M
    # records; sorted in a 512 MB driver, the spill files' read buffers ran it out of memory)
    if "spark.sql.files.maxPartitionBytes" not in launch_conf(spark):
        spark.conf.set("spark.sql.files.maxPartitionBytes", str(BYTES_PER_SPLIT))


# -- batch mode -----------------------------------------------------------------------


def write_outputs(decoded: DataFrame, unique: DataFrame, out: str, mode: str = "overwrite") -> None:
    """records/ (partitioned by date=YYYY-MM-DD, sorted by device, boot, seq within each
    file) and quarantine/, from the already decoded rows (no re-read, no global sort)."""
    _write_records(unique, out, mode)
    quarantine(decoded).write.mode(mode).parquet(f"{out}/quarantine")


def _write_records(unique: DataFrame, out: str, mode: str) -> None:
    # "static": an overwrite replaces all of records/, whatever the session's
    # spark.sql.sources.partitionOverwriteMode (with "dynamic", the dates of an earlier
    # run that this one does not write would stay beside its records)
    (
        record_output(unique)
        .sortWithinPartitions("date", "device", "boot", "seq")
        .write.mode(mode)
        .option("partitionOverwriteMode", "static")
        .partitionBy("date")
        .parquet(f"{out}/records")
    )


ROW_ID = "_row"  # the batch job's id of a decoded row (its staged copy)
RELEASED = "_released"  # the arrival keys' highest released_unconfirmed reading (first_arrivals)
STAGING = "_staging/decoded"  # under --out: the batch job's decoded rows, removed when it ends
# the arrival keys of the valid records: all that de-duplication and the report's windows read
KEY_COLUMNS = [
    "device",
    "boot",
    "seq",
    *ARRIVAL_ORDER[:-1],
    "sub_index",
    "synced",
    "latency_ms",
    "dropped_total",
    ROW_ID,
]
# later copies of a record (duplicates) are dropped from records/ with a broadcast
# anti-join up to this many (8 bytes each), beyond it with a shuffled one
BROADCAST_DUPLICATES = 4_000_000


def first_arrivals(arrivals: DataFrame) -> DataFrame:
    """KEY_COLUMNS of the valid records with their content hash (CONTENT), partitioned by
    (device, boot), with `_first`: the first arrival of its (device, boot, seq, content), kept
    in records/ (a key collision is kept, a resend is not), and KEY_FIRST (_dedup_flags).
    The report's windows reuse this partitioning. ROW_ID only where the rows have one (the
    batch job's staged copy; the stream's _decoded/ has none)."""
    content = F.col(CONTENT) if CONTENT in arrivals.columns else content_hash()  # run_batch stages it
    keys = [c for c in KEY_COLUMNS if c != ROW_ID or ROW_ID in arrivals.columns]
    released = accounting.released_value().alias(RELEASED)  # for the report (_boot_figures)
    return _dedup_flags(arrivals.select(*keys, content.alias(CONTENT), released).repartition("device", "boot"))


def _remove(spark: SparkSession, path: str) -> None:
    """Delete a directory tree on any Hadoop file system (local --out or a URL), and its
    parent directory when that is left empty."""
    p = spark.sparkContext._jvm.org.apache.hadoop.fs.Path(path)  # type: ignore[union-attr]
    fs = p.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration())
    fs.delete(p, True)
    if fs.exists(p.getParent()) and not fs.listStatus(p.getParent()):
        fs.delete(p.getParent(), False)


@contextlib.contextmanager
def _step(seconds: dict | None, name: str, say=None):
    """Adds the wall-clock seconds of the block to seconds[name] (when seconds is a dict)
    and, when it ends normally, says `spark: <name> <seconds> s` (when say is given)."""
    started = time.monotonic()
    ok = False
    try:
        yield
        ok = True
    finally:
        took = time.monotonic() - started
        if seconds is not None:
            seconds[name] = seconds.get(name, 0.0) + took
        if say is not None and ok:
            say(f"{PROGRESS}{name} {took:.1f} s")


# The batch job flags the later copies of a record in its decode pass (no step of its own, no
# anti-join) when it can shuffle the landed rows by topic (a device has one topic) without a
# task that holds a large part of the data: at least this many topics per shuffle partition.
TOPICS_PER_PARTITION = 4


def flags_in_decode(
    spark: SparkSession, landed: DataFrame, paths: list[str] | None = None, rows: int | None = None
) -> bool:
    """Whether run_batch flags the copies while it decodes, which shuffles the landed rows by
    topic (all of a device's rows in one task): only with the JVM fast path (part 0 is then
    valid records only: the Python decoders' rows, quarantined ones too, stay unflagged in
    part 1), at least TOPICS_PER_PARTITION topics per partition (parts: the larger of the
    shuffle partitions and the default parallelism) and no topic with more landed rows than a
    partition's share (total / parts). Else a task of that pass would take the data of a few
    devices, or of one busy device (a fleet of 10 on 64 cores would decode with 10 tasks):
    the keys are de-duplicated apart. The landed rows per topic are counted on the driver
    from `paths`, the files `landed` reads, when they are local (files.topic_rows: their
    topic column alone; a fresh JVM's first Spark job took 1.56 s of a cold run for it), else
    by one small Spark job."""
    if not jvm.registered(spark):
        return False
    parts = max(int(spark.conf.get("spark.sql.shuffle.partitions") or 0), spark.sparkContext.defaultParallelism)
    counts = landing_files.topic_rows(paths, rows) if paths is not None else None
    if counts is not None:
        topics, most, total = len(counts), max(counts.values(), default=0), sum(counts.values())
    else:
        per_topic = landed.groupBy("topic").agg(F.count(F.lit(1)).alias("rows"))
        got = per_topic.agg(
            F.count(F.lit(1)).alias("topics"), F.max("rows").alias("most"), F.sum("rows").alias("total")
        ).collect()[0]
        topics, most, total = got["topics"], got["most"], got["total"]
    if not topics or topics < TOPICS_PER_PARTITION * parts:
        return False
    return most * parts <= total


def staged_rows(rows: DataFrame, part: int, flagging: bool) -> DataFrame:
    """The rows run_batch stages of decode part `part` (decode_to): with their content hash
    (CONTENT, taken while the readings are at hand: de-duplication then reads 8 bytes per
    record instead of the readings again), a row id (ROW_ID; part 1's are negative: no clash)
    and, when flagging, part 0's copies flagged (_dedup_flags within the topic: the rows come
    partitioned by it, so no other shuffle)."""
    rows = rows.withColumn(CONTENT, content_hash())
    if flagging and part == 0:
        rows = _dedup_flags(rows, within=("topic",))
    ids = F.monotonically_increasing_id()
    return rows.withColumn(ROW_ID, ids if part == 0 else -1 - ids)


def run_batch(
    spark: SparkSession, landing: str, out: str, opts: JobOptions, seconds: dict | None = None, say=None
) -> dict:
    """Batch mode: outputs are overwritten, so a rerun gives the same result.

    One decode pass: the decoded rows (compact, decoder.compact) are written once to
    OUT/_staging/decoded; records/, quarantine/ and the report are derived from that copy.
    With many devices (flags_in_decode), the landed rows are shuffled by topic before they
    are decoded and the pass flags each record's later copies itself (_dedup_flags, its
    window within the topic's partition): records/ is then the flagged rows' first arrivals.
    Else, or when some landed rows took the Python decoders (part 1, unflagged),
    de-duplication and the report's windows shuffle only the arrival keys of the records
    (KEY_COLUMNS, persisted), and the records are written without a shuffle, the later
    copies of a record dropped by their row id (an anti-join, broadcast when small).
    `seconds`, if given, receives the wall-clock seconds of each step (the benchmark prints them);
    `say`, if given, is called with one progress line per step as it ends (`mqbatch spark`
    prints them on stderr). Every folder it creates is 0700 and every file 0600 (private_output)."""
    private_output(spark, out)
    with _step(seconds, "files.scan", say):
        paths, bad_files = landing_files.scan(landing)
        size_shuffle(spark, paths)
        landed = read_landing(spark, paths)
        in_files = landing_files.row_count(paths)  # from the Parquet footers; None for URLs
        flagging = bool(paths) and flags_in_decode(spark, landed, paths, in_files)
    staging = f"{out.rstrip('/')}/{STAGING}"

    def stage(rows: DataFrame, part: int) -> None:
        staged_rows(rows, part, flagging).write.mode("overwrite" if part == 0 else "append").parquet(staging)

    with _step(seconds, "decode and flag copies (to staging)" if flagging else "decode (to staging)", say):
        python = job_decode_to(spark, landed.repartition("topic") if flagging else landed, opts, stage)["python"]
    staged = DECODED_SCHEMA.fields + [T.StructField(ROW_ID, T.LongType()), T.StructField(CONTENT, T.LongType())]
    try:
        if flagging and not python:  # every row flagged: records/ is the first arrivals
            flags = [T.StructField(KEY_FIRST, T.BooleanType()), T.StructField(FIRST, T.BooleanType())]
            decoded = spark.read.schema(T.StructType(staged + flags)).parquet(staging)
            unique = records(decoded).where(F.col(FIRST))
            return _finish_batch(decoded, unique, unique, out, opts, bad_files, in_files, landing, seconds, say)
        decoded = spark.read.schema(T.StructType(staged)).parquet(staging)
        arrivals = records(decoded)
        keys = first_arrivals(arrivals).persist(StorageLevel.MEMORY_AND_DISK)
        try:
            with _step(seconds, "deduplicate (keys)", say):
                later = keys.where(~F.col(FIRST)).select(ROW_ID)
                n_later = later.count()
            if n_later:
                arrivals = arrivals.join(
                    F.broadcast(later) if n_later <= BROADCAST_DUPLICATES else later, ROW_ID, "left_anti"
                )
            return _finish_batch(
                decoded, arrivals, keys.where(F.col(FIRST)), out, opts, bad_files, in_files, landing, seconds, say
            )
        finally:
            keys.unpersist()
    finally:
        _remove(spark, staging)


def _finish_batch(decoded, kept, unique, out, opts, bad_files, in_files, landing, seconds, say) -> dict:
    """records/ (the rows of `kept`), quarantine/ and report.json (`unique`: the kept records'
    arrival keys, with KEY_FIRST), all private; returns the report."""
    with _step(seconds, "write records/", say):
        _write_records(kept, out, "overwrite")
    with _step(seconds, "write quarantine/", say):
        quarantine(decoded).write.mode("overwrite").parquet(f"{out}/quarantine")
    with _step(seconds, "build_report", say):
        report = build_report(decoded, opts, unique, bad_files)
    _account(in_files, report["landed"])
    report["skipped_landing_entries"] = landing_files.skipped_report(landing)
    write_report(report, pathlib.Path(out))
    make_private(out)
    return report


def _account(in_files: int | None, landed: int) -> None:
    """Every landed row of the readable files must be in the report (decoded or quarantined):
    a difference is a bug of the job, said loudly instead of a report that misses rows."""
    if in_files is not None and landed != in_files:
        raise RuntimeError(
            f"mqbatch.spark: the landing files hold {in_files} rows but report.json accounted for "
            f"{landed}: a bug of the job; report.json is not written"
        )
