"""The seen state's marks (mqbatch.spark.seen): every minute of landing time a micro-batch
notes, per (device, boot), the highest seq taken before it, so that a resend of newer seqs
looks back from that batch on instead of over the whole watermark; the older marks are
thinned binary-wise so that eight reach past an hour. Pure Arrow, no Spark."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq

from mqbatch.spark import seen

MIN = seen.MARK_EVERY_US


def state(rows):
    """A state of (device, boot, max_seq, last_us) rows, no marks."""
    names = ["device", "boot", "max_seq", "last_us"]
    return seen.with_marks(pa.table({n: [r[i] for r in rows] for i, n in enumerate(names)}))


def batch(rows):
    """of_arrivals of a micro-batch: (device, boot, min_seq, max_seq, last_us) rows."""
    return pa.table(
        {
            "device": [r[0] for r in rows],
            "boot": [r[1] for r in rows],
            "max_seq": [r[3] for r in rows],
            "last_us": [r[4] for r in rows],
            "min_seq": [r[2] for r in rows],
            "n": [r[3] - r[2] + 1 for r in rows],
            "seqs": [r[3] - r[2] + 1 for r in rows],
        },
        schema=seen.BATCH_KEYS,
    )


def test_a_mark_is_set_once_a_minute_of_landing_time_and_the_older_ones_shift():
    t, marks = seen.refreshed(state([("a", 1, 9, 5)]), (), 3, 1_000)
    assert marks == ((3, 1_000),) and t.column("mark0_seq").to_pylist() == [9]
    same, kept = seen.refreshed(t, marks, 4, 1_000 + MIN - 1)  # within the minute: as it was
    assert kept == marks and same.equals(t)
    t = seen.merged(t, batch([("a", 1, 10, 14, 10)]), 0)
    t, marks = seen.refreshed(t, marks, 5, 1_000 + MIN)
    assert marks == ((5, 1_000 + MIN), (3, 1_000))
    assert (t.column("mark0_seq").to_pylist(), t.column("mark1_seq").to_pylist()) == ([14], [9])
    assert len(seen.MARK_COLUMNS) == seen.MARKS and t.schema.equals(seen.SCHEMA)


def _minutes(n: int, start: int = 1):
    """refreshed once a minute for n minutes, the state's max_seq = the minute (one device,
    a record a minute): yields (minute, state, marks) after each."""
    t, marks = state([("a", 1, 0, 0)]), ()
    for minute in range(start, start + n):
        t = seen.merged(t, batch([("a", 1, minute, minute, minute * MIN)]), 0)
        t, marks = seen.refreshed(t, marks, minute, minute * MIN)  # batch id = minute
        yield minute, t, marks


def test_the_marks_reach_past_an_hour_and_a_resend_reads_at_most_three_times_its_age():
    """Eight marks thinned binary-wise: after the first two hours, at every minute there is a
    mark 64 minutes old or older (the default watermark is an hour), and a resend of a record
    first landed m minutes ago (1 <= m <= 60) finds a mark at most 3m old (that much history
    read instead of the hour). The instrument: marks shifted down every minute (the three
    of before, or eight) reach 2 or 7 minutes back and fail the first condition."""
    for minute, _t, marks in _minutes(400):
        if minute < 128:
            continue
        ages = [minute - b for b, _us in marks]
        assert ages == sorted(ages) and len(marks) == seen.MARKS, (minute, ages)
        assert ages[-1] >= 64, (minute, ages)
        for m in range(1, 61):
            assert min(a for a in ages if a >= m) <= 3 * m, (minute, m, ages)


def test_each_mark_column_moves_with_its_mark():
    """A mark (batch id, landed us) and its seq column go together: the seq noted for each
    mark is the state's max_seq when that mark was made (here, its minute). The instrument:
    thinning the marks but shifting the columns down every minute (or the other way round)
    pairs a mark with another minute's seqs."""
    for minute, t, marks in _minutes(300, start=37):
        row = [t.column(c)[0].as_py() for c in seen.MARK_COLUMNS[: len(marks)]]
        assert row == [b for b, _us in marks], minute
        assert all(t.column(c)[0].as_py() is None for c in seen.MARK_COLUMNS[len(marks) :]), minute
    # idle minutes (no micro-batch) skip ticks: the marks stay ordered and paired
    t, marks = state([("a", 1, 0, 0)]), ()
    for minute in (1, 2, 5, 6, 7, 19, 20, 64, 65, 66, 200, 201, 202, 203):
        t = seen.merged(t, batch([("a", 1, minute, minute, minute * MIN)]), 0)
        t, marks = seen.refreshed(t, marks, minute, minute * MIN)
        ids = [b for b, _us in marks]
        assert ids == sorted(ids, reverse=True) and ids[0] == minute, (minute, ids)
        assert [t.column(c)[0].as_py() for c in seen.MARK_COLUMNS[: len(marks)]] == ids, minute


def test_a_suspect_looks_back_from_the_newest_mark_below_its_seqs():
    """Marks at batches 20 (seq 30), 10 (seq 20), 5 (seq 10) for dev a: a resend of seqs 31..
    reads from batch 20, of 25.. from 10, of 15.. from 5, of 3.. from the watermark (0). A
    (device, boot) that has no seq at a mark (null: it began after it) reads from that mark
    at the earliest.
    The instrument: taking the newest mark whatever its seq gives 20 for all of them."""
    t = state([("a", 1, 40, 5), ("b", 1, 40, 5)])
    t = t.set_column(4, "mark0_seq", pa.array([30, 30], pa.int64()))
    t = t.set_column(5, "mark1_seq", pa.array([20, 2], pa.int64()))
    t = t.set_column(6, "mark2_seq", pa.array([10, None], pa.int64()))  # b began after batch 5
    marks = ((20, 300), (10, 200), (5, 100))
    got = {}
    for lo in (31, 25, 15, 3):
        s = seen.suspects(t, batch([("a", 1, lo, 45, 10)]), 0, marks)
        got[lo] = (s.column("from_batch").to_pylist(), seen.look_back_from(s))
    assert got == {31: ([20], 20), 25: ([10], 10), 15: ([5], 5), 3: ([0], 0)}
    # at a mark's own seq: that seq may be in an earlier batch, so the mark before it (fails
    # with "at or below" for "below")
    for lo, want in ((30, 10), (20, 5), (10, 0)):
        assert seen.look_back_from(seen.suspects(t, batch([("a", 1, lo, 45, 10)]), 0, marks)) == want, lo
    s = seen.suspects(t, batch([("b", 1, 3, 45, 10), ("a", 1, 31, 45, 10)]), 0, marks)
    assert sorted(zip(s.column("device").to_pylist(), s.column("from_batch").to_pylist())) == [("a", 20), ("b", 10)]
    assert seen.look_back_from(s) == 10  # the earliest any suspect needs
    s = seen.suspects(t, batch([("b", 1, 0, 45, 10)]), 0, marks)  # below every seq it has: from its start
    assert s.column("from_batch").to_pylist() == [5]
    assert seen.suspects(t, batch([("a", 1, 41, 45, 10)]), 0, marks).num_rows == 0  # above max_seq: none
    assert seen.look_back_from(seen.suspects(t, batch([("a", 1, 31, 45, 10)]), 0, ())) == 0  # no marks


def test_merging_keeps_a_boots_marks_and_a_new_boot_has_none():
    t = state([("a", 1, 9, 5)]).set_column(4, "mark0_seq", pa.array([7], pa.int64()))
    m = seen.merged(t, batch([("a", 1, 10, 12, 10), ("a", 2, 0, 3, 10)]), 0).sort_by("boot")
    assert m.column("max_seq").to_pylist() == [12, 3]
    assert m.column("mark0_seq").to_pylist() == [7, None]


def test_a_state_and_a_commit_without_marks_load_as_having_none(tmp_path):
    """From an older mqbatch: a state file of four columns, a commit without seen_marks (or
    with marks that do not parse: then none, i.e. the whole watermark)."""
    old = pa.table({"device": ["a"], "boot": [1], "max_seq": [9], "last_us": [5]})
    pq.write_table(old, tmp_path / seen.NAME)
    loaded = seen.load(tmp_path / seen.NAME)
    assert loaded.schema.equals(seen.SCHEMA) and loaded.column("mark0_seq").null_count == 1
    assert seen.marks_of({}) == () and seen.marks_of({seen.SEEN_MARKS: [["x", 1]]}) == ()
    assert seen.marks_of({seen.SEEN_MARKS: [[4, 100], [2, 50]]}) == ((4, 100), (2, 50))
