"""The shared `mqbatch bench all --quick` run of tests/bench (fixture `bench_all_quick`,
tests/bench/conftest.py), and what a fleet run landed (landed_batches)."""

from __future__ import annotations

import collections
import pathlib
import re
from dataclasses import dataclass


def landed_batches(landing: pathlib.Path) -> collections.Counter:
    """(topic, batch-seq) of every PUBLISH landed in `landing`'s Parquet files, counted: a
    count above 1 is a copy (a batch sent again after a lost connection, landed twice)."""
    import pyarrow.parquet as pq

    seen: collections.Counter = collections.Counter()
    for f in sorted(landing.rglob("*.parquet")):
        t = pq.read_table(f, columns=["topic", "user_properties"])
        for topic, props in zip(t.column("topic").to_pylist(), t.column("user_properties").to_pylist()):
            seen[(topic, next(p["value"] for p in props if p["key"] == "batch-seq"))] += 1
    return seen


@dataclass
class BenchRun:
    text: str  # everything `bench all --quick` printed
    out: pathlib.Path  # its --out directory (TARGET.json, benchmarks.md, benchmarks/*.png)

    def section(self, target: str) -> str:
        """What `bench TARGET` printed inside the run (from its `== mqbatch bench TARGET` line
        to the next `== ` line)."""
        m = re.search(rf"^== mqbatch bench {target}\b.*?$(.*?)(?=^== |\Z)", self.text, re.M | re.S)
        assert m, f"no section for bench {target} in:\n{self.text}"
        return m.group(1)

    def command(self, target: str, *args: str) -> str:
        """The command `bench all --quick` records in TARGET.json for a target run with `args`."""
        return f"mqbatch bench {target} {' '.join(args)} (part of: mqbatch bench all --quick --out {self.out})"
