"""Benchmark the device MQTT client against umqtt.simple in the MicroPython Unix port.

    .venv/bin/python tools/bench_mqtt.py [--runs 5] [--n 200] [--json FILE]

For each client (this project's mqb_client and umqtt.simple), transport (TCP, TLS)
and QoS (0, 1) it runs tests/mpy/mqtt_bench.py `--runs` times against a real
Mosquitto on 127.0.0.1 and prints the median [min..max] of:

- heap bytes allocated per PUBLISH, GC disabled (same 2,500-byte payload: the batch
  of 100 x 24-byte records; umqtt.simple cannot send its User Properties);
- PUBLISHes per second (QoS 1: each waits for its PUBACK).

Then it runs tests/mpy/mqtt_heap.py in `micropython -X heapsize=64K` with mutual TLS
(modules built with mpy-cross -O3) and prints its heap figures.

umqtt.simple is a baseline only: mqbatch.scenarios.baseline.fetch_umqtt() takes it from the
package index pip is configured with (micropython-umqtt.simple, sha256 checked) into
a temporary directory at bench time; it is never copied into this repository. If it cannot be fetched the bench says so and
reports this client alone. Only measured numbers are printed.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "host"), str(ROOT / "tests")]

from mqbatch.bench.device import MPY_TESTS, run_mpy, spread  # noqa: E402
from mqbatch.fleet.pki import make_pki  # noqa: E402
from mqbatch.lab.broker import Mosquitto  # noqa: E402
from mqbatch.scenarios.baseline import BaselineUnavailable, fetch_umqtt  # noqa: E402
from mqbatch.util.paths import micropython_env, micropython_exe, mpy_cross_exe  # noqa: E402


def run(kind: str, broker: Mosquitto, ca: str, qos: int, n: int, extra: list[str]) -> dict:
    return run_mpy("mqtt_bench.py", [kind, broker.host, str(broker.port), ca, str(qos), str(n)], extra)


def heap_64k(tmp: pathlib.Path, broker: Mosquitto, pki, runs: int) -> dict[str, list[int]]:
    mpy = tmp / "mpy"
    mpy.mkdir()
    for src in [
        ROOT / "firmware" / f"{m}.py"
        for m in ("mqb_codec", "mqb_packet", "mqb_packet_build", "mqb_transport", "mqb_inflight", "mqb_client")
    ] + [MPY_TESTS / "mqtt_heap.py"]:
        subprocess.run([str(mpy_cross_exe()), "-O3", "-o", str(mpy / (src.stem + ".mpy")), str(src)], check=True)
    dev = pki.client("device-1")
    figures: dict[str, list[int]] = {}
    for _ in range(runs):
        proc = subprocess.run(
            [
                str(micropython_exe()),
                "-X",
                "heapsize=64K",
                "-m",
                "mqtt_heap",
                broker.host,
                str(broker.port),
                str(pki.ca.cert_der),
                str(dev.cert_der),
                str(dev.key_der),
                "20",
            ],
            env=micropython_env("unix", mpy),
            capture_output=True,
            text=True,
            timeout=120,
        )
        if proc.returncode != 0:
            raise RuntimeError(f"mqtt_heap in 64K failed:\n{proc.stdout}\n{proc.stderr}")
        for line in proc.stdout.splitlines():
            key, _, value = line.partition(" ")
            if key.startswith(("heap_", "alloc_")):
                figures.setdefault(key, []).append(int(value.split()[0]))
    return figures


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=5, help="runs per configuration (default 5)")
    ap.add_argument("--n", type=int, default=200, help="PUBLISHes per measurement (default 200)")
    ap.add_argument("--json", type=pathlib.Path, help="also write all raw results here")
    args = ap.parse_args()

    with tempfile.TemporaryDirectory(prefix="bench-mqtt-") as t:
        tmp = pathlib.Path(t)
        pki = make_pki(tmp / "pki", clients=["device-1"])
        extra: list[str] = []
        try:
            umqtt_version = fetch_umqtt(tmp / "umqtt-lib")
            extra = [str(tmp / "umqtt-lib")]
            clients = ["mqb", "umqtt"]
        except BaselineUnavailable as e:
            print(f"umqtt.simple not available ({e}); benchmarking mqb_client alone")
            umqtt_version = None
            clients = ["mqb"]
        plain = Mosquitto(tmp / "plain").start()
        tls = Mosquitto(tmp / "tls", certfile=pki.server.cert, keyfile=pki.server.key, cafile=pki.ca_cert).start()
        mtls = Mosquitto(
            tmp / "mtls", certfile=pki.server.cert, keyfile=pki.server.key, cafile=pki.ca_cert, require_certificate=True
        ).start()
        results = []
        try:
            for broker, ca in ((plain, "-"), (tls, str(pki.ca.cert_der))):
                for qos in (0, 1):
                    for kind in clients:
                        rs = [run(kind, broker, ca, qos, args.n, extra) for _ in range(args.runs)]
                        results.append({"client": kind, "tls": ca != "-", "qos": qos, "runs": rs})
            heap = heap_64k(tmp, mtls, pki, args.runs)
        finally:
            for b in (plain, tls, mtls):
                b.stop()

    mp = subprocess.run(
        [str(micropython_exe()), "-c", "import sys; print(sys.version)"], capture_output=True, text=True
    ).stdout.strip()
    print(
        f"MicroPython Unix port: {mp}; Mosquitto 2.0.11 on 127.0.0.1; {args.runs} runs x {args.n} PUBLISHes; "
        f"payload 2,500 bytes (100 x 24-byte records)"
    )
    if umqtt_version:
        print(f"baseline: umqtt.simple {umqtt_version} from the package index, MQTT 3.1.1, no User Properties")
    print()
    print("| client | transport | QoS | heap bytes / PUBLISH (gc off) | PUBLISHes / s |")
    print("|---|---|---|---|---|")
    for r in results:
        allocs = [x["alloc_per_publish"] for x in r["runs"]]
        rates = [x["publishes_per_s"] for x in r["runs"]]
        name = "mqb_client" if r["client"] == "mqb" else f"umqtt.simple {umqtt_version}"
        print(
            f"| {name} | {'TLS' if r['tls'] else 'TCP'} | {r['qos']} | {spread(allocs, '.1f')} | "
            f"{spread(rates, '.0f')} |"
        )
    print()
    print(
        "mqtt_heap.py in -X heapsize=64K, mutual TLS, 4 KB batch buffer, .mpy built with -O3 "
        "(bytes; median [min..max]):"
    )
    for key, values in heap.items():
        print(f"  {key}: {spread(values, '.0f')}")
    if args.json:
        args.json.write_text(
            json.dumps({"umqtt_version": umqtt_version, "results": results, "heap_64k": heap}, indent=1)
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
