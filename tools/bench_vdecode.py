#!/usr/bin/env python3
"""Micro-benchmark outside Spark: records/s of the reference decode path (the job's
decode_batches: codec.decode + records.parse per row) against mqbatch.spark.vdecode on the
same landed Arrow batches.

    .venv/bin/python tools/bench_vdecode.py [--records 1000000] [--per-publish 100]
        [--arrow-rows 10000] [--runs 3] [--json-share 0.0]

The landing zone is binary sample records (3 readings, 33 bytes) with a health record
every 20th, --per-publish records per PUBLISH, cut into Arrow batches of --arrow-rows
landed rows (Spark's default spark.sql.execution.arrow.maxRecordsPerBatch is 10,000).
Prints median [min-max] of --runs runs of each path, the ratio, the batch_id hashing
share, and the peak memory of one vectorised batch (numpy via tracemalloc, Arrow pool).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
import tracemalloc

import pyarrow as pa

from mqbatch.spark import vdecode
from mqbatch.util.paths import ROOT
from mqbatch.wire import codec, records

T0_MS = 1_795_000_000_000


def reference_module():
    sys.path.insert(0, str(ROOT / "tools"))
    import vdecode_diff

    return vdecode_diff.reference_module()


def landing(n_records: int, per_publish: int, arrow_rows: int, json_share: float) -> list[pa.RecordBatch]:
    rows, seq = [], 0
    for p in range((n_records + per_publish - 1) // per_publish):
        subs = []
        for _ in range(min(per_publish, n_records - seq)):
            t = T0_MS + seq * 1000
            enc = records.encode_json if (seq % 1000) < json_share * 1000 else records.encode_binary
            if seq % 20 == 19:
                subs.append(enc("health", 1, seq, t, [(0x80, 40_000), (0x82, 0), (0x86, 512)]))
            else:
                subs.append(enc("sample", 1, seq, t, [(1, 2150 + seq % 7), (2, 4000), (3, 3300)]))
            seq += 1
        props, payload = codec.encode_batch(subs, max_batch_size=per_publish)
        rows.append(
            {
                "topic": f"mqbatch/dev-{p % 10}/telemetry",
                "payload": payload,
                "user_properties": [{"key": k, "value": v} for k, v in props],
                "qos": 1,
                "retain": False,
                "received_at": (T0_MS + seq * 1000) * 1000,
                "dup": False,
                "recorder": "bench",
                "segment": 0,
                "offset": p,
            }
        )
    table = pa.Table.from_pylist(rows, schema=vdecode.LANDED)
    return table.combine_chunks().to_batches(max_chunksize=arrow_rows)


def timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def figure(n: int, seconds: list[float]) -> str:
    rates = sorted(n / s for s in seconds)
    return f"{statistics.median(rates):,.0f} [{rates[0]:,.0f}-{rates[-1]:,.0f}] records/s"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--records", type=int, default=1_000_000)
    p.add_argument("--per-publish", type=int, default=100)
    p.add_argument("--arrow-rows", type=int, default=10_000)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--json-share", type=float, default=0.0, help="fraction of records written as JSON")
    p.add_argument("--skip-reference", action="store_true")
    p.add_argument(
        "--out-rows", type=int, default=10_000, help="--spark: decoded rows per output batch in the split variant"
    )
    p.add_argument(
        "--spark",
        action="store_true",
        help="instead: time the decode step inside Spark local[2] "
        "(reference, vectorised, and from_json+explode on the same records as JSON arrays)",
    )
    args = p.parse_args(argv)
    ref = reference_module()
    opts = ref.JobOptions(max_batch_size=max(100, args.per_publish))
    batches = landing(args.records, args.per_publish, args.arrow_rows, args.json_share)
    n = args.records
    if args.spark:
        print(f"bench_vdecode --spark: {n:,} records, {args.per_publish} per PUBLISH, {args.runs} runs")
        spark_bench(args, ref, batches)
        return 0
    print(
        f"bench_vdecode: {n:,} records, {args.per_publish} per PUBLISH, {sum(b.num_rows for b in batches):,} "
        f"landed rows in {len(batches)} Arrow batches of <= {args.arrow_rows:,} rows, JSON share {args.json_share}"
    )
    # the same output, once, before timing
    for b in batches[:1]:
        want = pa.Table.from_batches(list(ref.decode_batches(iter([b]), opts)))
        assert want.equals(pa.Table.from_batches([vdecode.decode_arrow(b, opts)])), "outputs differ"

    vec, refs, ids = [], [], []
    for _ in range(args.runs):  # interleaved, so both paths see the same machine load
        vec.append(timed(lambda: [vdecode.decode_arrow(b, opts) for b in batches]))
        if not args.skip_reference:
            refs.append(timed(lambda: [x for x in ref.decode_batches(iter(batches), opts)]))
        ids.append(
            timed(
                lambda: [
                    vdecode._batch_ids(
                        pc_topics(b),
                        vdecode._Props(b.column("user_properties"), b.num_rows),
                        b.column("payload"),
                        b.num_rows,
                    )
                    for b in batches
                ]
            )
        )
    print(f"  vectorised (mqbatch.spark.vdecode):  {figure(n, vec)}")
    if refs:
        print(f"  reference (decode_batches):    {figure(n, refs)}")
        ratios = sorted(r / v for r, v in zip(refs, vec))
        print(f"  speed-up, same runs: {statistics.median(ratios):.1f}x [{ratios[0]:.1f}-{ratios[-1]:.1f}]")
    rows = sum(b.num_rows for b in batches)
    per_row = sorted(s / rows * 1e6 for s in ids)
    print(
        f"  batch_id (hashlib per landed row, in the vectorised figure): {statistics.median(per_row):.2f} "
        f"[{per_row[0]:.2f}-{per_row[-1]:.2f}] us per landed row, "
        f"{statistics.median(ids) / statistics.median(vec) * 100:.0f} % of the vectorised time"
    )
    # memory of one batch: numpy through tracemalloc, Arrow through a pool of its own
    pool = pa.proxy_memory_pool(pa.default_memory_pool())
    pa.set_memory_pool(pool)
    tracemalloc.start()
    out = vdecode.decode_arrow(batches[0], opts)
    _, numpy_peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    print(
        f"  one Arrow batch of {batches[0].num_rows:,} landed rows ({batches[0].nbytes / 1e6:.1f} MB in, "
        f"{out.nbytes / 1e6:.1f} MB out): peak numpy/Python allocations {numpy_peak / 1e6:.1f} MB, "
        f"peak Arrow allocations {pool.max_memory() / 1e6:.1f} MB (the output included)"
    )
    return 0


# -- in Spark: the job's decode step, reference vs vectorised, and from_json ------------


def spark_bench(args, ref, batches: list[pa.RecordBatch]) -> None:
    """local[2]: decode+validate+explode of the same landing zone three ways, each written
    to Spark's `noop` sink (every column materialised, nothing stored)."""
    import pyarrow.parquet as pq
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    os.environ["PYSPARK_PYTHON"] = os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    os.environ["PYTHONPATH"] = os.pathsep.join([str(ROOT / "spark_jobs"), os.environ.get("PYTHONPATH", "")])
    tmp = tempfile.mkdtemp(prefix="bench_vdecode_")
    table = pa.Table.from_batches(batches)
    half = table.num_rows // 2  # two files: one task per core of local[2]
    os.makedirs(f"{tmp}/landed")
    os.makedirs(f"{tmp}/json")
    for i, part in enumerate((table.slice(0, half), table.slice(half))):
        pq.write_table(part, f"{tmp}/landed/part-{i}.parquet")
    # the same records as JSON arrays, one array per landed PUBLISH
    arrays = []
    for payload in table.column("payload").to_pylist():
        res = codec.decode(
            [("batch-format", "v1"), ("batch-size", str(args.per_publish))],
            payload,
            codec.DecodeOptions(max_batch_size=max(100, args.per_publish)),
        )
        recs = [records.parse(m) for m in res.messages]
        arrays.append(
            json.dumps(
                [
                    {
                        "v": 1,
                        "kind": r.kind,
                        "boot": r.boot,
                        "seq": r.seq,
                        "ts_ms": r.time_ms,
                        "synced": r.synced,
                        "r": {records.CHANNELS[c].name: v for c, v in r.readings},
                    }
                    for r in recs
                ],
                separators=(",", ":"),
            )
        )
    as_json = pa.table({"topic": table.column("topic"), "json": pa.array(arrays)})
    for i, part in enumerate((as_json.slice(0, half), as_json.slice(half))):
        pq.write_table(part, f"{tmp}/json/part-{i}.parquet")
    json_schema = T.ArrayType(
        T.StructType(
            [
                T.StructField("v", T.IntegerType()),
                T.StructField("kind", T.StringType()),
                T.StructField("boot", T.LongType()),
                T.StructField("seq", T.LongType()),
                T.StructField("ts_ms", T.LongType()),
                T.StructField("synced", T.BooleanType()),
                T.StructField("r", T.MapType(T.StringType(), T.LongType())),
            ]
        )
    )
    spark = (
        SparkSession.builder.master("local[2]")
        .appName("bench-vdecode")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.driver.memory", "2g")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    opts = ref.JobOptions(max_batch_size=max(100, args.per_publish))
    schema = ref.DECODED_SCHEMA

    def landed():
        return ref.read_landing(spark, f"{tmp}/landed").select(*ref.LANDED_COLUMNS)

    def reference():
        landed().mapInArrow(lambda it: ref.decode_batches(it, opts), schema).write.format("noop").mode(
            "overwrite"
        ).save()

    def vectorised():
        landed().mapInArrow(lambda it: (vdecode.decode_arrow(b, opts) for b in it), schema).write.format("noop").mode(
            "overwrite"
        ).save()

    def vectorised_split():
        def split(it):
            for b in it:
                out = vdecode.decode_arrow(b, opts)
                yield from (out.slice(i, args.out_rows) for i in range(0, out.num_rows, args.out_rows))

        landed().mapInArrow(split, schema).write.format("noop").mode("overwrite").save()

    # what the boundary costs: the same decoder, output without the landed columns the
    # report and records/ do not need per record (user_properties, payload, qos, ...)
    narrow = ["topic", "received_at", "recorder", "segment", "offset"] + ref.DECODED_SCHEMA.fieldNames()[
        len(ref.LANDED_COLUMNS) :
    ]
    narrow_schema = T.StructType([ref.DECODED_SCHEMA[c] for c in narrow])

    def vectorised_narrow():
        landed().mapInArrow(
            lambda it: (vdecode.decode_arrow(b, opts).select(narrow) for b in it), narrow_schema
        ).write.format("noop").mode("overwrite").save()

    def exchange_only():  # the floor: landed batches to Python and nothing back
        landed().mapInArrow(lambda it: (b.slice(0, 0) for b in it), landed().schema).write.format("noop").mode(
            "overwrite"
        ).save()

    def from_json():
        (
            spark.read.parquet(f"{tmp}/json")
            .select("topic", F.explode(F.from_json("json", json_schema)).alias("r"))
            .select("topic", "r.*")
            .write.format("noop")
            .mode("overwrite")
            .save()
        )

    paths = {
        "vectorised (mapInArrow + mqbatch.spark.vdecode)": vectorised,
        "from_json + explode (JSON arrays)": from_json,
        f"vectorised, output in batches of {args.out_rows:,} rows": vectorised_split,
        "vectorised, without the landed columns a record row does not need": vectorised_narrow,
        "mapInArrow returning nothing (input exchange only, no decoding)": exchange_only,
    }
    if not args.skip_reference:
        paths["reference (mapInArrow + decode_batches)"] = reference
    vectorised()  # warm-up: JVM, Python workers, file cache
    from_json()
    times: dict[str, list[float]] = {k: [] for k in paths}
    for _ in range(args.runs):
        for name, fn in paths.items():
            times[name].append(timed(fn))
    n = args.records
    for name, ts in times.items():
        print(f"  Spark local[2], {name}: {figure(n, ts)}")
    vec, js = times["vectorised (mapInArrow + mqbatch.spark.vdecode)"], times["from_json + explode (JSON arrays)"]
    ratios = sorted(j / v for j, v in zip(js, vec))
    print(f"  vectorised / from_json, same runs: {statistics.median(ratios):.2f}x [{ratios[0]:.2f}-{ratios[-1]:.2f}]")
    spark.stop()
    shutil.rmtree(tmp)


def pc_topics(batch: pa.RecordBatch) -> pa.Array:
    import pyarrow.compute as pc

    return pc.fill_null(batch.column("topic"), "")


if __name__ == "__main__":
    sys.exit(main())
