"""mqbatch.spark: the telemetry pipeline as a library (docs/spark.md) (product).

May import: ``mqbatch.ingest`` (the landing zone's layout), ``mqbatch.wire``, ``mqbatch.util``.

Public API (PySpark is imported on first use, so `mqbatch.spark.options` stays light):

    from mqbatch.spark import decode, records, quarantine, JobOptions

    landed  = spark.read.parquet(...)             # or read_landing(spark, landing_dir)
    decoded = decode(landed, JobOptions())       # DataFrame in DECODED_SCHEMA, one decode pass
    good    = records(decoded)                   # valid records, duplicates included
    bad     = quarantine(decoded)                # rejected PUBLISHes and records, with reason and detail
    unique  = deduplicate(good)                  # first arrival of each (device, boot, seq, content_hash())

    read_landing(spark, dir_or_files)  build_report(decoded, opts)  run_batch(spark, landing, out, opts)
    run_stream(spark, landing, out, opts, checkpoint=None, trigger_seconds=None, on_report=None)
    session(master=None)

The job's own entry point is mqbatch.spark.job.main (spark_jobs/telemetry_job.py).
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "JobOptions": "options",
    "DECODED_SCHEMA": "schema",
    "LANDING_SCHEMA": "schema",
    "LANDED_COLUMNS": "schema",
    "RECORD_COLUMNS": "schema",
    "QUARANTINE_COLUMNS": "schema",
    "decode_landed_row": "decoder",
    "decode_batches": "decoder",
    "decode_arrow": "decoder",
    "read_landing": "pipeline",
    "decode": "pipeline",
    "records": "pipeline",
    "quarantine": "pipeline",
    "record_rows": "pipeline",
    "quarantine_rows": "pipeline",
    "deduplicate": "pipeline",
    "content_hash": "pipeline",
    "boot_quality": "pipeline",
    "latency_percentiles": "pipeline",
    "build_report": "pipeline",
    "write_report": "pipeline",
    "run_batch": "pipeline",
    "job_decode": "pipeline",
    "job_decode_to": "pipeline",
    "decode_to": "pipeline",
    "size_arrow_batches": "pipeline",
    "run_stream": "stream",
    "session": "job",
    "main": "job",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'mqbatch.spark' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"mqbatch.spark.{module}"), name)
    globals()[name] = value
    return value
