"""`mqbatch bench latency` (issue 15): record sampled -> landed p50/p99 in steady state
and after a broker outage, from the demo's machinery (real firmware in the Unix port,
Mosquitto over TLS, the recorder, the Spark job). No timing is asserted."""

from __future__ import annotations

import json
import re

import pytest

from mqbatch_testing import run_bench


def test_phases_split_records_by_sampling_time():
    from mqbatch.bench.latency import phases

    device_s = [1.0, 6.0, 7.0, 12.0, 14.0, 24.0, 40.0, None]
    latency = [9999.0, 100.0, 300.0, 5000.0, 4000.0, 2000.0, 200.0, 50.0]
    p = phases(device_s, latency, (12.0, 15.0))
    assert p["steady state"]["n"] == 2 and p["steady state"]["p50"] == 200.0  # the 1 s warm-up record left out
    assert p["after outage"]["n"] == 3 and p["after outage"]["max"] == 5000.0  # during and < 10 s after
    assert p["recovered"] == {"n": 1, "p50": 200.0, "p99": 200.0, "max": 200.0}
    assert phases([], [], (1.0, 2.0))["steady state"] == {"n": 0}


@pytest.mark.slow
@pytest.mark.broker
def test_bench_latency_quick_prints_percentiles_and_writes_json(tmp_path):
    out = run_bench("latency", "--quick", "--out", str(tmp_path), timeout=600)
    for phase in ("steady state", "after outage"):
        assert re.search(
            rf"^  {phase} +latency p50 [\d,]+ ms, p99 [\d,]+ ms, max [\d,]+ ms \([\d,]+ records\)$", out, re.M
        ), phase
    doc = json.loads((tmp_path / "latency.json").read_text())
    f = doc["figures"]
    assert doc["quick"] is True and f["devices"] == 2
    start, end = f["outage"]
    assert end > start
    for phase in ("steady state", "after outage"):
        x = f["phases"][phase]
        assert x["n"] > 0 and 0 <= x["p50"] <= x["p99"] <= x["max"], (phase, x)
