#!/usr/bin/env python3
"""Differential run: the vectorised decoder (mqbatch.spark.vdecode) against the Spark job's
reference path (decode_batches) on generated, mutated and shared-vector batches.

    .venv/bin/python tests/spark/vdecode_diff.py --cases 10000000 [--seed N] [--batch 200]
    .venv/bin/python tests/spark/vdecode_diff.py --fuzz codec --cases 10000000     (codec.decode alone)
    .venv/bin/python tests/spark/vdecode_diff.py --fuzz records --cases 10000000   (records.parse alone)

Each case is one landed PUBLISH; cases are grouped into Arrow batches of --batch
rows, each batch with its own random job options (partial, allow_empty, limits,
max_future_s, and --hmac-keys for some: most rows carry a batch-hmac, good, tampered,
malformed or made with another key, some none, and some devices have no key). Both paths must return identical Arrow tables (schema, rows, order,
values), or both raise the same exception class. Prints the count of cases and of
differences; exit status 1 on any difference (the first few are printed).
Also used by tests/spark/test_vdecode.py (a bounded run in `make test`).
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import hashlib
import json
import random
import sys
import time

import pyarrow as pa

from mqbatch.spark import vdecode
from mqbatch.util.paths import ROOT
from mqbatch.wire import codec, integrity, records

T0_MS = 1_795_000_000_000


def reference_module():
    """The module holding the reference `decode_batches`, `JobOptions`, `_arrow_schema`."""
    from mqbatch.spark import decoder

    return decoder


# -- generators -------------------------------------------------------------------

SAMPLE_CH = [c.id for c in records.CHANNELS.values() if c.kind == records.SAMPLE]
HEALTH_CH = [c.id for c in records.CHANNELS.values() if c.kind == records.HEALTH]


def _value(rng: random.Random, ch: int) -> int:
    c = records.CHANNELS[ch]
    lo = c.low if c.low is not None else -(1 << 31)
    hi = c.high if c.high is not None else (1 << 31) - 1
    r = rng.random()
    if r < 0.15:
        return rng.choice([lo, hi])
    return rng.randint(lo, hi)


def _record(rng: random.Random, received_ms: int, fmt: str) -> bytes:
    kind = rng.choice([records.SAMPLE, records.HEALTH])
    chans = SAMPLE_CH if kind == records.SAMPLE else HEALTH_CH
    picked = rng.sample(chans, rng.randint(0, len(chans)))
    readings = [(c, _value(rng, c)) for c in picked]
    t = received_ms - rng.randint(-50_000, 5_000_000)
    enc = records.encode_json if fmt == "json" else records.encode_binary
    return enc(kind, rng.randint(0, 0xFFFFFFFF), rng.randint(0, 0xFFFFFFFF), t, readings, synced=rng.random() < 0.8)


def _bad_record(rng: random.Random, received_ms: int) -> bytes:
    """A record with one content or structure error (every record reason code)."""
    rec = bytearray(_record(rng, received_ms, "binary"))
    n = rec[3]
    what = rng.randrange(14)
    if what == 0:
        return b""
    if what == 1:
        rec[0] = rng.choice([0, 2, 0x7A, 0xFF])
    elif what == 2:
        rec = rec[: rng.randrange(18)]
    elif what == 3:
        rec[1] = rng.choice([0, 3, 255])
    elif what == 4:
        rec[2] |= 1 << rng.randint(1, 7)
    elif what == 5:
        rec[3] = rng.choice([33, 255, n + 1, max(n - 1, 0)])
    elif what == 6:
        rec += bytes(rng.randint(1, 6))
    elif what == 7:
        rec[16:18] = rng.randint(1000, 65535).to_bytes(2, "little")
    elif what == 8 and n:
        rec[18 + 5 * rng.randrange(n)] = rng.choice([0, 7, 0x7F, 0x87, 0xFF])
    elif what == 9 and n:
        i = rng.randrange(n)
        rec[18 + 5 * i] = rng.choice(HEALTH_CH if rec[1] == 1 else SAMPLE_CH)
    elif what == 10 and n >= 2:
        i, j = rng.sample(range(n), 2)
        rec[18 + 5 * j] = rec[18 + 5 * i]
    elif what == 11 and n:
        i = rng.randrange(n)
        c = records.CHANNELS.get(rec[18 + 5 * i])
        if c is not None and (c.low is not None or c.high is not None):
            v = (
                (c.low - rng.randint(1, 3))
                if c.high is None or (c.low is not None and rng.random() < 0.5)
                else c.high + rng.randint(1, 3)
            )
            rec[19 + 5 * i : 23 + 5 * i] = max(min(v, (1 << 31) - 1), -(1 << 31)).to_bytes(4, "little", signed=True)
    elif what == 12:
        t_s = (received_ms + 86_400_000 + rng.randint(-2, 2) * 1000) // 1000 - records.EPOCH_2020_S
        rec[12:16] = max(min(t_s, 0xFFFFFFFF), 0).to_bytes(4, "little")
    else:
        pos = rng.randrange(len(rec))
        rec[pos] = rng.randrange(256)
    return bytes(rec)


def _bad_json(rng: random.Random, received_ms: int) -> bytes:
    obj = json.loads(_record(rng, received_ms, "json"))
    what = rng.randrange(10)
    if what == 0:
        return b'{"v":1,' + bytes(rng.randrange(256) for _ in range(rng.randint(0, 6)))
    if what == 1:
        obj["v"] = rng.choice([2, True, "1", 1.0])
    elif what == 2:
        del obj[rng.choice(list(obj))]
    elif what == 3:
        obj[rng.choice(["boot", "seq", "ts_ms"])] = rng.choice([-1, 1 << 32, 1.5, None, "3", 10**19])
    elif what == 4:
        obj["r"][rng.choice(["heat", "free_heap", "temperature"])] = rng.choice([1, 1 << 31, -5001, 2.5])
    elif what == 5:
        obj["kind"] = rng.choice(["Sample", 1, None])
    elif what == 6:
        obj["synced"] = rng.choice([1, "true", None])
    elif what == 7:
        return b"[1,2]"
    elif what == 8:
        return (json.dumps(obj)[:-1] + ',"v":1}').encode()
    else:
        obj["ts_ms"] = received_ms + 86_400_000 + rng.randint(-1, 1)
    return json.dumps(obj).encode()


def _subs(rng: random.Random, received_ms: int) -> list[bytes]:
    n = rng.choice([1, 1, 2, 3, 5, 8]) if rng.random() < 0.95 else rng.randint(9, 120)
    mix = rng.random()
    out = []
    for _ in range(n):
        r = rng.random()
        if r < 0.06:
            out.append(_bad_record(rng, received_ms))
        elif r < 0.08:
            out.append(_bad_json(rng, received_ms))
        elif r < mix * 0.3:
            out.append(_record(rng, received_ms, "json"))
        else:
            out.append(_record(rng, received_ms, "binary"))
    return out


def _topic(rng: random.Random):
    r = rng.random()
    if r < 0.9:
        return f"mqbatch/dev-{rng.randrange(50)}/telemetry"
    return rng.choice(
        [
            None,
            "",
            "mqbatch//telemetry",
            "mqbatch/a/b/telemetry",
            "mqbatch/telemetry",
            "mqbatch/d\u00e9v/telemetry",
            "mqbatch/a\nb/telemetry",
            "mqbatch/x/telemetry/",
            "Mqbatch/x/telemetry",
            "mqbatch/x/telemetryx",
            "mqbatch/\u2603/telemetry",
            "mqbatch/\"q\\/telemetry",
        ]
    )


def _size_text(rng: random.Random, n: int) -> str:
    r = rng.random()
    if r < 0.85:
        return str(n)
    return rng.choice(
        [
            "0",
            "01",
            "+1",
            " 1",
            "1 ",
            "\u0661",
            "",
            "x",
            "1.0",
            str(n + 1),
            str(max(n - 1, 1)),
            "99999999999999999999",
            "10000000000000",
            "1" + "0" * 40,
            "-1",
            "2\n",
        ]
    )


def _props(rng: random.Random, n: int):
    props = [("batch-format", "v1"), ("batch-size", _size_text(rng, n))]
    r = rng.random()
    if r < 0.05:
        props.pop(rng.randrange(2))
    elif r < 0.08:
        props.append(rng.choice(props))
    elif r < 0.11:
        props[0] = ("batch-format", rng.choice(["v2", "V1", "v1 ", "", "\u00e91"]))
    elif r < 0.14:
        props.insert(
            rng.randrange(3),
            (
                rng.choice(["origin", "Batch-Format", "k\u00e9y", "q\"uote", "\\", "tab\t", ""]),
                rng.choice(["x", "\u2603", "", "a\"b"]),
            ),
        )
    elif r < 0.16:
        rng.shuffle(props)
    if rng.random() < 0.01:
        return None
    rows = [{"key": k, "value": v} for k, v in props]
    if rng.random() < 0.02:
        rows.insert(
            rng.randrange(len(rows) + 1),
            rng.choice([None, {"key": None, "value": "v1"}, {"key": "batch-format", "value": None}]),
        )
    return rows


def _mutate(rng: random.Random, payload: bytes) -> bytes:
    b = bytearray(payload)
    for _ in range(rng.randint(1, 3)):
        op = rng.randrange(5)
        if op == 0 and b:
            b[rng.randrange(len(b))] = rng.randrange(256)
        elif op == 1:
            b.insert(rng.randrange(len(b) + 1), rng.choice([0, 0x80, 0xFF, 0x7F, rng.randrange(256)]))
        elif op == 2 and b:
            del b[rng.randrange(len(b))]
        elif op == 3:
            b = b[: rng.randrange(len(b) + 1)]
        else:
            b += bytes(rng.randrange(256) for _ in range(rng.randint(1, 4)))
    return bytes(b)


VBI_CASES = [
    b"\x80",
    b"\xff\xff\xff\xff\x01",
    b"\x80\x00",
    b"\x81\x80\x00",
    b"\x80\x80\x80",
    b"\x00",
    b"\x05ab",
    b"\xff\xff\xff\x7f",
    b"\x80\x01" + b"x" * 128,
    b"\x7f" + b"y" * 127,
]


# the devices dev-0 .. dev-49 of _topic; --hmac-keys (when a batch's options have it) holds 45 of them
HMAC_KEYS = tuple((f"dev-{i}", hashlib.sha256(f"key of dev-{i}".encode()).digest()) for i in range(45))
_KEYS = dict(HMAC_KEYS)
_OTHER_KEY = b"\x42" * 32


def _sign(rng: random.Random, row: dict) -> None:
    """Add a batch-hmac to row's user properties (as the reference reads them): good (most),
    none, over a changed payload, under another key, malformed or repeated."""
    r = rng.random()
    if r < 0.15 or row["user_properties"] is None:
        return  # unsigned
    topic, payload = row["topic"], row["payload"] or b""
    props = [((p or {}).get("key") or "", (p or {}).get("value") or "") for p in row["user_properties"]]
    key = _KEYS.get(topic[len("mqbatch/") : -len("/telemetry")] if topic else "", _OTHER_KEY)
    try:
        mac = integrity.mac_hex(_OTHER_KEY if r < 0.2 else key, topic or "", props, payload)
    except ValueError:  # a hostile property over 65535 bytes
        return
    if r < 0.25:
        row["payload"] = payload + b"\x00"  # tampered after signing
    elif r < 0.28:
        mac = rng.choice([mac.upper(), mac[:-1], mac + "0", "", "g" * 64])
    entry = {"key": integrity.PROPERTY, "value": mac}
    row["user_properties"].insert(rng.randrange(len(row["user_properties"]) + 1), entry)
    if 0.28 <= r < 0.30:
        row["user_properties"].append(entry)  # repeated


def case(rng: random.Random) -> dict:
    """One landed row (dict of the landed columns; received_at in µs), signed by _sign."""
    row = _case(rng)
    _sign(rng, row)
    return row


def _case(rng: random.Random) -> dict:
    received_ms = T0_MS + rng.randint(0, 10**9)
    subs = _subs(rng, received_ms)
    payload = codec.encode_payload(subs)
    n = len(subs)
    r = rng.random()
    if r < 0.10:
        payload = _mutate(rng, payload)
    elif r < 0.13:
        payload = bytes(rng.randrange(256) for _ in range(rng.randint(0, 40)))
    elif r < 0.17:
        payload = rng.choice(VBI_CASES) if rng.random() < 0.5 else payload + rng.choice(VBI_CASES)
        n = rng.randint(1, 3) if rng.random() < 0.5 else n + 1
    elif r < 0.19:
        payload = codec.encode_payload(subs + [b""] * rng.randint(1, 3))
        n = n + (0 if rng.random() < 0.3 else 2)
    elif r < 0.20:
        payload = None
    return {
        "topic": _topic(rng),
        "payload": payload,
        "user_properties": _props(rng, n),
        "content_type": None,
        "payload_format_indicator": None,
        "message_expiry_interval": None,
        "qos": rng.choice([0, 1, 2]),
        "retain": False,
        "received_at": None if rng.random() < 0.01 else received_ms * 1000 + rng.randint(0, 999),
        "dup": False,
        "recorder": "r1",
        "segment": rng.randrange(3),
        "offset": rng.randrange(10**6),
    }


def job_options(rng: random.Random, ref):
    return ref.JobOptions(
        partial=rng.random() < 0.5,
        allow_empty=rng.random() < 0.7,
        max_batch_size=100 if rng.random() < 0.7 else rng.choice([1, 3, 120, 10**12, 10**13, 2**70, 0]),
        max_payload_bytes=65536 if rng.random() < 0.8 else rng.choice([30, 200, 10**20, 0]),
        max_future_s=86400 if rng.random() < 0.8 else rng.choice([0, -5, 10**20]),
        hmac_keys=HMAC_KEYS if rng.random() < 0.4 else None,
    )


def landed_batch(rows: list[dict]) -> pa.RecordBatch:
    return pa.RecordBatch.from_pylist(rows, schema=vdecode.LANDED)


def vector_batches(ref) -> list[tuple[pa.RecordBatch, object]]:
    """Every shared vector (tests/vectors/batch_v1.json) as one landed row, grouped by options."""
    with open(ROOT / "tests" / "vectors" / "batch_v1.json", encoding="utf-8") as f:
        vectors = json.load(f)["vectors"]
    groups: dict[str, list[dict]] = {}
    for i, v in enumerate(vectors):
        for topic in (f"mqbatch/vec-{i}/telemetry", "bad/topic"):
            groups.setdefault(json.dumps(v["options"], sort_keys=True), []).append(
                {
                    "topic": topic,
                    "payload": bytes.fromhex(v["payload_hex"]),
                    "user_properties": [{"key": k, "value": val} for k, val in v["user_properties"]],
                    "qos": 1,
                    "retain": False,
                    "received_at": (T0_MS + i) * 1000,
                    "dup": False,
                    "recorder": "vectors",
                    "segment": 0,
                    "offset": i,
                }
            )
    return [(landed_batch(rows), ref.JobOptions(**json.loads(o))) for o, rows in groups.items()]


# -- comparison --------------------------------------------------------------------


@dataclasses.dataclass
class Outcome:
    cases: int = 0
    batches: int = 0
    records: int = 0  # output rows of the reference
    equal_errors: int = 0  # both paths raised the same exception class
    differences: list = dataclasses.field(default_factory=list)
    stats: dict = dataclasses.field(default_factory=dict)
    reasons: collections.Counter = dataclasses.field(default_factory=collections.Counter)  # reference rows


def compare(batch: pa.RecordBatch, opts, ref, outcome: Outcome) -> None:
    outcome.cases += batch.num_rows
    outcome.batches += 1
    try:
        want = pa.Table.from_batches(list(ref.decode_batches(iter([batch]), opts)))
    except Exception as e:  # noqa: BLE001 - a reference crash must be a vdecode crash too
        want = e
    before = outcome.stats.get("mismatch", 0)
    try:
        got = pa.Table.from_batches([vdecode.decode_arrow(batch, opts, outcome.stats)])
    except Exception as e:  # noqa: BLE001
        got = e
    if outcome.stats.get("mismatch", 0) != before:  # vectorised checks flagged what the reference accepts
        outcome.differences.append(
            (
                batch,
                opts,
                "vdecode's vectorised checks disagree with the reference on a row it then handed to the reference",
            )
        )
    if isinstance(want, Exception) or isinstance(got, Exception):
        if type(want) is type(got):
            outcome.equal_errors += 1
        else:
            outcome.differences.append((batch, opts, f"reference: {want!r:.300}\nvdecode: {got!r:.300}"))
        return
    outcome.reasons.update(want.column("reason").to_pylist())
    outcome.records += want.num_rows
    if not want.equals(got) or want.schema != got.schema:
        outcome.differences.append((batch, opts, _first_difference(want, got)))


def _first_difference(want: pa.Table, got: pa.Table) -> str:
    if want.schema != got.schema:
        return f"schema differs:\n{want.schema}\n--\n{got.schema}"
    if want.num_rows != got.num_rows:
        return f"{want.num_rows} rows in the reference, {got.num_rows} from vdecode"
    for name in want.column_names:
        a, b = want.column(name).to_pylist(), got.column(name).to_pylist()
        for i, (x, y) in enumerate(zip(a, b)):
            if x != y:
                return f"column {name} row {i}: reference {x!r:.200} vdecode {y!r:.200}"
    return "tables differ (nulls or chunking)"


def run(cases: int, seed: int, batch_rows: int = 200, vectors: bool = True, progress: bool = False) -> Outcome:
    ref = reference_module()
    rng = random.Random(seed)
    outcome = Outcome()
    if vectors:
        for batch, opts in vector_batches(ref):
            compare(batch, opts, ref, outcome)
    t0 = time.monotonic()
    last = t0
    done = 0
    while done < cases:
        k = min(batch_rows if rng.random() < 0.9 else rng.randint(0, 5), cases - done)
        compare(landed_batch([case(rng) for _ in range(k)]), job_options(rng, ref), ref, outcome)
        done += k
        if progress and time.monotonic() - last > 60:
            last = time.monotonic()
            print(f"  {done:,} cases, {len(outcome.differences)} differences, {last - t0:.0f} s", flush=True)
    return outcome


# -- long fuzz runs of the two reference parsers (docs/format.md) ---------------------


def _fuzz_properties(rng: random.Random, n: int):
    """User properties in every shape decode() may meet: pairs, {key, value} dicts, junk."""
    props = [(d["key"], d["value"]) if d and rng.random() < 0.5 else d for d in (_props(rng, n) or [])]
    if rng.random() < 0.05:
        props.append(
            rng.choice(
                [
                    ("batch-size", "7" * rng.choice([13, 4301, 6000])),
                    {"name": "x", "value": 1},
                    (b"batch-format", b"v1"),
                    ("a",),
                    None,
                    5,
                    {"key": "k"},
                    (1, 2),
                ]
            )
        )
    return props


def fuzz_codec(rng: random.Random) -> str | None:
    """One hostile input to codec.decode; a string says what broke."""
    row = case(rng)
    opts = codec.DecodeOptions(
        max_batch_size=rng.choice([100, 1, 3, 10**12, 10**13, 2**70, 0]),
        max_payload_bytes=rng.choice([65536, 30, 0, 10**20]),
        allow_empty=rng.random() < 0.5,
        partial=rng.random() < 0.5,
    )
    payload = (
        row["payload"]
        if rng.random() < 0.9
        else rng.choice([None, bytearray(b"\x01a"), memoryview(b"\x01a"), "text", 5])
    )
    res = codec.decode(_fuzz_properties(rng, rng.randint(1, 9)), payload, opts, topic=row["topic"])
    json.dumps(res.log)
    if res.status not in (codec.OK, codec.PARTIAL, codec.DISCARDED) or (res.status == codec.OK) != (res.reason is None):
        return f"bad result {res.status} {res.reason}"
    if res.reason is not None and res.reason not in codec.REASON_CODES:
        return f"unknown reason {res.reason}"
    return None


def fuzz_records(rng: random.Random) -> str | None:
    """One hostile sub-payload to records.parse; a string says what broke."""
    received_ms = T0_MS + rng.randint(0, 10**9)
    r = rng.random()
    if r < 0.3:
        data = _bad_record(rng, received_ms)
    elif r < 0.5:
        data = _bad_json(rng, received_ms)
    elif r < 0.8:
        data = _mutate(rng, _record(rng, received_ms, rng.choice(["binary", "json"])))
    elif r < 0.9:
        data = _record(rng, received_ms, "binary")
    else:
        data = rng.choice([b"\x01", b"{"]) + bytes(rng.randrange(256) for _ in range(rng.randint(0, 60)))
    try:
        rec = records.parse(data, None if rng.random() < 0.05 else received_ms)
    except records.RecordError as e:
        return None if e.reason in records.RECORD_REASONS and e.detail else f"bad RecordError {e!r}"
    if (
        rec.format == "binary"
        and records.encode_binary(rec.kind, rec.boot, rec.seq, rec.time_ms, rec.readings, rec.synced) != data
    ):
        return f"binary record does not round-trip: {data.hex()}"
    return None


def fuzz(target: str, cases: int, seed: int) -> int:
    one = {"codec": fuzz_codec, "records": fuzz_records}[target]
    rng = random.Random(seed)
    crashes, failures, t0 = 0, 0, time.monotonic()
    last = t0
    for i in range(cases):
        try:
            what = one(rng)
        except Exception as e:  # noqa: BLE001 - a crash is what we count
            crashes += 1
            what = f"crash {e!r:.200}"
        if what:
            failures += 1
            if failures <= 3:
                print(f"  input {i} of seed {seed}: {what}")
        if time.monotonic() - last > 60:
            last = time.monotonic()
            print(f"  {i + 1:,} inputs, {crashes} crashes, {last - t0:.0f} s", flush=True)
    print(
        f"fuzz {target}: {cases:,} inputs (seed {seed}), {crashes} crashes, {failures - crashes} wrong results, "
        f"{time.monotonic() - t0:.0f} s"
    )
    return 1 if failures else 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cases", type=int, default=100_000)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--batch", type=int, default=200, help="landed rows per Arrow batch")
    p.add_argument(
        "--fuzz",
        choices=["codec", "records"],
        help="instead: fuzz codec.decode or records.parse alone with --cases inputs",
    )
    args = p.parse_args(argv)
    if args.fuzz:
        return fuzz(args.fuzz, args.cases, args.seed)
    t0 = time.monotonic()
    out = run(args.cases, args.seed, args.batch, progress=True)
    print(
        f"vdecode_diff: {out.cases:,} cases in {out.batches:,} Arrow batches (seed {args.seed}), "
        f"{len(out.differences)} differences, {out.equal_errors} batches where both paths raised the same "
        f"exception, {out.records:,} output rows, reference fallbacks {out.stats}, {time.monotonic() - t0:.0f} s"
    )
    print("  output rows by reason:", dict(sorted(out.reasons.items(), key=str)))
    for _batch, opts, what in out.differences[:3]:
        print(f"--- options {opts}\n{what}")
    return 1 if out.differences else 0


if __name__ == "__main__":
    sys.exit(main())
