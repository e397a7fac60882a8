#!/usr/bin/env python3
"""Differential run: the decode step with the JVM fast path (mqbatch.spark.jvm, Java code
for valid batches of binary records) against the same step without it (every row through
the Python decoders, themselves held to the reference by tests/spark/vdecode_diff.py), in Spark.

    .venv/bin/python tests/spark/jvm_decode_diff.py --cases 1000000 [--seed N] [--groups 20]

The cases are vdecode_diff's generated and mutated landed PUBLISHes (every batch, topic
and record reason, JSON records, nulls) plus the shared vectors; each group of cases
gets its own job options (as vdecode_diff draws them, --hmac-keys for some: the fast path
then takes only the batches whose batch-hmac verifies) and runs through `decode` in full and
in compact rows. Both paths must
give the same rows: same columns, same values, row for row after sorting by the landed
row and the position in it. Prints the cases, the rows, how many landed rows the fast
path took, and the differences; exit status 1 on any difference.
Also used by tests/spark/test_jvm_decode.py (a bounded run in `make test`).
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import os
import pathlib
import random
import sys
import tempfile
import time

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

HERE = pathlib.Path(__file__).resolve().parent
PATH = "_mqbatch_diff_fast"  # the union's tag column: True for the fast path's rows
SORT = [
    ("offset", "ascending"),
    ("segment", "ascending"),
    ("sub_index", "ascending"),
    ("stage", "ascending"),
    ("reason", "ascending"),
]


def _vdecode_diff():
    spec = importlib.util.spec_from_file_location("vdecode_diff", HERE / "vdecode_diff.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(spec.name, module)
    spec.loader.exec_module(module)
    return sys.modules[spec.name]


@dataclasses.dataclass
class Outcome:
    cases: int = 0
    rows: int = 0
    fast_landed: int = 0  # landed rows the JVM decoded
    differences: list = dataclasses.field(default_factory=list)


def _both(python, fast) -> tuple[pa.Table, pa.Table]:
    """The rows of both paths from one Spark job (a union tagged by path), each sorted."""
    from pyspark.sql import functions as F

    tagged = python.withColumn(PATH, F.lit(False)).unionByName(fast.withColumn(PATH, F.lit(True))).toArrow()
    mask = tagged.column(PATH)
    return tuple(tagged.filter(m).drop_columns([PATH]).sort_by(SORT) for m in (pc.invert(mask), mask))


def compare_group(spark, rows: list[dict], opts, tmp: pathlib.Path, outcome: Outcome) -> None:
    """One group of landed rows under one set of options: fast path vs Python, full and compact."""
    from mqbatch.spark import jvm, pipeline, vdecode

    for i, row in enumerate(rows):  # a unique (segment, offset) per landed row: the sort key
        row["segment"], row["offset"] = 0, outcome.cases + i
    path = tmp / f"group-{outcome.cases}.parquet"
    pq.write_table(pa.Table.from_pylist(rows, schema=vdecode.LANDED), path)
    landed = pipeline.read_landing(spark, [str(path)])
    outcome.cases += len(rows)
    outcome.fast_landed += landed.where(jvm.is_fast(spark, opts)).count()
    for compact in (False, True):
        python = pipeline.decode(landed, opts, compact, fast_path=False)
        fast = pipeline.decode(landed, opts, compact, fast_path=True)
        if python.schema != fast.schema:  # Spark's own types and nullability, before any job runs
            outcome.differences.append((opts, compact, f"schemas differ:\n{python.schema}\n--\n{fast.schema}"))
            continue
        want, got = _both(python, fast)
        if not compact:
            outcome.rows += want.num_rows
        if want.equals(got):  # one table's halves: same schema
            continue
        a, b = want.to_pylist(), got.to_pylist()
        if a != b:
            first = next(
                (f"row {k}: python {x!r:.600}\n  jvm {y!r:.600}" for k, (x, y) in enumerate(zip(a, b)) if x != y),
                f"{len(a)} rows from python, {len(b)} from the fast path",
            )
            outcome.differences.append((opts, compact, first))


def clean_case(diff, rng: random.Random, opts) -> dict:
    """A landed row the fast path should take (valid binary records at random values), or,
    one time in two, the same with one record at or just past one of its limits (edge())."""
    from mqbatch.wire import codec

    row = diff._case(rng)
    received_ms = row["received_at"] // 1000 if row["received_at"] is not None else diff.T0_MS
    subs = [diff._record(rng, received_ms, "binary") for _ in range(rng.choice([1, 2, 5, 50, 100]))]
    if rng.random() < 0.5:
        k = rng.randrange(len(subs))
        subs[k] = edge(rng, bytearray(subs[k]), received_ms, opts.max_future_s * 1000)
    payload = codec.encode_payload(subs)
    row.update(
        topic=f"mqbatch/dev-{rng.randrange(50)}/telemetry",
        payload=payload,
        user_properties=[{"key": "batch-format", "value": "v1"}, {"key": "batch-size", "value": str(len(subs))}],
    )
    sign(diff, rng, row, subs)
    return row


def sign(diff, rng: random.Random, row: dict, subs: list[bytes]) -> None:
    """A batch-hmac for a row the fast path may take (the batch stays well-formed, so only the
    MAC check can refuse it): good one time in two; under a key not in the file, under another
    device's key, or over the same records in reverse order (tampered) one time in eight each;
    else vdecode_diff's mix (none, tampered, another key, malformed, repeated)."""
    from mqbatch.wire import codec, integrity

    r = rng.random()
    if r >= 7 / 8:
        diff._sign(rng, row)
        return
    device = row["topic"][len("mqbatch/") : -len("/telemetry")]
    key = diff._KEYS.get(device, diff._OTHER_KEY)
    if 0.5 <= r < 5 / 8:
        key = diff._OTHER_KEY
    elif 5 / 8 <= r < 6 / 8:
        key = diff.HMAC_KEYS[(int(device.split("-")[1]) + 1) % len(diff.HMAC_KEYS)][1]
    props = [(p["key"], p["value"]) for p in row["user_properties"]]
    mac = integrity.mac_hex(key, row["topic"], props, row["payload"])
    if r >= 6 / 8:  # tampered: the records reordered (still valid, same length); one record: another key
        swapped = codec.encode_payload(subs[::-1])
        if swapped != row["payload"]:
            row["payload"] = swapped
        else:
            mac = integrity.mac_hex(diff._OTHER_KEY, row["topic"], props, row["payload"])
    row["user_properties"].append({"key": integrity.PROPERTY, "value": mac})


def edge(rng: random.Random, rec: bytearray, received_ms: int, max_future_ms: int) -> bytes:
    """One binary record moved to, or just past, one limit that records.parse checks."""
    from mqbatch.wire import records

    n = rec[3]
    what = rng.randrange(7)
    if what == 0 and n:  # a value at / past its channel's range
        i = rng.randrange(n)
        ch = records.CHANNELS[rec[18 + 5 * i]]
        bounds = [b + d for b in (ch.low, ch.high) if b is not None for d in (-1, 0, 1)]
        value = rng.choice(bounds) if bounds else rng.choice([-(1 << 31), (1 << 31) - 1])
        rec[19 + 5 * i : 23 + 5 * i] = max(-(1 << 31), min((1 << 31) - 1, value)).to_bytes(4, "little", signed=True)
    elif what == 1:  # device time at / past the future limit
        t = received_ms + max_future_ms + rng.choice([-1, 0, 1])
        t = max(records.EPOCH_2020_S * 1000, min(t, (records.EPOCH_2020_S + 0xFFFFFFFF) * 1000 + 999))
        s, ms = divmod(t, 1000)
        rec[12:16] = (s - records.EPOCH_2020_S).to_bytes(4, "little")
        rec[16:18] = ms.to_bytes(2, "little")
    elif what == 2:  # time_ms 999 / 1000 / 65535
        rec[16:18] = rng.choice([999, 1000, 65535]).to_bytes(2, "little")
    elif what == 3:  # flags: synced, reserved bits
        rec[2] = rng.choice([0, 1, 2, 0x80, 0xFF])
    elif what == 4:  # kind: other, unknown
        rec[1] = rng.choice([0, 1, 2, 3, 0xFF])
    elif what == 5 and n:  # a channel: another's, unknown, of the other kind
        i = rng.randrange(n)
        rec[18 + 5 * i] = rng.choice([rec[18 + 5 * rng.randrange(n)], 0, 7, 0x7F, 0x80, 0x86, 0x87, 0xFF])
    else:  # the reading count against the size
        rec[3] = rng.choice([max(0, n - 1), n + 1, 32, 33])
    return bytes(rec)


def run(spark, cases: int, seed: int, groups: int = 20, vectors: bool = True, progress: bool = False) -> Outcome:
    from mqbatch.spark import jvm

    if not jvm.registered(spark):
        raise SystemExit("jvm_decode_diff: the session has no JVM fast path (see above); nothing to compare")
    diff = _vdecode_diff()
    ref = diff.reference_module()
    rng = random.Random(seed)
    outcome = Outcome()
    with tempfile.TemporaryDirectory(prefix="mqbatch-jvm-diff-") as tmp:
        tmp = pathlib.Path(tmp)
        if vectors:
            for batch, opts in diff.vector_batches(ref):
                compare_group(spark, batch.to_pylist(), opts, tmp, outcome)
        per_group = max(1, -(-cases // groups))
        t0 = last = time.monotonic()
        done = 0
        while done < cases:
            k = min(per_group, cases - done)
            # every other group with --hmac-keys (the fast path then checks each batch-hmac)
            opts = dataclasses.replace(
                diff.job_options(rng, ref), hmac_keys=diff.HMAC_KEYS if done // per_group % 2 else None
            )
            rows = [diff.case(rng) if rng.random() < 0.5 else clean_case(diff, rng, opts) for _ in range(k)]
            compare_group(spark, rows, opts, tmp, outcome)
            done += k
            if progress and time.monotonic() - last > 60:
                last = time.monotonic()
                print(f"  {done:,} cases, {len(outcome.differences)} differences, {last - t0:.0f} s", flush=True)
    return outcome


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cases", type=int, default=100_000)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument(
        "--groups",
        type=int,
        default=20,
        help="option sets (each a few Spark jobs whose rows are collected to the driver; at least "
        "one per 5,000 cases, so that a group fits the 1 GB local driver)",
    )
    args = p.parse_args(argv)
    args.groups = max(args.groups, -(-args.cases // 5000))
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from mqbatch.spark import session

    spark = session(None, "ERROR", **{"spark.ui.showConsoleProgress": "false"})
    t0 = time.monotonic()
    outcome = run(spark, args.cases, args.seed, args.groups, progress=True)
    print(
        f"{outcome.cases:,} landed rows ({args.cases:,} generated + the shared vectors), {outcome.rows:,} decoded "
        f"rows, {outcome.fast_landed:,} landed rows decoded by the JVM fast path, "
        f"{len(outcome.differences)} differences, {time.monotonic() - t0:.0f} s (seed {args.seed})"
    )
    for opts, compact, text in outcome.differences[:5]:
        print(f"--- {opts} compact={compact}\n{text}")
    spark.stop()
    return 1 if outcome.differences else 0


if __name__ == "__main__":
    sys.exit(main())
