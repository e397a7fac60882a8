"""Vectorised decoder of landed PUBLISHes: one Arrow record batch in, one out.

`decode_arrow(batch, opts)` returns exactly the rows of the Spark job's reference
path (`decode_batches`: `mqbatch.wire.codec.decode` + `mqbatch.wire.records.parse` per row)
for one landed Arrow batch, but works on the batch's Arrow buffers with numpy and
pyarrow compute: no Python object per landed row or per record on the binary path.

- batch level: the two user properties are counted and read with Arrow list /
  struct kernels; the VBI length prefixes of all PUBLISHes are walked together,
  one vector step per sub-message index (at most the largest batch-size);
- record level: binary v1 records have a fixed layout, read as numpy views
  over the payload buffer; readings become a list array from computed offsets;
- everything the reference checks is checked in the same order with the same
  reason codes. Only rows that fail (their detail string is built by the
  reference: codec.decode, records.parse, records.device_from_topic) and JSON
  records (records.parse per record) run Python per row.
- batch_id is one hashlib.sha256 per landed row (per PUBLISH, not per record).
- with the job's --hmac-keys (opts.hmac_keys), mqbatch.spark.batch_hmac.check runs per
  landed row whose topic names a device, before the batch's structure counts: a
  failure is one discarded batch row with its BATCH_HMAC_* reason (docs/spark.md).

Pure: pyarrow + numpy, no pyspark, no I/O. Memory: a few arrays of the size of
the input batch's payload bytes, records and readings (docs/spark.md).
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from mqbatch.spark import batch_hmac
from mqbatch.wire import codec, records

# -- schema (pure pyarrow; equal to pyspark's to_arrow_schema(DECODED_SCHEMA)) ----

USER_PROPERTIES = pa.list_(pa.field("element", pa.struct([("key", pa.string()), ("value", pa.string())])))
TIMESTAMP = pa.timestamp("us", tz="UTC")
READING = pa.struct([("channel", pa.int32()), ("name", pa.string()), ("value", pa.int64()), ("scaled", pa.float64())])
LANDED = pa.schema(
    [
        ("topic", pa.string()),
        ("payload", pa.binary()),
        ("user_properties", USER_PROPERTIES),
        ("content_type", pa.string()),
        ("payload_format_indicator", pa.int32()),
        ("message_expiry_interval", pa.int64()),
        ("qos", pa.int32()),
        ("retain", pa.bool_()),
        ("received_at", TIMESTAMP),
        ("dup", pa.bool_()),
        ("recorder", pa.string()),
        ("segment", pa.int64()),
        ("offset", pa.int64()),
    ]
)
LANDED_COLUMNS = LANDED.names
DECODED = pa.schema(
    list(LANDED)
    + [
        ("landed_first", pa.bool_()),
        ("batch_id", pa.string()),
        ("batch_status", pa.string()),
        ("batch_count", pa.int32()),
        ("stage", pa.string()),
        ("reason", pa.string()),
        ("detail", pa.string()),
        ("sub_index", pa.int32()),
        ("sub_payload", pa.binary()),
        ("device", pa.string()),
        ("record_format", pa.string()),
        ("kind", pa.string()),
        ("synced", pa.bool_()),
        ("boot", pa.int64()),
        ("seq", pa.int64()),
        ("device_time", TIMESTAMP),
        ("readings", pa.list_(pa.field("element", READING))),
        ("dropped_total", pa.int64()),
    ]
)

# landed columns a valid record row does not need (records/ and the job's report do not
# read them; quarantine rows keep them): decode_arrow(compact=True) leaves them null there
NOT_FOR_RECORDS = (
    "user_properties",
    "content_type",
    "payload_format_indicator",
    "message_expiry_interval",
    "qos",
    "retain",
    "dup",
    "sub_payload",
)
STATUSES = (codec.OK, codec.PARTIAL, codec.DISCARDED)
STAGES = ("batch", "topic", "record")
REASONS = (
    codec.REASON_CODES
    + (records.TOPIC_INVALID, records.DEVICE_ID_INVALID)
    + records.RECORD_REASONS
    + batch_hmac.REASONS
)
_R = {r: i for i, r in enumerate(REASONS)}
_OK, _PARTIAL, _DISCARDED = range(3)
_BATCH, _TOPIC, _RECORD = range(3)
_PREFIX, _SUFFIX = "mqbatch/", "/telemetry"
_TOPIC_OK = f"^{_PREFIX}{records.DEVICE_ID_RE.pattern}{_SUFFIX}$"  # TOPIC_RE and DEVICE_ID_RE together

# channel tables indexed by the channel byte
_KNOWN = np.zeros(256, bool)
_KIND = np.zeros(256, np.int8)  # 1 sample, 2 health
_SLOT = np.zeros(256, np.int64)  # index of the channel within its kind (duplicate detection)
_LOW = np.full(256, -(1 << 40), np.int64)
_HIGH = np.full(256, 1 << 40, np.int64)
_DIV = np.ones(256, np.float64)
for _c in records.CHANNELS.values():
    _KNOWN[_c.id] = True
    _KIND[_c.id] = records.KIND_CODES[_c.kind]
    _SLOT[_c.id] = sorted(c.id for c in records.CHANNELS.values() if c.kind == _c.kind).index(_c.id)
    _LOW[_c.id] = _c.low if _c.low is not None else _LOW[_c.id]
    _HIGH[_c.id] = _c.high if _c.high is not None else _HIGH[_c.id]
    _DIV[_c.id] = _c.divisor
_NAMES = pa.array([records.CHANNELS[c].name if c in records.CHANNELS else None for c in range(256)], pa.string())
# a 6-bit counter per channel slot (<= 32 readings): a field >= 2 is a duplicate; the slots
# of the kind with the most channels (8 health channels since 0x87) must fit an int64
_N_SLOTS = max(int(_SLOT.max()) + 1, 1)
assert 6 * _N_SLOTS <= 62, f"{_N_SLOTS} channels of one kind: the duplicate counters need more than 62 bits"
_DUP_MASK = sum(0b111110 << (6 * s) for s in range(_N_SLOTS))
_HEADER = records.HEADER.size  # 18
_READING = records.READING.size  # 5
# JSON-safe property text: printable ASCII without '"' and '\' (json.dumps copies it verbatim)
_JSON_UNSAFE = r'[^\x20\x21\x23-\x5b\x5d-\x7f]'
_I62 = 1 << 62


def decode_arrow(batch: pa.RecordBatch, opts, stats: dict | None = None, compact: bool = False) -> pa.RecordBatch:
    """The decoded rows (schema DECODED) of one landed Arrow batch (LANDED_COLUMNS),
    identical to the reference `decode_batches`. `opts`: the job's options
    (partial, max_batch_size, max_payload_bytes, allow_empty, max_future_s).
    `stats`, if given, counts the rows and records that took the reference path
    ("fallback_rows", "fallback_records") and any row where the vectorised checks
    disagreed with the reference ("mismatch": must stay absent; the tests check).
    compact: the columns NOT_FOR_RECORDS are null on valid record rows (the batch job's
    rows: equal to mqbatch.spark.decoder.compact of the full output; tests/spark/test_vdecode.py)."""
    stats = stats if stats is not None else {}
    n = batch.num_rows
    topics = pc.fill_null(batch.column("topic"), "")
    payload = batch.column("payload")
    payload = pc.fill_null(payload, pa.scalar(b"", payload.type)) if payload.null_count else payload
    p_off, data = _offsets_and_data(payload)
    props = _Props(batch.column("user_properties"), n)
    received_us = batch.column("received_at").cast(pa.int64())

    status, breason, delivered, msgs = _split_batches(props, p_off, data, opts)
    topic_ok = _topic_ok(topics)
    device = pc.if_else(pa.array(topic_ok), _device(topics), pa.scalar(None, pa.string()))
    batch_id = _batch_ids(topics, props, payload, n)
    hmac_details = _check_hmac(status, breason, delivered, topic_ok, topics, props, payload, opts)
    if hmac_details:
        msgs = msgs.without(np.fromiter(hmac_details, np.int64))

    has_batch_row = status != _OK
    topic_row = (delivered > 0) & ~topic_ok
    rec_rows = np.where((delivered > 0) & topic_ok, delivered, 0)
    per_row = has_batch_row.astype(np.int64) + topic_row + rec_rows
    row_start = np.concatenate([[0], np.cumsum(per_row)])[:-1]
    n_out = int(per_row.sum())
    take = np.repeat(np.arange(n, dtype=np.int64), per_row)

    out = _Columns(n_out)
    _batch_rows(
        out, np.flatnonzero(has_batch_row), row_start, breason, props, payload, topics, opts, stats, hmac_details
    )
    _topic_rows(out, np.flatnonzero(topic_row), row_start + has_batch_row, topics, stats)

    # sub-messages of rows that deliver records
    keep = topic_ok[msgs.row]
    m_row, m_k, m_start, m_len = msgs.row[keep], msgs.k[keep], msgs.start[keep], msgs.len[keep]
    rpos = row_start[m_row] + has_batch_row[m_row] + m_k
    out.sub_index[rpos] = m_k
    received_ms = _received_ms(received_us)
    _records(out, rpos, m_row, m_start, m_len, data, received_ms, opts, stats)

    # assemble, in the reference's column order
    idx = pa.array(take)
    landed = [name for name in LANDED_COLUMNS if name != "payload"]  # the payload column is rebuilt below
    columns: dict[str, Any] = {}
    if compact:  # NOT_FOR_RECORDS: taken with a null index on valid record rows
        sparse = [name for name in landed if name in NOT_FOR_RECORDS]
        columns.update(zip(sparse, batch.select(sparse).take(pa.array(take, mask=out.valid)).columns))
    carried = batch.select([name for name in landed if name not in columns]).take(idx)
    columns.update(zip(carried.column_names, carried.columns))
    quarantined = np.flatnonzero(out.stage >= 0)
    columns["payload"] = _landed_payloads(n_out, quarantined, take[quarantined], p_off, data)
    first = np.zeros(n_out, bool)
    first[row_start] = True
    columns.update(
        landed_first=pa.array(first),
        batch_id=batch_id.take(idx),
        batch_status=pa.array(STATUSES, pa.string()).take(pa.array(status[take])),
        batch_count=pa.array(delivered[take].astype(np.int32)),
        stage=_lookup(STAGES, out.stage),
        reason=_lookup(REASONS, out.reason),
        detail=out.detail_array(),
        sub_index=pa.array(out.sub_index.astype(np.int32), mask=out.sub_index < 0),
        sub_payload=(
            _sub_payloads(n_out, rpos, m_start, m_len, data)
            if not compact
            else _quarantined_subs(n_out, rpos, m_start, m_len, data, out.stage[rpos] >= 0)
        ),
        device=device.take(idx),
    )
    columns.update(out.record_columns())
    return pa.RecordBatch.from_arrays([columns[f.name] for f in DECODED], schema=DECODED)


def _check_hmac(status, breason, delivered, topic_ok, topics, props, payload, opts) -> dict:
    """--hmac-keys: batch_hmac.check per landed row whose topic names a device (per PUBLISH,
    as the reference, before its structure counts). A failed row becomes one discarded
    batch row (status, reason, delivered updated in place); returns {row: detail}."""
    details: dict[int, str] = {}
    if getattr(opts, "hmac_keys", None) is None:
        return details
    for i in np.flatnonzero(topic_ok):
        failed = batch_hmac.check(opts.hmac_keys, topics[i].as_py(), props.row(i), payload[i].as_py())
        if failed is not None:
            status[i], breason[i], delivered[i] = _DISCARDED, _R[failed[0]], 0
            details[int(i)] = failed[1]
    return details


def _batch_rows(out, rows, pos, breason, props, payload, topics, opts, stats, hmac_details) -> None:
    """The batch rows (discarded or partial PUBLISHes); codec.decode writes their detail (rare
    rows), batch_hmac.check's detail for a batch that failed it."""
    out.stage[pos[rows]] = _BATCH
    out.reason[pos[rows]] = breason[rows]
    stats["fallback_rows"] = stats.get("fallback_rows", 0) + len(rows)
    for i in rows:
        if int(i) in hmac_details:
            out.details.append((pos[i], hmac_details[int(i)]))
            continue
        res = codec.decode(props.row(i), payload[i].as_py(), _decode_options(opts), topic=topics[i].as_py())
        if _R[res.reason] != breason[i]:  # type: ignore[index]  # a failed row always has a reason
            stats["mismatch"] = stats.get("mismatch", 0) + 1
        out.details.append((pos[i], res.log["detail"]))


def _topic_rows(out, rows, pos, topics, stats) -> None:
    """The topic rows (records on a topic that is not mqbatch/<device>/telemetry, or whose device
    id is not allowed); reason and detail by the reference."""
    out.stage[pos[rows]] = _TOPIC
    stats["fallback_rows"] = stats.get("fallback_rows", 0) + len(rows)
    for i in rows:
        try:
            records.device_from_topic(topics[i].as_py())
        except records.RecordError as e:
            out.reason[pos[i]] = _R[e.reason]
            out.details.append((pos[i], e.detail))
        else:
            stats["mismatch"] = stats.get("mismatch", 0) + 1


def _decode_options(opts) -> codec.DecodeOptions:
    return codec.DecodeOptions(
        max_batch_size=opts.max_batch_size,
        max_payload_bytes=opts.max_payload_bytes,
        allow_empty=opts.allow_empty,
        partial=opts.partial,
    )


def _offsets_and_data(arr: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """Offsets (n + 1, int64, from 0) and the data bytes (uint8 view) of a binary array without nulls."""
    bufs = arr.buffers()
    width = np.int64 if pa.types.is_large_binary(arr.type) or pa.types.is_large_string(arr.type) else np.int32
    offsets = np.frombuffer(bufs[1], width)[arr.offset : arr.offset + len(arr) + 1].astype(np.int64)
    if bufs[2] is None or offsets[-1] == offsets[0]:
        return offsets - offsets[0], np.zeros(0, np.uint8)
    # only this array's bytes: a slice of a larger array (Table.to_batches) shares the whole buffer
    data = np.frombuffer(bufs[2], np.uint8)[offsets[0] : offsets[-1]]
    return offsets - offsets[0], data


def _lookup(values, codes: np.ndarray) -> pa.Array:
    """values[code] per slot, null where code < 0."""
    pos = np.flatnonzero(codes >= 0)
    off, data = _offsets_and_data(pa.array(values, pa.string()).take(pa.array(codes[pos])))
    return _place(pa.string(), len(codes), pos, np.diff(off), data)


def _place(type_: pa.DataType, n: int, pos: np.ndarray, lengths: np.ndarray, data: np.ndarray) -> pa.Array:
    """A binary/string array of n slots: slot pos[k] holds the next lengths[k] bytes of data
    (pos ascending), the others are null. Built from buffers, because Arrow's take with null
    indices reserves (mean value length x n) bytes: gigabytes for a payload column."""
    sizes = np.zeros(n, np.int64)
    sizes[pos] = lengths
    offsets = np.concatenate([[0], np.cumsum(sizes)])
    if offsets[-1] > np.iinfo(np.int32).max:
        raise ValueError(
            f"decoded Arrow batch needs {offsets[-1]:,} bytes in one {type_} column (limit 2 GiB): "
            f"lower spark.sql.execution.arrow.maxRecordsPerBatch or max_batch_size"
        )
    valid = np.zeros(n, bool)
    valid[pos] = True
    return pa.Array.from_buffers(
        type_,
        n,
        [
            pa.py_buffer(np.packbits(valid, bitorder="little")),
            pa.py_buffer(offsets.astype(np.int32)),
            pa.py_buffer(data.copy()),
        ],
    )


def _received_ms(received_us: pa.Array) -> np.ndarray:
    """received_at in ms (floor, as the reference's `// 1000`); rows without one get None's stand-in."""
    us = received_us.fill_null(0).to_numpy(zero_copy_only=False)
    return np.where(received_us.is_null().to_numpy(zero_copy_only=False), np.iinfo(np.int64).min, us // 1000)


# -- user properties ---------------------------------------------------------------


class _Props:
    """The landed user properties as the reference sees them: nulls are ''."""

    def __init__(self, column: pa.Array, n: int):
        self.column = column
        self.lengths = pc.fill_null(pc.list_value_length(column), 0).to_numpy(zero_copy_only=False).astype(np.int64)
        self.offsets = np.concatenate([[0], np.cumsum(self.lengths)])
        flat = pc.list_flatten(column)
        if len(flat):
            key, value = flat.flatten()
        else:
            key = value = pa.array([], pa.string())
        self.keys, self.values = pc.fill_null(key, ""), pc.fill_null(value, "")
        self.row_of = np.repeat(np.arange(n, dtype=np.int64), self.lengths)

    def row(self, i: int) -> list[tuple[str, str]]:
        return [((p or {}).get("key") or "", (p or {}).get("value") or "") for p in (self.column[i].as_py() or [])]

    def count_and_first(self, key: str, n: int) -> tuple[np.ndarray, np.ndarray]:
        """Per row: how often `key` occurs, and the flat index of an occurrence (-1 if none)."""
        hits = np.flatnonzero(pc.equal(self.keys, key).to_numpy(zero_copy_only=False))
        rows = self.row_of[hits]
        where = np.full(n, -1, np.int64)
        where[rows] = hits  # only read where the count is 1
        return np.bincount(rows, minlength=n), where


# -- batch level: codec.decode checks 1-8 for every row at once ---------------------


class _Messages:
    def __init__(self, row, k, start, length):
        self.row, self.k, self.start, self.len = row, k, start, length

    def without(self, rows: np.ndarray) -> "_Messages":
        keep = ~np.isin(self.row, rows)
        return _Messages(self.row[keep], self.k[keep], self.start[keep], self.len[keep])


def _split_batches(props: _Props, p_off, data, opts):
    """codec.decode's checks 1-8 for every row: status, reason code (-1 = none),
    delivered count and the delivered sub-messages, ordered by row and index."""
    n = len(props.lengths)
    reason = np.full(n, -1, np.int64)

    def fail(mask, code):
        reason[(reason < 0) & mask] = _R[code]

    n_fmt, i_fmt = props.count_and_first(codec.FORMAT_KEY, n)
    n_size, i_size = props.count_and_first(codec.SIZE_KEY, n)
    fail((n_fmt == 0) | (n_size == 0), codec.MISSING_PROPERTY)  # 1
    fail((n_fmt > 1) | (n_size > 1), codec.INVALID_PROPERTY)  # 2
    fmt = _values_at(props, i_fmt)
    fail(~pc.equal(fmt, codec.FORMAT_V1).to_numpy(zero_copy_only=False), codec.UNSUPPORTED_FORMAT)  # 3
    size = _values_at(props, i_size)
    syntax = pc.match_substring_regex(size, r"^[1-9][0-9]*$").to_numpy(zero_copy_only=False)
    fail(~syntax, codec.INVALID_PROPERTY)  # 4
    digits = pc.binary_length(size).to_numpy(zero_copy_only=False).astype(np.int64)
    over = _exceeds(size, digits, syntax, opts.max_batch_size)
    fail(over, codec.SIZE_LIMIT)  # 5
    p_len = np.diff(p_off)
    fail(p_len > min(opts.max_payload_bytes, _I62), codec.PAYLOAD_LIMIT)  # 6
    # expected count; more digits than int64 holds can never be reached (a sub-message takes >= 1 byte)
    small = syntax & (digits <= 18)
    expected = pc.cast(pc.if_else(pa.array(small), size, "0"), pa.int64()).to_numpy(zero_copy_only=False)
    expected = np.where(small, expected, _I62)

    # 7: walk the length prefixes of all rows together, one sub-message per step
    pos, count, found = _walk(p_off, data, expected, reason, opts.allow_empty)

    # 8: count
    pending = reason < 0
    complete = pending & (count == expected) & (pos == p_off[1:])
    fail(pending & ~complete, codec.COUNT_MISMATCH)
    status = np.full(n, _DISCARDED, np.int8)
    status[complete] = _OK
    if opts.partial:
        status[(reason == _R[codec.COUNT_MISMATCH]) & (count > 0)] = _PARTIAL
    delivered = np.where(status == _DISCARDED, 0, count)

    row, k, start, length = found
    keep = status[row] != _DISCARDED
    row, k, start, length = row[keep], k[keep], start[keep], length[keep]
    order = np.argsort(row, kind="stable")  # steps are in k order: stable sort keeps it per row
    return status, reason, delivered, _Messages(row[order], k[order], start[order], length[order])


def _walk(p_off, data, expected, reason, allow_empty):
    """Check 7 for all rows at once: step k reads the k-th length prefix of every row still
    going. Sets `reason` of the rows that fail; returns each row's end position and count,
    and the sub-messages found (row, index, start, length)."""
    n = len(expected)
    pos, end = p_off[:-1].copy(), p_off[1:]
    count = np.zeros(n, np.int64)
    act = np.flatnonzero((reason < 0) & (pos < end) & (count < expected))
    rows, ks, starts, lens = [], [], [], []
    last = len(data) - 1
    while act.size:
        p, e = pos[act], end[act]
        b = data[p]
        val = (b & 0x7F).astype(np.int64)
        used = np.ones(len(act), np.int64)
        done = b < 0x80
        err = np.full(len(act), -1, np.int64)
        for k in (1, 2, 3):
            need = ~done & (err < 0)
            if not need.any():
                break
            err[need & (p + k >= e)] = _R[codec.INCOMPLETE_PAYLOAD]
            m = need & (p + k < e)
            bk = data[np.minimum(p + k, last)]
            val[m] |= (bk[m] & 0x7F).astype(np.int64) << (7 * k)
            used[m] = k + 1
            fin = m & (bk < 0x80)
            err[fin & (bk == 0)] = _R[codec.INVALID_LENGTH]  # non-minimal
            done |= fin
        err[~done & (err < 0)] = _R[codec.INVALID_LENGTH]  # 4th byte continues
        start = p + used
        if not allow_empty:
            err[(err < 0) & (val == 0)] = _R[codec.INVALID_LENGTH]
        err[(err < 0) & (val > e - start)] = _R[codec.LENGTH_EXCEEDS]
        bad = err >= 0
        reason[act[bad]] = err[bad]
        good = act[~bad]
        rows.append(good)
        ks.append(count[good])
        starts.append(start[~bad])
        lens.append(val[~bad])
        pos[good] = start[~bad] + val[~bad]
        count[good] += 1
        act = good[(pos[good] < end[good]) & (count[good] < expected[good])]

    cat = lambda xs: np.concatenate(xs) if xs else np.zeros(0, np.int64)
    return pos, count, (cat(rows), cat(ks), cat(starts), cat(lens))


def _values_at(props: _Props, idx: np.ndarray) -> pa.Array:
    """The property value at each row's flat index; '' where there is none."""
    if not len(props.values):
        return pc.fill_null(pa.nulls(len(idx), pa.string()), "")
    return pc.if_else(pa.array(idx >= 0), props.values.take(pa.array(np.maximum(idx, 0))), "")


def _exceeds(size: pa.Array, digits: np.ndarray, syntax: np.ndarray, limit: int) -> np.ndarray:
    """batch-size > limit, exactly, for decimal strings of any length (no int conversion)."""
    if limit < 1:
        return syntax.copy()
    text = str(limit)
    longer = digits > len(text)
    same = syntax & (digits == len(text))
    greater = pc.greater(size, text).to_numpy(zero_copy_only=False)
    return syntax & (longer | (same & greater))


# -- landed-row level: topic, batch id --------------------------------------------


def _topic_ok(topics: pa.Array) -> np.ndarray:
    """records.device_from_topic accepts the topic: mqbatch/<device id>/telemetry with the id
    1..MAX_DEVICE_ID of records.DEVICE_ID_RE's alphabet, vectorised."""
    ok = pc.match_substring_regex(topics, _TOPIC_OK)
    return pc.fill_null(ok, False).to_numpy(zero_copy_only=False)


def _device(topics: pa.Array) -> pa.Array:
    return pc.utf8_slice_codeunits(topics, len(_PREFIX), -len(_SUFFIX))


def _batch_ids(topics: pa.Array, props: _Props, payload: pa.Array, n: int) -> pa.Array:
    """sha-256 of topic, json.dumps(properties) and payload (as the reference), first 32 hex digits."""
    k, v = props.keys, props.values
    pair = pc.binary_join_element_wise('["', k, '", "', v, '"]', "")
    joined = pc.binary_join(pa.ListArray.from_arrays(pa.array(props.offsets.astype(np.int32)), pair), ", ")
    props_json = pc.binary_join_element_wise("[", joined, "]", "")
    unsafe = np.zeros(n, bool)
    bad = pc.or_(pc.match_substring_regex(k, _JSON_UNSAFE), pc.match_substring_regex(v, _JSON_UNSAFE))
    unsafe[props.row_of[bad.to_numpy(zero_copy_only=False)]] = True
    if unsafe.any():  # escapes or non-ASCII: json.dumps itself (rare)
        fixed = np.flatnonzero(unsafe)
        texts = [json.dumps(props.row(int(i))) for i in fixed]
        idx = np.arange(n)
        idx[fixed] = n + np.arange(len(fixed))
        props_json = pa.concat_arrays([props_json, pa.array(texts, pa.string())]).take(pa.array(idx))
    whole = pc.binary_join_element_wise(
        topics.cast(pa.binary()), props_json.cast(pa.binary()), payload.cast(pa.binary()), pa.scalar(b"\0", pa.binary())
    )
    off, data = _offsets_and_data(whole)
    view = memoryview(data)  # type: ignore[arg-type]  # an ndarray is a buffer
    sha = hashlib.sha256
    return pa.array([sha(view[off[i] : off[i + 1]]).hexdigest()[:32] for i in range(n)], pa.string())


# -- record level -----------------------------------------------------------------


class _Columns:
    """Per output row: stage/reason codes, sub_index, details and record fields."""

    def __init__(self, n: int):
        self.n = n
        self.stage = np.full(n, -1, np.int64)
        self.reason = np.full(n, -1, np.int64)
        self.sub_index = np.full(n, -1, np.int64)
        self.details: list[tuple[int, str]] = []
        self.valid = np.zeros(n, bool)
        self.fmt = np.zeros(n, np.int64)  # 0 binary, 1 json
        self.kind = np.zeros(n, np.int64)  # 0 sample, 1 health
        self.synced = np.zeros(n, bool)
        self.boot = np.zeros(n, np.int64)
        self.seq = np.zeros(n, np.int64)
        self.time_us = np.zeros(n, np.int64)
        self.n_readings = np.zeros(n, np.int64)
        self.readings: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []  # (output rows, channels, values)
        self.dropped = np.full(n, -1, np.int64)
        self.has_dropped = np.zeros(n, bool)

    def detail_array(self) -> pa.Array:
        details = sorted(self.details)
        off, data = _offsets_and_data(pa.array([d for _, d in details], pa.string()))
        return _place(pa.string(), self.n, np.array([p for p, _ in details], np.int64), np.diff(off), data)

    def record_columns(self) -> dict:
        v = self.valid
        inv = ~v
        offsets = np.concatenate([[0], np.cumsum(np.where(v, self.n_readings, 0))])
        total = int(offsets[-1])
        channel = np.zeros(total, np.int64)
        value = np.zeros(total, np.int64)
        for rows, ch, val in self.readings:  # readings in record order, scattered to their rows
            counts = self.n_readings[rows]
            first = np.repeat(offsets[rows], counts)
            dest = first + np.arange(len(ch)) - np.repeat(np.cumsum(counts) - counts, counts)
            channel[dest], value[dest] = ch, val
        readings = pa.StructArray.from_arrays(
            [
                pa.array(channel.astype(np.int32)),
                _NAMES.take(pa.array(channel)),
                pa.array(value),
                pa.array(value / _DIV[channel]),
            ],
            fields=list(READING),
        )
        return {
            "record_format": _lookup(("binary", "json"), np.where(v, self.fmt, -1)),
            "kind": _lookup((records.SAMPLE, records.HEALTH), np.where(v, self.kind, -1)),
            "synced": pa.array(self.synced, mask=inv),
            "boot": pa.array(self.boot, mask=inv),
            "seq": pa.array(self.seq, mask=inv),
            "device_time": pa.array(self.time_us, mask=inv).cast(TIMESTAMP),
            "readings": pa.ListArray.from_arrays(
                pa.array(offsets.astype(np.int32)), readings, type=DECODED.field("readings").type, mask=pa.array(inv)
            ),
            "dropped_total": pa.array(self.dropped, mask=~(v & self.has_dropped)),
        }


def _records(out: _Columns, rpos, m_row, m_start, m_len, data, received_ms, opts, stats) -> None:
    """records.parse for every delivered sub-message: binary v1 vectorised, the rest by the reference."""
    max_future_ms = min(max(opts.max_future_s * 1000, -_I62), _I62)
    binary = m_len >= _HEADER
    binary[binary] = data[m_start[binary]] == records.BINARY_V1
    b = np.flatnonzero(binary)
    flagged = ~binary  # JSON, unknown versions, short records
    if b.size:
        hdr = np.lib.stride_tricks.sliding_window_view(data, _HEADER)[m_start[b]]
        kind, flags, n = hdr[:, 1].astype(np.int64), hdr[:, 2], hdr[:, 3].astype(np.int64)
        boot = hdr[:, 4:8].copy().view("<u4").ravel().astype(np.int64)
        seq = hdr[:, 8:12].copy().view("<u4").ravel().astype(np.int64)
        time_s = hdr[:, 12:16].copy().view("<u4").ravel().astype(np.int64)
        time_ms = hdr[:, 16:18].copy().view("<u2").ravel().astype(np.int64)
        bad = (
            ((kind != 1) & (kind != 2))
            | ((flags & 0xFE) != 0)
            | (n > records.MAX_READINGS)
            | (m_len[b] != _HEADER + _READING * n)
            | (time_ms > 999)
        )
        n = np.where(bad, 0, n)
        rec, ch, val, wrong = _readings(data, m_start[b], kind, n)
        bad |= wrong
        t_ms = (records.EPOCH_2020_S + time_s) * 1000 + time_ms
        recv = received_ms[m_row[b]]
        has_recv = recv != np.iinfo(np.int64).min
        bad |= has_recv & (t_ms - np.where(has_recv, recv, 0) > max_future_ms)
        flagged[b[bad]] = True
        ok = ~bad
        pos = rpos[b[ok]]
        out.valid[pos] = True
        out.kind[pos] = kind[ok] - 1
        out.synced[pos] = (flags[ok] & 1) != 0
        out.boot[pos], out.seq[pos], out.time_us[pos] = boot[ok], seq[ok], t_ms[ok] * 1000
        out.n_readings[pos] = n[ok]
        keep_r = ok[rec]
        out.readings.append((pos, ch[keep_r], val[keep_r]))
        dropped = keep_r & (ch == records.DROPPED_TOTAL)
        out.dropped[rpos[b[rec[dropped]]]] = val[dropped]
        out.has_dropped[rpos[b[rec[dropped]]]] = True
    _reference_records(
        out, np.flatnonzero(flagged), rpos, m_row, m_start, m_len, data, received_ms, opts, stats, binary
    )


def _readings(data, starts, kind, n):
    """The readings of binary records (n per record, after the header): record index,
    channel and value per reading, and per record whether a channel is unknown, of the
    other kind, out of range or repeated (the content checks)."""
    total = int(n.sum())
    rec = np.repeat(np.arange(len(starts)), n)
    j = np.arange(total) - np.repeat(np.cumsum(n) - n, n)
    raw = (
        np.lib.stride_tricks.sliding_window_view(data, _READING)[starts[rec] + _HEADER + _READING * j]
        if total
        else np.zeros((0, _READING), np.uint8)
    )
    ch = raw[:, 0].astype(np.int64)
    val = raw[:, 1:5].copy().view("<i4").ravel().astype(np.int64)
    wrong = ~_KNOWN[ch] | (_KIND[ch] != kind[rec]) | (val < _LOW[ch]) | (val > _HIGH[ch])
    bad = _segment_sum(wrong.astype(np.int64), n) > 0
    slot_count = _segment_sum(np.where(_KNOWN[ch], np.left_shift(1, 6 * _SLOT[ch]), 0), n)
    return rec, ch, val, bad | ((slot_count & _DUP_MASK) != 0)


def _reference_records(out, which, rpos, m_row, m_start, m_len, data, received_ms, opts, stats, binary) -> None:
    """records.parse per sub-message for JSON records and the ones that fail."""
    stats["fallback_records"] = stats.get("fallback_records", 0) + len(which)
    rows, chans, vals = [], [], []
    for m in which:
        sub = data[m_start[m] : m_start[m] + m_len[m]].tobytes()
        recv = received_ms[m_row[m]]
        pos = rpos[m]
        try:
            rec = records.parse(
                sub, None if recv == np.iinfo(np.int64).min else int(recv), max_future_ms=opts.max_future_s * 1000
            )
        except records.RecordError as e:
            out.stage[pos], out.reason[pos] = _RECORD, _R[e.reason]
            out.details.append((pos, e.detail))
            continue
        if binary[m]:  # the vectorised checks flagged a record the reference accepts
            stats["mismatch"] = stats.get("mismatch", 0) + 1
        out.valid[pos] = True
        out.fmt[pos] = 0 if rec.format == "binary" else 1
        out.kind[pos] = records.KIND_CODES[rec.kind] - 1
        out.synced[pos], out.boot[pos], out.seq[pos] = rec.synced, rec.boot, rec.seq
        out.time_us[pos] = rec.time_ms * 1000
        out.n_readings[pos] = len(rec.readings)
        rows.append(pos)
        chans += [c for c, _ in rec.readings]
        vals += [v for _, v in rec.readings]
        dropped = rec.value(records.DROPPED_TOTAL)
        if dropped is not None:
            out.dropped[pos], out.has_dropped[pos] = dropped, True
    if rows:
        out.readings.append((np.array(rows, np.int64), np.array(chans, np.int64), np.array(vals, np.int64)))


def _segment_sum(x: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    c = np.concatenate([[0], np.cumsum(x)])
    ends = np.cumsum(lengths)
    return c[ends] - c[ends - lengths]


def _sub_payloads(n_out, rpos, m_start, m_len, data) -> pa.Array:
    """sub_payload: the delivered sub-messages (in buffer order) at their output rows, null elsewhere."""
    nonempty = m_len > 0
    marks = np.zeros(len(data) + 1, np.int8)
    marks[m_start[nonempty]] = 1
    marks[m_start[nonempty] + m_len[nonempty]] -= 1
    body = data[np.cumsum(marks[:-1], dtype=np.int8).astype(bool)] if len(data) else data
    return _place(pa.binary(), n_out, rpos, m_len, body)


def _quarantined_subs(n_out, rpos, m_start, m_len, data, bad) -> pa.Array:
    """sub_payload of the compact rows: the sub-messages of the quarantined records only."""
    parts = [data[a : a + n] for a, n in zip(m_start[bad], m_len[bad])]
    return _place(pa.binary(), n_out, rpos[bad], m_len[bad], np.concatenate(parts) if parts else np.zeros(0, np.uint8))


def _landed_payloads(n_out, pos, rows, p_off, data) -> pa.Array:
    """payload: the landed payload (b'' for null) at the quarantine rows `pos` of landed rows `rows`."""
    parts = [data[p_off[i] : p_off[i + 1]] for i in rows]  # quarantine rows only
    return _place(
        pa.binary(),
        n_out,
        pos,
        p_off[rows + 1] - p_off[rows],
        np.concatenate(parts) if parts else np.zeros(0, np.uint8),
    )
