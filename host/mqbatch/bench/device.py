"""`mqbatch bench device`: the device hot path in the MicroPython Unix port against a
real Mosquitto over TLS on 127.0.0.1 (figures of the host CPU, not of a board).

Per run it prints the median [min-max] of:
  - RecordWriter.sample (4 channels, 38-byte record): us per record, heap bytes per record;
  - publish_batch of a 100-record batch: us per batch and per record;
  - sample -> encoder -> client at QoS 1 (fill 100 records, publish, flush): records/s;
  - the app's per-record path (sample, outbox append, read back, PUBLISH, PUBACK, outbox
    ack): records/s, us per record by step, heap bytes by step (GC off); the outbox on the
    host filesystem (VfsPosix, flush = fsync), then timed again on littlefs over a RAM flash
    stand-in (the boards' filesystem; CPU only) with the flash traffic per batch;
  - QoS 1, one prebuilt batch of 100 x 24-byte records published again and again:
    stop-and-wait through flush() (Transport.wait) vs a busy loop on service(), PUBLISH/s
    (stored x 100 as "records/s": record slots on the wire, no record sampled, stored in
    the outbox or encoded; the per-record path is the "sample -> encoder -> client" figure),
    and their ratio.
--baseline DIR measures DIR's mqb_* modules too, interleaved run by run, and prints
new/baseline ratios of the same run (before/after figures). Device scripts: tests/mpy/record_bench.py and tests/mpy/mqtt_bench.py (also used by
tools/bench_mqtt.py, which shares run_mpy/spread from here).
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import tempfile
import threading
import time

from mqbatch.bench.out import spread
from mqbatch.util.paths import micropython_env, micropython_exe

ROOT = pathlib.Path(__file__).resolve().parents[3]
MPY_TESTS = ROOT / "tests" / "mpy"


def run_mpy(
    script: str, args: list[str], extra: list[str] | None = None, timeout: int = 300, marks: dict | None = None
) -> dict:
    """Run tests/mpy/SCRIPT in the Unix port and return the JSON of its last line.
    marks: {line: function}: when the script prints that line, call the function, then
    send the script a newline on stdin (it waits for it)."""
    env = micropython_env("unix", *(extra or []), MPY_TESTS)
    cmd = [str(micropython_exe()), str(MPY_TESTS / script), *args]
    if not marks:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
        out, err, rc = proc.stdout, proc.stderr, proc.returncode
    else:
        with subprocess.Popen(
            cmd, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        ) as proc:
            timer = threading.Timer(timeout, proc.kill)  # a hung script ends as a failed run
            timer.start()
            try:
                lines = []
                for line in proc.stdout:
                    lines.append(line)
                    if line.strip() in marks:
                        marks[line.strip()]()
                        proc.stdin.write("\n")
                        proc.stdin.flush()
                out, err, rc = "".join(lines), proc.stderr.read(), proc.wait()
            finally:
                timer.cancel()
    if rc != 0:
        raise RuntimeError(f"{script} {' '.join(args)}: exit {rc}\n{out}\n{err}")
    return json.loads(out.strip().splitlines()[-1])


def _one_run(broker, ca: str, batches: int, publishes: int, extra: list[str]) -> dict:
    """One run of the three measurements (records, stop-and-wait, busy loop) with these modules."""
    hp = [broker.host, str(broker.port), ca]
    with tempfile.TemporaryDirectory(prefix="mqbatch-bench-outbox-") as outbox:  # the app path's flash
        rec = run_mpy("record_bench.py", [*hp, str(batches), outbox + "/outbox"], extra)
    return {
        "rec": rec,
        "wait": run_mpy("mqtt_bench.py", ["mqb", *hp, "1", str(publishes)], extra),
        "busy": run_mpy("mqtt_bench.py", ["mqb-busy", *hp, "1", str(publishes)], extra),
    }


def _by_step(runs: list[dict], key: str) -> dict[str, list[float]]:
    """{step: [its figure in each run]} of record_bench.py's [[step, figure], ...] under key."""
    return {name: [dict(r["rec"][key])[name] for r in runs] for name, _ in runs[0]["rec"][key]}


def _report(label: str, runs: list[dict]) -> dict[str, list[float]]:
    fig = {
        "us_per_sample": [r["rec"]["us_per_sample"] for r in runs],
        "alloc": [r["rec"]["alloc_per_record"] for r in runs],
        "us_per_publish": [r["rec"]["us_per_publish"] for r in runs],
        "pipeline": [r["rec"]["records_per_s"] for r in runs],
        "app_path": [r["rec"]["app_records_per_s"] for r in runs],
        # by step, in the script's order (tests/mpy/record_bench.py PARTS)
        "app_parts": _by_step(runs, "app_parts_us_per_record"),  # us per record
        "app_heap": _by_step(runs, "app_heap_bytes_per_batch"),  # heap bytes per 100-record batch, GC off
        # the same path with the outbox on littlefs over a RAM flash stand-in (the boards' filesystem)
        "lfs_path": [r["rec"]["lfs_records_per_s"] for r in runs],
        "lfs_parts": _by_step(runs, "lfs_parts_us_per_record"),
        "lfs_programmed": [r["rec"]["lfs_flash_per_batch"]["bytes_programmed"] for r in runs],
        "lfs_erased": [r["rec"]["lfs_flash_per_batch"]["blocks_erased"] for r in runs],
        "wait": [r["wait"]["publishes_per_s"] * 100 for r in runs],
        "busy": [r["busy"]["publishes_per_s"] * 100 for r in runs],
    }
    fig["ratio"] = [w / b for w, b in zip(fig["wait"], fig["busy"])]
    print(label)
    print(
        f"  RecordWriter.sample, 4 channels (38 B): {spread(fig['us_per_sample'], '.2f')} us/record, "
        f"{spread(fig['alloc'], '.1f')} heap bytes/record (gc off)"
    )
    print(
        f"  publish_batch, 100 records: {spread(fig['us_per_publish'], '.0f')} us/batch = "
        f"{spread([u / 100 for u in fig['us_per_publish']], '.2f')} us/record"
    )
    print(f"  sample -> encoder -> client, QoS 1, flush per batch: {spread(fig['pipeline'], ',.0f')} records/s")
    print(
        "  the app's per-record path: sample -> outbox append (flushed per batch) -> read back -> PUBLISH "
        f"QoS 1 -> PUBACK -> outbox ack, 100-record batches: {spread(fig['app_path'], ',.0f')} records/s = "
        f"{spread([1e6 / r for r in fig['app_path']], '.1f')} us/record, by step (us/record): "
        + "; ".join(f"{k} {spread(v, '.2f')}" for k, v in fig["app_parts"].items())
    )
    per_batch = [sum(step[i] for step in fig["app_heap"].values()) for i in range(len(runs))]
    fig["app_heap_per_record"] = [b / 100 for b in per_batch]
    print(
        f"  the same path's heap, GC off: {spread(fig['app_heap_per_record'], '.2f')} bytes/record = "
        f"{spread(per_batch, ',.0f')} bytes per 100-record batch, by step (bytes/batch): "
        + "; ".join(f"{k} {spread(v, ',.0f')}" for k, v in fig["app_heap"].items())
    )
    print(
        "  the same path, the outbox on littlefs (os.VfsLfs2, the boards' filesystem) over a RAM flash "
        "stand-in in Python (CPU time only: a real flash adds its program and erase time): "
        f"{spread(fig['lfs_path'], ',.0f')} records/s = {spread([1e6 / r for r in fig['lfs_path']], '.1f')} "
        "us/record, by step (us/record): "
        + "; ".join(f"{k} {spread(v, '.2f')}" for k, v in fig["lfs_parts"].items())
        + f"; flash per 100-record batch: {spread(fig['lfs_programmed'], ',.0f')} bytes programmed, "
        f"{spread(fig['lfs_erased'], '.2f')} blocks (4 KiB) erased"
    )
    print(
        "  QoS 1, ONE prebuilt batch (100 x 24 B) republished, no record sampled, stored or encoded "
        f"(PUBLISH/s x 100): stop-and-wait flush() {spread([w / 100 for w in fig['wait']], ',.0f')} PUBLISH/s "
        f"= {spread(fig['wait'], ',.0f')} record slots/s; busy loop on service() "
        f"{spread([b / 100 for b in fig['busy']], ',.0f')} PUBLISH/s"
    )
    print(f"  stop-and-wait / busy loop (per run, same run): {spread(fig['ratio'], '.2f')}")
    return fig


APP_DEVICE = "bench-dev-1"
# the App as `mqbatch fleet` provisions a device (TLS, password, batch-hmac signing), at the
# firmware's highest sample rate; e2e acks off (they need a recorder) and PUBACK 0x10 (no
# subscriber) taken as delivered: nothing subscribes in this bench
APP_CONFIG = {
    "sample_hz": 1000,
    "require_subscribers": False,
    "health_every_s": 10,
    "flush": {"max_count": 100, "max_bytes": 4096},  # 100-record batches, as the app path above
}


def _cpu_s(pid: int) -> tuple[float, float]:
    """CPU seconds (user, system) the process has used so far (/proc/PID/stat)."""
    fields = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / tick, int(fields[12]) / tick


def _app_cpu(
    tmp: pathlib.Path, seconds: float, window_s: float, config: dict | None = None
) -> list[tuple[float, float]]:
    """The App itself (firmware/main.py in a virtual device, mqbatch.lab.devices) sampling at
    1,000 Hz into its outbox and publishing to a Mosquitto over TLS: its process's CPU time
    per stored record, (user, system) us, one pair per window of window_s seconds after a
    warm-up window. RuntimeError unless the App ran to its end and every record it stored
    was acknowledged, with no reconnect. config: merged over APP_CONFIG."""
    from mqbatch.lab.devices import stored_in
    from mqbatch.lab.stack import LocalStack

    def stored() -> int:  # records the App reported on flash so far
        return len(stored_in(fleet.console(APP_DEVICE)))

    stack = LocalStack(tmp / "stack", [APP_DEVICE])
    broker = stack.broker.start()
    try:
        cfg = dict(APP_CONFIG, run_for_s=seconds, **(config or {}))
        fleet = stack.fleet(tmp / "devices", broker.host, broker.port, config=cfg)
        with fleet:
            proc = fleet.start_device(APP_DEVICE)
            deadline = time.monotonic() + 60
            while not stored():  # connected and sampling
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"the App stored nothing:\n{fleet.console(APP_DEVICE)[-2000:]}")
                time.sleep(0.1)
            time.sleep(window_s)  # warm-up
            figures = []
            cpu, n = _cpu_s(proc.pid), stored()
            for _ in range(max(1, int(seconds / window_s) - 2)):
                time.sleep(window_s)
                if proc.poll() is not None:
                    break
                cpu2, n2 = _cpu_s(proc.pid), stored()
                if n2 > n:
                    figures.append(tuple((b - a) * 1e6 / (n2 - n) for a, b in zip(cpu, cpu2)))
                cpu, n = cpu2, n2
            codes = fleet.wait(seconds + 120)
            summary = fleet.summaries().get(APP_DEVICE)
            console = fleet.console(APP_DEVICE)[-2000:]
            # the figure is of the run its label says: the App ran to its end, published every
            # batch it stored and had them acknowledged, on one connection
            if codes[APP_DEVICE] != 0 or summary is None or not figures:
                raise RuntimeError(f"the App did not finish its run (exit {codes[APP_DEVICE]}):\n{console}")
            if summary["acked_records"] != summary["stored_records"] or summary["reconnects"]:
                raise RuntimeError(f"the App did not deliver what it stored on one connection: {summary}")
            return figures
    finally:
        broker.stop()


def bench_device(args: argparse.Namespace) -> int:
    from mqbatch.fleet.pki import make_pki
    from mqbatch.lab.broker import Mosquitto

    runs, batches, publishes = (args.runs, args.batches, args.publishes)
    if args.quick:
        runs, batches, publishes = 1, 5, 20
    variants = {"firmware/": []}
    if args.baseline:
        variants[f"baseline {args.baseline}"] = [str(args.baseline)]
    results: dict[str, list[dict]] = {k: [] for k in variants}
    with tempfile.TemporaryDirectory(prefix="mqbatch-bench-device-") as t:
        tmp = pathlib.Path(t)
        pki = make_pki(tmp / "pki", clients=["device-1"])
        broker = Mosquitto(tmp / "tls", certfile=pki.server.cert, keyfile=pki.server.key, cafile=pki.ca_cert).start()
        try:
            for _ in range(runs):  # interleaved, so load from other work hits every variant alike
                for name, extra in variants.items():
                    results[name].append(_one_run(broker, str(pki.ca.cert_der), batches, publishes, extra))
        finally:
            broker.stop()
    app_s, window_s = (8.0, 2.0) if args.quick else (args.app_seconds, 5.0)
    with tempfile.TemporaryDirectory(prefix="mqbatch-bench-app-") as t:
        app_cpu = _app_cpu(pathlib.Path(t), app_s, window_s)
    print(
        f"device pipeline, MicroPython Unix port, Mosquitto over TLS on {broker.host}; {runs} run(s), "
        f"median [min..max]{' (--quick: one short run, a smoke test, not a measurement)' if args.quick else ''}"
    )
    figs = {name: _report(f"modules from {name}:", rs) for name, rs in results.items()}
    from mqbatch.lab.devices import DEFAULT_HEAP

    total = [u + k for u, k in app_cpu]
    figs["firmware/"]["app_cpu"] = total  # us per record, user + system, one per window
    figs["firmware/"]["app_cpu_user"] = [u for u, _ in app_cpu]
    figs["firmware/"]["app_cpu_system"] = [k for _, k in app_cpu]
    print(
        "the App itself (firmware/main.py in a virtual device, heap "
        f"{DEFAULT_HEAP}): 1,000 samples/s of 4 channels into 100-record batches, outbox, TLS, QoS 1, "
        f"batch-hmac, health records, no e2e acks: {spread(total, '.1f')} us of process CPU per stored "
        f"record (user {spread(figs['firmware/']['app_cpu_user'], '.1f')}, "
        f"system {spread(figs['firmware/']['app_cpu_system'], '.1f')}; "
        f"{len(total)} windows of {window_s:g} s)"
    )
    from mqbatch.bench.out import write_result

    write_result(args, "device", {"runs": runs, "batches": batches, "publishes": publishes, "variants": figs})
    if args.baseline:
        new, old = figs.values()
        print("new / baseline, per run (same run):")
        print(
            f"  us per sample: {spread([a / b for a, b in zip(new['us_per_sample'], old['us_per_sample'])], '.2f')}; "
            f"stop-and-wait records/s: {spread([a / b for a, b in zip(new['wait'], old['wait'])], '.2f')}; "
            f"sample -> client records/s: {spread([a / b for a, b in zip(new['pipeline'], old['pipeline'])], '.2f')}"
        )
        print(
            "  the app's per-record path, us per record: outbox on the host filesystem "
            f"{spread([b / a for a, b in zip(new['app_path'], old['app_path'])], '.2f')}; on littlefs "
            f"{spread([b / a for a, b in zip(new['lfs_path'], old['lfs_path'])], '.2f')}"
        )
    return 0


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--runs", type=int, default=5, help="runs of each measurement (default 5)")
    p.add_argument("--batches", type=int, default=200, help="100-record batches per run (default 200)")
    p.add_argument("--publishes", type=int, default=500, help="QoS 1 PUBLISHes per wait/busy run (default 500)")
    p.add_argument(
        "--baseline",
        type=pathlib.Path,
        default=None,
        help="also measure the mqb_* modules in this directory (e.g. an older commit's: "
        "`git archive REV firmware | tar -x -C DIR`, then DIR/firmware), runs interleaved",
    )
    p.add_argument(
        "--app-seconds",
        type=float,
        default=40.0,
        help="how long the App itself runs (default 40; measured in 5-s windows after a warm-up)",
    )
    p.add_argument("--quick", action="store_true", help="one short run (seconds): a smoke test for CI")
