"""`mqbatch bench wire`: bytes per record on the wire, records/s and heap per record
against batch size, for 38-byte telemetry records (4 channels, RecordWriter), QoS 1.

Publishers of the same records, to a Mosquitto on 127.0.0.1:
  mqbatch       the firmware client (mqb_client) in the MicroPython Unix port, BATCH
                records per PUBLISH (batch-format v1 user properties);
  umqtt.simple  the usual MicroPython client (mqbatch.scenarios.baseline: fetched from the package
                index, sha256 checked), one record per PUBLISH, in the same Unix port;
                "+NODELAY": the same with TCP_NODELAY on its socket (its five writes
                per PUBLISH otherwise wait on Nagle x delayed ACK);
  JSON array    the spec's section-6 alternative: the same records as a JSON array
                (Payload Format Indicator 1, Content Type application/json, no user
                properties), published by paho-mqtt from the host (CPython's TLS).

Wire bytes (no root, no packet capture): every connection goes through the project's
proxy (mqbatch.conformance.proxy). Over TLS it counts TLS record headers and bytes per direction and
the TCP segments of its client-side socket (TCP_INFO, pure ACKs included). The client
pauses after its warm-up PUBLISH and after the last measured PUBACK; the proxy's counters
are read at both pauses (0.3 s in, so delayed ACKs have gone out), and their difference
over the records is the cost per record: no handshake, no teardown. The same run over
plain TCP lets the proxy parse every PUBLISH and PUBACK: record bytes, payload framing (the records' VBI length
prefixes; JSON's brackets and commas), MQTT header and properties (PUBACKs included).
TLS overhead = TLS bytes - MQTT bytes; TCP/IP headers = segments x 52 (IPv4 20 + TCP 20
+ the timestamp option 12, which Linux sends on every segment; no IP options, no SACK
blocks; Ethernet framing not counted). QoS 1 waits for each PUBACK, so every PUBLISH
is alone on the wire.

Physical limit at batch size B for an MSS m: 38 record bytes + 52 x ceil(38 B / m) / B
(the records alone, in as few full segments as fit one batch; no ACKs, TLS or MQTT).

Records/s and heap bytes per record: the same device script straight to the TLS
broker (no proxy): write B records with RecordWriter, publish, and at QoS 1 wait for
the PUBACK (flush()); at QoS 0 only send. GC disabled while measured.
"""

from __future__ import annotations

import argparse
import math
import pathlib
import socket
import statistics
import tempfile
import threading
import time

from mqbatch.bench.device import run_mpy
from mqbatch.bench.out import spread
from mqbatch.conformance.packets import read_vbi
from mqbatch.conformance.session import C2S, S2C
from mqbatch.wire import records

RECORD = 38
SEGMENT_HEADERS = 52  # IPv4 20 + TCP 20 + timestamps 12 (10 + 2 NOP)
MSS_ETHERNET = 1448  # 1500 - 20 - 20 - 12
SIZES = (1, 2, 5, 10, 20, 50, 100, 200, 500)
QUICK_SIZES = (1, 10, 100, 500)
WARM = 1  # PUBLISHes before the measured ones (the topic alias is set up here)
SETTLE_S = 0.3  # before each snapshot of the proxy's counters: delayed ACKs go out
JSON_TOPIC = "bench/json"
MQB_TOPIC = "mqbatch/bench-wire/telemetry"
VARIANTS = ("mqbatch", "JSON array", "umqtt.simple", "umqtt.simple+NODELAY")
KINDS = {"mqbatch": "mqb", "umqtt.simple": "umqtt", "umqtt.simple+NODELAY": "umqtt-nodelay"}


def loopback_mss() -> int:
    """The MSS Linux announces on a loopback TCP connection (tcpi_advmss, TCP_INFO bytes 84..88;
    the sender may cut smaller segments while the peer's window is small)."""
    ls = socket.socket()
    ls.bind(("127.0.0.1", 0))
    ls.listen(1)
    with ls, socket.create_connection(ls.getsockname()) as c:
        peer, _ = ls.accept()
        peer.close()
        info = c.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 104)
    return int.from_bytes(info[84:88], "little")


def limit(batch: int, mss: int) -> float:
    """Physical limit: bytes per record of the records alone plus their segments' headers."""
    return RECORD + SEGMENT_HEADERS * math.ceil(RECORD * batch / mss) / batch


def split_publish(raw: bytes, v5: bool) -> tuple[int, bytes]:
    """(header bytes, payload) of one PUBLISH packet (MQTT 5 or 3.1.1)."""
    _, p = read_vbi(raw, 1, "Remaining Length")
    p += 2 + int.from_bytes(raw[p : p + 2], "big")
    if (raw[0] >> 1) & 3:
        p += 2
    if v5:
        n, p = read_vbi(raw, p, "Property Length")
        p += n
    return p, raw[p:]


def json_payload(batch: int, seq0: int = 0) -> bytes:
    """The same records (values of tests/mpy/wire_bench.py) as one JSON array."""
    t = int(time.time() * 1000)
    return (
        b"["
        + b",".join(
            records.encode_json("sample", 1, seq0 + i, t, [(1, i), (2, 4500), (3, 3300), (4, -67)])
            for i in range(batch)
        )
        + b"]"
    )


class _Paho:
    """paho-mqtt publishing JSON arrays, QoS 1 stop-and-wait (MQTT 5, section-6 properties)."""

    def __init__(self, port: int, cafile: str | None):
        import paho.mqtt.client as mqtt
        from paho.mqtt.enums import CallbackAPIVersion
        from paho.mqtt.packettypes import PacketTypes
        from paho.mqtt.properties import Properties

        self.c = mqtt.Client(CallbackAPIVersion.VERSION2, client_id="bench-wire-json", protocol=mqtt.MQTTv5)
        if cafile:
            self.c.tls_set(ca_certs=cafile)
        self.props = Properties(PacketTypes.PUBLISH)
        self.props.PayloadFormatIndicator = 1
        self.props.ContentType = "application/json"
        up = threading.Event()
        self.c.on_connect = lambda client, userdata, flags, rc, p: rc.is_failure or up.set()
        self.c.connect("127.0.0.1", port, keepalive=60)
        self.c.loop_start()
        if not up.wait(15):
            raise RuntimeError(f"paho could not connect to 127.0.0.1:{port}")

    def run(self, batch: int, publishes: int) -> None:
        for k in range(publishes):
            info = self.c.publish(JSON_TOPIC, json_payload(batch, k * batch), qos=1, properties=self.props)
            info.wait_for_publish(10)
            if not info.is_published():
                raise RuntimeError("paho: no PUBACK within 10 s")

    def close(self) -> None:
        self.c.disconnect()
        self.c.loop_stop()


def _json_client(port: int, cafile: str | None, batch: int, publishes: int, mark) -> None:
    p = _Paho(port, cafile)
    try:
        p.run(batch, WARM)
        mark()
        p.run(batch, publishes)
        mark()
    finally:
        p.close()


class Wire:
    """The brokers, the proxy runs and the device runs of one bench."""

    def __init__(self, tmp: pathlib.Path, umqtt_lib: pathlib.Path | None):
        from mqbatch.fleet.pki import make_pki
        from mqbatch.lab.broker import Mosquitto

        self.pki = make_pki(tmp / "pki", clients=["device-1"])
        self.plain = Mosquitto(tmp / "plain").start()
        try:
            self.tls = Mosquitto(
                tmp / "tls", certfile=self.pki.server.cert, keyfile=self.pki.server.key, cafile=self.pki.ca_cert
            ).start()
        except Exception:
            self.plain.stop()
            raise
        self.extra = [str(umqtt_lib)] if umqtt_lib else []

    def stop(self) -> None:
        self.plain.stop()
        self.tls.stop()

    def device(
        self, kind: str, port: int, tls: bool, qos: int, batch: int, warm: int, publishes: int, mark=None
    ) -> dict:
        ca = str(self.pki.ca.cert_der) if tls else "-"
        return run_mpy(
            "wire_bench.py",
            [kind, "127.0.0.1", str(port), ca, str(qos), str(batch), str(warm), str(publishes), "1" if mark else "0"],
            self.extra,
            timeout=600,
            marks={"READY": mark, "DONE": mark} if mark else None,
        )

    def proxied(self, variant: str, tls: bool, batch: int, publishes: int) -> dict:
        """One connection of `variant` through a fresh proxy: what crossed it between the end of
        the warm-up and the last PUBACK (each snapshot once delayed ACKs had time to go out), and
        every PUBLISH and PUBACK (parsed on plain TCP)."""
        from mqbatch.conformance.proxy import Proxy

        broker = self.tls if tls else self.plain
        with Proxy(broker.host, broker.port, batch_topics=[MQB_TOPIC], max_batch_size=max(SIZES)) as px:
            snaps = []

            def mark():
                time.sleep(SETTLE_S)
                snaps.append(px.counters())

            if variant == "JSON array":
                _json_client(px.port, str(self.pki.ca_cert) if tls else None, batch, publishes, mark)
            else:
                self.device(KINDS[variant], px.port, tls, 1, batch, WARM, publishes, mark)
            a, b = snaps
            delta = {key: {d: b[key][d] - a[key][d] for d in (C2S, S2C)} for key in a}
            if not delta["segments"][C2S]:
                raise RuntimeError("the proxy saw no TCP segments (no TCP_INFO counters on this kernel?)")
            return dict(
                delta,
                publishes=[r.raw for r in px.packets("PUBLISH", C2S)],
                pubacks=[r.raw for r in px.packets("PUBACK", S2C)],
            )


def _mqtt_split(variant: str, plain: dict, batch: int) -> dict:
    """Per record, from the plain-TCP run's PUBLISHes and PUBACKs after the warm-up."""
    pubs, acks = plain["publishes"][WARM:], plain["pubacks"][WARM:]
    n = len(pubs) * batch
    rec = frame = hdr = 0
    for raw in pubs:
        h, payload = split_publish(raw, not variant.startswith("umqtt"))
        hdr += h
        if variant == "mqbatch":
            records_bytes = RECORD * batch  # the rest of the payload: each record's VBI length
        elif variant == "JSON array":
            records_bytes = len(payload) - (batch + 1)  # the records' JSON text; '[', ']', commas: framing
        else:
            records_bytes = len(payload)
        rec += records_bytes
        frame += len(payload) - records_bytes
    return {
        "record": rec / n,
        "framing": frame / n,
        "mqtt_header": (hdr + sum(map(len, acks))) / n,
        "mqtt": (sum(map(len, pubs)) + sum(map(len, acks))) / n,
        "publish_bytes": sum(map(len, pubs)) / len(pubs),
        "puback_bytes": sum(map(len, acks)) / max(1, len(acks)),
    }


def measure_wire(w: Wire, variant: str, batch: int, publishes: int, repeat: int) -> dict:
    n = publishes * batch
    split = _mqtt_split(variant, w.proxied(variant, False, batch, publishes), batch)
    reps = []
    for _ in range(repeat):
        d = w.proxied(variant, True, batch, publishes)
        both = lambda key, d=d: d[key][C2S] + d[key][S2C]
        tls_bytes, segments = both("tls_bytes") / n, both("segments") / n
        total = tls_bytes + SEGMENT_HEADERS * segments
        # estimate for a 1448-byte MSS: each PUBLISH's TLS bytes need ceil(bytes / 1448) data segments where
        # loopback sent one per TLS record (each its own write), plus one ACK per two extra segments
        up_bytes, up_records = d["tls_bytes"][C2S] / publishes, d["tls_records"][C2S] / publishes
        extra = max(0, math.ceil(up_bytes / MSS_ETHERNET) - up_records) * 1.5
        reps.append(
            {
                "total": total,
                "tls_overhead": tls_bytes - split["mqtt"],
                "tcpip": SEGMENT_HEADERS * segments,
                "tls_records_per_publish": both("tls_records") / publishes,
                "segments_per_publish": both("segments") / publishes,
                "total_eth_estimate": total + SEGMENT_HEADERS * extra / batch,
                "counters": {k: d[k] for k in ("bytes", "tls_records", "tls_bytes", "segments")},
            }
        )
    reps.sort(key=lambda r: r["total"])
    return {
        "variant": variant,
        "batch": batch,
        "publishes": publishes,
        "records": n,
        "repeat": repeat,
        **split,
        **reps[len(reps) // 2],
        "total_runs": [r["total"] for r in reps],
    }


def measure_rates(w: Wire, variant: str, batch: int, qos: int, records_n: int, repeat: int) -> dict:
    publishes = max(5, math.ceil(records_n / batch))
    runs = [w.device(KINDS[variant], w.tls.port, True, qos, batch, 3, publishes) for _ in range(repeat)]
    return {
        "client": variant,
        "batch": batch,
        "qos": qos,
        "records": publishes * batch,
        "records_per_s": [r["records_per_s"] for r in runs],
        "alloc_per_record": [r["alloc_per_record"] for r in runs],
    }


def _print_wire(rows: list[dict], mss_lo: int) -> None:
    print(
        f"wire bytes per record, both directions, QoS 1, TLS to Mosquitto on 127.0.0.1 through the proxy "
        f"(median of the repetitions' totals; split of the median one). TCP/IP = segments x {SEGMENT_HEADERS} B; "
        f"efficiency = {RECORD} / bytes; limit = {RECORD} + {SEGMENT_HEADERS} x ceil({RECORD}B/MSS)/B"
    )
    print(
        f"{'publisher':20} {'batch':>5} {'total B/rec':>22} {'record':>7} {'framing':>7} {'MQTT':>6} "
        f"{'TLS':>6} {'TCP/IP':>7} {'TLS rec/PUB':>11} {'seg/PUB':>7} {'eff.':>6} "
        f"{'pts from limit lo':>17} {'MSS 1448 est.':>13} {'pts from limit 1448':>19}"
    )
    for r in rows:
        b = r["batch"]
        lo, eth = limit(b, mss_lo), limit(b, MSS_ETHERNET)
        eff = 100 * RECORD / r["total"]
        eff_eth = 100 * RECORD / r["total_eth_estimate"]
        r.update(
            limit_loopback=lo,
            limit_ethernet=eth,
            efficiency=eff,
            points_from_limit_loopback=100 * RECORD / lo - eff,
            efficiency_eth=eff_eth,
            points_from_limit_ethernet=100 * RECORD / eth - eff_eth,
        )
        print(
            f"{r['variant']:20} {b:5d} {spread(r['total_runs'], '.1f'):>22} {r['record']:7.1f} {r['framing']:7.2f} "
            f"{r['mqtt_header']:6.2f} {r['tls_overhead']:6.2f} {r['tcpip']:7.2f} "
            f"{r['tls_records_per_publish']:11.1f} {r['segments_per_publish']:7.1f} {eff:5.1f}% "
            f"{r['points_from_limit_loopback']:17.1f} {r['total_eth_estimate']:13.1f} "
            f"{r['points_from_limit_ethernet']:19.1f}"
        )


def _print_rates(rows: list[dict]) -> None:
    print(
        "device side, MicroPython Unix port, TLS straight to the broker: write B records (RecordWriter), "
        "publish, QoS 1 waits for the PUBACK (flush), QoS 0 only sends; GC off while measured"
    )
    for r in rows:
        print(
            f"  {r['client']:20} QoS {r['qos']} batch {r['batch']:4d}: {spread(r['records_per_s'], ',.0f')} "
            f"records/s, {spread(r['alloc_per_record'], '.1f')} heap bytes/record"
        )


def bench_wire(args: argparse.Namespace) -> int:
    from mqbatch.bench.out import write_result
    from mqbatch.scenarios.baseline import BaselineUnavailable, fetch_umqtt

    sizes = QUICK_SIZES if args.quick else SIZES
    repeat = args.repeat or (1 if args.quick else 5)
    per_run = 40 if args.quick else 500  # records per wire run (at least 2 PUBLISHes)
    rate_records = 100 if args.quick else 2000
    umqtt_n = 10 if args.quick else 100
    mss_lo = loopback_mss()
    with tempfile.TemporaryDirectory(prefix="mqbatch-bench-wire-") as t:
        tmp = pathlib.Path(t)
        try:
            umqtt_version = fetch_umqtt(tmp / "umqtt-lib")
        except BaselineUnavailable as e:
            print(f"umqtt.simple not available ({e}): measuring mqbatch and JSON only")
            umqtt_version = None
        w = Wire(tmp, tmp / "umqtt-lib" if umqtt_version else None)
        try:
            wire, rates = [], []
            for b in sizes:
                publishes = max(2, math.ceil(per_run / b))
                for variant in ("mqbatch", "JSON array"):
                    wire.append(measure_wire(w, variant, b, publishes, repeat))
                for qos in (0, 1):
                    rates.append(measure_rates(w, "mqbatch", b, qos, rate_records, repeat))
                print(f"  batch {b}: measured", flush=True)
            for variant in VARIANTS[2:] if umqtt_version else ():
                wire.append(measure_wire(w, variant, 1, umqtt_n, repeat))
                for qos in (0, 1):  # QoS 0 does not wait: as many records as ours
                    rates.append(measure_rates(w, variant, 1, qos, rate_records if qos == 0 else umqtt_n, repeat))
        finally:
            w.stop()
    wire.sort(key=lambda r: (VARIANTS.index(r["variant"]), r["batch"]))
    print(
        f"wire bench: {RECORD}-byte records, batch sizes {', '.join(map(str, sizes))}; {repeat} repetition(s); "
        f"loopback MSS {mss_lo}, Ethernet MSS {MSS_ETHERNET}"
        f"{'; --quick: a smoke test, not a measurement' if args.quick else ''}"
    )
    if umqtt_version:
        print(f"baseline: umqtt.simple {umqtt_version} (MQTT 3.1.1), one record per PUBLISH")
    _print_wire(wire, mss_lo)
    _print_rates(rates)
    ours = {
        r["batch"]: statistics.median(r["records_per_s"]) for r in rates if r["client"] == "mqbatch" and r["qos"] == 1
    }
    for variant in VARIANTS[2:]:
        base = [statistics.median(r["records_per_s"]) for r in rates if r["client"] == variant and r["qos"] == 1]
        if base and base[0]:
            print(
                f"ratio mqbatch / {variant} records/s, QoS 1, medians of this run: "
                + ", ".join(f"batch {b}: {v / base[0]:,.{0 if v >= 10 * base[0] else 1}f}x" for b, v in ours.items())
            )
    write_result(
        args,
        "wire",
        {
            "record_bytes": RECORD,
            "segment_headers": SEGMENT_HEADERS,
            "mss_loopback": mss_lo,
            "mss_ethernet": MSS_ETHERNET,
            "umqtt_version": umqtt_version,
            "sizes": list(sizes),
            "repeat": repeat,
            "wire": wire,
            "rates": rates,
        },
    )
    return 0


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--repeat", type=int, default=None, help="repetitions of each measurement (default 5)")
    p.add_argument(
        "--quick",
        action="store_true",
        help="batch sizes 1, 10, 100, 500, one repetition, few records (seconds: a CI smoke test)",
    )
