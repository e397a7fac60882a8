"""Example: your own PySpark job on the mqbatch pipeline (docs/spark.md, "Your own job").

Decodes a landing zone once with mqbatch.spark, writes one row per reading to
OUT/readings/ partitioned by date (UTC, of the device's clock) and device, and the
rejected PUBLISHes/records to OUT/rejected/.

    mqbatch spark --print-command ... prints the environment spark-submit needs; then
    env SPARK_HOME=... PYSPARK_PYTHON=... .venv/bin/spark-submit --py-files build/mqbatch.zip \
        spark_jobs/example_partitioned.py LANDING OUT
"""

import sys

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from mqbatch.spark import JobOptions, decode, deduplicate, quarantine, read_landing, records


def readings(unique: DataFrame) -> DataFrame:
    """One row per reading of each unique record, with its partition columns."""
    return unique.select(
        "device", "boot", "seq", "kind", "device_time", "received_at", F.explode("readings").alias("r")
    ).select(
        "device",
        "boot",
        "seq",
        "kind",
        "device_time",
        "received_at",
        F.col("r.name").alias("channel"),
        F.col("r.scaled").alias("value"),
        F.date_format("device_time", "yyyy-MM-dd").alias("date"),
    )


def build(spark: SparkSession, landing: str, out: str) -> None:
    spark.conf.set("spark.sql.parquet.outputTimestampType", "TIMESTAMP_MICROS")  # UTC-adjusted, not INT96
    decoded = decode(read_landing(spark, landing), JobOptions()).cache()  # decoded once, used twice
    try:
        (
            readings(deduplicate(records(decoded)))
            .repartition("date", "device")
            .write.mode("overwrite")
            .partitionBy("date", "device")
            .parquet(f"{out}/readings")
        )
        quarantine(decoded).write.mode("overwrite").parquet(f"{out}/rejected")
    finally:
        decoded.unpersist()


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: example_partitioned.py LANDING OUT", file=sys.stderr)
        return 2
    spark = SparkSession.builder.appName("mqbatch-example").config("spark.sql.session.timeZone", "UTC").getOrCreate()
    try:
        build(spark, *argv)
    finally:
        spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
