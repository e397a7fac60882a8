"""Which landing files the job can read. A landing zone may hold a file no recorder
wrote (a README, a truncated copy, another tool's Parquet with other columns, a topic
that is not UTF-8): such a file is quarantined by name with a reason, and the job reads
the rest. Checked on the driver with pyarrow (footer, schema, UTF-8 of the string
columns; payloads are not read). Local paths only: a URL landing zone (hdfs://, ...)
is handed to Spark as a directory, unchecked."""

from __future__ import annotations

import dataclasses
import os
import pathlib

import pyarrow as pa
import pyarrow.parquet as pq

from mqbatch.ingest import landing

FILE_NOT_PARQUET = "LANDING_FILE_NOT_PARQUET"  # no Parquet magic (a README, a log, ...)
FILE_UNREADABLE = "LANDING_FILE_UNREADABLE"  # Parquet magic but footer or data unreadable (truncated)
FILE_WRONG_SCHEMA = "LANDING_FILE_WRONG_SCHEMA"  # a landing column missing or of another type
FILE_NOT_UTF8 = "LANDING_FILE_NOT_UTF8"  # a string column (topic, ...) holds bytes that are not UTF-8
FILE_REASONS = (FILE_NOT_PARQUET, FILE_UNREADABLE, FILE_WRONG_SCHEMA, FILE_NOT_UTF8)

CONTRACT = landing.SCHEMA.names[:9]  # a landing file must have these; the rest are optional
STRING_COLUMNS = ["topic", "user_properties", "content_type", "recorder"]


@dataclasses.dataclass(frozen=True)
class BadFile:
    file: str
    reason: str
    detail: str

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


def _shape(t: pa.DataType):
    """A type with what does not matter to Spark's reader removed (names of list
    elements, nullability, timestamp unit and zone)."""
    if pa.types.is_timestamp(t):
        return "timestamp"
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return ("list", _shape(t.value_type))
    if pa.types.is_struct(t):
        return ("struct", tuple((t.field(i).name, _shape(t.field(i).type)) for i in range(t.num_fields)))
    if pa.types.is_large_string(t):
        return str(pa.string())
    if pa.types.is_large_binary(t):
        return str(pa.binary())
    return str(t)


def check_file(path: str) -> BadFile | None:
    """None if the job can read this landing file, else why not."""
    name = os.path.basename(path)
    with open(path, "rb") as f:
        head = f.read(4)
    if head != b"PAR1":
        return BadFile(path, FILE_NOT_PARQUET, f"{name} does not start with the Parquet magic PAR1")
    try:
        pf = pq.ParquetFile(path)
        schema = pf.schema_arrow
    except (pa.ArrowException, OSError) as e:
        return BadFile(path, FILE_UNREADABLE, f"{name}: {str(e)[:300]}")
    for field in landing.SCHEMA:
        if field.name not in schema.names:
            if field.name in CONTRACT:
                return BadFile(path, FILE_WRONG_SCHEMA, f"{name} lacks the landing column {field.name!r}")
            continue
        got = schema.field(field.name).type
        if _shape(got) != _shape(field.type):
            return BadFile(path, FILE_WRONG_SCHEMA, f"{name}: column {field.name!r} is {got}, not {field.type}")
    columns = [c for c in STRING_COLUMNS if c in schema.names]
    try:
        for i in range(pf.num_row_groups):
            table = pf.read_row_group(i, columns=columns)
            for column in columns:
                try:
                    table.column(column).validate(full=True)
                except pa.ArrowInvalid as e:
                    return BadFile(path, FILE_NOT_UTF8, f"{name}: column {column!r}, row group {i}: {str(e)[:200]}")
    except (pa.ArrowException, OSError) as e:
        return BadFile(path, FILE_UNREADABLE, f"{name}: {str(e)[:300]}")
    return None


# landing entries the job does not read (and does not quarantine): counted in report.json
SKIPPED_HIDDEN = "HIDDEN_NAME"  # a `.`/`_` name: the recorder's in-progress .tmp files, its _wal/, ...
SKIPPED_EMPTY_DIRECTORY = "EMPTY_DIRECTORY"  # a directory holding no file the job reads or quarantines
SKIPPED_NOT_A_FILE = "NOT_A_REGULAR_FILE"  # a fifo, socket, device or dangling link
MAX_LISTED_SKIPS = 100  # report.json lists at most this many skipped entries (all are counted)


def walk(directory: str) -> tuple[list[str], list[tuple[str, str]]]:
    """(the files Spark would read in a landing directory, sorted; the entries skipped, as
    (path, reason)). Hidden (`.`/`_`) names are skipped with their contents (one entry);
    subdirectories are read through; a directory that yields no file is one entry skipped
    (whatever hidden or empty things are inside it)."""
    files: list[str] = []
    skipped: list[tuple[str, str]] = []

    def visit(path: str) -> int:
        found = 0
        with os.scandir(path) as entries:
            for e in sorted(entries, key=lambda e: e.name):
                if e.name.startswith((".", "_")):
                    skipped.append((e.path, SKIPPED_HIDDEN))
                elif e.is_dir():
                    before = len(skipped)
                    inner = visit(e.path)
                    if not inner:  # one entry for the whole directory, not one per thing in it
                        del skipped[before:]
                        skipped.append((e.path, SKIPPED_EMPTY_DIRECTORY))
                    found += inner
                elif e.is_file():
                    files.append(e.path)
                    found += 1
                else:
                    skipped.append((e.path, SKIPPED_NOT_A_FILE))
        return found

    visit(directory)
    return sorted(files), sorted(skipped)


def landing_files(directory: str) -> list[str]:
    """The files Spark would read in a landing directory (walk): hidden (`.`/`_`) names and
    directories (`_wal/`) skipped, sorted."""
    return walk(directory)[0]


def skipped_report(directory: str) -> dict:
    """report.json's `skipped_landing_entries` of a local landing directory: every entry the
    job neither read nor quarantined, counted by reason, the first MAX_LISTED_SKIPS listed."""
    skipped = [] if "://" in directory else walk(directory)[1]
    by_reason: dict = {}
    for _, reason in skipped:
        by_reason[reason] = by_reason.get(reason, 0) + 1
    return {
        "count": len(skipped),
        "by_reason": dict(sorted(by_reason.items())),
        "entries": [{"entry": path, "reason": reason} for path, reason in skipped[:MAX_LISTED_SKIPS]],
    }


def split_files(paths: list[str]) -> tuple[list[str], list[BadFile]]:
    """(readable files, quarantined files) of the given local paths."""
    good, bad = [], []
    for p in paths:
        problem = check_file(p)
        if problem is None:
            good.append(p)
        else:
            bad.append(problem)
    return good, bad


def scan(landing_dir: str) -> tuple[list[str], list[BadFile]]:
    if "://" in landing_dir:
        return [landing_dir], []
    if not pathlib.Path(landing_dir).is_dir():
        raise SystemExit(f"telemetry_job: landing zone {landing_dir!r} is not a directory")
    return split_files(landing_files(landing_dir))


def row_count(paths: list[str]) -> int | None:
    """The landed rows in these (readable, checked) local files, from their Parquet footers;
    None when one is a URL (not read on the driver)."""
    if any("://" in p for p in paths):
        return None
    return sum(pq.ParquetFile(p).metadata.num_rows for p in paths)


# topic_rows reads up to this many landed rows on the driver (one thread: about 0.1-0.3 s per
# 2 M rows, 2026-11-28); above it the rows per topic are a Spark job's
DRIVER_TOPIC_ROWS = 20_000_000


def topic_rows(paths: list[str], rows: int | None = None) -> dict | None:
    """Landed rows per topic of these (readable, checked) local files, a null topic counted as
    the topic None; None when one is a URL (not read on the driver) or when they hold more
    than DRIVER_TOPIC_ROWS rows (`rows`, the caller's row_count(paths), else their footers
    read here). Only the topic column is read, a file at
    a time, as a dictionary (the recorder's files hold it dictionary-encoded): run_batch's
    decision (pipeline.flags_in_decode) without a Spark job."""
    import pyarrow.compute as pc

    if any("://" in p for p in paths):
        return None
    if ((row_count(paths) or 0) if rows is None else rows) > DRIVER_TOPIC_ROWS:
        return None
    counts: dict = {}
    for p in paths:
        column = pq.ParquetFile(p, read_dictionary=["topic"]).read(columns=["topic"]).column(0)
        for pair in pc.value_counts(column).to_pylist():  # (nulls are a value of their own there)
            counts[pair["values"]] = counts.get(pair["values"], 0) + pair["counts"]
    return counts


def received_span(paths: list[str]) -> tuple[int, int] | None:
    """(earliest, latest) received_at of these readable, checked local files, in microseconds
    since the epoch (UTC), or None when they hold no rows. Their received_at column is read on
    the driver (8 bytes a row, no payload; any unit or zone check_file accepts, as Spark reads
    it). The stream bounds its look-back for duplicates with it, without a Spark job."""
    import pyarrow.compute as pc

    lows, highs = [], []
    for p in paths:
        column = pq.ParquetFile(p).read(columns=["received_at"]).column(0)
        span = pc.min_max(column.cast(pa.timestamp("us", tz="UTC"), safe=False).cast(pa.int64()))
        if span["min"].is_valid:
            lows.append(span["min"].as_py())
            highs.append(span["max"].as_py())
    return (min(lows), max(highs)) if lows else None
