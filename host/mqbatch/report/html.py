"""The HTML report of a Spark output directory: one self-contained file (inline SVG
from mqbatch.report.svgchart, no script, no external asset; it opens offline).

    write_report(spark_out)                          # -> spark_out/report.html
    write_report(spark_out, html_path, run=RunInfo(...))   # the demo: faults, events, its table

or, in parts:

    table = read_records(spark_out / "records")        # flat or partitioned (date=YYYY-MM-DD/)
    html = render(RunInfo(...), report_json, table)

Sections: header (run parameters, generation time, versions), outcome table,
records per second per device (small multiples), latency (log axis, p50/p95/p99),
the telemetry itself (each sensor and health channel over time per device),
bytes on the wire (when measured), quarantine, injected faults, the raw report.json
(collapsed). Every time chart shares one axis: seconds since the run started (the
first record landed, without a RunInfo), with the fault windows shaded."""

from __future__ import annotations

import dataclasses
import datetime
import html
import json
import math
import os
import pathlib
import platform
from collections.abc import Sequence

from mqbatch.report import svgchart
from mqbatch.wire.records import CHANNEL_BY_NAME, HEALTH

RECORD_COLUMNS = ["device", "kind", "device_time", "received_at", "latency_ms", "readings"]
UNITS = {
    "temperature": "°C",
    "humidity": "% RH",
    "supply_voltage": "V",
    "rssi": "dBm",
    "pressure": "Pa",
    "light": "lx",
    "free_heap": "bytes",
    "outbox_depth": "batches",
    "reconnects": "count",
    "dropped_total": "records",
    "sampled_total": "records",
    "outbox_bytes": "bytes",
    "released_unconfirmed": "records",
}
TITLES = {  # a channel whose name alone misleads
    "outbox_bytes": "outbox files on flash",
}
SKIP_CHANNELS = {"last_error", "sampled_total", "dropped_total", "released_unconfirmed"}  # the tables show them


@dataclasses.dataclass
class RunInfo:
    params: dict  # run parameters shown in the header, in order
    start_wall: float  # time.time() when the devices started: t = 0 of every chart
    faults: list[svgchart.Fault]  # (start s, end s, label)
    events: list[tuple[float, str]]  # (t s, text)
    headers: list[str]  # the outcome table (the same as the console summary)
    rows: list[list]
    wire_bars: list[tuple[str, float]]  # bytes on the wire per record (empty: not measured, no section)
    lost: list = dataclasses.field(default_factory=list)
    links: dict = dataclasses.field(default_factory=dict)  # name -> relative path (report.json, records/...)
    title: str = "mqbatch demo report"
    time_label: str = "seconds since the run started"
    # what the outcome line can claim: the demo compares with what devices stored; a
    # Spark output alone knows only what landed
    stored_known: bool = True
    # device reconnect back-off of the run, for the text under the records chart
    device_backoff_ms: tuple[int, int] | None = None


class ReportError(ValueError):
    """The directory is not a Spark output the report can be made from (one sentence)."""


# the recorder's MQTT client retries with paho's doubling back-off: 1, 2, 4, 8 s, at most 10 s
# (mqbatch/ingest/recorder.py: reconnect_delay_set(1, 10))
RECORDER_BACKOFF_S = (1, 10)

# the demo's per-device table: device, its own counts, then report_cells() and latency_cells()
DEMO_HEADERS = [
    "device",
    "stored",
    "published (acked)",
    "landed",
    "curated",
    "duplicates removed",
    "missing",
    "quarantined",
    "dropped on device",
    "reconnects",
    "latency p50",
    "latency p99",
]


def read_records(path: os.PathLike | str, extra: Sequence[str] = ()):
    """The curated records table (the report's columns + `extra`): one Parquet directory,
    flat or partitioned by `date=YYYY-MM-DD` (hive style); Spark's _SUCCESS/.crc files are ignored."""
    import pyarrow as pa
    import pyarrow.dataset as ds

    dataset = ds.dataset(str(path), format="parquet", partitioning="hive")
    cols = [c for c in RECORD_COLUMNS + list(extra) if c in dataset.schema.names]
    table = dataset.to_table(columns=cols)
    if "device" not in table.column_names:  # no record yet (an empty run, a stream before its first batch)
        ts = pa.timestamp("us", tz="UTC")
        reading = pa.struct(
            [("channel", pa.int32()), ("name", pa.string()), ("value", pa.int64()), ("scaled", pa.float64())]
        )
        types = {"device": pa.string(), "kind": pa.string(), "device_time": ts, "received_at": ts}
        types.update(latency_ms=pa.float64(), readings=pa.list_(reading), boot=pa.int64(), seq=pa.int64())
        table = pa.table({c: pa.array([], types.get(c, pa.string())) for c in RECORD_COLUMNS + list(extra)})
    return table


def _seconds(col, start_wall: float) -> list[float | None]:
    """_seconds_np as a list, None for a null."""
    return [None if math.isnan(v) else v for v in _seconds_np(col, start_wall).tolist()]


def _binned(points: list[tuple[float, float]], width: float) -> list[tuple[float, float]]:
    """Mean per `width`-second bin (keeps the SVG small for long runs)."""
    acc: dict[int, list[float]] = {}
    for t, v in points:
        acc.setdefault(int(t // width), []).append(v)
    return [((b + 0.5) * width, sum(vs) / len(vs)) for b, vs in sorted(acc.items())]


# per-device panels are drawn for at most this many devices (the first by id); a fleet's
# report adds one panel of all devices' records per second. Keeps the report of a million
# records from 5,000 devices small and its memory bounded (it was 132 MB of HTML, 5.6 GB RSS).
MAX_PANEL_DEVICES = 16


def _seconds_np(col, start_wall: float):
    """Seconds since start_wall of a timestamp column, as a float numpy array (NaN: null)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    us = pc.cast(pc.cast(col, pa.timestamp("us")), pa.int64())
    return us.to_numpy(zero_copy_only=False).astype(np.float64) / 1e6 - start_wall


def series(table, start_wall: float, max_devices: int = MAX_PANEL_DEVICES) -> dict:
    """Chart data from the records table: rate per device, latencies, channels per device.
    Per-device series for the first `max_devices` devices by id only (and then one series of
    all devices together); latencies and arrivals of every record."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    every = sorted(d for d in pc.unique(table["device"]).to_pylist() if d is not None)
    shown = every[:max_devices]
    full = table
    if len(every) > len(shown) or table["device"].null_count:  # rows without a device: in no panel
        table = table.filter(pc.is_in(table["device"], value_set=pa.array(shown, pa.string())))
    recv_all = _seconds_np(full["received_at"], start_wall)
    dev_all = _seconds_np(full["device_time"], start_wall) if "device_time" in full.column_names else recv_all
    both = np.concatenate([recv_all, dev_all])
    both = both[~np.isnan(both)]
    span = (0.0, max(float(both.max()) if len(both) else 1.0, 1.0))
    bin_s = 2.0
    nbins = int(span[1] // bin_s) + 1
    devices = table["device"].to_pylist()
    recv = _seconds(table["received_at"], start_wall)
    dev_t = _seconds(table["device_time"], start_wall) if "device_time" in table.column_names else recv
    counts = {d: [0] * nbins for d in set(devices)}
    for d, t in zip(devices, recv):
        if t is not None and t >= 0:
            counts[d][min(int(t // bin_s), nbins - 1)] += 1
    rate = {d: [((i + 0.5) * bin_s, c / bin_s) for i, c in enumerate(cs)] for d, cs in counts.items()}
    fleet_rate: dict[str, list[tuple[float, float]]] = {}  # its own chart: its own y scale
    if len(every) > len(shown):
        ok = recv_all[~np.isnan(recv_all) & (recv_all >= 0) & full["device"].is_valid().to_numpy(zero_copy_only=False)]
        total = np.bincount(np.minimum((ok // bin_s).astype(np.int64), nbins - 1), minlength=nbins)
        fleet_rate[f"all {len(every):,} devices"] = [
            ((i + 0.5) * bin_s, c / bin_s) for i, c in enumerate(total.tolist())
        ]
    latency: list[float] = []
    if "latency_ms" in full.column_names:
        lat = full["latency_ms"].to_numpy(zero_copy_only=False).astype(np.float64)
        latency = lat[~np.isnan(lat)].tolist()
    channels: dict[str, dict[str, list[tuple[float, float]]]] = {}
    if "readings" in table.column_names:
        for d, t, readings in zip(devices, dev_t, table["readings"].to_pylist()):
            if t is None:
                continue
            for r in readings or ():
                name = r.get("name")
                if name in SKIP_CHANNELS or name is None:
                    continue
                v = r.get("scaled") if r.get("scaled") is not None else r.get("value")
                if v is not None:
                    channels.setdefault(name, {}).setdefault(d, []).append((t, v))
    width = max(span[1] / 300, 0.5)
    channels = {n: {d: _binned(p, width) for d, p in per.items()} for n, per in channels.items()}
    arrivals = np.sort(recv_all[~np.isnan(recv_all)]).tolist()
    return {
        "span": span,
        "rate": rate,
        "fleet_rate": fleet_rate,
        "latency": latency,
        "channels": channels,
        "bin_s": bin_s,
        "arrivals": arrivals,
        "devices": len(every),
        "devices_shown": len(shown),
    }


def first_arrival_after(arrivals: list[float], t: float) -> float | None:
    """The first landing time >= t (arrivals sorted), None if nothing landed after t."""
    import bisect

    i = bisect.bisect_left(arrivals, t)
    return arrivals[i] if i < len(arrivals) else None


def fault_gaps_text(faults: list[svgchart.Fault], arrivals: list[float], device_backoff_ms=None) -> str:
    """Why records land again only some seconds after a fault ends, with the gap measured here."""
    parts = []
    for start, end, label in faults:
        first = first_arrival_after(arrivals, end)
        if first is None:
            continue
        gap = f"records landed again {first - end:.1f} s after the {label} ended"
        if "outage" in label:
            lo, hi = RECORDER_BACKOFF_S
            parts.append(
                f"After the {label} ({start:.0f}-{end:.0f} s) {gap}: the recorder lost its connection too, and its "
                f"MQTT client (paho-mqtt) retries with a doubling back-off ({lo}, 2, 4, 8 s, at most {hi} s; "
                "mqbatch/ingest/recorder.py), so it comes back up to that long after the broker; the devices, back "
                "sooner, publish into the broker's queue for the recorder's persistent session meanwhile (and keep "
                "each batch on flash until the recorder acknowledges it)."
            )
        else:
            backoff = (
                f" (this run: {device_backoff_ms[0]} ms doubling to at most {device_backoff_ms[1]} ms, with jitter)"
                if device_backoff_ms
                else ""
            )
            parts.append(
                f"After the {label} ({start:.0f}-{end:.0f} s) {gap}: each device reconnects after its own "
                f"back-off{backoff} and a TLS handshake, then sends its backlog."
            )
    return " ".join(parts)


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    s = sorted(values)
    k = (len(s) - 1) * q
    f = math.floor(k)
    return s[f] + (s[min(f + 1, len(s) - 1)] - s[f]) * (k - f)


def _versions() -> str:
    from importlib import metadata

    parts = [f"Python {platform.python_version()}"]
    for dist in ("mqbatch", "pyspark", "pyarrow", "paho-mqtt", "micropython-unix"):
        try:
            parts.append(f"{dist} {metadata.version(dist)}")
        except metadata.PackageNotFoundError:
            continue
    mosquitto = _mosquitto_version()
    if mosquitto:
        parts.append(mosquitto)
    return ", ".join(p for p in parts if p)


def _mosquitto_version() -> str | None:
    """ "Mosquitto 2.0.11" from the first line of `mosquitto -h`; None if it cannot be run."""
    import subprocess

    from mqbatch.util.paths import MOSQUITTO

    try:
        first = subprocess.run([str(MOSQUITTO), "-h"], capture_output=True, text=True, timeout=5).stdout.split("\n")[0]
    except (OSError, subprocess.TimeoutExpired):
        return None
    return "Mosquitto " + first.rsplit(" ", 1)[-1] if first.startswith("mosquitto version") else None


# soft hyphens where long header words may break (Chromium has no hyphenation dictionary offline)
HYPHENS = {
    "quarantined": "quaran\u00adtined",
    "reconnects": "re\u00adconnects",
    "duplicates": "dupli\u00adcates",
    "published": "pub\u00adlished",
}


def table(headers: list[str], rows: list[list]) -> str:
    """Text cells left-aligned, numbers right-aligned; cells never wrap, headers may."""

    def cell(tag, c):
        num = isinstance(c, (int, float)) or (isinstance(c, str) and c[:1].isdigit())
        return f'<{tag}{" class=num" if num and tag == "td" else ""}>{html.escape(str(c))}</{tag}>'

    head = "".join(cell("th", " ".join(HYPHENS.get(w, w) for w in str(h).split(" "))) for h in headers)
    body = "".join("<tr>" + "".join(cell("td", c) for c in row) + "</tr>" for row in rows)
    return f'<div class="scroll"><table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>'


def _explain(text: str) -> str:
    return f'<p class="explain">{html.escape(text)}</p>'


def _channel_title(name: str) -> str:
    unit = UNITS.get(name)
    return TITLES.get(name, name.replace("_", " ")) + (f" ({unit})" if unit else "")


def _first_devices(s: dict) -> str:
    """'the first 16 of 5,000 devices by id' when series() drew only some devices, else ''."""
    return (
        f"the first {s['devices_shown']} of {s['devices']:,} devices by id" if s["devices"] > s["devices_shown"] else ""
    )


def render(run: RunInfo, rep: dict, records) -> str:
    s = series(records, run.start_wall)
    first = _first_devices(s)
    span, faults = s["span"], run.faults
    lat = s["latency"]
    p50, p95, p99 = (percentile(lat, q) for q in (0.5, 0.95, 0.99))
    generated = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    params = "".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape(str(v))}</td></tr>" for k, v in run.params.items())
    head = (
        f'<table class="params">{params}<tr><th>generated</th><td>{generated}</td></tr>'
        f'<tr><th>versions</th><td class="wrap">{html.escape(_versions())}</td></tr></table>'
    )
    status = (
        f'<p class="bad">{len(run.lost)} records lost, e.g. {html.escape(str(run.lost[:3]))}</p>'
        if run.lost
        else '<p class="ok">No record lost: every record a device stored reached the curated table.</p>'
        if run.stored_known
        else _explain(
            "What landed and what the Spark job made of it, per device. Missing: sequence numbers absent "
            "from a device's boot (lost, or not landed yet); dropped on device: records the device itself "
            "counted as dropped (its health records)."
        )
    )
    sample_names = sorted(
        n for n in s["channels"] if CHANNEL_BY_NAME.get(n) is None or CHANNEL_BY_NAME[n].kind != HEALTH
    )
    health_names = sorted(n for n in s["channels"] if n not in sample_names)

    def channel_charts(names, zero):
        return (
            "".join(
                svgchart.time_panels(
                    _channel_title(n),
                    s["channels"][n],
                    span,
                    faults,
                    UNITS.get(n, "value"),
                    xlabel=run.time_label,
                    panel_h=44,
                    zero=zero,
                )
                for n in names
            )
            or "<p>No such readings.</p>"
        )

    q = sorted(rep.get("quarantine", {}).get("by_reason", {}).items())
    quarantine = (
        "<p>Nothing was quarantined: every landed PUBLISH decoded into valid records.</p>"
        if not q
        else _explain("Rows the Spark job set aside instead of the records table, by reason (docs/reasons).")
        + svgchart.hbars("quarantined rows by reason", q, "rows")
    )
    links = " · ".join(f'<a href="{html.escape(p)}">{html.escape(n)}</a>' for n, p in run.links.items())
    events = table(["t (s)", "event"], [[f"{t:.1f}", e.strip()] for t, e in run.events])
    sections = [
        ("Outcome", status + table(run.headers, run.rows) + accounting_section(rep)),
        (
            "Records per second, by arrival",
            _explain(
                f"Records landed per second ({s['bin_s']:g} s bins), one panel per device on the same scales"
                + (
                    f" ({first}, after a chart of all of them on its own scale; every device's counts are in the "
                    "outcome table). "
                    if first
                    else ". "
                )
                + "Shaded: injected faults; during them, devices keep sampling into their flash outbox and send the "
                "backlog afterwards (the peaks). " + fault_gaps_text(faults, s["arrivals"], run.device_backoff_ms)
            )
            + (
                svgchart.time_panels(
                    "records landed per second, all devices",
                    s["fleet_rate"],
                    span,
                    faults,
                    "records/s",
                    xlabel=run.time_label,
                )
                if s["fleet_rate"]
                else ""
            )
            + svgchart.time_panels(
                "records landed per second, per device", s["rate"], span, faults, "records/s", xlabel=run.time_label
            ),
        ),
        (
            "Latency",
            _explain(
                "Latency = time the recorder received a record minus the time the device sampled it. Most records "
                "wait only for their batch to fill (p50); "
                + (
                    "p99 is the backlog sent after the injected faults, which waited on flash for the fault to end."
                    if faults
                    else "no fault was injected, so p99 shows the slowest ordinary deliveries."
                    if run.stored_known
                    else "the slowest are usually a backlog a device kept on flash while it could not publish "
                    "(an outage, a lost link): see the peaks of the chart above."
                )
            )
            + svgchart.log_histogram(
                "latency of every curated record",
                lat,
                "latency (log scale)",
                [("p50", p50), ("p95", p95), ("p99", p99)],
            ),
        ),
        (
            "Sensor readings",
            _explain(
                "The telemetry itself: each sensor channel over time (device clock), "
                "one panel per device on the same scales" + (f" ({first})." if first else ".")
            )
            + channel_charts(sample_names, zero=False),
        ),
        (
            "Device health",
            _explain(
                "Health records every few seconds: free heap, outbox depth (batches waiting "
                "on flash: it rises during faults), reconnects. Outbox files on flash is the size of the "
                "outbox's segment files, not of what waits: acknowledged batches stay in the open segment file "
                "until it is full (outbox.segment_bytes, 16 KB by default) and is deleted, so with an empty "
                "outbox it stays below one segment instead of falling to 0 (firmware/mqb_outbox.py); it is "
                "not a leak." + (f" Panels for {first}." if first else "")
            )
            + channel_charts(health_names, zero=True),
        ),
        (
            "Bytes on the wire per record",
            _explain("Bytes sent device to broker per record, TLS included; batching shares the MQTT and TLS overhead.")
            + svgchart.hbars("bytes on the wire per record", run.wire_bars, "bytes per record", "{:.1f}"),
        )
        if run.wire_bars
        else None,
        ("Quarantine", quarantine),
        ("Injected faults and events", events) if run.events else None,
        (
            "Outputs",
            f"<p>{links}</p>"
            + "<details><summary>Spark report.json (raw)</summary><pre>"
            + html.escape(json.dumps(rep, indent=1, sort_keys=True))
            + "</pre></details>",
        ),
    ]
    return page(run.title, head, [x for x in sections if x is not None])


CSS = (
    "body{font-family:system-ui,sans-serif;max-width:1100px;margin:0 auto;padding:12px 20px;color:#222}"
    "h1{margin:.3em 0}h2{margin-top:1.6em;border-bottom:1px solid #ddd}"
    ".scroll{overflow-x:auto}table{border-collapse:collapse;margin:.6em 0;font-size:12.5px;font-stretch:condensed}"
    "td,th{border:1px solid #ccc;padding:2px 4px;text-align:left;white-space:nowrap;vertical-align:top}"
    "th{background:#f3f3f3;white-space:normal}td.num{text-align:right;font-variant-numeric:tabular-nums}"
    "td.wrap{white-space:normal}table.params th{text-align:left}"
    "svg.chart{display:block;width:100%;max-width:760px;height:auto;margin:.6em 0}"
    ".explain{color:#555;font-size:14px;max-width:760px}pre{overflow-x:auto;font-size:12px;background:#f8f8f8}"
    ".bad{color:#b00;font-weight:bold}.ok{color:#070;font-weight:bold}"
    "@media (max-width:900px){body{padding:8px 10px}table{font-size:12px}}"
)


def page(title: str, header: str, sections: list[tuple[str, str]]) -> str:
    parts = [f"<h2>{html.escape(h)}</h2>\n{body}" for h, body in sections]
    return (
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
        "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
        f"<title>{html.escape(title)}</title><style>{CSS}</style></head><body>"
        f"<h1>{html.escape(title)}</h1>\n{header}\n" + "\n".join(parts) + "\n</body></html>\n"
    )


# -- from a Spark output directory ---------------------------------------------------------


def _read_report_json(spark_out: pathlib.Path) -> dict:
    path = spark_out / "report.json"
    if not spark_out.is_dir():
        raise ReportError(f"{spark_out} is not a directory (give the Spark job's --out directory)")
    if not path.is_file():
        raise ReportError(f"{spark_out} has no report.json: not the output of `mqbatch spark --out {spark_out}`")
    try:
        rep = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ReportError(f"{path} cannot be read as JSON: {e}") from None
    if not isinstance(rep, dict):
        raise ReportError(f"{path} does not hold a JSON object")
    return rep


def _utc(text: str | None) -> float | None:
    if not text:
        return None
    return datetime.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def ms_text(v) -> str:
    """A latency cell: '912 ms', or '-' when there is none."""
    return "-" if v is None else f"{v:.0f} ms"


OUTCOME_HEADERS = [
    "device",
    "landed",
    "curated",
    "duplicates removed",
    "missing",
    "out of order",
    "quarantined",
    "dropped on device",
    "boots",
    "latency p50",
    "latency p99",
]


# report.json devices.*.accounting (mqbatch.spark.accounting), in the order shown
ACCOUNTING_COLUMNS = [
    ("stored", "stored"),
    ("landed", "landed"),
    ("dropped (never reached the broker)", "dropped"),
    ("released unconfirmed", "released_unconfirmed"),
    ("of those landed", "released_landed"),
    ("absent", "absent"),
    ("lost (counted by nobody)", "lost"),
    ("dropped but landed", "dropped_landed"),
]


def accounting_section(rep: dict) -> str:
    """Where every stored record went, per device; empty when report.json has no accounting."""
    devices = sorted((n, d["accounting"]) for n, d in rep.get("devices", {}).items() if "accounting" in d)
    if not devices:
        return ""
    rows = [[name, *(a[k] for _, k in ACCOUNTING_COLUMNS), "yes" if a["balanced"] else "NO"] for name, a in devices]
    return _explain(
        "Where every record went, per device: stored = landed + dropped + released unconfirmed that did not "
        "land (balanced). Stored: the sequence numbers up to the highest landed one; dropped: the device let it "
        "go before the broker accepted it; released unconfirmed: accepted by the broker (PUBACK), let go before "
        "its end-to-end ack came, so it may have landed; absent: sequence numbers that never landed; lost: absent "
        "and counted by no device counter; dropped but landed: the device counted more dropped than is absent."
    ) + table(["device", *(h for h, _ in ACCOUNTING_COLUMNS), "balanced"], rows)


def report_cells(d: dict, keys: Sequence[str]) -> list:
    """Cells of one device of report.json: its counts `keys` (0 when absent)."""
    return [d.get(k, 0) for k in keys]


def latency_cells(d: dict) -> list[str]:
    lat = d.get("latency_ms") or {}
    return [ms_text(lat.get("p50")), ms_text(lat.get("p99"))]


OUTCOME_KEYS = ("received", "unique", "duplicates", "missing", "out_of_order", "quarantined", "dropped_on_device")


def outcome_rows(rep: dict) -> list[list]:
    """The per-device table of a report.json (what landed and what the job made of it)."""
    return [
        [dev, *report_cells(d, OUTCOME_KEYS), d.get("boots", 0), *latency_cells(d)]
        for dev, d in sorted(rep.get("devices", {}).items())
    ]


def run_info_from(rep: dict, records, spark_out: pathlib.Path, html_path: pathlib.Path) -> RunInfo:
    """What a Spark output alone says about its run: t = 0 is the first record that landed."""
    import pyarrow.compute as pc

    firsts = [_utc((rep.get("received_at") or {}).get("min"))]
    for col in ("device_time", "received_at"):
        if records.num_rows and col in records.column_names:
            v = pc.min(records[col]).as_py()
            firsts.append(v.timestamp() if v is not None else None)
    start = min((t for t in firsts if t is not None), default=0.0)
    recs = rep.get("records", {})
    received = rep.get("received_at") or {}
    rel = lambda p: os.path.relpath(p, html_path.parent)
    return RunInfo(
        params={
            "Spark output": str(spark_out),
            "landed": f"{rep.get('landed', 0)} PUBLISHes, {recs.get('received', 0)} records",
            "curated": f"{recs.get('unique', 0)} records ({recs.get('duplicates', 0)} duplicates removed)",
            "devices": len(rep.get("devices", {})),
            "received": f"{received.get('min', '-')} to {received.get('max', '-')}",
        },
        start_wall=start,
        faults=[],
        events=[],
        headers=OUTCOME_HEADERS,
        rows=outcome_rows(rep),
        wire_bars=[],
        links={
            "report.json": rel(spark_out / "report.json"),
            "records/": rel(spark_out / "records"),
            "quarantine/": rel(spark_out / "quarantine"),
        },
        title="mqbatch report",
        time_label="seconds since the first record (sampled or landed)",
        stored_known=False,
    )


def write_report(
    spark_out: os.PathLike | str, html_path: os.PathLike | str | None = None, run: RunInfo | None = None
) -> pathlib.Path:
    """Write the HTML report of a Spark output directory (records/, quarantine/, report.json
    of `mqbatch spark --out DIR`, batch or streaming) to `html_path` (default
    DIR/report.html; replaced atomically) and return its path. `run`: the caller's own
    RunInfo (the demo's faults, events and table); default: what the output says.
    ReportError (one sentence) when DIR is not such an output."""
    spark_out = pathlib.Path(spark_out)
    rep = _read_report_json(spark_out)
    html_path = pathlib.Path(html_path) if html_path is not None else spark_out / "report.html"
    records_dir = spark_out / "records"
    if not records_dir.is_dir():
        raise ReportError(f"{spark_out} has no records/ directory: not a complete `mqbatch spark` output")
    records = read_records(records_dir, extra=["boot", "seq"])
    if run is None:
        run = run_info_from(rep, records, spark_out.resolve(), html_path.resolve())
    text = render(run, rep, records)
    html_path.parent.mkdir(parents=True, exist_ok=True)
    tmp = html_path.with_name(f".{html_path.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, html_path)
    return html_path
