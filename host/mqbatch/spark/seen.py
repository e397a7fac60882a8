"""What a streaming job has seen: per (device, boot), the highest seq of the valid records the
committed micro-batches took (every arrival, the copies they dropped too) and when the latest
of them landed.

A record can have an earlier copy only at a seq at or below that highest one (a copy has the
record's key). A micro-batch whose every (device, boot) starts above it, or whose earlier
arrivals all landed before the watermark, cannot drop anything: it skips the look-back for
earlier copies (stream._earlier_copies), whose cost grows with the history (at 10,000 devices,
one file of 50,000 records every 5 s, a micro-batch took 4.1 s at batch 20 and 5.8 s at batch
60, and fell behind). A resend, a reboot that reuses a boot number or a late landing file
makes the batch look back; the state then says which (device, boot)s and seqs may be copies
(suspects: only their earlier arrivals are joined) and, from its marks, from which
committed batch on (a resend of recent seqs reads recent files only).

The state is one small Parquet file per commit, written staged and moved with the batch's
outputs (`_seen/bN-seen.parquet`, private like them); the newest committed one is read, the
older ones deleted after the commit. It holds a row per (device, boot) that landed within the
watermark (about one per device: 10,000 devices, 68 kB before the marks; a synthetic one of
10,000 devices, max_seq random in 3,000..4,000 and mark k about 60 * 2^k below it, is 153 kB
without marks, 204 kB with three, 288 kB with the eight of now) and is exact from the commit's
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
SEEN_MARKS = "seen_marks"  # in a commit: its state's marks, [[batch id, landed us], ...] (newest first)
EVERYTHING = -(1 << 62)  # SEEN_FROM of a state that has seen every arrival (the first batch's)
NAME = "seen.parquet"  # the state's file in a batch's staging directory (stream._move_staged tags it)
# Marks: every MARK_EVERY_US of landing time a micro-batch N notes, per (device, boot), the
# highest seq the committed batches took before it (mark0_seq). So every arrival of that
# (device, boot) with a higher seq is in batch N or later: a resend of seqs above it looks back
# from batch N on, not over the whole watermark (suspects). The older marks are thinned out
# binary-wise (refreshed): mark k is about 2^(k-1) to 2^k minutes old, so the eight reach
# about 64-127 minutes back (past the default watermark of an hour) and a resend of a record that
# first landed m minutes ago reads at most about 3m minutes of history.
MARKS = 8
MARK_EVERY_US = 60_000_000
MARK_COLUMNS = [f"mark{i}_seq" for i in range(MARKS)]  # null: no arrival before that mark
SCHEMA = pa.schema(
    [
        pa.field("device", pa.string()),
        pa.field("boot", pa.int64()),
        pa.field("max_seq", pa.int64()),
        pa.field("last_us", pa.int64()),
        *(pa.field(c, pa.int64()) for c in MARK_COLUMNS),
    ]
)
EMPTY = SCHEMA.empty_table()


class Seen(NamedTuple):
    """A state and its SEEN_FROM: it covers every arrival landed at or after from_us. marks:
    ((batch id, landed us), ...), newest first, one per MARK_COLUMNS column that is set."""

    table: pa.Table
    from_us: int
    marks: tuple = ()


# of_arrivals: per (device, boot) of one micro-batch's valid records
BATCH_KEYS = pa.schema(
    [*list(SCHEMA)[:4], pa.field("min_seq", pa.int64()), pa.field("n", pa.int64()), pa.field("seqs", pa.int64())]
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


SUSPECTS = pa.schema(
    [
        pa.field("device", pa.string()),
        pa.field("boot", pa.int64()),
        pa.field("lo", pa.int64()),
        pa.field("hi", pa.int64()),
        pa.field("from_batch", pa.int64()),
    ]
)


def suspects(state: pa.Table, batch: pa.Table, since_us: int, marks: tuple = ()) -> pa.Table:
    """The (device, boot)s of `batch` (of_arrivals) whose records may have an earlier copy that
    landed at or after since_us, and the seqs such a copy can have, lo..hi: the (device, boot)
    is in `state` with an arrival at or after since_us, and lo (the batch's lowest seq) is at
    or below the state's highest; hi is the lower of the batch's highest and the state's (a
    copy has its record's key, and the state saw no seq above its highest). from_batch: the
    first committed batch that can hold such a copy, from the newest mark whose seq is below
    lo (0: none is). No row means that no record of the batch can be a copy of one the
    committed batches took within the watermark (a row per such (device, boot), usually few)."""
    state = with_marks(state)
    joined = batch.select(["device", "boot", "min_seq", "max_seq"]).join(
        state.rename_columns(["device", "boot", "state_max", "last_us", *MARK_COLUMNS]),
        keys=["device", "boot"],
        join_type="inner",
    )
    hit = joined.filter(
        pc.and_(
            pc.less_equal(joined.column("min_seq"), joined.column("state_max")),
            pc.greater_equal(joined.column("last_us"), pa.scalar(since_us, pa.int64())),
        )
    )
    lo = hit.column("min_seq")
    from_batch = pa.array([0] * hit.num_rows, pa.int64())
    for i in reversed(range(min(len(marks), MARKS))):  # oldest first: a newer usable mark wins
        mark = hit.column(MARK_COLUMNS[i])
        usable = pc.or_(pc.is_null(mark), pc.less(pc.fill_null(mark, -1), lo))
        from_batch = pc.if_else(usable, pa.scalar(int(marks[i][0]), pa.int64()), from_batch)
    return pa.table(
        [
            hit.column("device"),
            hit.column("boot"),
            lo,
            pc.min_element_wise(hit.column("max_seq"), hit.column("state_max")),
            from_batch,
        ],
        schema=SUSPECTS,
    )


def look_back_from(suspects_: pa.Table) -> int:
    """The first committed batch a look-back for these suspects must read (0: all within the
    watermark)."""
    return int(pc.min(suspects_.column("from_batch")).as_py() or 0) if suspects_.num_rows else 0


def with_marks(table: pa.Table) -> pa.Table:
    """`table` (a state, or per-boot keys of arrivals) as SCHEMA, mark columns null where it
    has none (a state an older mqbatch wrote, a micro-batch's own arrivals)."""
    columns = [
        table.column(f.name).cast(f.type) if f.name in table.column_names else pa.nulls(table.num_rows, f.type)
        for f in SCHEMA
    ]
    return pa.table(columns, schema=SCHEMA)


def refreshed(state: pa.Table, marks: tuple, batch_id: int, first_us: int) -> tuple[pa.Table, tuple]:
    """The state and marks as micro-batch batch_id (its earliest landed row at first_us) sees
    them: when MARK_EVERY_US have passed since the newest mark (or there is none), a new
    mark (batch_id, first_us) whose seq per (device, boot) is the state's max_seq (every
    arrival the committed batches took within the state is at or below it). Else as they were.

    The older marks are thinned binary-wise: with n the minute (first_us // MARK_EVERY_US) of
    the new mark and p that of the newest before it, slot k >= 1 takes the mark of slot k-1
    when n and p differ in n >> (k-1) (slot 1 every minute, slot 2 every other, slot 3 every
    fourth, ...), else keeps its own: slots 1..T take (T: the lowest k that does not, less
    one) and the old mark of slot T drops out.
    A mark and its seq column always move together, so each mark stays what it says. Set
    slots are a prefix (a slot only ever takes the one before it), as marks_of expects."""
    state = with_marks(state)
    if marks and first_us - int(marks[0][1]) < MARK_EVERY_US:
        return state, marks
    n = first_us // MARK_EVERY_US
    p = int(marks[0][1]) // MARK_EVERY_US if marks else None
    old_marks = list(marks)[:MARKS] + [None] * (MARKS - min(len(marks), MARKS))
    columns = [state.column("max_seq")]  # slot 0: the new mark
    new_marks = [(int(batch_id), int(first_us))]
    for k in range(1, MARKS):
        takes = p is None or (n >> (k - 1)) != (p >> (k - 1))
        columns.append(state.column(MARK_COLUMNS[k - 1 if takes else k]))
        new_marks.append(old_marks[k - 1 if takes else k])
    kept = tuple(m for m in new_marks if m is not None)
    table = pa.table(
        [state.column("device"), state.column("boot"), state.column("max_seq"), state.column("last_us"), *columns],
        schema=SCHEMA,
    )
    return table, kept


def merged(state: pa.Table, batch: pa.Table, since_us: int) -> pa.Table:
    """`state` with the batch's arrivals, without the (device, boot)s whose latest arrival
    landed before since_us (the state is then exact from since_us on). A (device, boot) keeps
    its mark seqs; one new to the state has none (null: all its arrivals are in this batch)."""
    both = pa.concat_tables([with_marks(state), with_marks(batch.select(["device", "boot", "max_seq", "last_us"]))])
    both = both.filter(pc.greater_equal(both.column("last_us"), pa.scalar(since_us, pa.int64())))
    names = ["max_seq", "last_us", *MARK_COLUMNS]
    grouped = both.group_by(["device", "boot"]).aggregate([(c, "max") for c in names])  # (max skips nulls)
    return pa.table(
        [grouped.column("device"), grouped.column("boot"), *(grouped.column(f"{c}_max") for c in names)],
        schema=SCHEMA,
    )


def marks_of(commit: dict) -> tuple:
    """The marks a commit recorded (none from an older mqbatch, or any that do not parse)."""
    raw = commit.get(SEEN_MARKS) or []
    try:
        marks = tuple((int(b), int(u)) for b, u in raw)
    except (TypeError, ValueError):
        return ()
    return marks[:MARKS]


def load(path: pathlib.Path) -> pa.Table | None:
    """The state in `path`, or None if there is none."""
    return with_marks(pq.read_table(path)) if path.is_file() else None


def save(state: pa.Table, directory: pathlib.Path) -> None:
    """Writes the state as `directory/NAME` (a staging directory: the caller makes it private)."""
    directory.mkdir(parents=True, exist_ok=True)
    pq.write_table(state, directory / NAME)
