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


def landing_files(directory: str) -> list[str]:
    """The files Spark would read in a landing directory: hidden (`.`/`_`) names and
    directories (`_wal/`) skipped, sorted."""
    out = []
    for root, dirs, files in os.walk(directory):
        dirs[:] = sorted(d for d in dirs if not d.startswith((".", "_")))
        out += [os.path.join(root, f) for f in files if not f.startswith((".", "_"))]
    return sorted(out)


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
