"""The report's per-boot figures in one pass (mqbatch.spark.arrival.boot_figures), without
Spark: against a row-by-row count, boots split over Arrow batches anywhere, key
collisions and absent dropped_total counters; the window's seqs held stay within the
window; and the comparison fails for a pass that forgets the carried seqs. The same pass
in the JVM (java/BootFigures.java, mqbatch.spark.jvm.boot_figures) against the same count,
in Spark."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from mqbatch.spark import arrival


def _rows(rng, boots=6):
    """(device, boot, seq, key, dropped_total) in (device, boot, arrival) order: seqs of each
    boot shuffled (out of order, gaps), some repeated as key collisions (key False)."""
    rows = []
    for b in range(boots):
        device, boot = f"dev-{b // 2}", b % 2
        n = int(rng.integers(1, 400))
        seqs = rng.choice(n + int(rng.integers(0, 200)), size=n, replace=False)
        for s in seqs:
            dropped = int(rng.integers(0, 50)) if rng.random() < 0.1 else None
            rows.append((device, boot, int(s), True, dropped))
            if rng.random() < 0.05:  # a collision: the same seq again, other content, kept
                rows.append((device, boot, int(s), False, None))
        if rng.random() < 0.3:  # a row that is no first arrival above every first arrival's seq
            rows.append((device, boot, int(seqs.max()) + int(rng.integers(1, 5)), False, int(rng.integers(0, 9))))
    return rows


def _by_hand(rows, window):
    out = {}
    for device, boot in dict.fromkeys((r[0], r[1]) for r in rows):
        mine = [r for r in rows if (r[0], r[1]) == (device, boot)]
        firsts = [r[2] for r in mine if r[3]]
        highest, late = -1, 0
        for s in firsts:
            late += s < highest
            highest = max(highest, s)
        top = max(r[2] for r in mine)
        drops = [r[4] for r in mine if r[4] is not None]
        old = sum(1 for s in firsts if s <= top - window)
        out[(device, boot)] = (len(mine), len(firsts), top, max(drops) if drops else None, late, old)
    return out


def _batches(rows, cuts) -> list:
    """The rows as Arrow record batches cut at the given row numbers."""
    cols = list(zip(*rows))
    whole = pa.RecordBatch.from_arrays(
        [
            pa.array(cols[0], pa.string()),
            pa.array(cols[1], pa.int64()),
            pa.array(cols[2], pa.int64()),
            pa.array(cols[3], pa.bool_()),
            pa.array(cols[4], pa.int64()),
        ],
        names=arrival.IN_COLUMNS,
    )
    edges = [0, *sorted(cuts), len(rows)]
    out = []
    for a, b in zip(edges, edges[1:]):
        out += [whole.slice(a, b - a), whole.slice(0, 0)]  # and an empty batch after each
    return out


def _figures(rows, window, cuts):
    got = {}
    for out in arrival.boot_figures(window)(iter(_batches(rows, cuts))):
        assert out.schema == arrival.SCHEMA
        for r in out.to_pylist():
            key = (r["device"], r["boot"])
            assert key not in got, f"{key} reported twice"  # a boot is one row, when it ends
            got[key] = (r["unique"], r["keys"], r["max_seq"], r["dropped_on_device"], r["out_of_order"], r["old"])
    return got


@pytest.mark.parametrize("window", [0, 1, 10, 100, 10**9])
def test_boot_figures_equal_a_row_by_row_count_wherever_the_batches_split(window):
    rng = np.random.default_rng(window)
    for trial in range(8):
        rows = _rows(rng)
        cuts = set(int(c) for c in rng.integers(1, len(rows), size=int(rng.integers(0, 12))))
        if trial == 0:
            cuts = set(range(1, len(rows)))  # one row per batch
        assert _figures(rows, window, cuts) == _by_hand(rows, window), (window, trial)


def test_no_rows_no_figures():
    assert list(arrival.boot_figures(10)(iter([]))) == []
    assert _figures([("d", 1, 5, True, None)], 10, set()) == {("d", 1): (1, 1, 5, None, 0, 0)}


def test_the_seqs_held_for_the_window_stay_within_it():
    """A boot of 200,000 first arrivals in batches of 100, window 50: the pass holds at most
    about twice max(window, 1,024) seqs, whatever the size of the boot; with a window larger
    than the boot it holds the boot's first arrivals (and is right either way)."""
    seqs = np.random.default_rng(1).permutation(200_000).astype(np.int64)
    for window, bound in ((50, 2 * 1024 + 100), (10**9, len(seqs))):
        boot = arrival._Boot("dev", 1)
        most = 0
        for a in range(0, len(seqs), 100):
            part = seqs[a : a + 100]
            boot.add(part, np.ones(len(part), bool), np.empty(0, np.int64), window)
            most = max(most, boot.n_held)
        assert most <= bound, (window, most)
        assert boot.row(window)[7] == max(0, len(seqs) - window)
    small = np.random.default_rng(2).permutation(20_000).astype(np.int64)
    boot = arrival._Boot("dev", 1)
    for a in range(0, len(small), 100):
        boot.add(small[a : a + 100], np.ones(100, bool), np.empty(0, np.int64), 50)
    late = _by_hand([("d", 1, int(v), True, None) for v in small], 50)[("d", 1)][4]
    assert boot.row(50)[4:] == (19_999, None, late, 19_950)


def test_the_check_fails_for_a_pass_that_forgets_the_seqs_it_carried():
    """The instrument can fail: a pass that drops the seqs it holds at each batch's end
    undercounts `old` once a boot spans batches."""

    class Forgetful(arrival._Boot):
        __slots__ = ()

        def add(self, seq, key, dropped, window):
            super().add(seq, key, dropped, window)
            self.held, self.n_held = [], 0

    real = arrival._Boot
    arrival._Boot = Forgetful
    try:
        rows = _rows(np.random.default_rng(3))
        broken = _figures(rows, 10, set(range(50, len(rows), 50)))
    finally:
        arrival._Boot = real
    assert broken != _by_hand(rows, 10)


def _jvm_figures(spark, rows, window, partitions=3):
    """jvm.boot_figures over `rows` (in arrival order), a boot's rows in one partition."""
    from mqbatch.spark import jvm

    df = spark.createDataFrame(
        [(*r, i) for i, r in enumerate(rows)],
        "device string, boot bigint, seq bigint, key boolean, dropped_total bigint, arrival bigint",
    )
    ordered = (
        df.repartition(partitions, "device", "boot")
        .sortWithinPartitions("device", "boot", "arrival")
        .select(*arrival.IN_COLUMNS)
    )
    got = {}
    for r in jvm.boot_figures(ordered, window).collect():
        key = (r["device"], r["boot"])
        assert key not in got, f"{key} reported twice"
        got[key] = (r["unique"], r["keys"], r["max_seq"], r["dropped_on_device"], r["out_of_order"], r["old"])
    return got


@pytest.mark.spark
def test_the_jvm_pass_equals_the_row_by_row_count(spark):
    """java/BootFigures.java: the same figures as the count by hand (and so as the Python pass),
    key collisions, absent counters, several boots to a partition, windows 0 to 10**9."""
    rng = np.random.default_rng(7)
    for window in (0, 1, 10, 100, 10**9):
        rows = _rows(rng, boots=10)
        assert _jvm_figures(spark, rows, window) == _by_hand(rows, window), window


@pytest.mark.spark
def test_the_jvm_pass_trims_what_it_holds_and_stays_right(spark):
    """A boot of 30,000 first arrivals in a shuffled order: with window 50 the pass trims the
    seqs it holds many times over (every 2,048 held), with 10**9 never; `old` and the order
    are right either way."""
    seqs = [int(v) for v in np.random.default_rng(3).permutation(30_000)]
    rows = [("dev", 1, s, True, None) for s in seqs]
    for window in (50, 10**9):
        assert _jvm_figures(spark, rows, window, partitions=1) == _by_hand(rows, window), window
