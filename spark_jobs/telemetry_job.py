"""Telemetry job: landing zone -> records/, quarantine/, report.json (docs/spark.md).

    spark-submit spark_jobs/telemetry_job.py --landing DIR --out DIR \
        [--partial] [--max-batch-size N] [--max-payload-bytes N] [--stream]

Pipeline (batch mode):

    landed      = read_landing(...)            the recorder's Parquet files, as landed
    decoded     = decode(landed, opts)         mapInArrow: mqbatch.codec + mqbatch.records per Arrow batch
    quarantine  = quarantine_rows(decoded)     malformed batches, bad topics, bad records, with reason
    arrivals    = record_rows(decoded)         every valid record, duplicates included
    records     = deduplicate(arrivals)        first arrival of each (device, boot, seq)
    report      = build_report(decoded, opts)  counts per reason, per-device quality

The structural checks are mqbatch.codec.decode itself and the content checks
mqbatch.records.parse, so the job and the host decoder cannot disagree.
Nothing row-at-a-time crosses the JVM/Python boundary: decode() works on Arrow
record batches. Every Spark SQL step after it uses null-safe arithmetic
(try_*), so bad data never fails the job under ANSI mode.
"""
from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import pathlib
import sys
from typing import Iterator

import pyarrow as pa
from pyspark import SparkConf, SparkContext
from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql import types as T

from mqbatch import codec, records
from telemetry_args import add_arguments

# -- schemas -------------------------------------------------------------------

USER_PROPERTIES = T.ArrayType(T.StructType([T.StructField("key", T.StringType()),
                                            T.StructField("value", T.StringType())]))
LANDING_SCHEMA = T.StructType([
    T.StructField("topic", T.StringType()),
    T.StructField("payload", T.BinaryType()),
    T.StructField("user_properties", USER_PROPERTIES),
    T.StructField("content_type", T.StringType()),
    T.StructField("payload_format_indicator", T.IntegerType()),
    T.StructField("message_expiry_interval", T.LongType()),
    T.StructField("qos", T.IntegerType()),
    T.StructField("retain", T.BooleanType()),
    T.StructField("received_at", T.TimestampType()),
    # extra columns written by `mqbatch ingest` (null when a landing file lacks them)
    T.StructField("dup", T.BooleanType()),
    T.StructField("recorder", T.StringType()),
    T.StructField("segment", T.LongType()),
    T.StructField("offset", T.LongType()),
])
LANDED_COLUMNS = LANDING_SCHEMA.fieldNames()
READING = T.StructType([T.StructField("channel", T.IntegerType()), T.StructField("name", T.StringType()),
                        T.StructField("value", T.LongType()), T.StructField("scaled", T.DoubleType())])
DECODED_SCHEMA = T.StructType(LANDING_SCHEMA.fields + [
    T.StructField("landed_first", T.BooleanType()),   # true on exactly one row per landed row
    T.StructField("batch_id", T.StringType()),        # sha-256 of topic, user properties, payload
    T.StructField("batch_status", T.StringType()),    # ok | partial | discarded (mqbatch.codec)
    T.StructField("batch_count", T.IntegerType()),    # sub-messages delivered by the decoder
    T.StructField("stage", T.StringType()),           # null | batch | topic | record
    T.StructField("reason", T.StringType()),          # null = a valid record
    T.StructField("detail", T.StringType()),
    T.StructField("sub_index", T.IntegerType()),      # 0-based index of the sub-message in the batch
    T.StructField("sub_payload", T.BinaryType()),
    T.StructField("device", T.StringType()),
    T.StructField("record_format", T.StringType()),
    T.StructField("kind", T.StringType()),
    T.StructField("synced", T.BooleanType()),
    T.StructField("boot", T.LongType()),
    T.StructField("seq", T.LongType()),
    T.StructField("device_time", T.TimestampType()),
    T.StructField("readings", T.ArrayType(READING)),
    T.StructField("dropped_total", T.LongType()),
])
RECORD_COLUMNS = ["device", "boot", "seq", "kind", "synced", "device_time", "received_at", "latency_ms",
                  "readings", "record_format", "batch_id", "sub_index", "topic", "recorder", "segment", "offset"]
QUARANTINE_COLUMNS = LANDED_COLUMNS + ["device", "batch_id", "batch_status", "stage", "reason", "detail",
                                       "sub_index", "sub_payload"]
ARRIVAL_ORDER = ["received_at", "recorder", "segment", "offset", "sub_index"]


@dataclasses.dataclass(frozen=True)
class JobOptions:
    partial: bool = False
    max_batch_size: int = 100
    max_payload_bytes: int = 65536
    allow_empty: bool = True
    reorder_window: int = 100            # a missing seq counts as lost once the boot is this far past it
    max_future_s: int = 86400            # device time this far after received_at is RECORD_TIME_IN_FUTURE
    watermark: str = "1 hour"            # --stream: how late a duplicate may arrive and still be dropped

    def decode_options(self) -> codec.DecodeOptions:
        return codec.DecodeOptions(max_batch_size=self.max_batch_size, max_payload_bytes=self.max_payload_bytes,
                                   allow_empty=self.allow_empty, partial=self.partial)


# -- decoding (Python, per Arrow record batch) ----------------------------------

def _batch_id(topic: str, props: list[tuple[str, str]], payload: bytes) -> str:
    h = hashlib.sha256()
    h.update(topic.encode("utf-8", "surrogatepass") + b"\0")
    h.update(json.dumps(props).encode() + b"\0")
    h.update(payload)
    return h.hexdigest()[:32]


def decode_landed_row(row: dict, opts: JobOptions) -> list[dict]:
    """The decoded rows of one landed row (DECODED_SCHEMA minus the landed columns)."""
    topic = row["topic"] or ""
    props = [((p or {}).get("key") or "", (p or {}).get("value") or "") for p in (row["user_properties"] or [])]
    payload = row["payload"] or b""
    res = codec.decode(props, payload, opts.decode_options(), topic=topic)
    try:
        device, topic_error = records.device_from_topic(topic), None
    except records.RecordError as e:
        device, topic_error = None, e
    base = {"batch_id": _batch_id(topic, props, payload), "batch_status": res.status,
            "batch_count": res.count, "device": device, "payload": None}
    out = []
    if res.status != codec.OK:          # discarded, or partial: the batch's own quarantine row
        out.append(dict(base, stage="batch", reason=res.reason, detail=res.log["detail"], payload=payload))
    if res.messages and topic_error is not None:
        out.append(dict(base, stage="topic", reason=topic_error.reason, detail=topic_error.detail, payload=payload))
    elif res.messages:
        received_ms = row["received_at_us"] // 1000 if row["received_at_us"] is not None else None
        for i, sub in enumerate(res.messages):
            out.append(dict(base, **_record_fields(sub, received_ms, opts), sub_index=i, sub_payload=sub))
            if out[-1].get("reason") is not None:
                out[-1]["payload"] = payload
    out[0]["landed_first"] = True
    return out


def _record_fields(sub: bytes, received_ms: int | None, opts: JobOptions) -> dict:
    try:
        rec = records.parse(sub, received_ms, max_future_ms=opts.max_future_s * 1000)
    except records.RecordError as e:
        return {"stage": "record", "reason": e.reason, "detail": e.detail}
    return {"record_format": rec.format, "kind": rec.kind, "synced": rec.synced, "boot": rec.boot,
            "seq": rec.seq, "device_time": rec.time_ms * 1000,
            "readings": [{"channel": c, "name": records.CHANNELS[c].name, "value": v,
                          "scaled": v / records.CHANNELS[c].divisor} for c, v in rec.readings],
            "dropped_total": rec.value(records.DROPPED_TOTAL)}


def _arrow_schema() -> pa.Schema:
    from pyspark.sql.pandas.types import to_arrow_schema
    return to_arrow_schema(DECODED_SCHEMA)


def decode_batches(batches: Iterator[pa.RecordBatch], opts: JobOptions) -> Iterator[pa.RecordBatch]:
    """mapInArrow body: landed Arrow batches in, decoded Arrow batches out. The landed
    columns are carried over with one Arrow `take`; only the decoder runs per row."""
    schema = _arrow_schema()
    new_columns = schema.names[len(LANDED_COLUMNS):]
    for batch in batches:
        received_us = batch.column("received_at").cast(pa.int64()).to_pylist()
        landed = batch.select(["topic", "user_properties", "payload"]).to_pylist()
        take, payloads = [], []
        cols: dict[str, list] = {name: [] for name in new_columns}
        for i, (row, at) in enumerate(zip(landed, received_us)):
            row["received_at_us"] = at
            for dec in decode_landed_row(row, opts):
                take.append(i)
                payloads.append(dec["payload"])
                for name in new_columns:
                    cols[name].append(dec.get(name))
        cols["landed_first"] = [bool(v) for v in cols["landed_first"]]
        carried = batch.take(pa.array(take, pa.int64()))
        arrays = [pa.array(payloads, pa.binary()) if name == "payload" else carried.column(name)
                  for name in LANDED_COLUMNS]
        arrays += [pa.array(cols[name], schema.field(name).type) for name in new_columns]
        yield pa.RecordBatch.from_arrays(arrays, schema=schema)


# -- pipeline steps ---------------------------------------------------------------

def read_landing(spark: SparkSession, path: str, stream: bool = False) -> DataFrame:
    if "://" not in path and not pathlib.Path(path).is_dir():
        raise SystemExit(f"telemetry_job: landing zone {path!r} is not a directory")
    reader = spark.readStream if stream else spark.read
    return reader.schema(LANDING_SCHEMA).parquet(path)


def decode(landed: DataFrame, opts: JobOptions) -> DataFrame:
    return landed.select(*LANDED_COLUMNS).mapInArrow(lambda it: decode_batches(it, opts), DECODED_SCHEMA)


def quarantine_rows(decoded: DataFrame) -> DataFrame:
    return decoded.where(F.col("reason").isNotNull()).select(*QUARANTINE_COLUMNS)


def record_rows(decoded: DataFrame) -> DataFrame:
    """Every valid record as it arrived (duplicates included), with its latency."""
    latency_us = F.try_subtract(F.unix_micros("received_at"), F.unix_micros("device_time"))
    return (decoded.where(F.col("reason").isNull() & F.col("sub_index").isNotNull())
            .withColumn("latency_ms", F.try_divide(latency_us, F.lit(1000.0))))


def deduplicate(arrivals: DataFrame) -> DataFrame:
    """The first arrival of each (device, boot, seq)."""
    first = Window.partitionBy("device", "boot", "seq").orderBy(*ARRIVAL_ORDER)
    return (arrivals.withColumn("_n", F.row_number().over(first)).where(F.col("_n") == 1).drop("_n"))


def boot_quality(arrivals: DataFrame, unique: DataFrame, opts: JobOptions) -> DataFrame:
    """Per (device, boot): received, unique, out-of-order, missing (older than the reorder
    window), pending (gaps still inside it), dropped on the device, max seq."""
    by_arrival = Window.partitionBy("device", "boot").orderBy(*ARRIVAL_ORDER) \
        .rowsBetween(Window.unboundedPreceding, -1)
    by_seq = Window.partitionBy("device", "boot").orderBy("seq")
    flagged = (unique
               .withColumn("out_of_order", F.coalesce(F.col("seq") < F.max("seq").over(by_arrival), F.lit(False)))
               .withColumn("prev_seq", F.coalesce(F.lag("seq").over(by_seq), F.lit(-1)))
               .withColumn("max_seq", F.max("seq").over(Window.partitionBy("device", "boot"))))
    # the gap before each record holds seqs prev+1 .. seq-1; those <= max_seq - window are lost
    lost_hi = F.least(F.col("seq") - 1, F.col("max_seq") - opts.reorder_window)
    flagged = (flagged.withColumn("gap", F.col("seq") - F.col("prev_seq") - 1)
               .withColumn("lost", F.greatest(F.lit(0), lost_hi - F.col("prev_seq"))))
    per_boot = flagged.groupBy("device", "boot").agg(
        F.count("*").alias("unique"),
        F.sum(F.col("out_of_order").cast("long")).alias("out_of_order"),
        F.sum("lost").alias("missing"),
        F.sum(F.col("gap") - F.col("lost")).alias("pending"),
        F.max("seq").alias("max_seq"),
        F.max("dropped_total").alias("dropped_on_device"))
    received = arrivals.groupBy("device", "boot").agg(F.count("*").alias("received"))
    return per_boot.join(received, ["device", "boot"])


def device_quality(arrivals: DataFrame, unique: DataFrame, quarantine: DataFrame, opts: JobOptions) -> DataFrame:
    boots = boot_quality(arrivals, unique, opts).groupBy("device").agg(
        F.count("*").alias("boots"), F.sum("received").alias("received"), F.sum("unique").alias("unique"),
        F.sum("out_of_order").alias("out_of_order"), F.sum("missing").alias("missing"),
        F.sum("pending").alias("pending"), F.sum(F.coalesce("dropped_on_device", F.lit(0))).alias("dropped_on_device"))
    latency = (unique.where(F.col("synced") & F.col("latency_ms").isNotNull())
               .groupBy("device")
               .agg(F.percentile("latency_ms", F.array(F.lit(0.5), F.lit(0.95), F.lit(0.99))).alias("lat"),
                    F.count("*").alias("latency_n")))
    quarantined = (quarantine.where(F.col("device").isNotNull())
                   .groupBy("device").agg(F.count("*").alias("quarantined")))
    devices = boots.select("device").union(quarantined.select("device")).distinct()
    return (devices.join(boots, "device", "left").join(latency, "device", "left")
            .join(quarantined, "device", "left").orderBy("device"))


def outcome_counts(decoded: DataFrame) -> list:
    """One small aggregate for the report's totals: rows per (landed_first,
    batch_status, stage, reason) with the received_at span of the landed rows."""
    iso = "yyyy-MM-dd'T'HH:mm:ss.SSSSSSXXX"
    return (decoded.groupBy("landed_first", "batch_status", "stage", "reason")
            .agg(F.count("*").alias("n"), F.date_format(F.min("received_at"), iso).alias("first"),
                 F.date_format(F.max("received_at"), iso).alias("last"))
            .collect())


def _tally(rows, key, where) -> dict:
    out: dict = {}
    for r in rows:
        if where(r):
            out[r[key]] = out.get(r[key], 0) + r["n"]
    return dict(sorted(out.items()))


def build_report(decoded: DataFrame, opts: JobOptions, unique: DataFrame | None = None) -> dict:
    """report.json: deterministic (only data-derived values, sorted keys). `unique` is
    deduplicate(record_rows(decoded)) when the caller already has it."""
    quarantine = quarantine_rows(decoded)
    arrivals = record_rows(decoded)
    unique = unique if unique is not None else deduplicate(arrivals)
    devices = {}
    for r in device_quality(arrivals, unique, quarantine, opts).collect():
        received, n_unique = r["received"] or 0, r["unique"] or 0
        devices[r["device"]] = {
            "boots": r["boots"] or 0, "received": received, "unique": n_unique, "duplicates": received - n_unique,
            "missing": r["missing"] or 0, "pending_gaps": r["pending"] or 0, "out_of_order": r["out_of_order"] or 0,
            "dropped_on_device": r["dropped_on_device"] or 0, "quarantined": r["quarantined"] or 0,
            "latency_ms": None if r["lat"] is None else {
                "n": r["latency_n"], "p50": round(r["lat"][0], 3), "p95": round(r["lat"][1], 3),
                "p99": round(r["lat"][2], 3)},
        }
    outcomes = outcome_counts(decoded)
    landed = [r for r in outcomes if r["landed_first"]]
    batches = _tally(outcomes, "batch_status", lambda r: r["landed_first"])
    by_reason = _tally(outcomes, "reason", lambda r: r["reason"] is not None)
    n_received = sum(d["received"] for d in devices.values())
    n_unique = sum(d["unique"] for d in devices.values())
    return {
        "options": dataclasses.asdict(opts),
        "landed": sum(batches.values()),
        "received_at": {"min": min((r["first"] for r in landed if r["first"]), default=None),
                        "max": max((r["last"] for r in landed if r["last"]), default=None)},
        "batches": batches,
        "records": {"received": n_received, "unique": n_unique, "duplicates": n_received - n_unique},
        "quarantine": {"rows": sum(by_reason.values()), "by_reason": by_reason,
                       "by_stage": _tally(outcomes, "stage", lambda r: r["reason"] is not None)},
        "devices": devices,
    }


def write_report(report: dict, out: pathlib.Path) -> pathlib.Path:
    out.mkdir(parents=True, exist_ok=True)
    path, tmp = out / "report.json", out / ".report.json.tmp"
    tmp.write_text(json.dumps(report, sort_keys=True, indent=2) + "\n", encoding="utf-8")
    os.replace(tmp, path)
    return path


def _record_output(unique: DataFrame) -> DataFrame:
    return unique.select(*RECORD_COLUMNS)


# -- the two modes ----------------------------------------------------------------

def run_batch(spark: SparkSession, landing: str, out: str, opts: JobOptions) -> dict:
    """Batch mode: outputs are overwritten, so a rerun gives the same result."""
    decoded = decode(read_landing(spark, landing), opts).persist()
    unique = deduplicate(record_rows(decoded)).persist()
    try:
        (_record_output(unique).orderBy("device", "boot", "seq")
         .write.mode("overwrite").parquet(f"{out}/records"))
        (quarantine_rows(decoded).orderBy("recorder", "segment", "offset", "batch_id", "sub_index", "stage")
         .write.mode("overwrite").parquet(f"{out}/quarantine"))
        report = build_report(decoded, opts, unique)
    finally:
        unique.unpersist()
        decoded.unpersist()
    write_report(report, pathlib.Path(out))
    return report


def run_stream(spark: SparkSession, landing: str, out: str, opts: JobOptions,
               checkpoint: str | None = None) -> dict:
    """Structured Streaming over the landing zone (trigger availableNow: process every
    file not yet seen, then stop). File sinks + checkpoints give exactly-once outputs;
    records are de-duplicated in state bounded by the watermark on received_at.
    report.json is then recomputed from everything the stream has decoded so far."""
    checkpoint = checkpoint or f"{out}/_checkpoint"
    sinks = {
        "records": lambda d: _record_output(record_rows(d).withWatermark("received_at", opts.watermark)
                                            .dropDuplicatesWithinWatermark(["device", "boot", "seq"])),
        "quarantine": quarantine_rows,
        # everything decoded, without the payloads: the input of report.json
        "_decoded": lambda d: d.withColumn("payload", F.lit(None).cast("binary"))
                               .withColumn("sub_payload", F.lit(None).cast("binary")),
    }
    for name, build in sinks.items():
        query = (build(decode(read_landing(spark, landing, stream=True), opts)).writeStream
                 .format("parquet").option("path", f"{out}/{name}")
                 .option("checkpointLocation", f"{checkpoint}/{name}")
                 .outputMode("append").trigger(availableNow=True).queryName(f"telemetry_{name}").start())
        query.awaitTermination()
    report = build_report(spark.read.schema(DECODED_SCHEMA).parquet(f"{out}/_decoded"), opts)
    write_report(report, pathlib.Path(out))
    return report


# -- command line -----------------------------------------------------------------

def options_from(args: argparse.Namespace) -> JobOptions:
    if args.reorder_window < 0:
        raise SystemExit(f"telemetry_job: --reorder-window must be >= 0, got {args.reorder_window}")
    return JobOptions(partial=args.partial, max_batch_size=args.max_batch_size,
                      max_payload_bytes=args.max_payload_bytes, allow_empty=not args.no_empty,
                      reorder_window=args.reorder_window, max_future_s=args.max_future_s, watermark=args.watermark)


def session(master: str | None = None) -> SparkSession:
    """The job's session: --master, else what spark-submit set, else local[*]."""
    # Start (or join) the JVM first: under spark-submit it holds spark-submit's
    # settings (--master among them), which a SparkConf made before it cannot see;
    # setting local[*] then would silently run a cluster submission locally.
    SparkContext._ensure_initialized()
    conf = SparkConf()
    if master:
        conf.setMaster(master)
    elif not conf.contains("spark.master"):
        conf.setMaster("local[*]")
    return (SparkSession.builder.appName("mqbatch-telemetry").config(conf=conf)
            .config("spark.sql.session.timeZone", "UTC").getOrCreate())


def run(args: argparse.Namespace, spark: SparkSession | None = None) -> dict:
    opts = options_from(args)
    spark = spark or session(args.master)
    spark.conf.set("spark.sql.session.timeZone", "UTC")
    if args.stream:
        return run_stream(spark, args.landing, args.out, opts, args.checkpoint)
    return run_batch(spark, args.landing, args.out, opts)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="telemetry_job.py", description=__doc__.splitlines()[0])
    add_arguments(p)
    args = p.parse_args(argv)
    report = run(args)
    q = report["quarantine"]
    print(f"telemetry_job: {report['landed']} landed PUBLISHes, {report['records']['unique']} records "
          f"({report['records']['duplicates']} duplicates), {q['rows']} quarantined "
          f"{json.dumps(q['by_reason'], sort_keys=True)} -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
