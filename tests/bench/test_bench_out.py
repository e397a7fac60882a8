"""The benchmarks' shared figures (mqbatch.bench.out): the median [min..max] formatter and the
machine's busy CPU seconds that `bench spark` prints beside each measurement."""

from __future__ import annotations

import os
import time

import pytest

from mqbatch.bench.out import machine_busy_s, spread


@pytest.mark.fast
def test_spread_is_median_with_min_and_max_in_any_order():
    assert spread([3.0, 1.0, 2.5], ".1f") == "2.5 [1.0..3.0]"
    assert spread([1000, 3000, 2000], ",.0f", "MB", "-") == "2,000 MB [1,000-3,000]"
    assert spread([1, 2], ".2f", sep="–") == "1.50 [1.00–2.00]"


@pytest.mark.skipif(not os.path.exists("/proc/stat"), reason="machine_busy_s reads Linux's /proc/stat")
def test_machine_busy_seconds_see_this_process_burn_cpu():
    """Half a second of this process's CPU must show in the machine's busy seconds (which also
    count every other process: only a lower bound can be asserted on a shared machine)."""
    before_cpu, before = time.process_time(), machine_busy_s()
    while time.process_time() - before_cpu < 0.5:
        pass
    burnt, seen = time.process_time() - before_cpu, machine_busy_s() - before
    assert seen >= 0.8 * burnt, (seen, burnt)
