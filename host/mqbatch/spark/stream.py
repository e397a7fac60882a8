"""Streaming mode: the landing zone as a stream of file names, each micro-batch decoded
once (foreachBatch) and written idempotently under its batch id.

A micro-batch is the list of landing files that appeared since the last one (Spark's
file source and its checkpoint decide which, by name). For batch id N the job

 1. skips it if `_batches/N.json` exists (committed before a crash, replayed by Spark);
 2. deletes every output file tagged `bN-` (left by an attempt that was killed);
 3. decodes the readable files once, drops records an earlier batch took (same device,
    boot, seq and content, received within --watermark before this batch's first landed
    row: the narrow _content column of their _decoded/ rows, _earlier_copies, read only
    when the seen state of the last commit says a record may be such a copy, and then only
    the rows of those devices and boots, from the batch its marks allow:
    mqbatch.spark.seen), writes records/, quarantine/, _decoded/ (without payloads, with
    _content) and the seen state after this batch (_seen/) to `_staging/bN/`;
 4. moves the staged files into place, named `bN-...`: the rows are readable in records/
    from here on (time to table does not wait for the report);
 5. computes report.json of the state after this batch (from _decoded/ and the commits)
    into `.report.json.bN`, writes `_batches/N.json` (the commit, with the quarantined
    files), and renames the waiting report to report.json. With --report-seconds S, only
    when S seconds have passed since the last report (ReportCadence): else it writes the
    commit alone and report.json stays that of an earlier commit until a later micro-batch
    or a restart recomputes it (also while the stream is idle; a stop says so in one line);
    the report's cost grows with the history, the rows' time to table must not. With
    --report-seconds the report is computed beside the stream (mqbatch.spark.beside: a thread
    and scheduler pool of its own, on the idle cores, of the commits up to N), so no
    micro-batch waits for it; report.json then counts the commits up to the one it started at.

So a SIGKILL at any moment, then a restart, gives the files of an uninterrupted run (the
restart first deletes the files of a batch moved into place but not committed, then Spark
replays that batch; report.json only ever counts committed batches); a stop
between a commit and its rename leaves report.json to settle_report (without Spark: on the
way out after a stop signal, and at the restart, which also rewrites report.json from the
committed state before anything else, unless it is byte for byte the one written after the
newest commit: REPORT_STATE), and one stream at a time holds the checkpoint
(CHECKPOINT/.lock, an flock the kernel drops when its holder dies; `mqbatch spark` checks
it before spark-submit starts a JVM)."""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.resources
import json
import math
import os
import pathlib
import re
import shutil
import threading
import time
import urllib.parse

from pyspark import StorageLevel
from pyspark.sql import DataFrame, Observation, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from mqbatch.spark import files as landing_files
from mqbatch.spark import seen, warmup
from mqbatch.spark.accounting import CHANNELS_READ
from mqbatch.spark.beside import Beside
from mqbatch.spark.checkpoint import (
    check_same_checkpoint,
    checkpoint_of,
    commits_mark,
    hold_checkpoint,
)
from mqbatch.spark.options import JobOptions
from mqbatch.spark.pipeline import (
    CONTENT,
    build_report,
    content_hash,
    deduplicate,
    job_decode,
    make_private,
    private_output,
    read_landing,
    records,
    size_shuffle,
    write_outputs,
    write_report,
)
from mqbatch.spark.schema import DECODED_SCHEMA
from mqbatch.util.private import private_dir, write_private

SEEN = "_seen"  # the seen state of each micro-batch (mqbatch.spark.seen), the newest committed kept
OUTPUTS = ("records", "quarantine", "_decoded", SEEN)
# the binaryFile source's fixed schema; the job selects `path` only, so file contents are not read
FILE_SOURCE_SCHEMA = "path string, modificationTime timestamp, length long, content binary"


def _local(uri: str) -> str:
    parsed = urllib.parse.urlparse(uri)
    return urllib.parse.unquote(parsed.path) if parsed.scheme in ("", "file") else uri


def _tag(batch_id: int) -> str:
    return f"b{batch_id:010d}"


def _has_parquet(path: pathlib.Path) -> bool:
    return path.is_dir() and any(path.rglob("*.parquet"))


def _commit_paths(out: pathlib.Path) -> list[pathlib.Path]:
    """The commits (_batches/N.json), oldest first."""
    return sorted((out / "_batches").glob("*.json"))


def _committed(out: pathlib.Path) -> list[dict]:
    return [json.loads(p.read_text(encoding="utf-8")) for p in _commit_paths(out)]


def _report_of(
    spark: SparkSession,
    out: pathlib.Path,
    bad: list[dict],
    opts: JobOptions,
    landing: str | None,
    upto: int | None = None,
    task_bytes: int = 0,
) -> dict:
    """report.json of the decoded rows under out/_decoded and the quarantined files `bad`
    (with the landing entries the job skips, files.skipped_report, when `landing` is given);
    `upto`: of the micro-batches up to that batch id only (the report beside the stream: later
    ones may commit while it runs); `task_bytes` > 0 (the report beside the stream, in a session
    of its own): its tasks read and shuffle about that many bytes of _decoded/ each. The records' content hashes are read from _decoded/
    (CONTENT), computed again only for the rows of batches an older mqbatch committed (KEYED)."""
    decoded_dir = out / "_decoded"
    schema = T.StructType(DECODED_SCHEMA.fields + [T.StructField(CONTENT, T.LongType())])
    commits = [c for c in _committed(out) if upto is None or c["batch_id"] <= upto]
    if upto is None:
        parts = list(decoded_dir.rglob("*.parquet")) if decoded_dir.is_dir() else []
        paths = [str(decoded_dir)]
    else:
        by_batch = _batch_files(decoded_dir)
        paths = [f for b in sorted(by_batch) if b <= upto for f in by_batch[b]]
        parts = [pathlib.Path(f) for f in paths]
    if task_bytes:
        spark.conf.set("spark.sql.files.maxPartitionBytes", str(task_bytes))
    if parts:
        with _listed_here(spark, len(paths)):
            decoded = spark.read.schema(schema).parquet(*paths)
        if any(not c.get(KEYED) for c in commits):
            decoded = decoded.withColumn(CONTENT, F.coalesce(F.col(CONTENT), content_hash()))
    else:
        decoded = spark.createDataFrame([], schema)
    history = sum(f.stat().st_size for f in parts)  # the report's shuffle partitions (below)
    with _at_least(spark, SHUFFLE_PARTITIONS, math.ceil(history / (task_bytes or REPORT_BYTES_PER_PARTITION))):
        report = build_report(decoded, opts, bad_files=bad)  # (its records de-duplicated once)
    if landing is not None:
        report["skipped_landing_entries"] = landing_files.skipped_report(landing)
    return report


_TAGGED = re.compile(r"b(\d{10})-")  # an output file of micro-batch N: bN-<Spark's name>


def drop_uncommitted_outputs(out: pathlib.Path) -> int:
    """Deletes the output files of micro-batches without a commit: moved into place, then the
    job died or was stopped before the commit. Spark replays such a batch, which writes them
    again (step 2 would delete them then; this does it before anything reports). Only while
    no batch runs: at the start and after the query stopped. Returns how many."""
    committed = {c["batch_id"] for c in _committed(out)}
    dropped = 0
    for name in OUTPUTS:
        for f in (out / name).rglob("b*-*"):
            m = _TAGGED.match(f.name)
            if m and f.is_file() and int(m.group(1)) not in committed:
                f.unlink()
                dropped += 1
    return dropped


def stream_report(spark: SparkSession, out: str, opts: JobOptions, landing: str | None = None) -> dict:
    """report.json of everything the stream has committed so far, written (while no batch runs:
    the outputs of a batch without a commit are dropped first, drop_uncommitted_outputs).
    When report.json is the one this job wrote for the same commits and options
    (_current_report), it is not computed again: a run with nothing new reads no history."""
    out_p = pathlib.Path(out)
    drop_uncommitted_outputs(out_p)
    report = _current_report(out_p, opts, landing)
    if report is None:
        bad = [b for c in _committed(out_p) for b in c["quarantined_files"]]
        report = _report_of(spark, out_p, bad, opts, landing)
        write_report(report, out_p)
        _note_reported(out_p)
    return report


# what report.json was computed from, written after it took effect: the commits (how many and
# the newest) and the SHA-256 of report.json as written. A stop before it leaves the older one:
# the report is computed again.
REPORT_STATE = ".report-state.json"


# the modules whose code makes report.json (build_report and what it calls): a report written by
# other code (an upgrade, a fix) is computed again
REPORT_CODE = (
    *("pipeline.py", "accounting.py", "arrival.py", "schema.py", "options.py", "stream.py"),
    *("jvm.py", "java/BootFigures.java"),  # the report's JVM pass (per boot, released, latency)
)


@functools.lru_cache(maxsize=1)
def _report_code() -> str | None:
    """SHA-256 of REPORT_CODE's source as this process imports it (also from spark-submit's zip);
    None when it cannot be read (a report is then never reused)."""
    try:
        package = importlib.resources.files("mqbatch.spark")
        digest = hashlib.sha256()
        for name in REPORT_CODE:
            digest.update(package.joinpath(name).read_bytes())
        return digest.hexdigest()
    except (OSError, ImportError, AttributeError):
        return None


def _note_reported(out: pathlib.Path, mark: list | None = None) -> None:
    """REPORT_STATE of report.json as it is now, computed from the commits `mark` (commits_mark
    when they were read; the newest by default)."""
    digest = hashlib.sha256((out / "report.json").read_bytes()).hexdigest()
    state = {"commits": mark or commits_mark(out), "report_sha256": digest, "code_sha256": _report_code()}
    write_private(out / REPORT_STATE, json.dumps(state) + "\n")


def _report_state(out: pathlib.Path) -> dict | None:
    """REPORT_STATE as _note_reported wrote it, or None (missing, unreadable, another shape)."""
    try:
        state = json.loads((out / REPORT_STATE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return state if isinstance(state, dict) else None


def report_behind(out: pathlib.Path) -> str | None:
    """Without Spark: a line saying report.json counts fewer commits than `_batches/` holds
    (--report-seconds skipped the newer ones' reports), or None when it counts them all."""
    mark = commits_mark(out)
    state = _report_state(out)
    counted = state.get("commits") if state is not None else None
    if counted == mark or not mark[0]:
        return None
    n = counted[0] if isinstance(counted, list) and counted else 0
    return (
        f"report.json counts {n} of the {mark[0]} committed micro-batches (--report-seconds); "
        f"the next start, or `mqbatch spark --once` on the same --out, recomputes it first"
    )


def _current_report(out: pathlib.Path, opts: JobOptions, landing: str | None) -> dict | None:
    """report.json when it is exactly what this job wrote after the newest commit (REPORT_STATE:
    same commits, same bytes, same code: REPORT_CODE) for the same options, else None. Its skipped landing entries are
    counted again (no Spark) and report.json rewritten if they changed."""
    state = _report_state(out)
    try:
        data = (out / "report.json").read_bytes()
    except OSError:
        return None
    if state is None or state.get("commits") != commits_mark(out):
        return None
    if state.get("report_sha256") != hashlib.sha256(data).hexdigest():
        return None
    if state.get("code_sha256") is None or state.get("code_sha256") != _report_code():
        return None
    report = json.loads(data)
    if report.get("options") != json.loads(json.dumps(opts.report_dict())):
        return None
    if landing is None:
        report.pop("skipped_landing_entries", None)
    elif report.get("skipped_landing_entries") != (skipped := landing_files.skipped_report(landing)):
        report["skipped_landing_entries"] = skipped
        write_report(report, out)
        _note_reported(out)
    return report


def _commit_path(out: pathlib.Path, batch_id: int) -> pathlib.Path:
    return out / "_batches" / f"{batch_id:010d}.json"


def _next_report(out: pathlib.Path, batch_id: int) -> pathlib.Path:
    """Where batch N's report waits for its commit (written before it, promoted after)."""
    return out / f".report.json.{_tag(batch_id)}"


def _promote(waiting: pathlib.Path, out: pathlib.Path) -> None:
    """The waiting report becomes report.json; its mtime is then the moment it did (after the
    commit: what a reader that polls report.json's mtime against the commits expects)."""
    os.replace(waiting, out / "report.json")
    os.utime(out / "report.json")


def settle_report(out: pathlib.Path, drop_uncommitted: bool = False) -> None:
    """Makes report.json match the commits without Spark (safe after a stop signal, when the
    JVM may be gone): a batch's report written before its commit is promoted if the commit
    exists; one without its commit is dropped when `drop_uncommitted` (no batch running).
    A stop between a commit and its report left report.json stale."""
    for waiting in sorted(out.glob(".report.json.b*")):
        with contextlib.suppress(FileNotFoundError):  # the batch promoted it itself meanwhile
            if _commit_path(out, int(waiting.name.rsplit(".b", 1)[1])).exists():
                _promote(waiting, out)
            elif drop_uncommitted:
                waiting.unlink()


# in a commit: this batch's _decoded/ rows carry the content hash of each record (CONTENT), so
# a later batch looks for earlier copies in 5 narrow columns of _decoded/ instead of hashing
# the readings of records/ (a batch committed by an older mqbatch has none: its records/ files)
KEYED = "decoded_content"


def _batch_files(directory: pathlib.Path) -> dict[int, list[str]]:
    """The output files under `directory` by micro-batch (their bN- tag), listed once."""
    by_batch: dict[int, list[str]] = {}
    for f in sorted(directory.rglob("b*-*.parquet")) if directory.is_dir() else ():
        m = _TAGGED.match(f.name)
        if m:
            by_batch.setdefault(int(m.group(1)), []).append(str(f))
    return by_batch


def _decoded_rows(decoded: DataFrame) -> DataFrame:
    """_decoded/ rows: the decoded rows without payloads, with CONTENT on each valid record,
    and of the readings only the one the report reads (released_unconfirmed: accounting): the
    readings are in records/, and the report and the look-back read CONTENT (CHANNELS_READ)."""
    is_record = F.col("reason").isNull() & F.col("sub_index").isNotNull()
    return (
        decoded.withColumn(CONTENT, F.when(is_record, content_hash()))
        .withColumn("payload", F.lit(None).cast("binary"))
        .withColumn("sub_payload", F.lit(None).cast("binary"))
        .withColumn("readings", F.filter("readings", lambda r: r["channel"].isin(*CHANNELS_READ)))
    )


def _look_back(out: pathlib.Path, since_us: int, from_batch: int = 0) -> tuple[list[str], list[str]]:
    """The files a micro-batch reads for earlier copies: (_decoded/ files of the KEYED commits,
    records/ files of the others), leaving out every committed batch before from_batch (a
    mark: seen.suspects) and every one whose latest landed row (received_max_us in its
    commit) is older than since_us. Only committed batches count."""
    commits = {c["batch_id"]: c for c in _committed(out)}
    recent = sorted(
        b
        for b, c in commits.items()
        if b >= from_batch and (c.get("received_max_us") is None or c["received_max_us"] >= since_us)
    )
    keyed = [b for b in recent if commits[b].get(KEYED)]
    older = [b for b in recent if not commits[b].get(KEYED)]
    # a directory is listed only when a batch is read from it: records/ (which grows with the
    # history) only for batches an older mqbatch committed
    decoded = _batch_files(out / "_decoded") if keyed else {}
    written = _batch_files(out / "records") if older else {}
    return [f for b in keyed for f in decoded.get(b, ())], [f for b in older for f in written.get(b, ())]


def _earlier_copies(spark: SparkSession, out: pathlib.Path, since_us: int, from_batch: int = 0) -> DataFrame | None:
    """(device, boot, seq, CONTENT) of the valid records the committed micro-batches took
    that were received at or after since_us, or None when there are none (_look_back: which
    files). From a KEYED batch every arrival counts, a later copy it dropped too (its
    _decoded/ rows: 5 narrow columns); from a batch an older mqbatch committed, the copies it
    kept in records/ (their content hashed from the columns again)."""
    narrow, old = _look_back(out, since_us, from_batch)
    since = F.timestamp_micros(F.lit(since_us))
    parts = []
    with _listed_here(spark, len(narrow) + len(old)):
        if narrow:
            fields = {f.name: f for f in DECODED_SCHEMA.fields}
            schema = T.StructType(
                [fields[c] for c in ("device", "boot", "seq", "received_at")] + [T.StructField(CONTENT, T.LongType())]
            )
            rows = spark.read.schema(schema).parquet(*narrow)  # CONTENT is set on valid records only
            parts.append(
                rows.where(F.col(CONTENT).isNotNull() & (F.col("received_at") >= since)).select(
                    "device", "boot", "seq", "received_at", CONTENT
                )
            )
        if old:
            rows = spark.read.option("basePath", str(out / "records")).parquet(*old)
            parts.append(
                rows.where(
                    (F.col("date") >= F.date_format(since, "yyyy-MM-dd")) & (F.col("received_at") >= since)
                ).select("device", "boot", "seq", "received_at", content_hash().alias(CONTENT))
            )
    return functools.reduce(DataFrame.unionByName, parts) if parts else None


PARALLEL_LISTING = "spark.sql.sources.parallelPartitionDiscovery.threshold"
SHUFFLE_PARTITIONS = "spark.sql.shuffle.partitions"
# the stream's report takes at least one shuffle partition per this many bytes of _decoded/
# (narrow rows: about 15 bytes a record in its Parquet, some 60-100 in the persisted arrival
# keys of build_report): about a million records a partition. With the micro-batches' two, a
# partition of an 18 M-record history ran a 1 GB driver out of heap (docs/scale.md)
REPORT_BYTES_PER_PARTITION = 16 * 1024 * 1024
# the report beside the stream: a task reads (and shuffles) about this much of _decoded/ (some
# 250,000 records), so a micro-batch's task, served first, waits about that long for a core
BESIDE_TASK_BYTES = 4 * 1024 * 1024


def _listed_here(spark: SparkSession, paths: int):
    """Spark lists more paths than PARALLEL_LISTING's value (32 by default) with a Spark job of
    its own, a task per path: 0.57 s for the 128 files of a look-back over 6 M records on 2
    cores, more than the driver takes to stat them. The look-back's files are local (found
    with pathlib, _look_back), so while `paths` are read the driver lists them itself."""
    return _at_least(spark, PARALLEL_LISTING, paths)


@contextlib.contextmanager
def _at_least(spark: SparkSession, key: str, value: int):
    """Within the block the session's setting `key` (an integer) is at least `value`; after it,
    as it was (unset if it was)."""
    before = spark.conf.get(key)
    if before is not None and value <= int(before):
        yield
        return
    spark.conf.set(key, str(value))
    try:
        yield
    finally:
        if before is None:
            spark.conf.unset(key)
        else:
            spark.conf.set(key, before)


def _since_us(spark: SparkSession, first_us: int, watermark: str) -> int:
    """first_us - the watermark (a Spark interval such as '1 hour', as Spark reads it), in
    microseconds: a query of one row and no data."""
    since = F.timestamp_micros(F.lit(first_us)) - F.expr(f"INTERVAL {watermark}")
    return spark.range(1).select(F.unix_micros(since).alias("s")).collect()[0]["s"]


def _latest_commit(out: pathlib.Path) -> dict | None:
    commits = _commit_paths(out)
    return json.loads(commits[-1].read_text(encoding="utf-8")) if commits else None


def _seen_file(out: pathlib.Path, batch_id: int) -> pathlib.Path:
    return out / SEEN / f"{_tag(batch_id)}-{seen.NAME}"


def _known(out: pathlib.Path) -> seen.Seen | None:
    """The seen state after the newest commit (an empty state that has seen everything before
    the first commit), or None when that commit has none (an older mqbatch)."""
    latest = _latest_commit(out)
    if latest is None:
        return seen.Seen(seen.EMPTY, seen.EVERYTHING)
    state = seen.load(_seen_file(out, latest["batch_id"]))
    start = latest.get(seen.SEEN_FROM)
    return None if state is None or start is None else seen.Seen(state, start, seen.marks_of(latest))


def _drop_older_seen(out: pathlib.Path, batch_id: int) -> None:
    """Deletes the seen states of the batches before batch_id (committed: only the newest is read)."""
    for older, files in _batch_files(out / SEEN).items():
        if older < batch_id:
            for f in files:
                pathlib.Path(f).unlink(missing_ok=True)


def _new_records(
    spark: SparkSession, arrivals: DataFrame, out: pathlib.Path, opts: JobOptions, first_us: int | None, batch_id: int
) -> tuple[DataFrame, seen.Seen | None]:
    """The first arrival of each record of `arrivals` (pipeline.deduplicate), without the
    records an earlier micro-batch took (received within the watermark before first_us, this
    batch's earliest landed row) with the same content: a resend is dropped, a key collision
    (same key, other content) is kept. From one small aggregate of the batch's keys
    (seen.of_arrivals): the batch is de-duplicated only if two of its arrivals share a key,
    and the earlier batches' files are read only if the seen state (mqbatch.spark.seen) says
    that a record may be such a copy. Returns the records and the seen state after this batch."""
    known = _known(out)
    if first_us is None:
        return deduplicate(arrivals), known
    since = _since_us(spark, first_us, opts.watermark)
    batch = seen.of_arrivals(arrivals)
    unique = deduplicate(arrivals) if seen.repeats_within(batch) else arrivals
    if known is not None and since >= known.from_us:  # the state covers this batch's look-back
        table, marks = seen.refreshed(known.table, known.marks, batch_id, first_us)
        after = seen.Seen(seen.merged(table, batch, since), max(known.from_us, since), marks)
        suspects = seen.suspects(table, batch, since, marks)
        if not suspects.num_rows:
            return unique, after
        earlier = _earlier_copies(spark, out, since, seen.look_back_from(suspects))
        if earlier is not None:
            earlier = _of_suspects(spark, earlier, suspects)
    else:  # the state anew from the look-back (read twice then: a late file, an upgrade)
        earlier = _earlier_copies(spark, out, since)
        base = seen.EMPTY if earlier is None else seen.of_arrivals(earlier)
        after = seen.Seen(seen.merged(base, batch, since), since)
    if earlier is None:
        return unique, after
    key = ["device", "boot", "seq", CONTENT]
    copies = earlier.select(*key)
    return unique.withColumn(CONTENT, content_hash()).join(copies, key, "left_anti").drop(CONTENT), after


def _of_suspects(spark: SparkSession, earlier: DataFrame, suspects) -> DataFrame:
    """The rows of `earlier` whose (device, boot) is a suspect (seen.suspects) and whose seq is
    within its lo..hi: the only earlier arrivals a record of the batch can be a copy of. A
    broadcast filter in the scan's own stage (the suspects are a row per device and boot at
    most): the rows of the other devices, the history's bulk, are still read but dropped
    there, never shuffled nor joined with the micro-batch (a resend made a micro-batch join
    the whole watermark)."""
    rows = spark.createDataFrame(
        list(zip(*(suspects.column(c).to_pylist() for c in ("device", "boot", "lo", "hi")))),
        "_s_device string, _s_boot bigint, _s_lo bigint, _s_hi bigint",
    )
    hit = (
        (F.col("device") == F.col("_s_device"))
        & (F.col("boot") == F.col("_s_boot"))
        & F.col("seq").between(F.col("_s_lo"), F.col("_s_hi"))
    )
    return earlier.join(F.broadcast(rows), hit, "left_semi")


def _counts() -> tuple:
    """A micro-batch's counts of its decoded rows (observed while _decoded/ is written)."""
    return (
        F.sum(F.col("landed_first").cast("long")).alias("landed"),
        F.sum(F.col("reason").isNotNull().cast("long")).alias("quarantined"),
    )


OBSERVED_WAIT_S = 60.0


def _observed(observation: Observation) -> dict | None:
    """The observation's metrics once the write that carried them ended, or None if Spark has
    not delivered them within OBSERVED_WAIT_S (a listener event can be dropped when Spark's
    listener queue overflows: Observation.get would then wait for ever)."""
    try:
        done = observation._jo.future().isCompleted  # type: ignore[union-attr]
    except Exception:  # another Spark: its own get
        return observation.get
    deadline = time.monotonic() + OBSERVED_WAIT_S
    while not done():
        if time.monotonic() > deadline:
            return None
        time.sleep(0.01)
    return observation.get


def _move_staged(staging: pathlib.Path, out: pathlib.Path, tag: str) -> None:
    for name in OUTPUTS:
        for src in sorted((staging / name).rglob("*.parquet")):
            rel = src.relative_to(staging / name)
            dst = out / name / rel.parent / f"{tag}-{rel.name}"
            private_dir(dst.parent)
            os.replace(src, dst)


class ReportCadence:
    """When a micro-batch recomputes report.json: after every one (every_s 0, the default),
    or only once every_s seconds have passed since the last report (--report-seconds).
    The first micro-batch of a run reports unless the run began with a report (run_stream
    calls done() after the one it writes at a restart)."""

    def __init__(self, every_s: float = 0.0):
        if every_s < 0:
            raise ValueError(f"report interval {every_s} s: must be >= 0")
        self.every_s = every_s
        self.last: float | None = None

    def due(self) -> bool:
        return not self.every_s or self.last is None or time.monotonic() - self.last >= self.every_s

    def next_in(self) -> float:
        """Seconds until the next report is due (0 if due now)."""
        if self.due():
            return 0.0
        assert self.last is not None  # due() otherwise
        return self.every_s - (time.monotonic() - self.last)

    def done(self) -> None:
        self.last = time.monotonic()


def process_batch(
    spark: SparkSession,
    files_df: DataFrame,
    batch_id: int,
    out: str,
    opts: JobOptions,
    say=print,
    landing: str | None = None,
    checkpoint: str | None = None,
    on_report=None,
    cadence: ReportCadence | None = None,
    beside: Beside | None = None,
) -> None:
    """One micro-batch (the module's steps). `beside` (with a cadence of every_s > 0, as
    run_stream passes with --report-seconds): report.json is computed beside the stream
    (_report_beside) instead of in this micro-batch's path; its failure fails the next one."""
    out_p, tag = pathlib.Path(out), _tag(batch_id)
    commit = _commit_path(out_p, batch_id)
    report_beside = beside is not None and cadence is not None and cadence.every_s > 0
    if beside is not None:
        beside.raise_failure()  # the last report's failure fails the stream, as it would inline
    if commit.exists():
        say(f"batch {batch_id}: already committed, skipped", flush=True)
        return
    started = time.monotonic()
    paths = sorted(_local(r.path) for r in files_df.collect())
    say(f"batch {batch_id}: started, {len(paths)} new landing files", flush=True)
    for name in OUTPUTS:  # what a killed attempt of this batch left
        for leftover in (out_p / name).rglob(f"{tag}-*"):
            leftover.unlink()
    good, bad = landing_files.split_files(paths)
    size_shuffle(spark, good)
    decoded = job_decode(spark, read_landing(spark, good), opts).persist(StorageLevel.MEMORY_AND_DISK)
    try:
        span = landing_files.received_span(good)  # on the driver: no Spark job
        unique, state = _new_records(spark, records(decoded), out_p, opts, span and span[0], batch_id)
        staging = out_p / "_staging" / tag
        shutil.rmtree(staging, ignore_errors=True)
        if state is not None:
            seen.save(state.table, staging / SEEN)
        # the batch's counts are observed while its outputs are written (no Spark job of their own)
        written, observed = Observation("records"), Observation("decoded")
        write_outputs(decoded, unique.observe(written, F.count(F.lit(1)).alias("records")), str(staging))
        _decoded_rows(decoded.observe(observed, *_counts())).write.mode("overwrite").parquet(str(staging / "_decoded"))
        counts, written_count = _observed(observed), _observed(written)
    finally:
        decoded.unpersist()
    if counts is None or written_count is None:  # (never seen here) Spark did not deliver the metrics
        say(f"batch {batch_id}: Spark did not report the batch's counts within {OBSERVED_WAIT_S:g} s: counted again")
        counts = spark.read.parquet(str(staging / "_decoded")).agg(*_counts()).collect()[0].asDict()
        records_dir = staging / "records"
        n_records = spark.read.parquet(str(records_dir)).count() if _has_parquet(records_dir) else 0
    else:
        n_records = written_count["records"]
    make_private(staging)  # before the files move into place
    # the rows are readable in records/ now, before the report (whose cost grows with the
    # stream's history): a restart before the commit deletes them (step 2) and writes the same
    _move_staged(staging, out_p, tag)
    readable = time.monotonic() - started
    bad_now = [b.as_dict() for b in bad]
    done = (
        f"batch {batch_id}: {len(paths)} files ({len(bad)} quarantined), {counts['landed'] or 0} landed rows, "
        f"{n_records} new records, {counts['quarantined'] or 0} quarantined rows, "
        f"in records/ after {readable:.1f} s"
    )
    # else the commit alone: report.json stays an earlier one's
    reporting = not report_beside and (cadence is None or cadence.due())
    if reporting:
        # the report of the state after the commit, written before it: commit and report.json move
        # together (settle_report promotes it if a stop comes in between, here or at the restart)
        report = _report_of(
            spark, out_p, [b for c in _committed(out_p) for b in c["quarantined_files"]] + bad_now, opts, landing
        )
        waiting = write_report(report, out_p, _next_report(out_p, batch_id).name)
    private_dir(commit.parent)
    write_private(
        commit,
        json.dumps(
            {
                "batch_id": batch_id,
                "files": paths,
                "quarantined_files": bad_now,
                KEYED: True,
                "received_max_us": span and span[1],
                **({seen.SEEN_FROM: state.from_us, seen.SEEN_MARKS: state.marks} if state is not None else {}),
            },
            indent=1,
        ),
    )
    _drop_older_seen(out_p, batch_id)
    if reporting:
        _promote(waiting, out_p)
        _note_reported(out_p)
    shutil.rmtree(staging, ignore_errors=True)
    if checkpoint is not None:
        make_private(checkpoint)
    if report_beside:
        assert cadence is not None and beside is not None
        if cadence.due() and _report_beside(beside, out_p, batch_id, opts, landing, on_report, say):
            cadence.done()
            say(f"{done}, report.json being recomputed beside the stream", flush=True)
            return
    if not reporting:
        assert cadence is not None
        wait = (
            "the last one still running"
            if beside is not None and beside.busy()
            else f"next in {cadence.next_in():.0f} s"
        )
        say(f"{done}, report.json not recomputed ({wait}: --report-seconds)", flush=True)
        return
    if cadence is not None:
        cadence.done()
    if on_report is not None:
        on_report(out)
    say(f"{done}, report.json after {time.monotonic() - started:.1f} s", flush=True)


def _report_beside(
    beside: Beside, out: pathlib.Path, batch_id: int, opts: JobOptions, landing: str | None, on_report, say
) -> bool:
    """Starts report.json of the commits up to `batch_id` (just committed) beside the stream
    (beside.Beside: the micro-batches go on meanwhile), unless the last one still runs (False).
    It is written as process_batch writes its own, after its commit (so promoted by
    settle_report if a stop comes in between), with REPORT_STATE's mark of those commits: a
    report.json that counts fewer commits than exist is computed again at the end."""
    mark, bad = commits_mark(out), [b for c in _committed(out) for b in c["quarantined_files"]]

    def work(session: SparkSession) -> None:
        started = time.monotonic()
        report = _report_of(session, out, bad, opts, landing, upto=batch_id, task_bytes=BESIDE_TASK_BYTES)

        def write() -> None:  # (not after a stop began: the stop's own report counts every commit)
            _promote(write_report(report, out, _next_report(out, batch_id).name), out)
            _note_reported(out, mark)

        if beside.publish(write):
            say(f"batch {batch_id}: report.json after {time.monotonic() - started:.1f} s beside the stream", flush=True)
            if on_report is not None:
                on_report(str(out))

    return beside.start(f"report.json of batch {batch_id}", work)


_SAYING = threading.Lock()


def _whole_lines(say):
    """`say` (print, or a callback that prints) called one thread at a time."""

    def said(*args, **kwargs):
        with _SAYING:
            return say(*args, **kwargs)

    return said


def run_stream(
    spark: SparkSession,
    landing: str,
    out: str,
    opts: JobOptions,
    checkpoint: str | None = None,
    trigger_seconds: int | None = None,
    say=print,
    on_report=None,
    report_seconds: float = 0.0,
    max_bytes_per_trigger: int = 0,
    warm_up: bool = False,
) -> dict:
    """Structured Streaming over the landing zone. trigger_seconds None: every file not
    yet processed, then stop (availableNow); else a micro-batch every trigger_seconds
    until the query is stopped (KeyboardInterrupt, SIGTERM in the job). `on_report(out)`, if
    given, is called after each rewrite of report.json (the command writes the HTML report).
    report_seconds > 0: a micro-batch starts report.json's computation beside the stream
    (_report_beside) only if that long has passed since the last one started (ReportCadence)
    and it ended. max_bytes_per_trigger > 0: a micro-batch takes at
    most that many bytes of landing files (at least one file; Spark's maxBytesPerTrigger, also
    with availableNow), so a backlog is taken in bounded steps. A run that ends by itself (availableNow) reports
    every commit on the way out; a stop signal leaves report.json as the last report (no Spark
    then: the JVM may be gone) and says so in one line (report_behind); the next start
    recomputes it before anything else. warm_up: two micro-batches of its own first
    (mqbatch.spark.warmup), so the first landing files do not wait for a cold JVM."""
    cadence = ReportCadence(report_seconds)
    if report_seconds > 0:  # two threads print: each line whole (print writes its end apart)
        say, on_report = _whole_lines(say), on_report and _whole_lines(on_report)
    aside = Beside(spark, say) if report_seconds > 0 else None
    if "://" in out:
        raise SystemExit("telemetry_job: --stream/--once write to a local --out only")
    landing_files.scan(landing)  # a clear error for a missing directory
    checkpoint = checkpoint_of(out, checkpoint)
    private_output(spark, out)
    trigger = {"availableNow": True} if trigger_seconds is None else {"processingTime": f"{trigger_seconds} seconds"}
    with hold_checkpoint(checkpoint):  # one stream per checkpoint, or one clear line
        check_same_checkpoint(out, checkpoint)  # ... and the commits under --out are its own
        # a restart makes report.json match the committed outputs at once (a SIGKILL between
        # a batch's commit and its report would leave it stale until new data arrived)
        settle_report(pathlib.Path(out), drop_uncommitted=True)
        if _committed(pathlib.Path(out)):
            stream_report(spark, out, opts, landing)  # also drops a moved but uncommitted batch
            cadence.done()
            if on_report is not None:
                on_report(out)
        else:
            drop_uncommitted_outputs(pathlib.Path(out))
        warmup.remove(out)  # what a killed warm-up left
        if warm_up:
            try:
                say(f"telemetry_job: {warmup.warm_up(spark, out, opts, process_batch).line()}", flush=True)
            except Exception as e:  # an optimisation only: the job streams cold, and says why
                say(f"telemetry_job: the warm-up failed ({type(e).__name__}: {e}); streaming cold", flush=True)

        def batch(df: DataFrame, batch_id: int) -> None:
            process_batch(spark, df, batch_id, out, opts, say, landing, checkpoint, on_report, cadence, aside)

        source = spark.readStream.format("binaryFile").schema(FILE_SOURCE_SCHEMA)
        if max_bytes_per_trigger:
            source = source.option("maxBytesPerTrigger", str(max_bytes_per_trigger))
        query = (
            source.load(landing)
            .select("path")
            .writeStream.foreachBatch(batch)
            .option("checkpointLocation", f"{checkpoint}/landing")
            .trigger(**trigger)
            .queryName("telemetry")
            .start()
        )
        say(
            f"telemetry_job: streaming {landing} -> {out} ("
            f"{'every file not yet processed, then stop' if trigger_seconds is None else f'every {trigger_seconds} s'})",
            flush=True,
        )
        try:
            query.awaitTermination()
        finally:
            try:
                if query.isActive:
                    query.stop()
            finally:  # after a stop signal the JVM may be gone: no Spark here (but a cancel tried)
                if aside is not None:  # a report beside the stream: cancelled (the one below counts every commit)
                    aside.stop()
                settle_report(pathlib.Path(out))
                behind = report_behind(pathlib.Path(out))
                if behind is not None:
                    say(f"telemetry_job: {behind}", flush=True)
        report = stream_report(spark, out, opts, landing)
        make_private(out)
        make_private(checkpoint)
        if on_report is not None:
            on_report(out)
        return report
