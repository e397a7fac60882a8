"""benchmarks.md and its PNG plots from the results of `mqbatch bench TARGET`
(OUT/TARGET.json, mqbatch.bench.out). `mqbatch bench all` calls render() at its end;
`mqbatch bench report` renders again from the files alone.

    render(pathlib.Path("run/bench"), pathlib.Path("docs"))
    # -> docs/benchmarks.md, docs/benchmarks/{wire_bytes,records_per_s,heap}.png

Plots are drawn with matplotlib's Agg backend (no display). Every table says the
machine, the versions and the exact command its figures came from.
"""

from __future__ import annotations

import pathlib
import statistics

from mqbatch.bench.out import load_results, spread

DEVICE_TARGET_US = 10.0  # issue 15: RecordWriter.sample, 38-byte record, Unix port
INGEST_TARGET_RATIO = 0.90  # issue 24: recorder >= 90 % of the counting subscriber, final roll included
STYLE = {
    "mqbatch": ("tab:blue", "o"),
    "JSON array": ("tab:orange", "s"),
    "umqtt.simple": ("tab:red", "^"),
    "umqtt.simple+NODELAY": ("tab:purple", "v"),
}


def _med(values) -> float:
    return statistics.median(values)


def _spread(values, spec: str = ",.0f") -> str:
    return spread(values, spec, sep="–")


def _provenance(r: dict) -> str:
    m, v = r["machine"], r["versions"]
    vers = ", ".join(f"{k} {val}" for k, val in v.items() if val)
    note = " **`--quick`: a smoke test, not a measurement.**" if r.get("quick") else ""
    return (
        f"*Command:* `{r['command']}` (finished {r['finished_utc']}).{note}  \n"
        f"*Machine:* {m['cpu']}, {m['cores']} cores, {m['memory_gb']} GB, {m['os']}; load average "
        f"{'/'.join(map(str, m['load_average']))} at the end (1/5/15 min; the machine is shared with other "
        f"work, so rates swing between repetitions)"
        + (
            f"; JVM options `SPARK_SUBMIT_OPTS={m['spark_submit_opts']}`"
            if m.get("spark_submit_opts") and r.get("target") == "spark"
            else ""
        )
        + (
            "; a class-data archive was written for the JVM to map (mqbatch.spark.cds)"
            if m.get("jvm_cds_archive") and r.get("target") in ("spark", "latency")
            else ""
        )
        + f".  \n*Versions:* {vers}."
    )


# -- plots ------------------------------------------------------------------------------


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_wire(fig: dict, path: pathlib.Path) -> None:
    from mqbatch.bench.wire import MSS_ETHERNET, limit

    plt = _plt()
    f, ax = plt.subplots(figsize=(8, 6.5), dpi=110)
    sizes = fig["sizes"]
    for variant, (color, marker) in STYLE.items():
        rows = [r for r in fig["wire"] if r["variant"] == variant]
        if not rows:
            continue
        if len(rows) == 1 and variant.startswith("umqtt"):
            ax.axhline(
                rows[0]["total"],
                color=color,
                ls=":",
                lw=1.5,
                label=f"{variant} (1 record/PUBLISH): {rows[0]['total']:.0f} B",
            )
            continue
        ax.plot([r["batch"] for r in rows], [r["total"] for r in rows], color=color, marker=marker, label=variant)
        if variant == "mqbatch":
            ax.plot(
                [r["batch"] for r in rows],
                [r["total_eth_estimate"] for r in rows],
                color=color,
                ls="--",
                lw=1,
                label="mqbatch, estimate at Ethernet MSS 1448",
            )
    for mss, ls, name in ((fig["mss_loopback"], "--", "loopback"), (MSS_ETHERNET, "-.", "Ethernet")):
        ax.plot(
            sizes, [limit(b, mss) for b in sizes], color="black", ls=ls, lw=1, label=f"physical limit, {name} MSS {mss}"
        )
    ax.set_yscale("log")
    ax.set_yticks([40, 50, 60, 80, 100, 150, 200, 300, 500, 700, 1000])
    _finish(
        plt,
        f,
        ax,
        path,
        "bytes per record on the wire (both directions, log)",
        f"{fig['record_bytes']}-byte records, QoS 1, TLS: IP+TCP+TLS+MQTT bytes per record",
    )


def _errorbar(ax, rows: list[dict], key: str, ys: list[float], **style) -> None:
    """Medians ys at each row's batch size, bars from the row's min to max."""
    ax.errorbar(
        [r["batch"] for r in rows],
        ys,
        capsize=3,
        yerr=[[y - min(r[key]) for y, r in zip(ys, rows)], [max(r[key]) - y for y, r in zip(ys, rows)]],
        **style,
    )


def _rate_plot(
    fig: dict, path: pathlib.Path, key: str, ylabel: str, title: str, log: bool, variants=tuple(STYLE)
) -> None:
    plt = _plt()
    f, ax = plt.subplots(figsize=(8, 6.5), dpi=110)
    for variant in variants:
        color, marker = STYLE[variant]
        for qos, ls in ((0, "--"), (1, "-")):
            rows = sorted(
                (r for r in fig["rates"] if r["client"] == variant and r["qos"] == qos), key=lambda r: r["batch"]
            )
            if not rows:
                continue
            ys = [_med(r[key]) for r in rows]
            label = f"{variant}, QoS {qos}"
            if len(rows) == 1 and variant.startswith("umqtt"):
                ax.axhline(
                    ys[0],
                    color=color,
                    ls=":" if qos else (0, (6, 2, 1, 2)),
                    lw=1.5,
                    label=f"{label} (1 record/PUBLISH): {ys[0]:,.0f}",
                )
                continue
            _errorbar(ax, rows, key, ys, color=color, marker=marker, ls=ls, label=label)
    if log:
        ax.set_yscale("log")
    _finish(plt, f, ax, path, ylabel, title)


QOS_COLOR = {  # one colour per (client, QoS): the two QoS levels of a client are told apart at a glance
    ("mqbatch", 0): "tab:cyan",
    ("mqbatch", 1): "tab:blue",
    ("umqtt.simple", 0): "tab:pink",
    ("umqtt.simple", 1): "tab:red",
    ("umqtt.simple+NODELAY", 0): "tab:olive",
    ("umqtt.simple+NODELAY", 1): "tab:purple",
}
NAGLE_BOUND = 1000.0  # records/s: a rate below this is umqtt.simple waiting on Nagle x delayed ACK, not CPU


def rate_panels(fig: dict, path: pathlib.Path) -> None:
    """records/s vs batch size, one panel per QoS (log y), a distinct colour per client and QoS;
    a rate bound by a TCP timer (umqtt.simple QoS 1 without NODELAY, ~22/s) is named in the
    panel's note instead of being drawn, so it does not stretch the axis over 4 decades."""
    plt = _plt()
    f, axes = plt.subplots(1, 2, figsize=(11, 6), dpi=110, sharey=True)
    for ax, qos in zip(axes, (0, 1)):
        notes = []
        for variant in STYLE:
            rows = sorted(
                (r for r in fig["rates"] if r["client"] == variant and r["qos"] == qos), key=lambda r: r["batch"]
            )
            if not rows:
                continue
            color, marker = QOS_COLOR.get((variant, qos), STYLE[variant][0]), STYLE[variant][1]
            ys = [_med(r["records_per_s"]) for r in rows]
            if len(rows) == 1 and variant.startswith("umqtt"):
                if ys[0] < NAGLE_BOUND:
                    notes.append(f"{variant}: {ys[0]:,.0f} records/s (Nagle x delayed ACK bound; not drawn)")
                    continue
                ax.axhline(ys[0], color=color, ls=":", lw=1.8, label=f"{variant} (1 record/PUBLISH): {ys[0]:,.0f}")
                continue
            _errorbar(ax, rows, "records_per_s", ys, color=color, marker=marker, label=variant)
        ax.set_yscale("log")
        title = f"QoS {qos}" + ("".join(f"\n{n}" for n in notes))
        _axes(ax, "records per second (log)" if qos == 0 else "", title)
    f.suptitle("records/s vs batch size, MicroPython Unix port, TLS to Mosquitto on 127.0.0.1", fontsize=11)
    f.tight_layout()
    f.savefig(path)
    plt.close(f)


def _axes(ax, ylabel: str, title: str) -> None:
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    ax.set_xscale("log")
    ax.set_xticks([1, 2, 5, 10, 20, 50, 100, 200, 500])
    if ax.yaxis.get_scale() == "log":
        ax.yaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
    for axis in (ax.xaxis, ax.yaxis):
        if axis.get_scale() == "log":
            axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,.0f}"))
            axis.set_minor_formatter(NullFormatter())
    ax.set_xlabel("records per PUBLISH (batch size)")
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.13), ncol=2)


def _finish(plt, f, ax, path: pathlib.Path, ylabel: str, title: str) -> None:
    """Log x axis of batch sizes with plain labels, legend under the plot, save as PNG."""
    _axes(ax, ylabel, title)
    f.tight_layout()
    f.savefig(path)
    plt.close(f)


# -- sections -----------------------------------------------------------------------------


def _wire_section(r: dict, img: str) -> list[str]:
    fig = r["figures"]
    out = [
        "## Bytes per record on the wire",
        "",
        _provenance(r),
        "",
        f"![bytes per record vs batch size]({img}/wire_bytes.png)",
        "",
        f"{fig['record_bytes']}-byte telemetry records (4 channels, written by the firmware's `RecordWriter`), "
        "QoS 1, TLS to a Mosquitto on 127.0.0.1, both directions, through the project's proxy "
        "(`mqbatch.conformance.proxy`: TLS record headers and bytes per direction, TCP segments from `TCP_INFO`; "
        "no root, no packet capture). The client pauses after a warm-up PUBLISH and after the last "
        "measured PUBACK; the proxy's counters are read at both pauses (0.3 s in, so delayed ACKs have gone "
        "out) and their difference divided by the records is the figure: no handshake, no teardown. The "
        "split into record bytes, framing and MQTT comes from the same run over plain TCP, where the proxy "
        "parses every PUBLISH and PUBACK; TLS and TCP/IP are what the TLS run adds to those MQTT bytes.",
        "",
        "- **mqbatch**: the firmware client (`mqb_client`) in the MicroPython Unix port, batch-format v1; "
        "stop-and-wait (`flush()` after each PUBLISH), so each PUBLISH is alone on the wire.",
        "- **JSON array**: the spec's §6 alternative, the same records as a JSON array with Payload Format "
        "Indicator 1 and Content Type `application/json` (no user properties), published by **paho-mqtt** "
        "from the host (CPython's TLS: up to 16 KB per TLS record, where MicroPython's mbedTLS cuts at 4 KB).",
        f"- **umqtt.simple** {fig.get('umqtt_version') or '(not available in this run)'}: MQTT 3.1.1, one "
        "record per PUBLISH, fetched from the package index and sha256-checked at run time "
        "(`mqbatch.scenarios.baseline`); **+NODELAY**: the same with `TCP_NODELAY` set on its socket "
        "(its five writes per PUBLISH otherwise wait on Nagle × delayed ACK).",
        "",
        f"Assumptions: TCP/IP = segments × {fig['segment_headers']} B (IPv4 20 + TCP 20 + the timestamp option "
        "12 that Linux puts on every segment; no IP options, no SACK blocks; Ethernet framing not counted). "
        "Segments include pure ACKs. TLS = TLS bytes − MQTT bytes (record headers, explicit nonce, tag). "
        f"Physical limit at batch B = {fig['record_bytes']} + {fig['segment_headers']} × "
        f"⌈{fig['record_bytes']}·B / MSS⌉ / B: the records alone in the fewest segments, no ACK, TLS or MQTT; "
        f"loopback MSS {fig['mss_loopback']} (`tcpi_advmss`), Ethernet MSS {fig['mss_ethernet']}. "
        "The Ethernet column is an **estimate** from the loopback run: each PUBLISH's TLS bytes cut into "
        f"⌈bytes / {fig['mss_ethernet']}⌉ segments, one more ACK per two extra segments. "
        "Efficiency = record bytes (38) / bytes on the wire; \"points\" = limit's efficiency − ours, in "
        "percentage points.",
        "",
        "| publisher | batch | total B/record, median [min–max] | record | framing (VBI / JSON `[,]`) | MQTT header+props (+PUBACK) | TLS | TCP/IP | TLS records / PUBLISH | segments / PUBLISH | efficiency | points from loopback limit | MSS 1448 estimate B/record | points from 1448 limit |",
        "|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|",
    ]
    for w in fig["wire"]:
        out.append(
            f"| {w['variant']} | {w['batch']} | {_spread(w['total_runs'], '.1f')} | {w['record']:.1f} | "
            f"{w['framing']:.2f} | {w['mqtt_header']:.2f} | {w['tls_overhead']:.2f} | {w['tcpip']:.2f} | "
            f"{w['tls_records_per_publish']:.1f} | {w['segments_per_publish']:.1f} | {w['efficiency']:.1f} % | "
            f"{w['points_from_limit_loopback']:.1f} | {w['total_eth_estimate']:.1f} | "
            f"{w['points_from_limit_ethernet']:.1f} |"
        )
    out += [
        "",
        "Record bytes of the JSON array are the records' JSON text (the same values), so its efficiency "
        "counts the 38 bytes of information, not its text.",
        "",
    ]
    return out


def _rates_section(r: dict, img: str) -> list[str]:
    fig = r["figures"]
    out = [
        "## Records per second and heap bytes per record (device side)",
        "",
        _provenance(r),
        "",
        f"![records/s vs batch size]({img}/records_per_s.png)",
        "",
        f"![heap bytes per record]({img}/heap.png)",
        "",
        "The MicroPython Unix port, TLS straight to the broker on 127.0.0.1 (no proxy), "
        "`tests/mpy/wire_bench.py`: write B records with `RecordWriter.sample` (4 channels, 38 B), publish, "
        "at QoS 1 wait for the PUBACK (`flush()`, stop-and-wait), at QoS 0 only send. Measured with the GC "
        "disabled after 3 warm-up PUBLISHes; heap bytes = `gc.mem_alloc()` growth / records (sample, publish "
        "and acknowledgement). Figures of this host's CPU, not of a board. umqtt.simple writes each PUBLISH "
        "in five socket writes and at QoS 1 waits for its PUBACK: without `TCP_NODELAY`, Nagle holds the "
        "later writes until the broker's delayed ACK, so its plain QoS 1 rate is bounded by that timer, not "
        "by the CPU; the +NODELAY rows are the fair per-record comparison, and both ratios are given.",
        "",
        "| client | QoS | batch | records | records/s, median [min–max] | heap bytes/record |",
        "|---|--:|--:|--:|--:|--:|",
    ]
    for x in sorted(fig["rates"], key=lambda x: (list(STYLE).index(x["client"]), x["qos"], x["batch"])):
        out.append(
            f"| {x['client']} | {x['qos']} | {x['batch']} | {x['records']:,} | {_spread(x['records_per_s'])} | "
            f"{_spread(x['alloc_per_record'], '.1f')} |"
        )
    ours = {x["batch"]: _med(x["records_per_s"]) for x in fig["rates"] if x["client"] == "mqbatch" and x["qos"] == 1}
    out.append("")
    for variant in ("umqtt.simple", "umqtt.simple+NODELAY"):
        base = [_med(x["records_per_s"]) for x in fig["rates"] if x["client"] == variant and x["qos"] == 1]
        if base and base[0] and ours:
            out.append(
                f"Ratio mqbatch / {variant} at QoS 1 (medians, same run): "
                + ", ".join(f"batch {b}: {v / base[0]:,.1f}×" for b, v in sorted(ours.items()))
                + "."
            )
            out.append("")
    return out


def _device_section(r: dict) -> list[str]:
    figs = r["figures"]["variants"]
    f = figs.get("firmware/") or next(iter(figs.values()))
    us = _med(f["us_per_sample"])
    verdict = (
        f"**met** ({us:.2f} µs ≤ {DEVICE_TARGET_US:g} µs)"
        if us <= DEVICE_TARGET_US
        else f"**missed** by {us - DEVICE_TARGET_US:.2f} µs ({us / DEVICE_TARGET_US:.2f}× the target)"
    )
    ratio = _med(f["ratio"])
    return [
        "## Device CPU per record (`mqbatch bench device`)",
        "",
        _provenance(r),
        "",
        "| figure | median [min–max] | target |",
        "|---|--:|---|",
        f"| `RecordWriter.sample`, 4 channels (38 B), µs/record | {_spread(f['us_per_sample'], '.2f')} | "
        f"≤ {DEVICE_TARGET_US:g} µs: {verdict} |",
        f"| heap bytes per record (GC off) | {_spread(f['alloc'], '.1f')} | 0 |",
        f"| `publish_batch`, 100 records, µs/batch | {_spread(f['us_per_publish'])} | |",
        f"| sample → encoder → client, QoS 1, records/s | {_spread(f['pipeline'])} | |",
        *(
            [
                "| the app's per-record path: sample → outbox append (flushed per batch) → read back → PUBLISH "
                f"QoS 1 → PUBACK → outbox ack, records/s | {_spread(f['app_path'])} | |"
            ]
            if "app_path" in f
            else []
        ),
        "| one prebuilt 100-record batch republished, QoS 1 stop-and-wait `flush()`, PUBLISH/s "
        f"(× 100 = record slots/s; no record sampled, stored or encoded) | {_spread([w / 100 for w in f['wait']])} "
        f"({_spread(f['wait'])}) | |",
        "| the same, busy loop on `service()`, PUBLISH/s (× 100 = record slots/s) | "
        f"{_spread([b / 100 for b in f['busy']])} ({_spread(f['busy'])}) | |",
        f"| stop-and-wait / busy loop (per run) | {_spread(f['ratio'], '.2f')} | ≥ 0.90: "
        f"{'**met**' if ratio >= 0.9 else f'**missed** by {0.9 - ratio:.2f}'} |",
        "",
        "How (docs/mqtt-client.md, docs/records.md): `sample()` checks the channel set once per configuration "
        "and packs the readings into the caller's buffer without allocating; `Transport.wait()` polls the raw "
        "TCP socket, so stop-and-wait no longer loses up to 1 ms per PUBACK. "
        + (
            ""
            if us <= DEVICE_TARGET_US and ratio >= 0.9
            else "Why missed: what remains is interpreter time of the MicroPython Unix port on this shared, loaded "
            "host, which swings by 2× between runs (docs/records.md: 3.1–12 µs for the same code); on loopback "
            "the PUBACK is often back before the first `service()`, so stop-and-wait vs busy loop varies. "
        )
        + "Figures of this host's CPU, not of a 240 MHz board.",
        "",
    ]


def _ingest_section(r: dict) -> list[str]:
    f = r["figures"]
    ratio = _med(f["ratios"])
    rss = [x["vmhwm_kb"] / 1024 for x in f["runs"]["recorder"]]
    verdict = (
        f"**met** ({ratio:.2f})"
        if ratio >= INGEST_TARGET_RATIO
        else f"**missed** by {INGEST_TARGET_RATIO - ratio:.2f} (median {ratio:.2f})"
    )
    return [
        "## Recorder vs a counting subscriber (`mqbatch bench ingest`)",
        "",
        _provenance(r),
        "",
        f"{f['publishes']:,} PUBLISHes of {f['records_per_publish']} records ({f['payload_bytes']:,.0f} B "
        f"payload) per consumer and repetition, {f['repeat']} repetitions, segments of {f['roll_mb']:g} MiB, "
        "Mosquitto over TLS on 127.0.0.1 (docs/ingest.md).",
        "",
        "| figure | median [min–max] | target |",
        "|---|--:|---|",
        f"| counting subscriber, PUBLISH/s | {_spread(f['counter_rates'])} | |",
        (
            "| recorder (fsync before PUBACK; until every row is in Parquet, stop and final roll included), "
            if all("seconds_acked" in x for x in f["runs"]["recorder"])
            else "| recorder (fsync before PUBACK; until the N-th PUBACK, a result recorded before 2026-11-26), "
        )
        + f"PUBLISH/s | {_spread(f['recorder_rates'])} | |",
        f"| ratio recorder/counter (same repetition) | {_spread(f['ratios'], '.2f')} | "
        f"≥ {INGEST_TARGET_RATIO:.2f}: {verdict} |",
        f"| CPU s per 1,000 PUBLISHes: counter / recorder | {_spread(f['cpu_per_1000']['counter'], '.2f')} / "
        f"{_spread(f['cpu_per_1000']['recorder'], '.2f')} | |",
        f"| recorder peak RSS, MB | {_spread(rss)} | bounded by the segment size |",
        "",
        (
            ""
            if ratio >= INGEST_TARGET_RATIO
            else "Why missed (docs/ingest.md): the recorder fsyncs every commit group before its PUBACKs; what remains "
            "is paho's per-PUBLISH parsing (which the counter pays too), the fsync, the roll's CPU (JSON header "
            "per frame, zstd) in a background thread on the same two cores, and one PUBACK system call per "
            "message inside paho. "
        )
        + "Wall-clock rates on this shared 2-core machine swing by 2× between repetitions (the CPU figures "
        "much less); the ratio is per repetition, both consumers draining the same backlog. Peak RSS is "
        "about 68 MB of imports plus a few `chunk_bytes` for a roll, not the data (docs/ingest.md).",
        "",
    ]


def _spark_section(r: dict) -> list[str]:
    f = r["figures"]
    n = f["records"]
    out = [
        "## Spark pipeline (`mqbatch bench spark`)",
        "",
        _provenance(r),
        "",
        "| measurement | records/s, median [min–max] | machine CPU s (all processes), median [min–max] |",
        "|---|--:|--:|",
    ]
    cpu = f.get("machine_cpu_seconds") or {}
    for name, secs in f["seconds"].items():
        busy = _spread(cpu[name], ".2f") if cpu.get(name) else "not recorded"
        out.append(f"| {name} | {_spread([n / s for s in secs])} | {busy} |")
    path = {True: "on", False: "off (no JDK, or a session without its jar)"}.get(f.get("jvm_fast_path"), "not recorded")
    ratios = []
    if f.get("ratio_a_over_b") is not None:
        ratios.append(
            f"Ratio (a)/(b), the decode step against from_json, medians of this run: {f['ratio_a_over_b']:.2f}."
        )
    if f.get("ratio_c_over_d") is not None:
        ratios.append(
            "Ratio (c)/(d), the whole batch job against the plain JSON job (records/s; 1 or more: mqbatch "
            f"is at least as fast), medians of this run: {f['ratio_c_over_d']:.2f}."
        )
    for name, secs in (f.get("cold_seconds") or {}).items():
        ratios.append(f"Cold, fresh process each run: {name}: {_spread(secs, '.1f')} s.")
    out += ["", *ratios, f"{n:,} records; JVM fast path {path}; docs/spark.md.", ""]
    return out


def _latency_section(r: dict | None) -> list[str]:
    if r is not None and r["figures"].get("mode") == "stream":
        return _table_latency_section(r)
    out = ["## End-to-end latency (record sampled → recorder received; not yet in a table)", ""]
    if r is None:
        return out + [
            "Not measured in this run: `mqbatch bench latency` (part of `mqbatch bench all`, not of "
            "`--quick`) measures time to table in streaming mode and fills this section.",
            "",
        ]
    f = r["figures"]
    s, e = f["outage"]
    out += [
        _provenance(r),
        "",
        f"{f['devices']} virtual devices (the firmware in the MicroPython Unix port, 64K heap) sampling at "
        f"{f['sample_hz']:g} Hz for {f['duration_s']:g} s through Mosquitto (TLS) into the recorder, a broker "
        f"outage from {s:.1f} to {e:.1f} s, then the Spark job (`mqbatch.scenarios.demo` machinery, no network cut). "
        "Latency = `received_at` (the recorder received the PUBLISH; it lands in its WAL and is fsync'd "
        "before the PUBACK) − the record's device time, over the curated records. Batches leave at "
        f"{f['flush']}, so in steady state the latency is mostly the batch's age. Phases by sampling time: "
        f"steady state = {f['warmup_s']:g} s after the start to {f['before_s']:g} s before the outage (the "
        f"batch age limit + 1 s: delivered before it began); after outage = from then to {f['after_s']:g} s "
        "after its end (batches the outage caught, kept in the outbox on flash, then drained); recovered = "
        "later.",
        "",
        "| phase | records | p50 (ms) | p99 (ms) | max (ms) |",
        "|---|--:|--:|--:|--:|",
    ]
    for name, x in f["phases"].items():
        out.append(
            f"| {name} | {x['n']:,} | "
            + (" | ".join(f"{x[k]:,.0f}" for k in ("p50", "p99", "max")) if x["n"] else "– | – | –")
            + " |"
        )
    return out + [""]


def _pct_cells(x: dict, scale: float = 1.0) -> str:
    if not x.get("n"):
        return "– | – | – | –"
    return f"{x['n']:,} | " + " | ".join(f"{x[k] / scale:,.1f}" for k in ("p50", "p99", "max"))


def _table_latency_section(r: dict) -> list[str]:
    f = r["figures"]
    return [
        "## End-to-end latency: time to table (record sampled → row readable in records/)",
        "",
        _provenance(r),
        "",
        f"{f['devices']} simulated devices (`mqbatch.bench.simfleet`: batch-format v1, binary records, TLS, "
        f"end-to-end acks) at {f['rate']:g} records/s each, batches of {f['batch']}, {f['minutes']:g} min, "
        f"through Mosquitto, `mqbatch ingest --roll-seconds {f['roll_seconds']:g}` and `mqbatch spark --stream "
        f"--trigger-seconds {f['trigger_seconds']}`. records/ is polled every 0.5 s with pyarrow; each row is "
        "matched by (device, boot, seq) to the sampling time its device recorded. *Time to table* is what a "
        "user of the table waits; *device → recorder* (`received_at` − device time) is when the recorder had "
        "the PUBLISH, before any table has the row (the figure this section showed before). Steady = records "
        f"sampled after the job's first rows were readable ({f.get('first_rows_after_s') or 0:.0f} s in: its "
        f"cold start). Records lost: {f['lost']:,} of {f['stored']:,}.",
        "",
        "| figure | records | p50 (s) | p99 (s) | max (s) |",
        "|---|--:|--:|--:|--:|",
        f"| time to table, steady | {_pct_cells(f.get('time_to_table_steady_s') or {})} |",
        f"| time to table, all after the connection ramp | {_pct_cells(f['time_to_table_s'])} |",
        f"| device → recorder received (not a table) | {_pct_cells(f['device_to_recorder_ms'], 1000.0)} |",
        "",
    ]


def _fleet_section(r: dict) -> list[str]:
    from mqbatch.bench.fleet import report_lines

    return [
        "## Fleet scale (`mqbatch bench fleet`)",
        "",
        _provenance(r),
        "",
        "```",
        *report_lines(r["figures"]),
        "```",
        "",
        "More sizes, the settings that give what time to table, and what breaks first: docs/scale.md.",
        "",
    ]


def _e2e_cost_section(r: dict) -> list[str]:
    rows = r["figures"]["rows"]
    return [
        "## What end-to-end acks cost on the wire (`mqbatch bench e2e-cost`)",
        "",
        _provenance(r),
        "",
        "| batch | without, B/batch | with, B/batch | TLS bytes added per batch | added B/batch (TLS + TCP/IP) "
        "| added B/record |",
        "|--:|--:|--:|--:|--:|--:|",
        *(
            f"| {x['batch']} | {x['without']['total_wire_bytes']:,.1f} | {x['with']['total_wire_bytes']:,.1f} | "
            f"{x['extra_tls_bytes_per_batch']:,.1f} | {x['extra_bytes_per_batch']:,.1f} | "
            f"{x['extra_bytes_per_record']:.2f} |"
            for x in rows
        ),
        "",
        f"One simulated device, stop-and-wait, {r['figures']['batches']} batches per measurement, through the "
        "inspecting proxy (TLS record bytes and TCP segments × 52 B, both directions); with = the batch-seq "
        "property, the recorder's ack PUBLISH and the device's PUBACK of it (docs/e2e-ack.md).",
        "",
    ]


def render(out: pathlib.Path, docs: pathlib.Path) -> pathlib.Path:
    """Write docs/benchmarks.md and docs/benchmarks/*.png from out/*.json; return the .md path."""
    results = load_results(pathlib.Path(out))
    docs = pathlib.Path(docs)
    img_dir = docs / "benchmarks"
    img_dir.mkdir(parents=True, exist_ok=True)
    lines = [
        "# Benchmarks",
        "",
        "Generated by `mqbatch bench all` (`make bench`) from `run/bench/*.json`; do not edit by hand. "
        "`mqbatch bench report` renders this page again from those files; `mqbatch bench TARGET` "
        "(wire, device, ingest, spark, latency; fleet and e2e-cost are rendered when their results are present) reruns one part. `bench all --quick` (the CI smoke test, without latency) renders "
        "into run/bench/ and never overwrites docs/. Every figure was measured in the run named under its "
        "heading; ratios are computed within one run.",
        "",
    ]
    if not results:
        lines.append(f"No results in {out}: run `mqbatch bench all` first.")
    if "wire" in results:
        fig = results["wire"]["figures"]
        plot_wire(fig, img_dir / "wire_bytes.png")
        rate_panels(fig, img_dir / "records_per_s.png")
        _rate_plot(
            fig,
            img_dir / "heap.png",
            "alloc_per_record",
            "heap bytes allocated per record",
            "heap bytes per record (sample + publish + ack), GC off; umqtt.simple's are the same with NODELAY",
            False,
            variants=("mqbatch", "umqtt.simple"),
        )
        lines += _wire_section(results["wire"], "benchmarks") + _rates_section(results["wire"], "benchmarks")
    if "device" in results:
        lines += _device_section(results["device"])
    if "ingest" in results:
        lines += _ingest_section(results["ingest"])
    if "spark" in results:
        lines += _spark_section(results["spark"])
    lines += _latency_section(results.get("latency"))
    if "fleet" in results:
        lines += _fleet_section(results["fleet"])
    if "e2e-cost" in results:
        lines += _e2e_cost_section(results["e2e-cost"])
    md = docs / "benchmarks.md"
    md.write_text("\n".join(lines))
    return md
