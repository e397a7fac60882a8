"""`mqbatch bench latency` (issue 15): record sampled -> landed p50/p99 in steady state
and after a broker outage, from the demo's machinery (real firmware in the Unix port,
Mosquitto over TLS, the recorder, the Spark job). No timing is asserted."""

from __future__ import annotations

import json
import re

import pytest

from mqbatch_testing import run_bench


@pytest.mark.fast
def test_phases_split_records_by_sampling_time():
    from mqbatch.bench.latency import phases

    device_s = [1.0, 6.0, 7.0, 12.0, 14.0, 24.0, 40.0, None]
    latency = [9999.0, 100.0, 300.0, 5000.0, 4000.0, 2000.0, 200.0, 50.0]
    p = phases(device_s, latency, (12.0, 15.0))
    assert p["steady state"]["n"] == 2 and p["steady state"]["p50"] == 200.0  # the 1 s warm-up record left out
    assert p["after outage"]["n"] == 3 and p["after outage"]["max"] == 5000.0  # during and < 10 s after
    assert p["recovered"] == {"n": 1, "p50": 200.0, "p99": 200.0, "max": 200.0}
    assert phases([], [], (1.0, 2.0))["steady state"] == {"n": 0}


@pytest.mark.fast
def test_the_latency_bench_gives_the_fleet_run_every_option_it_reads():
    """bench latency runs bench fleet's run_fleet with its own settings; an option added to
    bench fleet later (as --receive-maximum was, which run_fleet then read and the latency
    bench did not set: an AttributeError) must come with fleet's default."""
    import argparse

    from mqbatch.bench import fleet, latency

    p = argparse.ArgumentParser()
    latency.add_arguments(p)
    args = p.parse_args(["--devices", "7", "--report-seconds", "30"])
    args.out = "OUT"
    fargs = latency.fleet_args(args)
    fp = argparse.ArgumentParser()
    fleet.add_arguments(fp)
    assert set(vars(fp.parse_args([]))) <= set(vars(fargs))
    assert (fargs.devices, fargs.rate, fargs.report_seconds, fargs.receive_maximum) == (7, 10, 30, 100)


def test_stream_latency_labels_time_to_table_apart_from_recorder_receive():
    from mqbatch.bench.fleet import report_lines
    from mqbatch.bench.report import _latency_section

    pct = {"n": 10, "p50": 20.0, "p99": 30.0, "max": 31.0}
    fig = {
        "mode": "stream",
        "devices": 10,
        "rate": 10.0,
        "batch": 20,
        "minutes": 2,
        "workers": 1,
        "ramp_s": 2.0,
        "roll_seconds": 60.0,
        "trigger_seconds": 10,
        "ack_timeout": 30.0,
        "device_totals": dict.fromkeys(("stored", "published", "republished", "acked", "outbox", "dropped"), 5),
        "stored_per_s": 100.0,
        "table_per_s_steady": 90.0,
        "rows": 5,
        "landing_files": 2,
        "landing_files_not_in_table": 0,
        "stored": 5,
        "lost": 0,
        "extra_rows": 0,
        "duplicate_rows": 0,
        "time_to_table_s": pct,
        "time_to_table_steady_s": pct,
        "first_rows_after_s": 40.0,
        "device_to_recorder_ms": {"n": 10, "p50": 1000.0, "p99": 2000.0, "max": 2100.0},
        "recorder_cpu_pct_steady": 3.0,
        "recorder_peak_rss_mb": 80.0,
        "broker_connections_max": 11,
        "broker_rss_mb_max": 10.0,
        "spark_batches": 3,
    }
    text = "\n".join(report_lines(fig))
    assert "time to table, all (sampled on the device -> row readable in records/" in text
    assert "device -> recorder receive (received_at - device time, not the table): p50 1.00 s" in text
    doc = {"figures": fig, "command": "mqbatch bench latency", "finished_utc": "x", "quick": False}
    doc |= {"machine": {"cpu": "c", "cores": 2, "memory_gb": 1, "os": "L", "load_average": [1, 1, 1]}}
    doc["versions"] = {"mqbatch": "0"}
    md = "\n".join(_latency_section(doc))
    assert "| time to table, steady | 10 | 20.0 | 30.0 | 31.0 |" in md
    assert "| device → recorder received (not a table) | 10 | 1.0 | 2.0 | 2.1 |" in md


@pytest.mark.slow
@pytest.mark.long  # 124-183 s in CI: a whole demo run; make test runs the demo with its outage (test_demo.py), phases() above
@pytest.mark.broker
def test_bench_latency_outage_quick_prints_percentiles_and_writes_json(tmp_path):
    out = run_bench("latency", "--outage", "--quick", "--out", str(tmp_path), timeout=600)
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
