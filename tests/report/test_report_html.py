"""The demo's HTML report, built from a small synthetic records table (no Spark run),
rendered in real headless Chromium at 1280 and 800 px: no horizontal overflow, no
SVG label outside its chart, no wrapped table cell, every chart titled with both
axis labels. PNG screenshots of both widths are kept in run/report-check/."""

import datetime
import json
import re
import shutil
import subprocess
import tempfile

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from mqbatch.report import html as htmlreport
from mqbatch.util.paths import ROOT

START = 1_790_000_000.0  # run start (wall clock) of the synthetic run
DEVICES = ["dev-001", "dev-002", "greenhouse-north-0042"]
FAULTS = [(15.0, 23.0, "broker outage"), (36.0, 42.0, "network cut")]


def synthetic_records() -> pa.Table:
    """60 s at 2 Hz per device + a health record every 5 s; records sampled during a
    fault arrive when it ends (the backlog), the others ~1 s later (batching)."""
    rows = {k: [] for k in ("device", "boot", "seq", "kind", "device_time", "received_at", "latency_ms", "readings")}
    for d_i, dev in enumerate(DEVICES):
        seq = 0
        for i in range(120):
            t = i / 2
            fault_end = next((b for a, b, _ in FAULTS if a <= t < b), None)
            arrive = (fault_end + 0.5 + 0.01 * i % 1) if fault_end else t + 0.8 + (i % 4) * 0.1
            health = i % 10 == 0
            readings = (
                [
                    {"channel": 0x80, "name": "free_heap", "value": 30000 - 10 * i, "scaled": 30000.0 - 10 * i},
                    {
                        "channel": 0x81,
                        "name": "outbox_depth",
                        "value": 3 if fault_end else 0,
                        "scaled": 3.0 if fault_end else 0.0,
                    },
                    {
                        "channel": 0x83,
                        "name": "reconnects",
                        "value": sum(t >= b for _, b, _ in FAULTS),
                        "scaled": float(sum(t >= b for _, b, _ in FAULTS)),
                    },
                ]
                if health
                else [
                    {
                        "channel": 1,
                        "name": "temperature",
                        "value": 2100 + 30 * d_i + i % 7,
                        "scaled": 21 + 0.3 * d_i + (i % 7) / 100,
                    },
                    {"channel": 2, "name": "humidity", "value": 4500 + 100 * d_i, "scaled": 45.0 + d_i},
                    {"channel": 3, "name": "supply_voltage", "value": 3300 - i % 3, "scaled": 3.3 - (i % 3) / 1000},
                ]
            )
            for k, v in (
                ("device", dev),
                ("boot", 1),
                ("seq", seq),
                ("kind", "health" if health else "sample"),
                ("device_time", datetime.datetime.fromtimestamp(START + t, datetime.timezone.utc)),
                ("received_at", datetime.datetime.fromtimestamp(START + arrive, datetime.timezone.utc)),
                ("latency_ms", (arrive - t) * 1000),
                ("readings", readings),
            ):
                rows[k].append(v)
            seq += 1
    return pa.table(rows)


def run_info() -> htmlreport.RunInfo:
    headers = htmlreport.DEMO_HEADERS
    rows = [[d, 120, 120, 123, 120, 3, 0, 0, 0, 2, "912 ms", "8412 ms"] for d in DEVICES]
    return htmlreport.RunInfo(
        params={
            "devices": len(DEVICES),
            "sampling": "60 s at 2 Hz per device",
            "faults": "broker outage 15-23 s, network cut 36-42 s",
            "device heap": "64K",
        },
        start_wall=START,
        faults=FAULTS,
        events=[(15.0, "fault: broker outage"), (23.0, "fault over")],
        headers=headers,
        rows=rows,
        wire_bars=[("mqbatch, batched", 21.4), ("umqtt.simple 1.3.4, 1 record per PUBLISH", 203.0)],
        links={
            "report.json": "spark-out/report.json",
            "records/": "spark-out/records",
            "quarantine/": "spark-out/quarantine",
        },
    )


REPORT_JSON = {
    "landed": 40,
    "quarantine": {"rows": 0, "by_reason": {}},
    "devices": {d: {"unique": 120} for d in DEVICES},
}


def test_records_are_read_flat_or_partitioned_by_date(tmp_path):
    table = synthetic_records()
    flat, parted = tmp_path / "flat", tmp_path / "parted"
    flat.mkdir()
    pq.write_table(table, flat / "part-00000.parquet")
    (flat / "_SUCCESS").write_text("")  # what Spark leaves next to its files
    for date in ("2026-11-22", "2026-11-23"):
        (parted / f"date={date}").mkdir(parents=True)
    pq.write_table(table.slice(0, 100), parted / "date=2026-11-22" / "part-0.parquet")
    pq.write_table(table.slice(100), parted / "date=2026-11-23" / "part-0.parquet")
    a = htmlreport.read_records(flat, extra=["boot", "seq"])
    b = htmlreport.read_records(parted, extra=["boot", "seq"])
    key = lambda t: sorted(zip(t["device"].to_pylist(), t["seq"].to_pylist()))
    assert a.num_rows == b.num_rows == table.num_rows
    assert key(a) == key(b)


def test_report_content_from_a_synthetic_run():
    html = htmlreport.render(run_info(), REPORT_JSON, synthetic_records())
    assert html.startswith("<!DOCTYPE html>") and "<script" not in html
    assert not re.search(r'(src|href)="(https?:)?//|url\(', html), "the report must open offline: no external asset"
    charts = html.count('<svg class="chart"')
    # rate (small multiples), latency, temperature, humidity, supply voltage, heap, outbox depth, reconnects, bytes
    assert charts == 9, charts
    assert html.count('class="fault"') >= 2 * 7  # both faults shaded on every time chart
    for text in (
        "p50",
        "p95",
        "p99",
        "supply voltage (V)",
        "free heap (bytes)",
        "outbox depth (batches)",
        "Nothing was quarantined",
        "<details>",
        'href="spark-out/records"',
        'href="spark-out/quarantine"',
        "seconds since the run started",
        "greenhouse-north-0042",
        "versions",
        "generated",
        "Mosquitto 2.",
    ):
        assert text in html, text


@pytest.mark.parametrize("lo, hi", [(3.297, 3.3), (0, 30), (20, 22.5), (0, 0.25), (-60, -45), (0, 25000)])
def test_tick_labels_are_distinct_and_short(lo, hi):
    from mqbatch.report.svgchart import fmt, ticks

    t = ticks(lo, hi, 4)
    labels = [fmt(v, t[1] - t[0]) for v in t]
    assert len(set(labels)) == len(labels) >= 3, labels
    assert max(map(len, labels)) <= 6, labels


CHECK_JS = """<script>
(function () {
  const r = {width: window.innerWidth, scrollWidth: document.documentElement.scrollWidth,
             height: document.documentElement.scrollHeight, clipped: [], wrapped: [], charts: [], scrollers: []};
  for (const svg of document.querySelectorAll('svg.chart')) {
    const box = svg.getBoundingClientRect();
    const label = (c) => (svg.querySelector('text.' + c) || {}).textContent || '';
    r.charts.push({title: label('title'), x: label('xlabel'), y: label('ylabel')});
    for (const t of svg.querySelectorAll('text')) {
      const b = t.getBoundingClientRect();
      if (b.left < box.left - 0.5 || b.right > box.right + 0.5 || b.top < box.top - 0.5 || b.bottom > box.bottom + 0.5)
        r.clipped.push(label('title') + ': ' + t.textContent);
    }
  }
  for (const td of document.querySelectorAll('td:not(.wrap), th')) {
    const range = document.createRange(); range.selectNodeContents(td);
    const lines = new Set([...range.getClientRects()].map((x) => Math.round(x.top)));
    if (td.tagName === 'TD' && lines.size > 1) r.wrapped.push(td.textContent);
  }
  for (const e of document.querySelectorAll('.scroll')) if (e.scrollWidth > e.clientWidth + 1) r.scrollers.push(e.textContent.slice(0, 40));
  const out = document.createElement('pre'); out.id = 'layout-check'; out.textContent = JSON.stringify(r);
  document.body.appendChild(out);
})();
</script>"""


def _chromium(*args) -> subprocess.CompletedProcess:
    exe = shutil.which("chromium")
    if exe is None:
        pytest.skip("headless Chromium not installed (tools/bootstrap.sh installs the Debian package `chromium`)")
    with tempfile.TemporaryDirectory() as profile:
        return subprocess.run(
            [
                exe,
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-quic",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                f"--user-data-dir={profile}",
                *args,
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )


@pytest.mark.parametrize("width", [1280, 800])
def test_report_layout_in_headless_chromium(tmp_path, width):
    html = htmlreport.render(run_info(), REPORT_JSON, synthetic_records())
    checked = tmp_path / "checked.html"
    checked.write_text(html.replace("</body>", CHECK_JS + "</body>"))
    proc = _chromium(f"--window-size={width},2000", "--dump-dom", checked.as_uri())
    dom = proc.stdout
    assert 'id="layout-check"' in dom, proc.stderr[-2000:]
    r = json.loads(
        dom.split('<pre id="layout-check">')[1]
        .split("</pre>")[0]
        .replace("&quot;", '"')
        .replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&amp;", "&")
    )
    assert r["width"] == width
    assert r["scrollWidth"] <= r["width"], f"horizontal overflow at {width} px: {r['scrollWidth']}"
    assert r["clipped"] == [], f"labels outside their chart at {width} px: {r['clipped']}"
    assert r["wrapped"] == [], f"wrapped table cells at {width} px: {r['wrapped']}"
    assert r["scrollers"] == [], f"tables wider than the page at {width} px: {r['scrollers']}"
    assert len(r["charts"]) == 9
    for c in r["charts"]:
        assert c["title"] and c["x"] and c["y"], c
    # the screenshot a reviewer looks at: the whole page at this width
    page = tmp_path / "report.html"
    page.write_text(html)
    shots = ROOT / "run" / "report-check"
    shots.mkdir(parents=True, exist_ok=True)
    png = shots / f"report-{width}.png"
    png.unlink(missing_ok=True)
    proc = _chromium(f"--window-size={width},{r['height']}", f"--screenshot={png}", page.as_uri())
    assert png.exists() and png.stat().st_size > 10_000, proc.stderr[-2000:]
