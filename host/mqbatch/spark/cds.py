"""Class-data sharing for the job's JVM: Spark's classes mapped from an archive instead of
read, parsed and verified again from its jars at every start (docs/spark.md, "JVM start-up").

A JVM (JDK 13 or later) started with -XX:ArchiveClassesAtExit=F writes the classes it
loaded to F when it exits; a later JVM started with -XX:SharedArchiveFile=F maps them.

- A batch run of `mqbatch spark` writes the archive when there is none for this Java and
  this Spark (that run takes about 30 s longer; the file is about 170 MB), into
  a temporary file renamed into place only after the run succeeded. `mqbatch spark
  --prepare` does it ahead of time, on a small generated landing zone (for a container
  image's build, or `make setup`).
- Every later JVM that mqbatch starts (`mqbatch spark`, session() when it starts the JVM)
  maps it. The JVM checks that the archive fits (its own version, the class path, each
  jar's size and time) and runs without it otherwise; its notes about that are off
  (QUIET), since spark-submit's JVM writes them to the job's stdout.
- A class path with a folder that holds files cannot be archived: with your own
  SPARK_CONF_DIR nothing is written (and an archive written without it does not fit).
- MQBATCH_JVM_CDS=off: never; =DIR: archives live in DIR (default: build/cds in a
  checkout, else ~/.cache/mqbatch/cds).
"""

from __future__ import annotations

import hashlib
import os
import pathlib
import shlex
import shutil
import subprocess

ENV = "MQBATCH_JVM_CDS"
QUIET = "-Xlog:cds*=off"  # the JVM's notes on archives (a mismatch, classes it skips) go to stdout


def java() -> pathlib.Path | None:
    """The java that spark-submit runs: $JAVA_HOME/bin/java, else java on PATH."""
    home = os.environ.get("JAVA_HOME")
    if home and (pathlib.Path(home) / "bin" / "java").is_file():
        return pathlib.Path(home) / "bin" / "java"
    found = shutil.which("java")
    return pathlib.Path(found) if found else None


def directory() -> pathlib.Path | None:
    """Where archives live, or None when $MQBATCH_JVM_CDS is `off`."""
    setting = os.environ.get(ENV, "")
    if setting.lower() == "off":
        return None
    if setting:
        return pathlib.Path(setting)
    from mqbatch.util.paths import cache_dir

    return cache_dir("cds")


def archive() -> pathlib.Path | None:
    """This Java's and this Spark's archive (whether it exists or not); None without java
    or when off. Its name changes with the java binary and with any of Spark's jars."""
    from mqbatch.spark.jvm import spark_jars_dir

    where, exe = directory(), java()
    if where is None or exe is None:
        return None
    exe = exe.resolve()
    jars = spark_jars_dir().resolve()
    parts = [f"{exe}:{exe.stat().st_size}:{exe.stat().st_mtime_ns}", str(jars)]
    parts += sorted(f"{p.name}:{p.stat().st_size}:{p.stat().st_mtime_ns}" for p in jars.glob("*.jar"))
    return where / f"spark-{hashlib.sha256(chr(10).join(parts).encode()).hexdigest()[:16]}.jsa"


def _conf_dir_has_files() -> bool:
    conf = os.environ.get("SPARK_CONF_DIR")
    return conf is not None and os.path.isdir(conf) and any(os.scandir(conf))


def java_options(create: bool = False) -> tuple[list[str], pathlib.Path | None]:
    """(JVM options, pending): map the archive when it exists; else, with `create`, write it
    at the JVM's exit into `pending`, a temporary file that finish() renames into place."""
    path = archive()
    if path is None:
        return [], None
    if path.is_file():
        return [f"-XX:SharedArchiveFile={path}", QUIET], None
    if not create or _conf_dir_has_files():
        return [], None
    path.parent.mkdir(parents=True, exist_ok=True)
    _remove_abandoned(path)
    pending = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    return [f"-XX:ArchiveClassesAtExit={pending}", QUIET], pending


def finish(pending: pathlib.Path | None, ok: bool) -> pathlib.Path | None:
    """After the JVM given java_options(create=True) ended: its archive in place when the run
    succeeded and the JVM wrote one that a JVM loads (returned), else the temporary file
    removed (None). A cut archive (a full disk, a JVM killed while it wrote) is never put in
    place: every JVM that mapped it would crash (SIGBUS)."""
    if pending is None:
        return None
    if ok and pending.is_file() and loads(pending):
        final = pending.with_name(pending.name.rsplit(".", 2)[0])
        os.replace(pending, final)
        return final
    pending.unlink(missing_ok=True)
    return None


def loads(path: pathlib.Path) -> bool:
    """Whether a JVM starts with this archive (`java -version`: its class path does not fit,
    so the JVM reads the archive's header and regions, then runs without it). About 0.2 s."""
    exe = java()
    if exe is None or not path.is_file() or path.stat().st_size == 0:
        return False
    flags = [f"-XX:SharedArchiveFile={path}", QUIET, "-XX:-CreateCoredumpOnCrash", "-XX:ErrorFile=/dev/null"]
    proc = subprocess.run([str(exe), *flags, "-version"], capture_output=True, timeout=120)
    return proc.returncode == 0


def _remove_abandoned(path: pathlib.Path) -> None:
    """Temporary archives of runs that died before finish() (their process is gone)."""
    for tmp in path.parent.glob(f"{path.name}.*.tmp"):
        pid = tmp.name.rsplit(".", 2)[1]
        if pid.isdigit() and not _alive(int(pid)):
            tmp.unlink(missing_ok=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def with_options(existing: str | None, options: list[str]) -> str:
    """SPARK_SUBMIT_OPTS: what the caller had, then `options` (quoted as spark-submit parses them)."""
    return " ".join(([existing] if existing else []) + [shlex.quote(o) for o in options])


SAMPLE_T0_MS = 1_767_225_600_000  # 2026-01-01T00:00:00Z


def sample_landing(directory: pathlib.Path) -> pathlib.Path:
    """A small landing zone that takes the job through every step (`mqbatch spark --prepare`
    archives the classes it loads): batches of binary records from 3 devices, one PUBLISH
    landed twice (de-duplication), a batch of JSON records and a malformed payload (the
    Python decoders and quarantine/)."""
    from mqbatch.ingest import landing
    from mqbatch.wire import codec, records

    rows = []
    for dev in range(3):
        for batch in range(4):
            recs = [
                records.encode_binary("sample", 1, seq, SAMPLE_T0_MS + seq * 1000, [(1, 200 + seq), (2, 5000)])
                for seq in range(batch * 10, batch * 10 + 10)
            ]
            props, payload = codec.encode_batch(recs)
            received = (SAMPLE_T0_MS + batch * 10_000 + 10_300) * 1000
            rows.append(landing.Landed(f"mqbatch/dev-{dev}/telemetry", payload, list(props), received_at_us=received))
    rows.append(rows[0])  # landed twice
    props, payload = codec.encode_batch([records.encode_json("sample", 2, 0, SAMPLE_T0_MS, [(1, 1)])])
    rows.append(landing.Landed("mqbatch/dev-3/telemetry", payload, list(props), received_at_us=SAMPLE_T0_MS * 1000))
    rows.append(landing.Landed("mqbatch/dev-3/telemetry", b"\xff\x01", list(props), received_at_us=SAMPLE_T0_MS * 1000))
    directory.mkdir(parents=True, exist_ok=True)
    landing.write_parquet_atomic(landing.to_table(rows, "prepare", 0), directory, landing.parquet_name("prepare", 0))
    return directory
