"""spark-submit entry of the telemetry job; the pipeline is the package mqbatch.spark.

    spark-submit --py-files mqbatch.zip spark_jobs/telemetry_job.py --landing DIR --out DIR [...]

(`mqbatch spark --print-command` prints a complete line that runs from a clean shell.)
Importing this file also gives the package's public API (from mqbatch.spark import *)."""

import sys

from mqbatch.spark import *  # noqa: F401,F403 - the API for callers that import this file
from mqbatch.spark.job import main

if __name__ == "__main__":
    sys.exit(main())
