"""`mqbatch report --out DIR` / mqbatch.report.write_report: the demo's HTML report from
any Spark output directory (records/, quarantine/, report.json), and the report's own
defects of issue 26: an axis with one tick, 'outbox bytes' read as a leak, the gap
after an outage left unexplained."""

import json
import re
import subprocess

import pyarrow.parquet as pq
import pytest
from test_report_html import DEVICES, FAULTS, START, run_info, synthetic_records

from mqbatch.report import ReportError, svgchart, write_report
from mqbatch.report import html as htmlreport
from mqbatch_testing import VENV_BIN

REPORT_JSON = {
    "landed": 40,
    "records": {"received": 363, "unique": 360, "duplicates": 3},
    "received_at": {"min": "2026-09-21T13:46:40.800000Z", "max": "2026-09-21T13:47:40.000000Z"},
    "quarantine": {"rows": 2, "by_reason": {"bad_hmac": 2}, "files": 0},
    "devices": {
        d: {
            "received": 121,
            "unique": 120,
            "duplicates": 1,
            "missing": 0,
            "out_of_order": 0,
            "quarantined": 0,
            "dropped_on_device": 0,
            "boots": 1,
            "latency_ms": {"p50": 912.0, "p99": 8412.0},
        }
        for d in DEVICES
    },
}


def spark_output(tmp_path, partitioned=True):
    """What `mqbatch spark --out DIR` writes, with the synthetic run's records."""
    out = tmp_path / "spark-out"
    part = out / "records" / "date=2026-09-21" if partitioned else out / "records"
    part.mkdir(parents=True)
    pq.write_table(synthetic_records(), part / "part-00000.parquet")
    (out / "records" / "_SUCCESS").write_text("")
    (out / "quarantine").mkdir()
    (out / "report.json").write_text(json.dumps(REPORT_JSON))
    return out


@pytest.mark.fast
def test_report_of_any_spark_output(tmp_path):
    out = spark_output(tmp_path)
    path = write_report(out)
    assert path == out / "report.html"
    html = path.read_text()
    assert "<title>mqbatch report</title>" in html and "<script" not in html
    assert "seconds since the first record" in html
    # the per-device table comes from report.json: landed 121, curated 120, 1 duplicate removed
    for dev in DEVICES:
        assert re.search(rf"<td>{dev}</td><td class=num>121</td><td class=num>120</td><td class=num>1</td>", html)
    for text in ("free heap (bytes)", "supply voltage (V)", "bad_hmac", 'href="records"', 'href="report.json"'):
        assert text in html, text
    # what a Spark output cannot know is not claimed: no lost-records verdict, no wire bytes, no events
    assert "No record lost" not in html and "Bytes on the wire" not in html and "Injected faults" not in html


def test_report_html_elsewhere_links_back_to_the_output(tmp_path):
    out = spark_output(tmp_path, partitioned=False)
    path = write_report(out, tmp_path / "site" / "fleet.html")
    html = path.read_text()
    assert 'href="../spark-out/report.json"' in html and 'href="../spark-out/quarantine"' in html


@pytest.mark.parametrize(
    "make, why",
    [
        (lambda d: None, "is not a directory"),
        (lambda d: d.mkdir(), "has no report.json: not the output of `mqbatch spark --out"),
        (lambda d: (d.mkdir(), (d / "report.json").write_text("{oops")), "cannot be read as JSON"),
        (lambda d: (d.mkdir(), (d / "report.json").write_text("{}")), "has no records/ directory"),
    ],
)
def test_not_a_spark_output_is_one_sentence(tmp_path, make, why):
    d = tmp_path / "out"
    make(d)
    with pytest.raises(ReportError, match=re.escape(why)):
        write_report(d)


def test_report_command(tmp_path):
    out = spark_output(tmp_path)
    proc = subprocess.run([str(VENV_BIN / "mqbatch"), "report", "--out", str(out)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == f"report: {out / 'report.html'} (3 devices, 360 curated records)"
    assert (out / "report.html").read_text().startswith("<!DOCTYPE html>")
    proc = subprocess.run([str(VENV_BIN / "mqbatch"), "report", "--out", str(tmp_path)], capture_output=True, text=True)
    assert proc.returncode == 2 and proc.stderr.strip() == (
        f"report: {tmp_path} has no report.json: not the output of `mqbatch spark --out {tmp_path}`"
    )
    proc = subprocess.run(
        [str(VENV_BIN / "mqbatch"), "report", "--out", str(out / "report.json")], capture_output=True, text=True
    )
    assert proc.returncode == 2 and "argument --out:" in proc.stderr and "not a directory" in proc.stderr


# -- the report's own defects ---------------------------------------------------------------


def y_tick_counts(svg: str) -> list[int]:
    """Tick labels on the y axis of each panel of a time_panels chart (right-aligned at LEFT - 5)."""
    panels = svg.split("<polyline")[:-1]  # each panel's axis comes before its line
    x = svgchart.LEFT - 5
    return [len(re.findall(rf'<text x="{x}" y="[^"]+" font-size="11" text-anchor="end">', p)) for p in panels]


@pytest.mark.parametrize(
    "values",
    [
        [3.281, 3.311, 3.30],  # supply voltage of a demo run: one tick (3.3) before
        [20.152, 21.976],  # temperature
        [-62.2, -45.8],  # rssi: two ticks before
        [0.0, 8.0],  # outbox depth
        [0.0, 12258.0],  # outbox bytes
        [29696.0, 30688.0],  # free heap (zero-based)
        [5.0, 5.0],  # constant
    ],
)
def test_every_panel_axis_has_at_least_three_ticks(values):
    panels = {"dev-001": [(float(i), v) for i, v in enumerate(values)], "dev-002": [(0.0, values[0])]}
    svg = svgchart.time_panels("t", panels, (0.0, 10.0), [], "unit", panel_h=44, zero=False)
    counts = y_tick_counts(svg)
    assert len(counts) == 2 and min(counts) >= 3 and max(counts) <= 5, counts


def test_y_tick_counter_sees_a_one_tick_axis():
    """The checker above can fail: an axis drawn with a single tick counts as 1."""
    axis, _ = svgchart._y_axis(3.28, 3.32, 0, 44, 1)
    one = "".join(axis)
    old_ticks = svgchart._ticks(3.28, 3.32, 2)  # what time_panels asked for before: one tick
    assert old_ticks == [3.3]
    assert y_tick_counts(one + "<polyline/>") == [len(svgchart.ticks(3.28, 3.32, 1))]
    fake = f'<text x="{svgchart.LEFT - 5}" y="1" font-size="11" text-anchor="end">3.3</text><polyline/>'
    assert y_tick_counts(fake) == [1]


def test_outbox_bytes_is_labelled_as_files_on_flash_and_explained():
    html = htmlreport.render(run_info(), REPORT_JSON, synthetic_records_with_outbox_bytes())
    assert "outbox files on flash (bytes)" in html and "outbox bytes (bytes)" not in html
    assert "acknowledged batches stay in the open segment file" in html and "not a leak" in html


def synthetic_records_with_outbox_bytes():
    import pyarrow as pa

    t = synthetic_records()
    rows = t.to_pylist()
    for r in rows:
        if r["kind"] == "health":
            r["readings"] = r["readings"] + [{"channel": 0x86, "name": "outbox_bytes", "value": 9000, "scaled": 9000.0}]
    return pa.Table.from_pylist(rows, schema=t.schema)


def test_the_gap_after_an_outage_is_explained_with_its_measured_length():
    """Records sampled during a fault land 0.5 s + 0.01 s x sample index after it ends in the
    synthetic run (the outage's first backlog record: index 30, so 0.8 s; the cut's: index 72,
    0.5 + 0.72 = 1.22, but the ordinary record sampled at 42.0 s lands 0.8 s later): the text
    names that gap and its cause (the recorder's paho back-off after a broker outage; the
    devices' back-off after a network cut)."""
    info = run_info()
    info.device_backoff_ms = (500, 4000)
    html = htmlreport.render(info, REPORT_JSON, synthetic_records())
    a, b, _ = FAULTS[0]
    assert (
        f"After the broker outage ({a:.0f}-{b:.0f} s) records landed again 0.8 s after the broker outage ended" in html
    )
    assert "paho-mqtt) retries with a doubling back-off (1, 2, 4, 8 s, at most 10 s" in html
    assert "After the network cut (36-42 s) records landed again 0.8 s after the network cut ended" in html
    assert "500 ms doubling to at most 4000 ms" in html


def test_the_recorder_backoff_the_report_quotes_is_the_recorders():
    """The explanation quotes RECORDER_BACKOFF_S: it must be what the recorder really sets."""
    import inspect

    from mqbatch.ingest import recorder

    lo, hi = htmlreport.RECORDER_BACKOFF_S
    assert f"reconnect_delay_set({lo}, {hi})" in inspect.getsource(recorder)


def test_start_is_the_first_record_not_a_demo_clock(tmp_path):
    out = spark_output(tmp_path)
    table = htmlreport.read_records(out / "records", extra=["boot", "seq"])
    info = htmlreport.run_info_from(REPORT_JSON, table, out, out / "report.html")
    assert info.start_wall == pytest.approx(START)  # the first device_time of the synthetic run


def test_an_output_without_records_yet_still_gets_a_report(tmp_path):
    """A run that landed nothing, or a stream before its first batch: records/ holds no Parquet."""
    out = tmp_path / "out"
    (out / "records").mkdir(parents=True)
    (out / "report.json").write_text(json.dumps({"landed": 0, "devices": {}, "quarantine": {"by_reason": {}}}))
    html = write_report(out).read_text()
    assert "<title>mqbatch report</title>" in html and "No such readings." in html


def test_the_accounting_table_shows_each_device_and_whether_it_balances():
    """report.json's devices.*.accounting (issue 22) as a table under the outcome; a device whose
    counters do not balance says NO; a report.json without accounting gets no table."""
    rep = json.loads(json.dumps(REPORT_JSON))
    good, bad = DEVICES[0], DEVICES[1]
    rep["devices"][good]["accounting"] = {
        "stored": 130, "landed": 120, "absent": 10, "dropped": 4, "released_unconfirmed": 9,
        "released_landed": 3, "released_not_landed": 6, "lost": 0, "dropped_landed": 0, "balanced": True,
    }  # fmt: skip
    rep["devices"][bad]["accounting"] = dict(rep["devices"][good]["accounting"], lost=2, balanced=False)
    html = htmlreport.render(run_info(), rep, synthetic_records())
    rows = {m[0]: m[1] for m in re.findall(r"<tr><td>([^<]+)</td>((?:<td[^>]*>[^<]*</td>)+)</tr>", html)}
    cells = lambda dev: re.findall(r">([^<]*)</td>", rows[dev])  # noqa: E731
    assert "released unconfirmed" in html and "of those landed" in html
    assert cells(good) == ["130", "120", "4", "9", "3", "10", "0", "0", "yes"], cells(good)
    assert cells(bad)[-3:] == ["2", "0", "NO"], cells(bad)
    assert "of those landed" not in htmlreport.render(run_info(), REPORT_JSON, synthetic_records())


def test_a_fleets_report_draws_a_bounded_number_of_device_panels(tmp_path):
    """1.65 M records of 5,000 devices made a 132 MB report in 100 s and 5.6 GB (one panel per
    device, every reading as a Python object): per-device panels are now drawn for the first
    MAX_PANEL_DEVICES devices by id, after one panel of all of them; latencies of every record."""
    import pyarrow as pa

    rows = synthetic_records().to_pylist()
    n_dev = htmlreport.MAX_PANEL_DEVICES + 24
    names = [f"fleet-{i:03d}" for i in range(n_dev)]
    many = [dict(r, device=name) for name in names for r in rows]
    table = pa.Table.from_pylist(many, schema=synthetic_records().schema)
    html = htmlreport.render(run_info(), REPORT_JSON, table)
    shown, hidden = names[: htmlreport.MAX_PANEL_DEVICES], names[htmlreport.MAX_PANEL_DEVICES :]
    assert "records landed per second, all devices" in html and f">all {n_dev} devices<" in html
    assert f"the first {htmlreport.MAX_PANEL_DEVICES} of {n_dev} devices by id" in html
    assert all(f">{d}<" in html for d in shown), "a shown device's panel is missing"
    assert not any(d in html for d in hidden), "a device beyond the bound was drawn"
    s = htmlreport.series(table, START)
    assert len(s["latency"]) == sum(1 for r in many if r["latency_ms"] is not None)  # every record
    total = s["fleet_rate"][f"all {n_dev} devices"]
    assert sum(c for _, c in total) * s["bin_s"] == len(many)  # every record counted once
    # the fleet's total has its own chart: the device panels keep the devices' own scale
    assert set(s["rate"]) == set(shown) and max(c for d in shown for _, c in s["rate"][d]) < max(c for _, c in total)
    nulls = pa.Table.from_pylist(many + [dict(rows[0], device=None)], schema=table.schema)
    s2 = htmlreport.series(nulls, START)  # a row without a device: in no panel, not in the total
    assert s2["devices"] == n_dev and sum(c for _, c in s2["fleet_rate"][f"all {n_dev} devices"]) * 2 == len(many)
    small = htmlreport.series(synthetic_records(), START)
    assert "devices_shown" in small and small["devices"] == small["devices_shown"] == len(DEVICES)
    assert not small["fleet_rate"] and set(small["rate"]) == set(DEVICES)  # a small fleet: per device only
    htmlreport.render(run_info(), REPORT_JSON, pa.Table.from_pylist(rows + [dict(rows[0], device=None)]))
