"""The end-to-end demo: secured broker, virtual devices running the real
firmware, the recorder, the Spark job, a summary and an HTML report.

Steps (each prints progress):
  1. certificates, passwords, ACLs; Mosquitto with TLS on a free loopback port;
     a relay in front of it, through which the devices connect (network cuts,
     bytes on the wire)
  2. the recorder (`mqbatch ingest`) with a persistent shared subscription
  3. N virtual devices sample for `duration` s; one broker outage and one
     network cut are injected on the way
  4. devices stop sampling and drain their outboxes, then exit (end-to-end acks on:
     an outbox entry leaves only when the recorder has landed it, docs/e2e-ack.md)
  5. the recorder is stopped (SIGTERM closes its landing file)
  6. the Spark job (`mqbatch spark`) decodes, validates, de-duplicates, reports
  7. summary + HTML report; exit status 1 if any record a device stored was lost

Everything lives under the run directory (default run/demo/ in the repo). A
run directory an earlier demo made (it holds mqbatch.util.rundir's marker) or an
empty one is wiped at the start, so running twice in a row works; any other
existing folder is refused, never deleted. The directory is locked while the demo
runs (flock, released when the process ends): a second demo in it stops at once,
naming the pid of the first.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import signal
import subprocess
import sys
import threading
import time

from mqbatch.lab.devices import DEFAULT_HEAP, MAX_SAMPLE_HZ, Fleet, device_ids
from mqbatch.lab.stack import LocalStack
from mqbatch.report import html as htmlreport
from mqbatch.scenarios.netcut import Relay
from mqbatch.util.paths import ROOT, venv_tool
from mqbatch.util.procs import end_process, log_tail
from mqbatch.util.rundir import claim_dir

# what a demo writes into its run directory (one made before the rundir marker is recognised by these)
RUN_DIR_ENTRIES = frozenset(
    {
        "stack",
        "relay",
        "landing",
        "devices",
        "recorder.pw",
        "recorder.log",
        "spark-out",
        "spark-local",
        "spark.log",
        "mqbatch.zip",
        "baseline",
        "report.html",
    }
)


# the devices' config (with sample_hz, run_for_s, drain_timeout_s from the options)
DEVICE_CONFIG = {
    "health_every_s": 5,
    "flush": {"max_count": 100, "max_bytes": 2048, "max_age_ms": 2000},
    "backoff": {"initial_ms": 500, "max_ms": 4000},
    # a batch leaves a device only when the recorder says it is landed (docs/e2e-ack.md)
    "e2e_ack": {"enabled": True, "resend_after_s": 10},
}


class DemoError(RuntimeError):
    pass


@dataclasses.dataclass
class DemoOptions:
    devices: int = 5
    duration: float = 60.0
    sample_hz: float = 10.0
    outage_at: float | None = None  # default: 25 % into the run
    outage_s: float = 8.0
    cut_at: float | None = None  # default: 60 % into the run
    cut_s: float = 6.0
    drain_timeout: float = 120.0
    run_dir: pathlib.Path = ROOT / "run" / "demo"
    heapsize: str | None = DEFAULT_HEAP  # mqbatch.lab.devices: 64K is the measured floor, this leaves room for TLS
    baseline: bool = True

    def check(self) -> None:
        """DemoError naming the first nonsensical option (before anything starts)."""
        if self.devices < 1:
            raise DemoError(f"--devices must be at least 1, got {self.devices}")
        if not 0 < self.sample_hz <= MAX_SAMPLE_HZ:
            raise DemoError(
                f"--sample-hz must be in (0, {MAX_SAMPLE_HZ:g}] (the firmware's limit), got {self.sample_hz:g}"
            )
        if self.duration <= 0:
            raise DemoError(f"--duration must be > 0 s, got {self.duration:g}")
        if self.outage_s < 0 or self.cut_s < 0:
            raise DemoError("--outage-s and --cut-s must be >= 0 (0: no such fault)")


class Demo:
    def __init__(self, opts: DemoOptions, out=sys.stdout):
        self.o = opts
        self.out = out
        self.t0 = time.monotonic()
        self.procs: list[subprocess.Popen] = []
        self.stack: LocalStack | None = None
        self.relay: Relay | None = None
        self.fleet: Fleet | None = None
        self.events: list[tuple[float, str]] = []
        self.stopping = threading.Event()  # set by cleanup(): the fault thread must not restart anything
        self.faults: threading.Thread | None = None
        self.fault_error: str | None = None
        self.fault_windows: list[tuple[float, float, str]] = []  # (start s, end s, label) for the report
        self.run_start = self.t0
        self.run_start_wall = time.time()

    # -- output -------------------------------------------------------------------

    def say(self, text: str) -> None:
        print(f"[{time.monotonic() - self.t0:6.1f}s] {text}", file=self.out, flush=True)

    def now(self) -> float:
        """Seconds since the devices started (t = 0 of the report's time axis)."""
        return time.monotonic() - self.run_start

    def event(self, text: str) -> None:
        self.events.append((self.now(), text))
        self.say(text)

    # -- steps --------------------------------------------------------------------

    def run(self) -> int:
        o = self.o
        o.check()
        # locked while the demo runs: a second demo in the same directory stops here (DirInUse)
        with claim_dir(o.run_dir, "mqbatch demo", known=RUN_DIR_ENTRIES):
            return self._run()

    def _run(self) -> int:
        o = self.o
        ids = device_ids(o.devices)
        try:
            self.say(f"1/7 broker: CA, passwords and ACLs for {len(ids)} devices; Mosquitto with TLS")
            self.say("    making the CA, the broker's certificate and one account per device")
            t = time.monotonic()
            self.stack = LocalStack(o.run_dir / "stack", ids)
            self.say(f"    certificates and accounts made ({time.monotonic() - t:.1f} s); starting Mosquitto")
            broker = self.stack.broker.start()
            self.relay = Relay(broker.host, broker.port).start()
            self.say(f"    broker {broker.url}, devices connect through relay port {self.relay.port}")

            self.say("2/7 recorder: mqbatch ingest (TLS, QoS 1, $share subscription, persistent session)")
            landing = o.run_dir / "landing"
            recorder = self.start_recorder(landing)

            self.say(
                f"3/7 devices: {len(ids)} virtual devices (firmware in the MicroPython Unix port), "
                f"{o.duration:.0f} s at {o.sample_hz:g} Hz"
            )
            cfg = dict(DEVICE_CONFIG, sample_hz=o.sample_hz, run_for_s=o.duration, drain_timeout_s=o.drain_timeout)
            self.say("    compiling the firmware (mpy-cross) into one ROMFS image, writing each device's flash")
            t = time.monotonic()
            self.fleet = self.stack.fleet(
                o.run_dir / "devices", self.relay.host, self.relay.port, heapsize=o.heapsize, config=cfg
            )
            self.say(f"    firmware ready ({time.monotonic() - t:.1f} s); starting {len(ids)} device processes")
            self.run_start, self.run_start_wall = time.monotonic(), time.time()
            self.fleet.start()
            self.faults = threading.Thread(target=self.inject_faults, name="faults", daemon=True)
            self.faults.start()
            codes = self.fleet.wait(o.duration + o.drain_timeout + 60, self.progress)
            self.faults.join()
            if self.fault_error:
                raise DemoError(f"fault injection failed: {self.fault_error}")
            sums = self.fleet.summaries()
            for dev in ids:
                s = sums.get(dev)
                if s is None or codes[dev] != 0 or s["outbox_depth"]:
                    why = (
                        "no summary"
                        if s is None
                        else f"{s['outbox_depth']} batches still in its outbox"
                        if s["outbox_depth"]
                        else f"exit status {codes[dev]}"
                    )
                    raise DemoError(
                        f"{dev} did not finish cleanly ({why}); its console:\n"
                        + log_tail(self.fleet.dir(dev) / "console.log")
                    )
            self.say("4/7 devices finished sampling and drained their outboxes")

            self.say("5/7 stopping the recorder (SIGTERM: closes the landing file)")
            self.stop_recorder(recorder)

            self.say("6/7 Spark job: decode, validate, de-duplicate, report")
            out = o.run_dir / "spark-out"
            self.run_spark(landing, out)

            self.say("7/7 summary and HTML report")
            if o.baseline:
                self.say("    measuring the umqtt.simple baseline (one record per PUBLISH, 200 records; ~10 s)")
            baseline = self.measure_baseline() if o.baseline else None
            return self.report(out, sums, baseline)
        finally:
            self.cleanup()

    def spawn(self, cmd: list[str], **kw) -> subprocess.Popen:
        """Start a helper process in its own process group, so that cleanup() can end
        it with everything it started (spark-submit starts a JVM and Python workers)."""
        proc = subprocess.Popen(cmd, start_new_session=True, **kw)
        self.procs.append(proc)
        return proc

    def start_recorder(self, landing: pathlib.Path) -> subprocess.Popen:
        pw = self.o.run_dir / "recorder.pw"
        with open(os.open(pw, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as f:
            f.write(self.stack.recorder_login[1])
        b = self.stack.broker
        log = open(self.o.run_dir / "recorder.log", "w")
        proc = self.spawn(
            [
                str(venv_tool("mqbatch")),
                "ingest",
                "--host",
                b.host,
                "--port",
                str(b.port),
                "--landing",
                str(landing),
                "--cafile",
                str(self.stack.ca_cert),
                "--username",
                self.stack.recorder_login[0],
                "--password-file",
                str(pw),
                "--roll-seconds",
                "15",
                "--progress-seconds",
                "10",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        log.close()
        started = time.monotonic()
        said = started
        while "subscribed" not in (self.o.run_dir / "recorder.log").read_text():
            if proc.poll() is not None or time.monotonic() > started + 30:
                raise DemoError("recorder did not subscribe:\n" + log_tail(self.o.run_dir / "recorder.log"))
            if time.monotonic() - said >= 5:
                said = time.monotonic()
                self.say(f"    waiting for the recorder to connect and subscribe ({said - started:.0f} s)")
            time.sleep(0.2)
        self.say(f"    recorder subscribed ({time.monotonic() - started:.1f} s; log {self.o.run_dir / 'recorder.log'})")
        return proc

    def stop_recorder(self, proc: subprocess.Popen) -> None:
        proc.send_signal(signal.SIGTERM)
        try:
            code = proc.wait(60)
        except subprocess.TimeoutExpired:
            end_process(proc, group=True)
            raise DemoError("recorder did not stop within 60 s of SIGTERM") from None
        if code != 0:
            raise DemoError(f"recorder exited with {code}:\n" + log_tail(self.o.run_dir / "recorder.log"))

    def inject_faults(self) -> None:
        try:
            self._inject_faults()
        except Exception as e:  # reported to the main thread, which stops the demo
            self.fault_error = f"{type(e).__name__}: {e}"

    def _inject_faults(self) -> None:
        o = self.o
        outage_at = o.duration * 0.25 if o.outage_at is None else o.outage_at
        cut_at = o.duration * 0.6 if o.cut_at is None else o.cut_at
        planned = [(outage_at, "outage")] * (o.outage_s > 0) + [(cut_at, "cut")] * (o.cut_s > 0)
        for at, kind in sorted(planned):
            if self.stopping.wait(max(0.0, at - (time.monotonic() - self.run_start))):
                return
            if kind == "outage":
                self.event(f"    fault: broker outage for {o.outage_s:g} s (Mosquitto stopped)")
                start = self.now()
                self.stack.broker.stop()
                if self.stopping.wait(o.outage_s):
                    return
                self.stack.broker.start()
                self.fault_windows.append((start, self.now(), "broker outage"))
                self.event("    fault over: broker restarted on the same port (sessions persisted)")
            else:
                self.event(f"    fault: network cut for {o.cut_s:g} s (every device link dropped, connects refused)")
                start = self.now()
                self.relay.cut()
                if self.stopping.wait(o.cut_s):
                    return
                self.relay.restore()
                self.fault_windows.append((start, self.now(), "network cut"))
                self.event("    fault over: network restored")

    def progress(self, fleet: Fleet) -> None:
        now = time.monotonic()
        if now - getattr(self, "_last_progress", 0) < 5:
            return
        self._last_progress = now
        running = len(fleet.running())
        what = (
            f"{running} devices running"
            if now - self.run_start < self.o.duration
            else f"sampling over, {running} of {self.o.devices} devices still draining their outbox"
        )
        self.say(
            f"    {now - self.run_start:5.0f} s: {what}, "
            f"{len(fleet.stored())} records stored on flash, {self.relay.bytes_up} bytes sent on the wire"
        )

    def run_spark(self, landing: pathlib.Path, out: pathlib.Path) -> None:
        local = self.o.run_dir / "spark-local"
        local.mkdir()
        java_opts = f"-Djava.io.tmpdir={local} -XX:-UsePerfData"
        cmd = [
            str(venv_tool("mqbatch")),
            "spark",
            "--landing",
            str(landing),
            "--out",
            str(out),
            "--pyfiles-zip",
            str(self.o.run_dir / "mqbatch.zip"),
            "--hmac-keys",
            str(self.stack.hmac_keys_file),
            "--conf",
            f"spark.local.dir={local}",
            "--conf",
            f"spark.driver.extraJavaOptions={java_opts}",
            "--conf",
            "spark.ui.enabled=false",
            "--conf",
            "spark.sql.shuffle.partitions=4",
        ]
        env = dict(os.environ, SPARK_LOCAL_DIRS=str(local), TMPDIR=str(local))
        log_path = self.o.run_dir / "spark.log"
        with open(log_path, "w") as log:
            proc = self.spawn(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
            started = time.monotonic()
            while proc.poll() is None:
                time.sleep(5)
                if proc.poll() is None:
                    self.say(f"    Spark job running ({time.monotonic() - started:.0f} s; log {log_path})")
        if proc.returncode != 0 or not (out / "report.json").exists():
            raise DemoError(f"Spark job failed ({proc.returncode}):\n" + log_tail(log_path))

    def measure_baseline(self) -> dict | None:
        """Wire bytes per record of umqtt.simple (one record per PUBLISH), measured here;
        None (and said why) when umqtt.simple cannot be fetched."""
        from mqbatch.scenarios import baseline

        try:
            return baseline.measure(self.o.run_dir / "baseline", self.stack, count=200)
        except baseline.BaselineUnavailable as e:
            self.say(f"    umqtt.simple baseline not measured: {e}")
            return None

    # -- report -------------------------------------------------------------------

    def report(self, out: pathlib.Path, sums: dict, baseline: dict | None) -> int:
        rep = json.loads((out / "report.json").read_text())
        recs = htmlreport.read_records(out / "records", extra=["boot", "seq"])
        curated = set(zip(recs["device"].to_pylist(), recs["boot"].to_pylist(), recs["seq"].to_pylist()))
        stored = self.fleet.stored()
        lost = sorted(stored - curated)
        devs = rep.get("devices", {})
        total_published = sum(s["acked_records"] for s in sums.values())
        total_stored = sum(s["stored_records"] for s in sums.values())
        wire_per_record = self.relay.bytes_up / total_published if total_published else 0.0
        mqtt_per_record = sum(s["wire_bytes"] for s in sums.values()) / total_published if total_published else 0.0
        rows = []
        landed = ("received", "unique", "duplicates", "missing", "quarantined", "dropped_on_device")
        for dev, s in sorted(sums.items()):
            d = devs.get(dev, {})
            rows.append(
                [dev, s["stored_records"], s["acked_records"], *htmlreport.report_cells(d, landed), s["reconnects"]]
                + htmlreport.latency_cells(d)
            )
        headers = htmlreport.DEMO_HEADERS
        self.print_table(headers, rows)
        q = rep.get("quarantine", {}).get("by_reason", {})
        self.say(f"    quarantined by reason: {q or 'none'}")
        self.say(
            f"    bytes on the wire (TLS, device->broker, incl. handshakes and reconnects): "
            f"{wire_per_record:.1f} per record; MQTT PUBLISH packets alone, resends included: {mqtt_per_record:.1f} per record"
        )
        if baseline:
            self.say(
                f"    baseline {baseline['client']}, one record per PUBLISH (MQTT 3.1.1, QoS 1, TLS): "
                f"{baseline['wire_bytes_per_record']:.1f} bytes per record on the wire "
                f"(+{baseline['connection_bytes']} bytes per connection)"
            )
        html_path = htmlreport.write_report(
            out, self.o.run_dir / "report.html", run=self.run_info(rows, headers, wire_per_record, baseline, lost, out)
        )
        self.say(f"    HTML report: {html_path} (mqbatch report --out DIR makes one from any Spark output)")
        if lost:
            self.say(f"LOST {len(lost)} records that devices had stored, e.g. {lost[:5]}")
            return 1
        self.say(f"OK: all {total_stored} records the devices stored reached the curated table; none lost")
        return 0

    def print_table(self, headers: list[str], rows: list[list]) -> None:
        widths = [max(len(str(h)), *(len(str(r[i])) for r in rows)) for i, h in enumerate(headers)]
        line = "  ".join(str(h).rjust(w) for h, w in zip(headers, widths))
        print(line, file=self.out)
        for r in rows:
            print("  ".join(str(c).rjust(w) for c, w in zip(r, widths)), file=self.out)
        self.out.flush()

    def run_info(self, rows, headers, wire, baseline, lost, out: pathlib.Path) -> htmlreport.RunInfo:
        """What the demo knows beyond its Spark output: faults, events, the devices' own counts."""
        o = self.o
        bars = [("mqbatch, batched", round(wire, 1))]
        if baseline:
            bars.append((f"{baseline['client']}, 1 record per PUBLISH", round(baseline["wire_bytes_per_record"], 1)))
        faults = ", ".join(f"{label} {a:.0f}-{b:.0f} s" for a, b, label in self.fault_windows) or "none"
        rel = lambda p: os.path.relpath(p, o.run_dir)
        run = htmlreport.RunInfo(
            params={
                "devices": o.devices,
                "sampling": f"{o.duration:g} s at {o.sample_hz:g} Hz per device",
                "faults": faults,
                "device heap": o.heapsize or "port default",
                "started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(self.run_start_wall)),
            },
            start_wall=self.run_start_wall,
            faults=self.fault_windows,
            events=self.events,
            headers=headers,
            rows=rows,
            wire_bars=bars,
            lost=lost,
            links={
                "report.json": rel(out / "report.json"),
                "records/": rel(out / "records"),
                "quarantine/": rel(out / "quarantine"),
                "Spark log": "spark.log",
                "recorder log": "recorder.log",
            },
            device_backoff_ms=(DEVICE_CONFIG["backoff"]["initial_ms"], DEVICE_CONFIG["backoff"]["max_ms"]),
        )
        return run

    # -- cleanup ------------------------------------------------------------------

    def cleanup(self) -> None:
        self.stopping.set()
        if self.faults is not None:
            self.faults.join(30)
        if self.fleet:
            self.fleet.stop()
        for p in self.procs:
            end_process(p, group=True)
        if self.relay:
            self.relay.stop()
        if self.stack:
            self.stack.broker.stop()
