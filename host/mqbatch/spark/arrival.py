"""The report's per-boot figures in one pass: no Spark window, no join, no Python object per row.

A record is out of order when a record of the same boot that arrived before it has a
higher seq. A Spark window over a whole boot buffers the boot's rows and, short of task
memory, spills them into many small files whose readers each take a 1 MB heap buffer:
10 M records of 50 devices ran a 768 MB driver out of memory there (docs/spark.md).
Here the rows come sorted by (device, boot, arrival) in Arrow batches (mapInArrow) and a
boot's figures are carried from batch to batch until its last row: memory is one Arrow
batch plus, for the boot at hand, the seqs of its first arrivals that may still end up
within the reorder window of its highest (8 bytes each; at most about twice
max(window, 1,024) of them, or the boot's first arrivals when it has fewer). Python work
per boot is about 30 us besides the rows' own (numpy per batch).

Per (device, boot), from the unique records (KEY_FIRST marks one per seq, its first arrival):
unique rows, keys (first arrivals), the highest seq (of all its unique rows), the highest
dropped_total, the first arrivals out of order, and `old`: the first arrivals at or below
the highest seq minus the window (the seqs absent there are lost, those above it may
still come).
"""

from __future__ import annotations

from typing import Callable, Iterator

import numpy as np
import pyarrow as pa

SCHEMA = pa.schema(
    [
        ("device", pa.string()),
        ("boot", pa.int64()),
        ("unique", pa.int64()),
        ("keys", pa.int64()),
        ("max_seq", pa.int64()),
        ("dropped_on_device", pa.int64()),
        ("out_of_order", pa.int64()),
        ("old", pa.int64()),
    ]
)
IN_COLUMNS = ["device", "boot", "seq", "key", "dropped_total"]  # what boot_figures reads, in this order


class _Boot:
    """The figures of one (device, boot) so far, and the first arrivals' seqs that may still
    be at or below (highest seq - window) when the boot ends (trimmed now and then, _trim)."""

    __slots__ = (
        *("device", "boot", "unique", "keys", "max_seq", "dropped", "late", "old"),
        *("key_max", "held", "n_held", "next_trim"),
    )

    def __init__(self, device, boot) -> None:
        self.device, self.boot = device, boot
        self.unique = self.keys = self.late = self.old = self.n_held = 0
        self.max_seq = self.key_max = -1  # seqs are u32: -1 is below all
        self.dropped: int | None = None
        self.held: list = []  # arrays of first arrivals' seqs not yet counted in `old`
        self.next_trim = 0

    def add(self, seq: np.ndarray, key: np.ndarray, dropped: np.ndarray, window: int) -> None:
        """Rows of this boot in arrival order: seq, is a first arrival; `dropped`: the rows'
        dropped_total values that are not null."""
        self.unique += len(seq)
        self.max_seq = max(self.max_seq, int(seq.max()))
        if len(dropped):
            top = int(dropped.max())
            self.dropped = top if self.dropped is None else max(self.dropped, top)
        firsts = seq[key]
        if len(firsts):
            self.keys += len(firsts)
            running = np.maximum.accumulate(np.concatenate([[self.key_max], firsts]))
            self.late += int(np.count_nonzero(firsts < running[:-1]))
            self.key_max = int(running[-1])
            self.held.append(firsts)
            self.n_held += len(firsts)
        if self.n_held > self.next_trim:
            self._trim(window)

    def _trim(self, window: int) -> None:
        """Count the held seqs at or below (highest seq so far - window) into `old`: the highest
        only grows, so they are at or below it at the end too. What stays is above it: at most
        `window` seqs (a boot's first arrivals have unique seqs). The next trim comes when twice
        as many are held (at least 1,024), so each seq is looked at a few times on average."""
        seqs = np.concatenate(self.held) if self.held else np.empty(0, np.int64)
        below = seqs <= self.max_seq - window
        self.old += int(np.count_nonzero(below))
        kept = seqs[~below]
        self.held, self.n_held = [kept], len(kept)
        self.next_trim = 2 * max(1024, window, len(kept))

    def row(self, window: int) -> tuple:
        self._trim(window)
        return (self.device, self.boot, self.unique, self.keys, self.max_seq, self.dropped, self.late, self.old)


def boot_figures(window: int) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """For mapInArrow: rows IN_COLUMNS sorted by (device, boot, arrival) in (a boot in one
    partition: repartitioned by device and boot; device and boot never null), out one row
    per (device, boot) of SCHEMA, each boot once, when its last row has been read."""

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        current = None
        for batch in batches:
            if batch.num_rows == 0:
                continue
            device = batch.column("device").to_numpy(zero_copy_only=False)
            boot = batch.column("boot").to_numpy(zero_copy_only=False).astype(np.int64)
            seq = batch.column("seq").to_numpy(zero_copy_only=False).astype(np.int64)
            key = batch.column("key").to_numpy(zero_copy_only=False).astype(bool)
            drops = batch.column("dropped_total")
            dropped = drops.fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)
            has_dropped = drops.is_valid().to_numpy(zero_copy_only=False)
            starts = np.ones(len(seq), dtype=bool)
            starts[1:] = (device[1:] != device[:-1]) | (boot[1:] != boot[:-1])
            bounds = [*np.flatnonzero(starts), len(seq)]
            done = []
            for a, b in zip(bounds, bounds[1:]):
                if current is None or (current.device, current.boot) != (device[a], int(boot[a])):
                    if current is not None:
                        done.append(current.row(window))
                    current = _Boot(device[a], int(boot[a]))
                current.add(seq[a:b], key[a:b], dropped[a:b][has_dropped[a:b]], window)
            if done:
                yield _batch(done)
        if current is not None:
            yield _batch([current.row(window)])

    return run


def _batch(rows: list) -> pa.RecordBatch:
    return pa.RecordBatch.from_arrays(
        [pa.array(list(col), f.type) for col, f in zip(zip(*rows), SCHEMA)], schema=SCHEMA
    )
