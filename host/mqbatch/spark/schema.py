"""Spark schemas of the job: the landing zone as read, the decoded rows, the outputs."""

from __future__ import annotations

from pyspark.sql import types as T

USER_PROPERTIES = T.ArrayType(
    T.StructType([T.StructField("key", T.StringType()), T.StructField("value", T.StringType())])
)
LANDING_SCHEMA = T.StructType(
    [
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
    ]
)
LANDED_COLUMNS = LANDING_SCHEMA.fieldNames()
READING = T.StructType(
    [
        T.StructField("channel", T.IntegerType()),
        T.StructField("name", T.StringType()),
        T.StructField("value", T.LongType()),
        T.StructField("scaled", T.DoubleType()),
    ]
)
DECODED_SCHEMA = T.StructType(
    LANDING_SCHEMA.fields
    + [
        T.StructField("landed_first", T.BooleanType()),  # true on exactly one row per landed row
        T.StructField("batch_id", T.StringType()),  # sha-256 of topic, user properties, payload
        T.StructField("batch_status", T.StringType()),  # ok | partial | discarded (mqbatch.wire.codec)
        T.StructField("batch_count", T.IntegerType()),  # sub-messages delivered by the decoder
        T.StructField("stage", T.StringType()),  # null | batch | topic | record
        T.StructField("reason", T.StringType()),  # null = a valid record
        T.StructField("detail", T.StringType()),
        T.StructField("sub_index", T.IntegerType()),  # 0-based index of the sub-message in the batch
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
    ]
)
RECORD_COLUMNS = [
    "device",
    "boot",
    "seq",
    "kind",
    "synced",
    "device_time",
    "received_at",
    "latency_ms",
    "readings",
    "record_format",
    "batch_id",
    "sub_index",
    "topic",
    "recorder",
    "segment",
    "offset",
]
QUARANTINE_COLUMNS = LANDED_COLUMNS + [
    "device",
    "batch_id",
    "batch_status",
    "stage",
    "reason",
    "detail",
    "sub_index",
    "sub_payload",
]
ARRIVAL_ORDER = ["received_at", "recorder", "segment", "offset", "sub_index"]
