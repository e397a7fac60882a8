"""Decoding landed rows (Python, per Arrow record batch): mqbatch.wire.codec for the batch
structure, mqbatch.wire.records for the topic and each sub-message. Every failure of a
landed row or of a record becomes a row with a reason; nothing raises on hostile input.

`decode_arrow(batch, opts)` here is the reference path: readable, per row. The pipeline
runs `decode_vectorised` (mqbatch.spark.pipeline.DECODE_ARROW): mqbatch.spark.vdecode, the
same output computed over the whole Arrow batch (tests/spark/test_vdecode.py requires them
equal), with this reference path for a batch the vectorised decoder cannot handle."""

from __future__ import annotations

import hashlib
import json
import sys
from typing import Iterator

import pyarrow as pa
import pyarrow.compute as pc

from mqbatch.spark import batch_hmac, vdecode
from mqbatch.spark.options import JobOptions
from mqbatch.spark.schema import DECODED_SCHEMA, LANDED_COLUMNS
from mqbatch.wire import codec, records

DECODER_ERROR = "DECODER_ERROR"  # the decoder itself failed on a landed row (a bug): kept, with the error


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
    base = {"batch_id": _batch_id(topic, props, payload), "payload": None, "landed_first": True}
    try:
        out = _decode(topic, props, payload, row["received_at_us"], opts, base)
    except Exception as e:  # noqa: BLE001 - a decoder bug must not lose the row nor stop the job
        return [
            dict(
                base,
                batch_status=codec.DISCARDED,
                batch_count=0,
                stage="batch",
                reason=DECODER_ERROR,
                detail=f"{type(e).__name__}: {str(e)[:200]}",
                payload=payload,
            )
        ]
    for later in out[1:]:
        later.pop("landed_first", None)
    return out


def _decode(topic: str, props, payload: bytes, received_us, opts: JobOptions, base: dict) -> list[dict]:
    try:
        device, topic_error = records.device_from_topic(topic), None
    except records.RecordError as e:
        device, topic_error = None, e
    failed = batch_hmac.check(opts.hmac_keys, topic, props, payload)  # before any structural decoding
    if failed is not None:
        return [
            dict(
                base,
                batch_status=codec.DISCARDED,
                batch_count=0,
                device=device,
                stage="batch",
                reason=failed[0],
                detail=failed[1],
                payload=payload,
            )
        ]
    res = codec.decode(props, payload, opts.decode_options(), topic=topic)
    base = dict(base, batch_status=res.status, batch_count=res.count, device=device)
    out = []
    if res.status != codec.OK:  # discarded, or partial: the batch's own quarantine row
        out.append(dict(base, stage="batch", reason=res.reason, detail=res.log["detail"], payload=payload))
    if res.messages and topic_error is not None:
        out.append(dict(base, stage="topic", reason=topic_error.reason, detail=topic_error.detail, payload=payload))
    elif res.messages:
        received_ms = received_us // 1000 if received_us is not None else None
        for i, sub in enumerate(res.messages):
            out.append(dict(base, **_record_fields(sub, received_ms, opts), sub_index=i, sub_payload=sub))
            if out[-1].get("reason") is not None:
                out[-1]["payload"] = payload
    return out


def _record_fields(sub: bytes, received_ms: int | None, opts: JobOptions) -> dict:
    try:
        rec = records.parse(sub, received_ms, max_future_ms=opts.max_future_s * 1000)
    except records.RecordError as e:
        return {"stage": "record", "reason": e.reason, "detail": e.detail}
    except Exception as e:  # noqa: BLE001 - parse() promises RecordError only; a bug quarantines the record
        return {"stage": "record", "reason": DECODER_ERROR, "detail": f"{type(e).__name__}: {str(e)[:200]}"}
    return {
        "record_format": rec.format,
        "kind": rec.kind,
        "synced": rec.synced,
        "boot": rec.boot,
        "seq": rec.seq,
        "device_time": rec.time_ms * 1000,
        "readings": [
            {"channel": c, "name": records.CHANNELS[c].name, "value": v, "scaled": v / records.CHANNELS[c].divisor}
            for c, v in rec.readings
        ],
        "dropped_total": rec.value(records.DROPPED_TOTAL),
    }


def _arrow_schema() -> pa.Schema:
    from pyspark.sql.pandas.types import to_arrow_schema

    return to_arrow_schema(DECODED_SCHEMA)


def decode_arrow(batch: pa.RecordBatch, opts: JobOptions) -> pa.RecordBatch:
    """One landed Arrow batch in, its decoded Arrow batch out (DECODED_SCHEMA). The landed
    columns are carried over with one Arrow `take`; only the decoder runs per row."""
    schema = _arrow_schema()
    new_columns = schema.names[len(LANDED_COLUMNS) :]
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
    arrays = [pa.array(payloads, pa.binary()) if name == "payload" else carried.column(name) for name in LANDED_COLUMNS]
    arrays += [pa.array(cols[name], schema.field(name).type) for name in new_columns]
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


def decode_batches(batches: Iterator[pa.RecordBatch], opts: JobOptions) -> Iterator[pa.RecordBatch]:
    """mapInArrow body: landed Arrow batches in, decoded Arrow batches out."""
    for batch in batches:
        yield decode_arrow(batch, opts)


def compact(decoded: pa.RecordBatch) -> pa.RecordBatch:
    """The decoded rows with vdecode.NOT_FOR_RECORDS null on valid record rows (no reason,
    a sub_index): what the batch job's decode step returns to the JVM (about half as wide;
    quarantine rows unchanged). The specification of vdecode.decode_arrow(compact=True)."""
    valid = pc.and_(pc.is_null(decoded.column("reason")), pc.is_valid(decoded.column("sub_index")))
    if not pc.any(valid).as_py():
        return decoded
    columns = [
        pc.if_else(valid, pa.nulls(decoded.num_rows, f.type), decoded.column(i))
        if f.name in vdecode.NOT_FOR_RECORDS
        else decoded.column(i)
        for i, f in enumerate(decoded.schema)
    ]
    return pa.RecordBatch.from_arrays(columns, schema=decoded.schema)


def decode_vectorised(batch: pa.RecordBatch, opts: JobOptions, compact_rows: bool = False) -> pa.RecordBatch:
    """mqbatch.spark.vdecode.decode_arrow; should it fail on a batch (a bug), that batch is
    decoded by the reference path instead and the failure is said on stderr (the
    executor's log): the job neither stops nor loses the batch. compact_rows: the batch
    job's compact rows (compact())."""
    try:
        return vdecode.decode_arrow(batch, opts, compact=True) if compact_rows else vdecode.decode_arrow(batch, opts)
    except Exception as e:  # noqa: BLE001 - any bug of the fast path falls back to the reference
        print(
            f"mqbatch.spark: vectorised decoder failed on a batch of {batch.num_rows} landed rows "
            f"({type(e).__name__}: {str(e)[:200]}); decoding it with the reference path",
            file=sys.stderr,
            flush=True,
        )
        out = decode_arrow(batch, opts)
        return compact(out) if compact_rows else out
