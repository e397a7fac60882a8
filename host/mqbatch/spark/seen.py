"""What a streaming job has seen: per (device, boot), the highest seq of the valid records the
committed micro-batches took (every arrival, the copies they dropped too) and when the latest
of them landed.

A record can have an earlier copy only at a seq at or below that highest one (a copy has the
record's key). A micro-batch whose every (device, boot) starts above it, or whose earlier
arrivals all landed before the watermark, cannot drop anything: it skips the look-back for
earlier copies (stream._earlier_copies), whose cost grows with the history (at 10,000 devices,
one file of 50,000 records every 5 s, a micro-batch took 4.1 s at batch 20 and 5.8 s at batch
60, and fell behind). A resend, a reboot that reuses a boot number or a late landing file
makes the batch look back as before: the state only ever says "no copy is possible".

The state is one small Parquet file per commit, written staged and moved with the batch's
outputs (`_seen/bN-seen.parquet`, private like them); the newest committed one is read, the
older ones deleted after the commit. It holds a row per (device, boot) that landed within the
watermark (about one per device: 10,000 devices, 68 kB) and is exact from the commit's
SEEN_FROM (`seen_from_us`) on: every valid arrival the committed batches took that landed at
or after it is covered. A batch whose look-back reaches further back (a late file), or the
first batch after an older mqbatch committed (no SEEN_FROM), looks back and builds the state
from what it read."""

from __future__ import annotations

import pathlib
from typing import NamedTuple

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

SEEN_FROM = "seen_from_us"  # in a commit: its state (_seen/) covers every arrival landed at or after this
EVERYTHING = -(1 << 62)  # SEEN_FROM of a state that has seen every arrival (the first batch's)
NAME = "seen.parquet"  # the state's file in a batch's staging directory (stream._move_staged tags it)
SCHEMA = pa.schema(
    [
        pa.field("device", pa.string()),
        pa.field("boot", pa.int64()),
        pa.field("max_seq", pa.int64()),
        pa.field("last_us", pa.int64()),
    ]
)
EMPTY = SCHEMA.empty_table()


class Seen(NamedTuple):
    """A state and its SEEN_FROM: it covers every arrival landed at or after from_us."""

    table: pa.Table
    from_us: int


# of_arrivals: per (device, boot) of one micro-batch's valid records
BATCH_KEYS = pa.schema(
    [*SCHEMA, pa.field("min_seq", pa.int64()), pa.field("n", pa.int64()), pa.field("seqs", pa.int64())]
)


def of_arrivals(arrivals: DataFrame) -> pa.Table:
    """Per (device, boot) of the valid records `arrivals`: min_seq, max_seq, last_us (the
    latest received_at, microseconds), n (arrivals) and seqs (distinct seqs among them),
    collected to the driver (a row per device and boot: BATCH_KEYS)."""
    keyed = arrivals.where(F.col("device").isNotNull() & F.col("boot").isNotNull() & F.col("seq").isNotNull())
    per_boot = keyed.groupBy("device", "boot").agg(
        F.min("seq").alias("min_seq"),
        F.max("seq").alias("max_seq"),
        F.max(F.unix_micros("received_at")).alias("last_us"),
        F.count(F.lit(1)).alias("n"),
        F.count_distinct("seq").alias("seqs"),
    )
    table = per_boot.toArrow()
    return pa.table({f.name: table.column(f.name).cast(f.type) for f in BATCH_KEYS})


def repeats_within(batch: pa.Table) -> bool:
    """Whether two arrivals of the batch (of_arrivals) share a key (device, boot, seq): False
    means every arrival is the first of its key and the batch needs no de-duplication."""
    return bool(pc.any(pc.greater(batch.column("n"), batch.column("seqs"))).as_py())


def may_repeat(state: pa.Table, batch: pa.Table, since_us: int) -> bool:
    """Whether a record of `batch` (of_arrivals) may have an earlier copy that landed at or
    after since_us: its (device, boot) is in `state` with a seq at or above the batch's lowest
    and an arrival at or after since_us. False means that no record of the batch can be a
    copy of one the committed batches took within the watermark."""
    joined = batch.select(["device", "boot", "min_seq"]).join(state, keys=["device", "boot"], join_type="inner")
    hit = pc.and_(
        pc.less_equal(joined.column("min_seq"), joined.column("max_seq")),
        pc.greater_equal(joined.column("last_us"), pa.scalar(since_us, pa.int64())),
    )
    return bool(pc.any(hit).as_py())


def merged(state: pa.Table, batch: pa.Table, since_us: int) -> pa.Table:
    """`state` with the batch's arrivals, without the (device, boot)s whose latest arrival
    landed before since_us (the state is then exact from since_us on)."""
    both = pa.concat_tables([state.select(SCHEMA.names), batch.select(SCHEMA.names).cast(SCHEMA)])
    both = both.filter(pc.greater_equal(both.column("last_us"), pa.scalar(since_us, pa.int64())))
    grouped = both.group_by(["device", "boot"]).aggregate([("max_seq", "max"), ("last_us", "max")])
    return pa.table(
        [
            grouped.column("device"),
            grouped.column("boot"),
            grouped.column("max_seq_max"),
            grouped.column("last_us_max"),
        ],
        schema=SCHEMA,
    )


def load(path: pathlib.Path) -> pa.Table | None:
    """The state in `path`, or None if there is none."""
    return pq.read_table(path, schema=SCHEMA) if path.is_file() else None


def save(state: pa.Table, directory: pathlib.Path) -> None:
    """Writes the state as `directory/NAME` (a staging directory: the caller makes it private)."""
    directory.mkdir(parents=True, exist_ok=True)
    pq.write_table(state, directory / NAME)
