"""Issue 22's "streaming SIGKILL at random moments x5": `mqbatch spark --stream` runs on the
landing zone while the devices publish; it is SIGKILLed (the command only: no handler runs,
its children get nothing from us) at seeded random moments and restarted each time. After
each kill every process it had started must be gone (the JVM dies with the command); at the
end, once the stream has committed every landing file, report.json must match records/ and
what landed, with every device's accounting balanced (mqbatch.spark.accounting).

    job = StreamJob(landing, out, log).start()
    job.kill()                    # -> the pids it had started that outlived it (must be [])
    job.caught_up(landing)        # every landing file is in a committed micro-batch
    check_outputs(out, landed)    # -> (figures, problems)
"""

from __future__ import annotations

import collections
import json
import os
import pathlib
import signal
import subprocess
import sys
import time

SMALL = ["--master", "local[2]", "--conf", "spark.ui.enabled=false", "--conf", "spark.sql.shuffle.partitions=2"]


def _live_children() -> dict[int, list[int]]:
    """ppid -> live (not zombie) pids, from /proc."""
    kids: dict[int, list[int]] = collections.defaultdict(list)
    for stat in pathlib.Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] != "Z":
            kids[int(fields[1])].append(int(stat.parent.name))
    return kids


def descendants(pid: int) -> list[int]:
    kids, out, todo = _live_children(), [], [pid]
    while todo:
        for k in kids.get(todo.pop(), []):
            out.append(k)
            todo.append(k)
    return out


def alive(pids) -> list[int]:
    left = []
    for p in pids:
        try:
            state = pathlib.Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z":
            left.append(p)
    return left


class StreamJob:
    def __init__(self, landing, out, log, trigger_seconds: int = 5):
        self.out, self.log = pathlib.Path(out), pathlib.Path(log)
        self.cmd = [str(pathlib.Path(sys.executable).parent / "mqbatch"), "spark", "--landing", str(landing)]
        self.cmd += ["--out", str(out), "--stream", "--trigger-seconds", str(trigger_seconds), *SMALL]
        # no warm-up: it would add about 20 s to every restart, and the kills are meant for micro-batches
        self.cmd.append("--no-warm-up")
        self.proc: subprocess.Popen | None = None
        self._log_from = 0
        self.orphans: list[int] = []  # pids that outlived a SIGKILL of the command (60 s grace)

    def start(self) -> "StreamJob":
        self._log_from = self.log.stat().st_size if self.log.exists() else 0
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                self.cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True
            )
        return self

    def output(self) -> str:
        return self.log.read_bytes()[self._log_from :].decode("utf-8", "replace") if self.log.exists() else ""

    def phase(self) -> str:
        """What this run of the job was doing (from its output): starting, idle, or in batch N."""
        lines = [x for x in self.output().splitlines() if x.startswith(("batch ", "telemetry_job: streaming"))]
        if not lines:
            return "starting"
        last = lines[-1]
        if ": started," in last:
            return f"in {last.split(':')[0]}"
        return "idle" if last.startswith("telemetry_job") else f"after {last.split(':')[0]}"

    def kill(self, grace: float = 60.0) -> list[int]:
        """SIGKILL the command alone; the pids it had started still alive `grace` s later
        (then SIGKILLed by us, so the run goes on; they are reported)."""
        started = descendants(self.proc.pid)
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(30)
        deadline = time.monotonic() + grace
        while alive(started) and time.monotonic() < deadline:
            time.sleep(0.5)
        left = alive(started)
        for p in left:
            try:
                os.kill(p, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.orphans += left
        return left

    def stop(self, timeout: float = 120.0) -> tuple[int | None, list[int]]:
        """SIGTERM (a clean stop); (exit status, pids left 30 s after it exited)."""
        if self.proc is None or self.proc.poll() is not None:
            return (None if self.proc is None else self.proc.returncode), []
        started = descendants(self.proc.pid)
        self.proc.send_signal(signal.SIGTERM)
        try:
            rc = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            rc = self.proc.wait(30)
        deadline = time.monotonic() + 30
        while alive(started) and time.monotonic() < deadline:
            time.sleep(0.5)
        left = alive(started)
        for p in left:
            os.kill(p, signal.SIGKILL)
        return rc, left

    def committed_files(self) -> set[str]:
        names: set[str] = set()
        for commit in (self.out / "_batches").glob("*.json"):
            try:
                names.update(os.path.basename(f) for f in json.loads(commit.read_text())["files"])
            except (OSError, ValueError, KeyError):
                continue  # being written (it is replaced atomically, but be safe)
        return names

    def caught_up(self, landing) -> bool:
        """Every landing file is in a committed micro-batch, and report.json took effect no
        earlier than the latest commit (the job renames it into place after each commit, and
        rewrites it at each start)."""
        from mqbatch.spark import files as landing_files

        want = {os.path.basename(f) for f in landing_files.landing_files(str(landing))}
        commits = list((self.out / "_batches").glob("*.json"))
        report = self.out / "report.json"
        if not (want <= self.committed_files() and commits and report.is_file()):
            return False
        # >=: the job renames a batch's report into place right after its commit, often within
        # one tick of the file system's clock (equal mtimes); a stale report is older
        return report.stat().st_mtime_ns >= max(c.stat().st_mtime_ns for c in commits)


def records_keys(out) -> list[tuple[str, int, int]]:
    """(device, boot, seq) of every row of OUT/records/."""
    import pyarrow.dataset as ds

    path = pathlib.Path(out) / "records"
    if not path.is_dir():
        return []
    t = ds.dataset(str(path), format="parquet", partitioning="hive").to_table(columns=["device", "boot", "seq"])
    return list(zip(*(t.column(c).to_pylist() for c in ("device", "boot", "seq")), strict=True))


def check_outputs(out, landed: set[tuple[str, int, int]]) -> tuple[dict, list[str]]:
    """report.json against records/ and against what landed (unique (device, boot, seq)
    decoded from the landing zone), and every device's accounting. Returns (figures,
    problems); no problem means: per device the report's `unique` = rows in records/ =
    unique landed, records/ holds no key twice, every accounting balanced with 0 lost."""
    out = pathlib.Path(out)
    problems: list[str] = []
    try:
        report = json.loads((out / "report.json").read_text())
    except (OSError, ValueError) as e:
        return {}, [f"report.json cannot be read: {e}"]
    keys = records_keys(out)
    in_records = collections.Counter(k[0] for k in keys)
    dup_keys = len(keys) - len(set(keys))
    want = collections.Counter(k[0] for k in landed)
    devices = report.get("devices", {})
    for dev in sorted(set(devices) | set(in_records) | set(want)):
        d = devices.get(dev, {})
        got = (d.get("unique"), in_records.get(dev, 0), want.get(dev, 0))
        if len(set(got)) != 1:
            problems.append(f"{dev}: report unique {got[0]}, rows in records/ {got[1]}, unique landed {got[2]}")
        acc = d.get("accounting")
        if acc is None:
            problems.append(f"{dev}: no accounting in report.json")
        elif not acc.get("balanced") or acc.get("lost"):
            problems.append(f"{dev}: accounting not balanced: {json.dumps(acc, sort_keys=True)}")
    if dup_keys:
        problems.append(f"records/ holds {dup_keys} rows whose (device, boot, seq) is there already")
    accs = [d.get("accounting") or {} for d in devices.values()]
    figures = {
        "report_unique": report.get("records", {}).get("unique"),
        "records_rows": len(keys),
        "landed_unique": len(landed),
        "report_lost": sum(a.get("lost", 0) for a in accs),
        "report_dropped": sum(a.get("dropped", 0) for a in accs),
        "report_released_unconfirmed": sum(a.get("released_unconfirmed", 0) for a in accs),
        "devices_balanced": f"{sum(bool(a.get('balanced')) for a in accs)}/{len(devices)}",
    }
    return figures, problems


def stream_kills(h, run_for_s: float, rng, kills: int = 5) -> None:
    """`mqbatch spark --stream` on the landing zone from the start; SIGKILLed at one seeded
    random moment in each fifth of the first 80 % of the run, restarted at once. The end
    (caught up, outputs checked, no JVM left) is h's after-landing step."""
    job = StreamJob(h.landing, h.dir / "spark-out", h.dir / "spark.log").start()
    h.cleanups.append(lambda: job.proc.poll() is None and job.kill(grace=10))
    slot = run_for_s * 0.8 / kills
    for k in range(kills):
        time.sleep(max(0.0, k * slot + rng.uniform(0, slot) - (time.monotonic() - h.t0)))
        phase = job.phase()
        if job.proc.poll() is not None:  # it ended by itself: a finding, whatever the kills show
            h.problems.append(f"stream-kills: mqbatch spark --stream exited {job.proc.returncode} by itself ({phase})")
        left = job.kill()
        h.fault(f"spark --stream SIGKILL ({phase}{f', {len(left)} processes outlived it' if left else ''}) + restart")
        job.start()
    time.sleep(max(0.0, run_for_s - (time.monotonic() - h.t0)))

    def finish(landed: set) -> None:  # after the recorder stopped: every landing file complete
        deadline = time.monotonic() + 600
        while not job.caught_up(h.landing) and time.monotonic() < deadline and job.proc.poll() is None:
            time.sleep(2)
        if not job.caught_up(h.landing):
            exited = job.proc.poll()
            h.problems.append(
                "stream-kills: the stream had not committed every landing file "
                + (f"(it exited {exited})" if exited is not None else "within 600 s")
            )
        figures, problems = check_outputs(job.out, landed)  # while it runs, caught up
        rc, left = job.stop()
        _, after_stop = check_outputs(job.out, landed)  # a SIGTERM must not leave it stale either
        figures["report_stale_after_sigterm"] = bool(after_stop)
        problems += [f"after the SIGTERM: {p}" for p in after_stop if p not in problems]
        figures.update(
            kills=kills,
            orphans_after_kills=len(job.orphans),
            exit_on_sigterm=rc,
            left_after_sigterm=len(left),
        )
        h.checks["stream"] = figures
        h.problems.extend(f"stream-kills: {p}" for p in problems)
        if job.orphans:
            h.problems.append(f"stream-kills: {len(job.orphans)} processes outlived a SIGKILL of mqbatch spark")
        if left:
            h.problems.append(f"stream-kills: {len(left)} processes outlived a SIGTERM of mqbatch spark")

    h.after_landing.append(finish)


def spark_report_check(h) -> None:
    """For any scenario (tools/e2e_scenarios.py --spark-check): once the recorder has stopped,
    `mqbatch spark` (batch) on the landing zone, and check_outputs on what it wrote; the
    figures go to h.checks["spark"], what is wrong to h.problems."""

    def step(landed: set) -> None:
        out, log = h.dir / "spark-batch", h.dir / "spark-batch.log"
        cmd = [str(pathlib.Path(sys.executable).parent / "mqbatch"), "spark", "--landing", str(h.landing)]
        with open(log, "ab") as f:
            rc = subprocess.run(
                [*cmd, "--out", str(out), *SMALL], stdout=f, stderr=subprocess.STDOUT, timeout=1800
            ).returncode
        figures, problems = check_outputs(out, landed)
        h.checks["spark"] = {"exit": rc, **figures}
        if rc != 0:
            problems.insert(0, f"mqbatch spark exited {rc} (see {log})")
        h.problems.extend(f"spark report: {p}" for p in problems)

    h.after_landing.append(step)
