"""Command-line options of spark_jobs/telemetry_job.py, without importing PySpark
(`mqbatch spark` reuses them; spark-submit ships this file next to the job)."""
from __future__ import annotations

import argparse

from mqbatch.commands.decode import _positive


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The job's options (shared with `mqbatch spark`)."""
    p.add_argument("--landing", required=True, help="landing zone directory (Parquet files of `mqbatch ingest`)")
    p.add_argument("--out", required=True, help="output directory: records/, quarantine/, report.json")
    p.add_argument("--partial", action="store_true", help="deliver sub-messages parsed before a count mismatch")
    p.add_argument("--max-batch-size", type=_positive, default=100)
    p.add_argument("--max-payload-bytes", type=_positive, default=65536)
    p.add_argument("--no-empty", action="store_true", help="reject zero-length sub-messages")
    p.add_argument("--reorder-window", type=int, default=100,
                   help="a missing seq counts as lost once the boot's highest seq is this many past it (default 100)")
    p.add_argument("--max-future-s", type=_positive, default=86400,
                   help="quarantine records whose device time is this far after received_at (default 86400)")
    p.add_argument("--stream", action="store_true", help="Structured Streaming (availableNow) with a checkpoint")
    p.add_argument("--checkpoint", help="--stream checkpoint directory (default OUT/_checkpoint)")
    p.add_argument("--watermark", default="1 hour", help="--stream de-duplication watermark (default '1 hour')")
    p.add_argument("--master", help="Spark master when not given by spark-submit (default local[*])")
