"""The benchmark tests' shared run: `mqbatch bench all --quick` once (per worker; the tests
that use it are one xdist group, tests/conftest.py), and each target's test checks its own
section of that run and its JSON. `bench all --quick` runs each target through the same
argument parser and code as `mqbatch bench TARGET --quick` (commands/bench.py ALL), so a
separate run per target would repeat the same work."""

from __future__ import annotations

import pathlib
import re
from dataclasses import dataclass

import pytest

from mqbatch_testing import run_bench


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


@pytest.fixture(scope="session")
def bench_all_quick(tmp_path_factory) -> BenchRun:
    out = tmp_path_factory.mktemp("bench-all-quick")
    return BenchRun(run_bench("all", "--quick", "--out", str(out), timeout=900), out)
