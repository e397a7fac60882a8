"""Class-data sharing for the job's JVM: Spark's classes mapped from an archive instead of
read, parsed and verified again from its jars at every start (docs/spark.md, "JVM start-up").

A JVM (JDK 13 or later) started with -XX:ArchiveClassesAtExit=F writes the classes it
loaded to F when it exits; a later JVM started with -XX:SharedArchiveFile=F maps them.

- Written only by `mqbatch spark --prepare` (write_options/finish): a throwaway batch run
  over a small generated landing zone (sample_landing), never the user's own job (a JVM
  that cannot write the archive ends with exit 1 after the job: a full disk, a folder with
  files on its class path). About 60 s on 2 cores; the file is about 170 MB, 0600 in a
  0700 folder; it is put in place only after the run succeeded and a JVM starts with it
  (a cut archive crashes every JVM that maps it), under an exclusive lock, and the
  folder keeps the KEEP newest archives.
- Mapped (map_options) by every JVM mqbatch starts on this machine (`mqbatch spark`,
  session() when it starts the JVM), unless the archive is not this user's or sits in a
  folder others can write (an archive is code), or the caller's SPARK_SUBMIT_OPTS choose
  sharing themselves. The JVM checks that it fits (its version, the class path, each
  jar's size and time, the heap's compressed-oops mode) and runs without it otherwise;
  its notes about that are off (QUIET), since spark-submit's JVM writes them to the
  job's stdout. The name changes with the java binary and with any of Spark's jars.
- MQBATCH_JVM_CDS=off: never; =DIR: archives live in DIR (default: build/cds in a
  checkout, else ~/.cache/mqbatch/cds).
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import pathlib
import shlex
import subprocess

ENV = "MQBATCH_JVM_CDS"
QUIET = "-Xlog:cds*=off"  # the JVM's notes on archives (a mismatch, classes it skips) go to stdout
WRITE_LOG = "-Xlog:cds*=error"  # while writing: the reason the JVM could not, nothing else
KEEP = 3  # archives a folder keeps (the newest): one per Java and Spark installation
_SHARING = ("-Xshare", "-XX:SharedArchiveFile", "-XX:ArchiveClassesAtExit", "-XX:+AutoCreateSharedArchive")


class CdsError(Exception):
    """Why no archive can be written here (one line)."""


def directory() -> pathlib.Path | None:
    """Where archives live, or None when $MQBATCH_JVM_CDS is `off` (or there is no home)."""
    setting = os.environ.get(ENV, "")
    if setting.lower() == "off":
        return None
    if setting:
        return pathlib.Path(setting)
    from mqbatch.util.paths import cache_dir

    try:
        return cache_dir("cds")
    except RuntimeError:  # Path.home(): no home directory
        return None


def archive() -> pathlib.Path | None:
    """This Java's and this Spark's archive (whether it exists or not); None without java
    or when off. Its name changes with the java binary and with any of Spark's jars."""
    from mqbatch.spark.jvm import jdk_tool, spark_jars_dir

    where, found = directory(), jdk_tool("java")
    if where is None or found is None:
        return None
    exe = pathlib.Path(found).resolve()
    try:
        jars = spark_jars_dir().resolve()
    except ImportError:  # no pyspark: `mqbatch spark` says so itself, in one line
        return None
    parts = [f"{exe}:{exe.stat().st_size}:{exe.stat().st_mtime_ns}", str(jars)]
    parts += sorted(f"{p.name}:{p.stat().st_size}:{p.stat().st_mtime_ns}" for p in jars.glob("*.jar"))
    return where / f"spark-{hashlib.sha256(chr(10).join(parts).encode()).hexdigest()[:16]}.jsa"


def written() -> pathlib.Path | None:
    """This installation's archive when one has been written (by `mqbatch spark --prepare`)."""
    path = archive()
    return path if path is not None and path.is_file() else None


def chooses_sharing(submit_opts: str | None) -> bool:
    """Whether JVM options (SPARK_SUBMIT_OPTS) already say how to share classes."""
    try:
        words = shlex.split(submit_opts or "")
    except ValueError:
        return True  # unparsable: leave them alone
    return any(w.startswith(_SHARING) for w in words)


def map_options(submit_opts: str | None = None) -> list[str]:
    """The JVM options that map this installation's archive: none when there is none, when it
    is not trusted (not this user's, or in a folder others can write), or when
    `submit_opts` (the caller's SPARK_SUBMIT_OPTS) choose sharing themselves, or when a JVM
    does not start with it (loads: 0.2 s; a cut archive would crash the job's JVM)."""
    path = written()
    if path is None or chooses_sharing(submit_opts) or not _trusted(path):
        return []
    if not loads(path):
        return []
    return [f"-XX:SharedArchiveFile={path}", QUIET]


def _trusted(path: pathlib.Path) -> bool:
    for p in (path, path.parent):
        st = p.stat()
        if st.st_uid != os.getuid() or st.st_mode & 0o022:
            return False
    return True


def _class_path_folder() -> str | None:
    """The Spark configuration folder spark-submit puts on the class path ($SPARK_CONF_DIR, else
    conf/ beside the jars of the Spark it runs), when it holds files."""
    from mqbatch.spark.jvm import spark_jars_dir

    conf = os.environ.get("SPARK_CONF_DIR") or str(spark_jars_dir().parent / "conf")
    return conf if os.path.isdir(conf) and any(os.scandir(conf)) else None


def write_options() -> tuple[list[str], pathlib.Path, int]:
    """For `mqbatch spark --prepare`: (JVM options, pending, lock): the JVM writes this
    installation's archive into `pending` at its exit; finish() puts it in place. Holds the
    folder's exclusive lock (a second prepare fails at once). CdsError says why not."""
    from mqbatch.util.private import open_private, private_dir

    path = archive()
    if path is None:
        raise CdsError(f"{ENV}=off" if directory() is None else "no java (JAVA_HOME/bin/java, or java on PATH)")
    folder = _class_path_folder()
    if folder:
        raise CdsError(f"{folder} holds files and is on the JVM's class path: a JVM cannot write an archive then")
    if chooses_sharing(os.environ.get("SPARK_SUBMIT_OPTS")):
        raise CdsError("SPARK_SUBMIT_OPTS choose class-data sharing themselves (-Xshare, an archive)")
    try:
        private_dir(path.parent, tighten=True)
        lock = open_private(path.parent / ".lock", os.O_RDWR | os.O_CREAT)
    except OSError as e:
        raise CdsError(f"cannot use {path.parent}: {e.strerror or e}") from None
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(lock)
        raise CdsError(f"another `mqbatch spark --prepare` is writing into {path.parent}") from None
    for stale in path.parent.glob("*.jsa.tmp"):  # of a prepare that died: no other writer holds the lock
        stale.unlink(missing_ok=True)
    pending = path.with_name(path.name + ".tmp")
    return [f"-XX:ArchiveClassesAtExit={pending}", WRITE_LOG], pending, lock


def finish(pending: pathlib.Path, lock: int, ok: bool) -> str | None:
    """After the JVM given write_options() ended: its archive in place (0600) when the run
    succeeded (`ok`) and a JVM starts with what it wrote; older archives beyond KEEP
    removed; the lock released. Returns None when done, else why not (the pending file
    is removed: a cut archive crashes every JVM that maps it)."""
    try:
        if not ok:
            return "the run failed"
        if not pending.is_file() or pending.stat().st_size == 0:
            return "the JVM wrote no archive"
        if not loads(pending):
            return "a JVM does not start with what it wrote (cut or damaged)"
        os.chmod(pending, 0o600)
        final = pending.with_name(pending.name.removesuffix(".tmp"))
        os.replace(pending, final)
        for old in sorted(final.parent.glob("spark-*.jsa"), key=lambda p: p.stat().st_mtime, reverse=True)[KEEP:]:
            old.unlink(missing_ok=True)
        return None
    finally:
        pending.unlink(missing_ok=True)
        os.close(lock)


def loads(path: pathlib.Path) -> bool:
    """Whether a JVM starts with this archive (`java -version`: its class path does not fit,
    so the JVM reads the archive's header and regions, then runs without it). About 0.2 s."""
    from mqbatch.spark.jvm import jdk_tool

    exe = jdk_tool("java")
    if exe is None or not path.is_file() or path.stat().st_size == 0:
        return False
    flags = [f"-XX:SharedArchiveFile={path}", QUIET, "-XX:-CreateCoredumpOnCrash", "-XX:ErrorFile=/dev/null"]
    try:
        return subprocess.run([exe, *flags, "-version"], capture_output=True, timeout=120).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def with_options(options: list[str], submit_opts: str | None) -> str:
    """SPARK_SUBMIT_OPTS: `options` (quoted as spark-submit parses them), then the caller's
    own (`submit_opts`), which win where both set the same thing (the JVM takes the last)."""
    return " ".join([shlex.quote(o) for o in options] + ([submit_opts] if submit_opts else []))


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
