"""The benchmark tests' shared run: `mqbatch bench all --quick` once (per worker; the tests
that use it are one xdist group, tests/conftest.py), and each target's test checks its own
section of that run and its JSON. `bench all --quick` runs each target through the same
argument parser and code as `mqbatch bench TARGET --quick` (commands/bench.py ALL), so a
separate run per target would repeat the same work."""

from __future__ import annotations

import pytest

from mqbatch_testing import run_bench
from mqbatch_testing.bench import BenchRun


@pytest.fixture(scope="session")
def bench_all_quick(tmp_path_factory) -> BenchRun:
    out = tmp_path_factory.mktemp("bench-all-quick")
    return BenchRun(run_bench("all", "--quick", "--out", str(out), timeout=900), out)
