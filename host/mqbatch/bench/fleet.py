"""`mqbatch bench fleet --devices N --rate R --minutes M`: N simulated devices through
the whole streaming pipeline, and what it costs.

    LocalStack (Mosquitto, TLS, one dynamic-security account per device)
      <- N devices (mqbatch.bench.simfleet: asyncio, many per process, --workers processes;
         batch-format v1, binary records, QoS 1, end-to-end acks with resend)
      -> `mqbatch ingest` (subprocess, --roll-seconds)
      -> `mqbatch spark --stream` (subprocess, --trigger-seconds)
      -> records/   polled here with pyarrow every --poll-s
    --cut-after F: devices lose their connection after a fraction F of their new PUBLISHes
      and publish their outboxes again (the resends a real fleet's landing zone holds)

Figures: records/s stored by the devices and readable in records/; records lost (every
record a device stored, by (device, boot, seq), against records/ after draining: must be
0, and no record may be in records/ twice, else the exit status is 1); time to table =
when a row was first seen readable in records/ minus the sampling time its device
recorded for it (p50/p99 over the records sampled after the connection ramp); device ->
recorder receive (the job's latency_ms: received_at - device time) as a second, separately
labelled figure; recorder CPU and RSS, broker established connections and RSS (from
/proc); a PNG of all of it over time.

The run directory keeps accounting.json, samples-*.npz and records/; `--check RUN_DIR`
recomputes lost and time to table from them (the loss check's own test deletes a
records/ file and expects lost > 0).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import multiprocessing as mp
import os
import pathlib
import resource
import signal
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np

from mqbatch.bench import simfleet

POLL_S = 0.5


# -- /proc ---------------------------------------------------------------------------------
def proc_cpu_s(pid: int) -> float | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return None


def proc_rss_mb(pid: int, field: str = "VmRSS") -> float | None:
    """A /proc/PID/status memory figure in MB (VmRSS now, VmHWM the peak)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


def established(port: int) -> int:
    """TCP connections in state ESTABLISHED whose local port is `port` (the broker's side)."""
    n = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                next(f)
                for line in f:
                    parts = line.split()
                    if parts[3] == "01" and int(parts[1].rsplit(":", 1)[1], 16) == port:
                        n += 1
        except OSError:
            pass
    return n


# -- the records/ poller -------------------------------------------------------------------
class TablePoller:
    """Reads every new Parquet file of records/ once, noting when it was first readable."""

    def __init__(self, records: pathlib.Path):
        self.records = records
        self.seen: set[str] = set()
        self.parts: list[dict] = []  # device, seq, boot, latency_ms arrays + seen_ms
        self.rows = 0
        self.first_rows_ms: int | None = None
        self.lock = threading.Lock()

    def poll(self) -> int:
        import pyarrow.parquet as pq

        new = 0
        if not self.records.is_dir():
            return 0
        for path in sorted(self.records.rglob("*.parquet")):
            key = str(path)
            if key in self.seen:
                continue
            seen_ms = int(time.time() * 1000)
            t = pq.read_table(path, columns=["device", "boot", "seq", "latency_ms"])
            self.seen.add(key)
            part = {
                "device": np.asarray(t["device"].to_pylist(), dtype=object),
                "boot": t["boot"].to_numpy(zero_copy_only=False),
                "seq": t["seq"].to_numpy(zero_copy_only=False),
                "latency_ms": t["latency_ms"].to_numpy(zero_copy_only=False),
                "seen_ms": np.full(t.num_rows, seen_ms, dtype=np.int64),
            }
            with self.lock:
                self.parts.append(part)
                self.rows += t.num_rows
                if self.first_rows_ms is None and t.num_rows:
                    self.first_rows_ms = seen_ms
            new += t.num_rows
        return new

    def table(self) -> dict:
        with self.lock:
            if not self.parts:
                return {k: np.array([], dtype=object if k == "device" else float) for k in self.PART_KEYS}
            return {k: np.concatenate([p[k] for p in self.parts]) for k in self.PART_KEYS}

    PART_KEYS = ("device", "boot", "seq", "latency_ms", "seen_ms")


# -- accounting (pure) ----------------------------------------------------------------------
def account(samples: dict[str, np.ndarray], table: dict, since_ms: int = 0, until_ms: int | None = None) -> dict:
    """Lost, extra and duplicate rows, and time to table, from what each device stored
    (samples: device -> sampling time in ms by seq, seqs 0..n-1 of boot simfleet.BOOT)
    against the rows seen in records/ (table: arrays device, boot, seq, latency_ms,
    seen_ms). Time to table over records sampled in [since_ms, until_ms)."""
    names = sorted(samples)
    index = {d: i for i, d in enumerate(names)}
    counts = np.array([len(samples[d]) for d in names], dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(counts)])
    stored = int(counts.sum())
    sample_ms = np.concatenate([np.asarray(samples[d], dtype=np.int64) for d in names]) if names else np.array([])
    dev = table["device"]
    rows = len(dev)
    idx = np.array([index.get(d, -1) for d in dev], dtype=np.int64)
    seq = np.asarray(table["seq"], dtype=np.int64)
    boot = np.asarray(table["boot"], dtype=np.int64)
    known = (idx >= 0) & (boot == simfleet.BOOT) & (seq >= 0)
    known[known] &= seq[known] < counts[idx[known]]
    extra = int(rows - known.sum())
    flat = offsets[idx[known]] + seq[known]
    seen = np.asarray(table["seen_ms"], dtype=np.int64)[known]
    first_seen = np.full(stored, np.iinfo(np.int64).max, dtype=np.int64)
    np.minimum.at(first_seen, flat, seen)
    found = first_seen != np.iinfo(np.int64).max
    lost = int(stored - found.sum())
    duplicates = int(len(flat) - found.sum())
    window = found & (sample_ms >= since_ms) & (sample_ms < (until_ms if until_ms is not None else np.inf))
    ttt = (first_seen[window] - sample_ms[window]) / 1000.0
    lat = np.asarray(table["latency_ms"], dtype=float)[known]
    lost_by_device = {names[i]: int(counts[i] - found[offsets[i] : offsets[i + 1]].sum()) for i in range(len(names))}
    return {
        "stored": stored,
        "rows": rows,
        "found": int(found.sum()),
        "lost": lost,
        "extra_rows": extra,
        "duplicate_rows": duplicates,
        "lost_devices": _first(lost_by_device),
        "time_to_table_s": _pct(ttt),
        "device_to_recorder_ms": _pct(lat[~np.isnan(lat)]),
        "ttt_series": (sample_ms[window], ttt),
    }


def _first(lost_by_device: dict[str, int], n: int = 5) -> dict[str, int]:
    return dict(list(((d, k) for d, k in lost_by_device.items() if k))[:n])


def _pct(a: np.ndarray) -> dict:
    if len(a) == 0:
        return {"n": 0}
    return {
        "n": int(len(a)),
        "p50": float(np.percentile(a, 50)),
        "p99": float(np.percentile(a, 99)),
        "max": float(a.max()),
    }


# -- workers ----------------------------------------------------------------------------------
def _worker(idx: int, devices: list, opts: simfleet.SimOptions, flush_ev, end_ev, q, out: str, nice: int = 0) -> None:
    import asyncio

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides when we stop
    if nice:
        os.nice(nice)  # --device-nice: the stand-ins for devices yield the CPU to the pipeline they feed

    def control():
        return "end" if end_ev.is_set() else "flush" if flush_ev.is_set() else None

    result = asyncio.run(simfleet.run_devices(devices, opts, control, lambda s: q.put(("tick", idx, s))))
    names = list(result["samples"])
    np.savez(
        out,
        names=np.asarray(names),
        counts=np.asarray([len(result["samples"][d]) for d in names], dtype=np.int64),
        sample_ms=np.concatenate([np.frombuffer(result["samples"][d], dtype=np.int64) for d in names])
        if names
        else np.array([], dtype=np.int64),
    )
    q.put(("done", idx, result["stats"]))


def load_samples(run_dir: pathlib.Path) -> dict[str, np.ndarray]:
    out: dict[str, np.ndarray] = {}
    for path in sorted(run_dir.glob("samples-*.npz")):
        with np.load(path) as z:  # z[key] reads the array from the file again on every access
            names, counts, sample_ms = z["names"], z["counts"], z["sample_ms"]
        pos = 0
        for name, n in zip(names, counts):
            out[str(name)] = sample_ms[pos : pos + n]  # views of one array per file
            pos += n
    return out


# -- the run ------------------------------------------------------------------------------------
def _raise_nofile(n_devices: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = min(hard, max(soft, 2 * n_devices + 1024))
    if want > soft:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    if want < n_devices + 256:
        raise SystemExit(
            f"bench fleet: {n_devices} devices need ~{n_devices + 256} file descriptors, hard limit {hard}"
        )


def _start_spark(
    run_dir: pathlib.Path,
    landing: pathlib.Path,
    out: pathlib.Path,
    keys,
    trigger: int,
    log,
    report_seconds: int = 0,
    warm_up: bool = True,
):
    from mqbatch.util.paths import venv_tool

    local = run_dir / "spark-local"
    local.mkdir(exist_ok=True)
    cmd = [
        str(venv_tool("mqbatch")),
        "spark",
        "--stream",
        "--trigger-seconds",
        str(trigger),
        "--report-seconds",
        str(report_seconds),
        "--landing",
        str(landing),
        "--out",
        str(out),
        "--hmac-keys",
        str(keys),
        "--pyfiles-zip",
        str(run_dir / "mqbatch.zip"),
        "--conf",
        f"spark.local.dir={local}",
        "--conf",
        f"spark.driver.extraJavaOptions=-Djava.io.tmpdir={local} -XX:-UsePerfData",
        "--conf",
        "spark.ui.enabled=false",
        "--conf",
        "spark.sql.shuffle.partitions=2",
        *(() if warm_up else ("--no-warm-up",)),
    ]
    env = dict(os.environ, SPARK_LOCAL_DIRS=str(local), TMPDIR=str(local))
    return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)


def _stop_group(proc: subprocess.Popen, timeout: float = 30) -> None:
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
        except ProcessLookupError:
            pass


def _wait_for(text: str, path: pathlib.Path, proc: subprocess.Popen, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while text not in path.read_text(errors="replace"):
        if proc.poll() is not None:
            raise RuntimeError(f"{path.name}: exited {proc.returncode}:\n{path.read_text()[-3000:]}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"{path.name}: no {text!r} within {timeout:.0f} s:\n{path.read_text()[-3000:]}")
        time.sleep(0.5)


def job_failure(log: pathlib.Path) -> str:
    """The first line of the streaming job's log that names an error (an OutOfMemoryError, an
    exception), or its last line."""
    lines = [x.strip() for x in log.read_text(errors="replace").splitlines() if x.strip()]
    for mark in ("OutOfMemoryError", " ERROR ", "Traceback", "Exception"):
        for line in lines:
            if mark in line:
                return f"its log: {line[:300]}"
    return f"its log ends: {lines[-1][:300]}" if lines else "its log is empty"


def committed_files(out: pathlib.Path) -> set[str]:
    """The landing files of every micro-batch the streaming job has committed (_batches/N.json)."""
    files: set[str] = set()
    for commit in (out / "_batches").glob("*.json") if (out / "_batches").is_dir() else ():
        try:
            files.update(str(pathlib.Path(f).resolve()) for f in json.loads(commit.read_text())["files"])
        except (OSError, ValueError, KeyError):
            continue  # being written: read again at the next poll
    return files


def stack_recorder(stack, run_dir: pathlib.Path, extra: tuple[str, ...] = ()):
    """`mqbatch ingest` (not started) for a LocalStack: its recorder account, landing in
    run_dir/landing, log in run_dir/recorder.log."""
    from mqbatch.lab.recproc import RecorderProcess
    from mqbatch.lab.stack import RECORDER_CLIENT_ID

    pw = run_dir / "recorder.pw"
    pw.write_text(stack.recorder_login[1])
    pw.chmod(0o600)
    return RecorderProcess(
        run_dir / "recorder.log",
        host=stack.broker.host,
        port=stack.broker.port,
        cafile=stack.ca_cert,
        landing=run_dir / "landing",
        client_id=RECORDER_CLIENT_ID,
        username=stack.recorder_login[0],
        password_file=pw,
        extra=extra,
    )


def run_fleet(args: argparse.Namespace, say=print) -> dict:
    from mqbatch.fleet.brokerconf import LIMITS
    from mqbatch.lab.devices import device_ids
    from mqbatch.lab.stack import LocalStack

    n = args.devices
    _raise_nofile(n)
    run_dir = pathlib.Path(args.run_dir).resolve()
    run_dir.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    # the broker's per-listener max_connections (10,000 by default) must hold every device
    # and the recorder: one more device than it allows is refused at CONNECT
    limits = dataclasses.replace(LIMITS, max_connections=max(LIMITS.max_connections, n + 16))
    stack = LocalStack(run_dir / "stack", device_ids(n, prefix="sim"), limits=limits)
    setup_s = time.monotonic() - t0
    stack.broker.start(timeout=120)
    say(f"fleet: {n:,} accounts, certificates and policy in {setup_s:.1f} s; broker {stack.broker.url}")
    procs: list = []
    spark = None
    rec = None
    try:
        landing = run_dir / "landing"
        rec_args = ("--roll-seconds", str(args.roll_seconds), "--receive-maximum", str(args.receive_maximum))
        rec = stack_recorder(stack, run_dir, rec_args).start()
        landing.mkdir(exist_ok=True)
        out = run_dir / "spark-out"
        spark_log_path = run_dir / "spark.log"
        spark_log = open(spark_log_path, "wb")
        t_spark = time.monotonic()
        spark = _start_spark(
            run_dir,
            landing,
            out,
            stack.hmac_keys_file,
            args.trigger_seconds,
            spark_log,
            args.report_seconds,
            warm_up=not args.no_warm_up,
        )
        _wait_for("telemetry_job: streaming", spark_log_path, spark, 300)
        say(f"fleet: recorder and streaming job up (job started in {time.monotonic() - t_spark:.0f} s)")

        poller = TablePoller(out / "records")
        series: list[dict] = []
        ticks: dict[int, dict] = {}
        stop_sampling = threading.Event()
        ctx = mp.get_context("spawn")
        q = ctx.Queue()
        flush_ev, end_ev = ctx.Event(), ctx.Event()
        opts = simfleet.SimOptions(
            host=stack.broker.host,
            port=stack.broker.port,
            cafile=str(stack.ca_cert),
            rate=args.rate,
            batch=args.batch,
            ack_timeout=args.ack_timeout,
            ramp_s=args.ramp_s,
            cut_after=args.cut_after,
        )
        devs = [(d, pw_, stack.hmac_keys[d]) for d, pw_ in stack.credentials.items()]
        workers = max(1, min(args.workers, n))
        for w in range(workers):
            p = ctx.Process(
                target=_worker,
                args=(
                    w,
                    devs[w::workers],
                    opts,
                    flush_ev,
                    end_ev,
                    q,
                    str(run_dir / f"samples-{w}.npz"),
                    args.device_nice,
                ),
                daemon=True,
            )
            p.start()
            procs.append(p)
        start_wall = time.time()
        start = time.monotonic()
        finals: dict[int, dict] = {}

        def drain_queue(timeout: float = 0.0) -> None:
            import queue as queue_mod

            end = time.monotonic() + timeout
            while True:
                try:
                    kind, w, s = q.get(timeout=max(0.0, end - time.monotonic()))
                except queue_mod.Empty:
                    return
                (ticks if kind == "tick" else finals)[w] = s
                if kind == "done":
                    ticks[w] = s

        prev = {"t": start, "rec_cpu": proc_cpu_s(rec.proc.pid), "rows": 0, "stored": 0}

        def sample_metrics() -> dict:
            now = time.monotonic()
            tot = {k: sum(t.get(k, 0) for t in ticks.values()) for k in (*simfleet.COUNTERS, "outbox")}
            cpu = proc_cpu_s(rec.proc.pid)
            dt = max(1e-6, now - prev["t"])
            m = {
                "t": now - start,
                **tot,
                "table_rows": poller.rows,
                "stored_per_s": (tot["stored"] - prev["stored"]) / dt,
                "table_per_s": (poller.rows - prev["rows"]) / dt,
                "recorder_cpu_pct": None
                if cpu is None or prev["rec_cpu"] is None
                else 100 * (cpu - prev["rec_cpu"]) / dt,
                "recorder_rss_mb": proc_rss_mb(rec.proc.pid),
                "broker_rss_mb": proc_rss_mb(stack.broker.process.pid),
                "broker_connections": established(stack.broker.port),
                "sampling": not stop_sampling.is_set(),
            }
            prev.update(t=now, rec_cpu=cpu, rows=poller.rows, stored=tot["stored"])
            series.append(m)
            return m

        run_s = args.minutes * 60 + args.ramp_s
        last_print = start
        while time.monotonic() - start < run_s:
            drain_queue(1.0)
            poller.poll()
            m = sample_metrics()
            if time.monotonic() - last_print >= args.progress_s:
                last_print = time.monotonic()
                say(_progress(m))
            if any(not p.is_alive() for p in procs):
                raise RuntimeError("a device worker died")
        flush_ev.set()
        stop_sampling.set()
        sample_end_wall = time.time()
        say(f"fleet: sampling stopped after {time.monotonic() - start:.0f} s; draining the outboxes")
        drain_deadline = time.monotonic() + args.drain_s
        while time.monotonic() < drain_deadline:
            drain_queue(1.0)
            poller.poll()
            m = sample_metrics()
            if len(ticks) == workers and m["outbox"] == 0 and time.monotonic() - start > run_s + 2:
                break
            if time.monotonic() - last_print >= args.progress_s:
                last_print = time.monotonic()
                say(_progress(m))
        end_ev.set()
        while len(finals) < workers and any(p.is_alive() for p in procs):
            drain_queue(1.0)
        drain_queue(0.5)
        for p in procs:
            p.join(30)
        totals = {k: sum(f.get(k, 0) for f in finals.values()) for k in (*simfleet.COUNTERS, "outbox")}
        errors = [f.get("last_error") for f in finals.values() if f.get("last_error")]
        say(
            f"fleet: devices stopped: {totals['stored']:,} stored, {totals['acked']:,} acked end to end, "
            f"outbox {totals['outbox']:,}" + (f"; last device error: {errors[0]}" if errors else "")
        )
        # the open landing segment: the recorder closes it on SIGTERM (everything in it is already
        # acknowledged end to end, so this only decides when it becomes a file)
        rec_cpu_total = proc_cpu_s(rec.proc.pid)
        rec_peak_rss = proc_rss_mb(rec.proc.pid, "VmHWM")
        rec.stop()
        # drained = every landing file the recorder wrote is in a committed micro-batch
        landed_files = {str(p.resolve()) for p in landing.glob("*.parquet")}
        table_deadline = time.monotonic() + args.table_wait_s
        unprocessed = landed_files
        while time.monotonic() < table_deadline:
            poller.poll()
            sample_metrics()
            unprocessed = landed_files - committed_files(out)
            if not unprocessed:
                poller.poll()
                break
            if spark.poll() is not None:  # it will not take them: say why now, not at the deadline
                break
            time.sleep(POLL_S)
        if unprocessed:
            say(
                f"fleet: the streaming job did not take {len(unprocessed)} of {len(landed_files)} landing files "
                + (
                    f"within --table-wait-s {args.table_wait_s:g}"
                    if spark.poll() is None
                    else f"before it exited (status {spark.returncode}; {job_failure(spark_log_path)})"
                )
                + ": their records are counted as lost (not proven lost: `mqbatch bench fleet --check` after "
                "`mqbatch spark --once` on the run's landing/ and spark-out/ tells)"
            )
        samples = load_samples(run_dir)
        ramp_end_ms = int((start_wall + args.ramp_s) * 1000)
        table = poller.table()
        acc = account(samples, table, ramp_end_ms, int(sample_end_wall * 1000))
        # the streaming job's first micro-batch is its cold start (JIT, code generation): the
        # steady figure counts the records sampled after the first rows were readable
        warm_ms = max(ramp_end_ms, poller.first_rows_ms or ramp_end_ms)
        steady_acc = account(samples, table, warm_ms, int(sample_end_wall * 1000))
        sampled_s = args.minutes * 60
        steady = [m for m in series if m["sampling"] and m["t"] > args.ramp_s]
        fig = {
            "devices": n,
            "rate": args.rate,
            "batch": args.batch,
            "minutes": args.minutes,
            "workers": workers,
            "device_nice": args.device_nice,
            "warm_up": not args.no_warm_up,
            "roll_seconds": args.roll_seconds,
            "receive_maximum": args.receive_maximum,
            "trigger_seconds": args.trigger_seconds,
            "report_seconds": args.report_seconds,
            "ack_timeout": args.ack_timeout,
            "cut_after": args.cut_after,
            "ramp_s": args.ramp_s,
            "setup_s": round(setup_s, 1),
            "device_totals": totals,
            "device_errors": errors[:5],
            "stored_per_s": totals["stored"] / (sampled_s + args.ramp_s),
            "table_per_s_steady": window_rate(steady, "table_rows"),
            **{k: v for k, v in acc.items() if k != "ttt_series"},
            "time_to_table_steady_s": steady_acc["time_to_table_s"],
            "first_rows_after_s": None if poller.first_rows_ms is None else poller.first_rows_ms / 1000 - start_wall,
            "recorder_cpu_pct_steady": _median([m["recorder_cpu_pct"] for m in steady]),
            "recorder_cpu_s_total": rec_cpu_total,
            "recorder_peak_rss_mb": rec_peak_rss,
            "broker_rss_mb_max": max((m["broker_rss_mb"] or 0) for m in series) if series else None,
            "broker_connections_max": max((m["broker_connections"] for m in series), default=0),
            "landing_files": len(landed_files),
            "landing_files_not_in_table": len(unprocessed),
            "spark_batches": len(list((out / "_batches").glob("*.json"))) if (out / "_batches").is_dir() else 0,
        }
        (run_dir / "series.json").write_text(json.dumps(series))
        (run_dir / "accounting.json").write_text(
            json.dumps({k: v for k, v in fig.items()}, indent=1, default=str) + "\n"
        )
        _save_table(run_dir, poller.table())
        fig["plot"] = str(plot(series, acc["ttt_series"], start_wall, fig, pathlib.Path(args.out) / "fleet.png"))
        return fig
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
        if rec is not None:
            rec.close()
        if spark is not None:
            _stop_group(spark)
        stack.broker.stop()


def window_rate(series: list[dict], key: str) -> float | None:
    """Per second over the whole window of samples (first to last), or None with fewer than
    two: rows reach records/ a micro-batch at a time, every few seconds, so most 1-s samples
    see none and the median of per-sample rates was 0 /s while 10,000 rows/s arrived."""
    if len(series) < 2 or series[-1]["t"] <= series[0]["t"]:
        return None
    return (series[-1][key] - series[0][key]) / (series[-1]["t"] - series[0]["t"])


def _median(values) -> float | None:
    v = [x for x in values if x is not None]
    return float(np.median(v)) if v else None


def _save_table(run_dir: pathlib.Path, table: dict) -> None:
    np.savez(run_dir / "seen.npz", **{k: (v.astype(str) if k == "device" else v) for k, v in table.items()})


def _progress(m: dict) -> str:
    cpu = m["recorder_cpu_pct"]
    return (
        f"  {m['t']:5.0f} s: {m['connected']:,} connected, {m['stored']:,} stored, {m['acked']:,} acked, "
        f"outbox {m['outbox']:,}, {m['table_rows']:,} rows in records/; recorder "
        f"{'?' if cpu is None else f'{cpu:.0f}'} % CPU {m['recorder_rss_mb'] or 0:.0f} MB; broker "
        f"{m['broker_connections']:,} conns {m['broker_rss_mb'] or 0:.0f} MB"
    )


def plot(series: list[dict], ttt, start_wall: float, fig: dict, path: pathlib.Path) -> pathlib.Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path.parent.mkdir(parents=True, exist_ok=True)
    t = [m["t"] for m in series]
    f, ax = plt.subplots(4, 1, figsize=(9, 11), sharex=True)
    # cumulative counts: a micro-batch lands at once, so a rate would be one spike
    ax[0].plot(t, [m["stored"] for m in series], label="stored by the devices", color="tab:blue")
    ax[0].plot(t, [m["acked"] for m in series], label="acked end to end", color="tab:green", ls="--")
    ax[0].plot(t, [m["table_rows"] for m in series], label="readable in records/", color="tab:orange")
    ax[0].set_ylabel("records (cumulative)")
    ax[0].legend(loc="upper left")
    ax[1].plot(t, [m["outbox"] for m in series], label="records in outboxes (not acked)", color="tab:red")
    ax[1].set_ylabel("records")
    a2 = ax[1].twinx()
    a2.plot(t, [m["broker_connections"] for m in series], label="broker connections", color="tab:green")
    a2.set_ylabel("connections")
    ax[1].legend(loc="upper left")
    a2.legend(loc="upper right")
    ax[2].plot(t, [m["recorder_cpu_pct"] for m in series], label="recorder CPU %", color="tab:purple")
    ax[2].set_ylabel("CPU % (1 core = 100)")
    a3 = ax[2].twinx()
    a3.plot(t, [m["recorder_rss_mb"] for m in series], label="recorder RSS", color="tab:brown")
    a3.plot(t, [m["broker_rss_mb"] for m in series], label="broker RSS", color="tab:gray")
    a3.set_ylabel("MB")
    ax[2].legend(loc="upper left")
    a3.legend(loc="upper right")
    sample_ms, secs = ttt
    if len(secs):
        st = (np.asarray(sample_ms) / 1000.0) - start_wall
        ax[3].scatter(st, secs, s=1, alpha=0.2, color="tab:blue", label="one record (sampled at x)")
        ax[3].legend(loc="upper left")
    ax[3].set_ylabel("time to table, s")
    ax[3].set_xlabel("seconds since the devices started")
    ttt_f = fig.get("time_to_table_s", {})
    f.suptitle(
        f"bench fleet: {fig['devices']:,} devices x {fig['rate']:g} rec/s, batches of {fig['batch']}, "
        f"roll {fig['roll_seconds']:g} s, trigger {fig['trigger_seconds']} s, report every "
        f"{fig.get('report_seconds', 0)} s\n"
        f"lost {fig['lost']}, time to table p50 {ttt_f.get('p50', float('nan')):.1f} s "
        f"p99 {ttt_f.get('p99', float('nan')):.1f} s"
    )
    f.tight_layout()
    f.savefig(path, dpi=80)
    plt.close(f)
    return path


def check(run_dir: pathlib.Path) -> dict:
    """Recompute the accounting of a finished run from its files (samples-*.npz and the
    Parquet files now in spark-out/records/, all seen at the time of this check)."""
    poller = TablePoller(run_dir / "spark-out" / "records")
    poller.poll()
    return account(load_samples(run_dir), poller.table())


def report_lines(fig: dict) -> list[str]:
    t, d = fig["time_to_table_s"], fig["device_to_recorder_ms"]
    tot = fig["device_totals"]
    lines = [
        f"devices {fig['devices']:,} x {fig['rate']:g} records/s, batches of {fig['batch']}, {fig['minutes']:g} min "
        f"(+{fig['ramp_s']:g} s ramp), {fig['workers']} worker processes at nice {fig.get('device_nice', 0)}, recorder --roll-seconds "
        f"{fig['roll_seconds']:g} --receive-maximum {fig.get('receive_maximum', 100)}, "
        f"spark --stream --trigger-seconds {fig['trigger_seconds']} --report-seconds {fig.get('report_seconds', 0)}"
        + ("" if fig.get("warm_up") else " --no-warm-up"),
        f"  stored {tot['stored']:,} records ({fig['stored_per_s']:,.0f}/s), published {tot['published']:,} "
        f"(+{tot['republished']:,} again: after {fig['ack_timeout']:g} s without ack or a lost connection), acked "
        f"end to end {tot['acked']:,}, outbox left {tot['outbox']:,}, dropped on devices {tot['dropped']:,}",
        f"  connections lost {tot.get('disconnects', 0):,} ({tot.get('cuts', 0):,} cut on purpose, --cut-after "
        f"{fig.get('cut_after', 0):g}), connects {tot.get('connects', 0):,}",
        f"  landing files {fig['landing_files']:,}, not taken by the streaming job at the end "
        f"{fig['landing_files_not_in_table']:,}",
        f"  records/ rows {fig['rows']:,} ({fig['table_per_s_steady'] or 0:,.0f}/s median while sampling); "
        f"LOST {fig['lost']:,}; rows not stored by any device {fig['extra_rows']:,}; duplicate rows "
        f"{fig['duplicate_rows']:,}; device outboxes hold {tot['outbox']:,} records not acked end to end "
        "(landed ones among them: their ack did not arrive)",
    ]
    if t.get("n"):
        lines.append(
            f"  time to table, all (sampled on the device -> row readable in records/, polled every {POLL_S:g} s): "
            f"p50 {t['p50']:.1f} s, p99 {t['p99']:.1f} s, max {t['max']:.1f} s ({t['n']:,} records sampled after the ramp)"
        )
    s = fig.get("time_to_table_steady_s") or {}
    if s.get("n"):
        lines.append(
            f"  time to table, steady (sampled after the job's first rows were readable, "
            f"{fig['first_rows_after_s']:.0f} s in): p50 {s['p50']:.1f} s, p99 {s['p99']:.1f} s, max {s['max']:.1f} s "
            f"({s['n']:,} records)"
        )
    if d.get("n"):
        lines.append(
            f"  device -> recorder receive (received_at - device time, not the table): p50 {d['p50'] / 1000:.2f} s, "
            f"p99 {d['p99'] / 1000:.2f} s"
        )
    lines.append(
        f"  recorder: {fig['recorder_cpu_pct_steady'] or 0:.0f} % of a core (median while sampling), "
        f"peak RSS {fig['recorder_peak_rss_mb'] or 0:.0f} MB; broker: {fig['broker_connections_max']:,} connections "
        f"at most, RSS up to {fig['broker_rss_mb_max'] or 0:.0f} MB; {fig['spark_batches']} Spark micro-batches"
    )
    return lines


def bench_fleet(args: argparse.Namespace) -> int:
    from mqbatch.bench.out import write_result

    if args.check:
        acc = check(pathlib.Path(args.check))
        print(
            f"fleet check {args.check}: stored {acc['stored']:,}, found {acc['found']:,}, LOST {acc['lost']:,} "
            f"(first devices: {acc['lost_devices']}), rows not stored by any device {acc['extra_rows']:,}, "
            f"duplicate rows {acc['duplicate_rows']:,}"
        )
        return 1 if acc["lost"] or acc["extra_rows"] or acc["duplicate_rows"] else 0
    if args.ramp_s is None:
        args.ramp_s = max(5.0, args.devices / 250)  # TLS handshakes: ~250/s leave the CPU for the rest
    with tempfile.TemporaryDirectory(prefix="mqbatch-bench-fleet-") as tmp:
        if args.run_dir is None:
            args.run_dir = tmp
        print(
            f"bench fleet: {args.devices:,} simulated devices, {args.rate:g} records/s each, batches of {args.batch}, "
            f"{args.minutes:g} min, TLS and end-to-end acks; run directory {args.run_dir}",
            flush=True,
        )
        fig = run_fleet(args, say=lambda s: print(s, flush=True))
    for line in report_lines(fig):
        print(line)
    print(f"plot: {fig['plot']}")
    write_result(args, "fleet", fig)
    bad = problems(fig)
    if bad:
        print("bench fleet: FAILED: " + "; ".join(bad), file=sys.stderr)
    return 1 if bad else 0


def problems(fig: dict) -> list[str]:
    """What makes a fleet run fail (exit 1), one phrase each: a record lost, a row no device
    stored, a record in records/ twice (a resend the job did not drop), a record dropped on a
    device or never acked end to end."""
    tot = fig["device_totals"]
    found = [
        (fig["lost"], f"{fig['lost']:,} records lost (first devices: {fig['lost_devices']})"),
        (fig["extra_rows"], f"{fig['extra_rows']:,} rows no device stored"),
        (fig["duplicate_rows"], f"{fig['duplicate_rows']:,} records in records/ more than once"),
        (tot["dropped"], f"{tot['dropped']:,} dropped on devices"),
        (
            tot["outbox"],
            f"{tot['outbox']:,} never acked end to end (left in the device outboxes: a device would keep "
            "them on flash and send them again, until its outbox is full)",
        ),
    ]
    return [text for n, text in found if n]


def _fraction(text: str) -> float:
    value = float(text)
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"{text}: a fraction from 0 to 1")
    return value


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--devices", type=int, default=100, help="simulated devices (default 100)")
    p.add_argument("--rate", type=float, default=1.0, help="records per second per device (default 1)")
    p.add_argument("--minutes", type=float, default=2.0, help="minutes of sampling after the ramp (default 2)")
    p.add_argument("--batch", type=int, default=10, help="records per PUBLISH (default 10)")
    p.add_argument("--workers", type=int, default=2, help="device processes (default 2)")
    p.add_argument(
        "--device-nice",
        type=int,
        choices=range(20),
        metavar="0..19",
        default=10,
        help="nice increment of the device processes (default 10): real devices bring their own CPUs, so the "
        "stand-ins yield this machine's to the broker, the recorder and the job; 0 makes them compete equally",
    )
    p.add_argument("--roll-seconds", type=float, default=60.0, help="recorder --roll-seconds (default 60, its default)")
    p.add_argument(
        "--receive-maximum",
        type=int,
        default=100,
        help="recorder --receive-maximum: PUBLISHes in flight to it, so the most one fsync'd group holds "
        "(default 100, its default)",
    )
    p.add_argument("--trigger-seconds", type=int, default=10, help="spark --trigger-seconds (default 10, its default)")
    p.add_argument(
        "--report-seconds",
        type=int,
        default=0,
        help="spark --report-seconds: report.json at most this often (default 0, its default: every micro-batch)",
    )
    p.add_argument(
        "--no-warm-up",
        action="store_true",
        help="start the streaming job with --no-warm-up (its first micro-batches then pay the cold JVM)",
    )
    p.add_argument("--ack-timeout", type=float, default=30.0, help="s before an unacked batch is sent again")
    p.add_argument(
        "--cut-after",
        type=_fraction,
        default=0.0,
        metavar="FRACTION",
        help="lose a device's connection (no DISCONNECT) within 1 s after this fraction of its new PUBLISHes "
        "(default 0): it reconnects and publishes its outbox again, so records/ must drop the copies",
    )
    p.add_argument("--ramp-s", type=float, default=None, help="connections spread over this long (default N/250 s)")
    p.add_argument("--drain-s", type=float, default=120.0, help="most s to wait for the outboxes to empty")
    p.add_argument(
        "--table-wait-s",
        type=float,
        default=900.0,
        help="most s to wait, after that, for the streaming job to commit every landing file (default 900)",
    )
    p.add_argument("--progress-s", type=float, default=10.0, help="progress line interval")
    p.add_argument("--run-dir", default=None, help="keep the run here (default: a temporary directory)")
    p.add_argument("--check", metavar="RUN_DIR", help="only recompute lost records of a kept run (exit 1 if any)")
