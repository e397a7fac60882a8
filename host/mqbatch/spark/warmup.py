"""A streaming job's warm-up: two micro-batches of its own before it takes the landing zone.

A fresh JVM pays for its first micro-batches: class loading, code generation, the JIT, the
Python workers' start. At 10,000 devices one run's first micro-batch took 26 s for 3,660
records and the five after it 14-17 s each, where a warm one takes about 4 s for 50,000;
the landing files that came meanwhile queued behind them, and it took about four minutes
to catch up (docs/scale.md, "The first micro-batches"). A live table pays that with its
first data. The warm-up pays it before the job says it is streaming:

- micro-batch 0: one landing file of WARM_UP_PUBLISHES valid batches of binary records of a
  device of its own (DEVICE; signed with a key of its own when the job checks batch-hmac)
  and one malformed PUBLISH (the Python decoders and quarantine/);
- micro-batch 1: the next records of that device and a copy of micro-batch 0's first
  PUBLISH (a resend: the look-back, de-duplication and the seen state);

each through the stream's own `process_batch`, report included, into OUT/_warmup (private,
removed after, and at the next start if a kill left it). Nothing of it reaches the job's
outputs. It took 15.9-18.9 s on 2 cores beside a 10,000-device fleet, before the first micro-batch.
`--no-warm-up` skips it. If it fails, the job says so in one line and streams cold.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import re
import shutil
import time

from pyspark.sql import SparkSession

from mqbatch.ingest import landing as landing_zone
from mqbatch.spark.options import JobOptions
from mqbatch.util.private import DIR_MODE, private_dir
from mqbatch.wire import codec, integrity, records

DIRECTORY = "_warmup"  # under --out; hidden from Spark's readers like every _ name
DEVICE = "mqbatch-warm-up"  # its records' device (a topic of its own: mqbatch/<device>/telemetry)
WARM_UP_PUBLISHES = 40  # valid PUBLISHes per micro-batch
PER_PUBLISH = 50  # records per PUBLISH, at most (fewer when the job's limits allow fewer)
RECORDER = "warmup"
TOPIC = f"mqbatch/{DEVICE}/telemetry"


@dataclasses.dataclass(frozen=True)
class Done:
    """What the warm-up did: its seconds, and the new records each micro-batch wrote, the
    duplicates and quarantined rows of its report; `expected` the same figures when every
    step worked (a shortfall means a path stayed cold)."""

    seconds: float
    new_records: tuple[int, ...]
    duplicates: int
    quarantined: int
    expected: tuple

    def line(self) -> str:
        got = (self.new_records, self.duplicates, self.quarantined)
        return (
            f"warmed up in {self.seconds:.1f} s: two micro-batches of its own, new records "
            f"{' + '.join(map(str, self.new_records))}, {self.duplicates} duplicates, {self.quarantined} quarantined"
            + ("" if got == self.expected else f" (expected {self.expected}: part of the job stays cold)")
            + " (--no-warm-up skips it)"
        )


def _per_publish(opts: JobOptions, now_us: int) -> int:
    """Records per PUBLISH: PER_PUBLISH, or fewer when the job's --max-batch-size or
    --max-payload-bytes would quarantine a batch of that many."""
    per = min(PER_PUBLISH, opts.max_batch_size)
    while per > 1 and len(_publish(0, per, now_us, None, now_us).payload) > opts.max_payload_bytes:
        per -= 1
    return per


def _publish(first: int, per: int, now_us: int, key: bytes | None, received_us: int, payload=None):
    """The PUBLISH of DEVICE's records first..first+per-1 (sampled a minute before now_us),
    or with `payload` instead (the malformed one), signed when key is given."""
    if payload is None:
        t_ms = now_us // 1000 - 60_000
        recs = [
            records.encode_binary("sample", 1, seq, t_ms + seq, [(1, seq % 4000), (2, 3300)])
            for seq in range(first, first + per)
        ]
        props, payload = codec.encode_batch(recs, max_batch_size=per)
    else:
        props = []
    if key is not None:
        props.append(integrity.sign(key, TOPIC, props, payload))
    return landing_zone.Landed(TOPIC, payload, props, received_at_us=received_us)


def _landing_file(directory: pathlib.Path, part: int, per: int, key: bytes | None, now_us: int) -> str:
    """Micro-batch `part`'s landing file (as a file: URI, as Spark's file source gives it):
    its valid PUBLISHes, in part 1 a copy of part 0's first one, and a malformed one."""
    received = now_us + part * 1_000_000
    rows = [
        _publish((part * WARM_UP_PUBLISHES + i) * per, per, now_us, key, received + i) for i in range(WARM_UP_PUBLISHES)
    ]
    if part == 1:
        rows.append(_publish(0, per, now_us, key, received + WARM_UP_PUBLISHES))
    rows.append(_publish(0, per, now_us, key, received + WARM_UP_PUBLISHES + 1, payload=b"\x00not a batch"))
    table = landing_zone.to_table(rows, RECORDER, part)
    path = landing_zone.write_parquet_atomic(table, directory, landing_zone.parquet_name(RECORDER, part))
    return path.resolve().as_uri()


def remove(out: str) -> None:
    """OUT/_warmup, if a warm-up left it (killed); a symlink or file there is unlinked, not followed."""
    base = pathlib.Path(out) / DIRECTORY
    if base.is_symlink() or (base.exists() and not base.is_dir()):
        base.unlink()
    shutil.rmtree(base, ignore_errors=True)


def warm_up(spark: SparkSession, out: str, opts: JobOptions, process_batch) -> Done:
    """Runs the two micro-batches through process_batch(spark, files_df, batch_id, out, opts,
    say=...) into OUT/_warmup, removes it, and says what they did (Done)."""
    started = time.monotonic()
    base = pathlib.Path(out) / DIRECTORY
    remove(out)
    os.mkdir(base, DIR_MODE)  # fails if anything is there: never a directory of someone else's
    key = os.urandom(integrity.HMAC_KEY_BYTES) if opts.hmac_keys is not None else None
    if key is not None:  # a key of its own, beside the job's (its options are not changed)
        own = [(d, k) for d, k in opts.hmac_keys or () if d != DEVICE]
        opts = dataclasses.replace(opts, hmac_keys=tuple(sorted([*own, (DEVICE, key)])))
    now_us = time.time_ns() // 1000
    per = _per_publish(opts, now_us)
    said: list[str] = []
    try:
        private_dir(base / "landing")
        for part in (0, 1):
            uri = _landing_file(base / "landing", part, per, key, now_us)
            files = spark.createDataFrame([(uri,)], "path string")
            process_batch(spark, files, part, str(base / "out"), opts, say=lambda line, **_: said.append(line))
        report = json.loads((base / "out" / "report.json").read_text(encoding="utf-8"))
    finally:
        remove(out)
    new = tuple(int(m.group(1)) for line in said if (m := re.search(r"(\d+) new records", line)))
    n = WARM_UP_PUBLISHES * per
    return Done(
        time.monotonic() - started,
        new,
        report["records"]["duplicates"],
        report["quarantine"]["rows"],
        expected=((n, n), per, 2),
    )
