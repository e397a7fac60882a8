"""Out-of-order records per (device, boot), streamed: no Spark window, no Python object per row.

A record is out of order when a record of the same boot that arrived before it has a
higher seq. A Spark window over a whole boot buffers the boot's rows and, short of task
memory, spills them into many small files whose readers each take a 1 MB heap buffer:
10 M records of 50 devices ran a 768 MB driver out of memory there (docs/spark.md).
Here the rows come sorted by (device, boot, arrival) in Arrow batches (mapInArrow) and the
boot's highest seq so far is carried from batch to batch: memory is one Arrow batch,
whatever the size of a boot.
"""

from __future__ import annotations

from typing import Iterator

import numpy as np
import pyarrow as pa

SCHEMA = pa.schema([("device", pa.string()), ("boot", pa.int64()), ("out_of_order", pa.int64())])
_GROUP = np.int64(1 << 33)  # seq is a u32: group * 2^33 + seq orders by group, then by seq


def count_out_of_order(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """Rows (device, boot, seq) sorted by (device, boot, arrival) in; out, per batch, one row
    per (device, boot) in it with its out-of-order count (a boot over several batches gives
    several rows: sum them)."""
    carried = None  # (device, boot, highest seq) of the last batch's last boot
    for batch in batches:
        if batch.num_rows == 0:
            continue
        device = batch.column("device").to_numpy(zero_copy_only=False)
        boot = batch.column("boot").to_numpy(zero_copy_only=False).astype(np.int64)
        seq = batch.column("seq").to_numpy(zero_copy_only=False).astype(np.int64)
        if carried is not None and (device[0], boot[0]) == carried[:2]:
            # the boot goes on from the last batch: its highest seq so far leads as a row of its own
            device, boot, seq = (
                np.concatenate([[carried[0]], device]),
                np.concatenate([[carried[1]], boot]),
                np.concatenate([[carried[2]], seq]),
            )
        starts = np.ones(len(seq), dtype=bool)
        starts[1:] = (device[1:] != device[:-1]) | (boot[1:] != boot[:-1])
        group = np.cumsum(starts) - 1
        running = np.maximum.accumulate(group * _GROUP + seq)  # the highest seq so far, per boot
        late = np.zeros(len(seq), dtype=bool)
        late[1:] = (group[1:] * _GROUP + seq[1:]) < running[:-1]
        late &= ~starts  # nothing arrived before a boot's first
        firsts = np.flatnonzero(starts)
        counts = np.bincount(group, weights=late, minlength=len(firsts)).astype(np.int64)
        carried = (device[-1], boot[-1], running[-1] - group[-1] * _GROUP)
        yield pa.RecordBatch.from_arrays(
            [pa.array(device[firsts], pa.string()), pa.array(boot[firsts]), pa.array(counts)], schema=SCHEMA
        )
