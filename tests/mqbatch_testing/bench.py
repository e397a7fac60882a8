"""The shared `mqbatch bench all --quick` run of tests/bench (fixture `bench_all_quick`,
tests/bench/conftest.py)."""

from __future__ import annotations

import pathlib
import re
from dataclasses import dataclass


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
