"""Landing zone: the durable, unchanged record of every PUBLISH the recorder received.

Layout of a landing directory (docs/ingest.md):

    landing-<recorder>-<segment>.parquet   complete files, the only ones readers look at
    .landing-<recorder>-<segment>.parquet.tmp   being written (hidden: Spark skips it)
    _wal/<recorder>-<segment>.wal          write-ahead log of the open segment
    _wal/<recorder>.lock                   held (flock) by the running recorder

A Parquet file is only readable once its footer is written, so the open segment
is a write-ahead log: each message is appended as a frame (length, CRC-32,
body) and the file is flushed and fsync'd before the PUBACKs go out. Rolling
(by size or age) converts the WAL into Parquet under a temporary name, fsyncs,
renames it into place, fsyncs the directory and only then deletes the WAL. On
start the recorder converts whatever WAL its previous run left; a torn frame at
the end (written but never acknowledged) is dropped and the broker redelivers
it. The Parquet name depends only on (recorder, segment), so a conversion that
is repeated after a crash rewrites the same file with the same rows.
"""

from __future__ import annotations

import array
import dataclasses
import errno
import fcntl
import itertools
import json
import os
import pathlib
import re
import struct
import threading
import time
import zlib

import pyarrow as pa
import pyarrow.parquet as pq

from mqbatch.util.private import open_private, private_dir

WAL_DIR = "_wal"
FRAME = struct.Struct("<II")  # body length, CRC-32 of the body
HEAD = struct.Struct("<I")  # length of the JSON header inside the body

USER_PROPERTY = pa.struct(
    [pa.field("key", pa.string(), nullable=False), pa.field("value", pa.string(), nullable=False)]
)
# The landing schema (docs/ingest.md). The first nine columns are the contract;
# the last four say where and how the row was landed.
SCHEMA = pa.schema(
    [
        pa.field("topic", pa.string(), nullable=False),
        pa.field("payload", pa.binary(), nullable=False),
        pa.field("user_properties", pa.list_(pa.field("element", USER_PROPERTY, nullable=False)), nullable=False),
        pa.field("content_type", pa.string()),
        pa.field("payload_format_indicator", pa.int32()),
        pa.field("message_expiry_interval", pa.int64()),
        pa.field("qos", pa.int32(), nullable=False),
        pa.field("retain", pa.bool_(), nullable=False),
        pa.field("received_at", pa.timestamp("us", tz="UTC"), nullable=False),
        pa.field("dup", pa.bool_(), nullable=False),
        pa.field("recorder", pa.string(), nullable=False),
        pa.field("segment", pa.int64(), nullable=False),
        pa.field("offset", pa.int64(), nullable=False),
    ]
)

_NAME_RE = re.compile(r"[A-Za-z0-9_.-]{1,64}")

# errors of the landing disk that the recorder waits out (it stops acknowledging and
# retries): full, read-only, failing, over quota, file too big
DISK_ERRNOS = frozenset({errno.ENOSPC, errno.EROFS, errno.EIO, errno.EDQUOT, errno.EFBIG})


def is_disk_error(e: BaseException) -> bool:
    """True for an OSError of the landing disk that may go away by itself (DISK_ERRNOS)."""
    return isinstance(e, OSError) and e.errno in DISK_ERRNOS


@dataclasses.dataclass
class Landed:
    """One received PUBLISH, as landed."""

    topic: str
    payload: bytes
    user_properties: list[tuple[str, str]]
    content_type: str | None = None
    payload_format_indicator: int | None = None
    message_expiry_interval: int | None = None
    qos: int = 1
    retain: bool = False
    received_at_us: int = 0  # µs since the Unix epoch, UTC
    dup: bool = False

    def encode(self) -> bytes:
        head = json.dumps(
            {
                "t": self.topic,
                "up": self.user_properties,
                "ct": self.content_type,
                "pfi": self.payload_format_indicator,
                "mei": self.message_expiry_interval,
                "q": self.qos,
                "r": self.retain,
                "at": self.received_at_us,
                "d": self.dup,
            },
            separators=(",", ":"),
        ).encode()
        return HEAD.pack(len(head)) + head + bytes(self.payload)

    @classmethod
    def decode(cls, body: bytes) -> "Landed":
        (n,) = HEAD.unpack_from(body)
        h = json.loads(body[HEAD.size : HEAD.size + n])
        return cls(
            h["t"],
            body[HEAD.size + n :],
            [tuple(p) for p in h["up"]],
            h["ct"],
            h["pfi"],
            h["mei"],
            h["q"],
            h["r"],
            h["at"],
            h["d"],
        )


def check_name(recorder: str) -> str:
    if not _NAME_RE.fullmatch(recorder):
        raise ValueError(f"recorder id {recorder!r} must be 1-64 characters of A-Z a-z 0-9 _ . -")
    return recorder


def parquet_name(recorder: str, segment: int) -> str:
    return f"landing-{recorder}-{segment:08d}.parquet"


def wal_name(recorder: str, segment: int) -> str:
    return f"{recorder}-{segment:08d}.wal"


def _fsync_dir(path: pathlib.Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def read_wal(path: pathlib.Path) -> tuple[list[Landed], int]:
    """The complete frames of a WAL file and the byte offset where they end
    (a torn or corrupt tail after it was never acknowledged). Holds the whole
    WAL in memory: tests and tools only; the recorder streams (WalReader)."""
    return read_wal_bytes(path.read_bytes())


def read_wal_bytes(data: bytes) -> tuple[list[Landed], int]:
    out, pos = [], 0
    while pos + FRAME.size <= len(data):
        n, crc = FRAME.unpack_from(data, pos)
        body = data[pos + FRAME.size : pos + FRAME.size + n]
        if len(body) < n or zlib.crc32(body) != crc:
            break
        out.append(Landed.decode(body))
        pos += FRAME.size + n
    return out, pos


class WalReader:
    """Reads a WAL incrementally: chunks() yields lists of Landed holding at most
    about chunk_bytes of frames (one frame more than that only if a single frame is
    bigger); afterwards .end is the byte offset where the complete frames end.
    Memory: one read buffer of 1 MiB plus one chunk, whatever the WAL's size."""

    READ = 1 << 20

    def __init__(self, path: pathlib.Path, chunk_bytes: int = 8 << 20):
        self.path, self.chunk_bytes, self.end = path, chunk_bytes, 0

    def chunks(self):
        rows, size, buf, pos = [], 0, b"", 0
        with open(self.path, "rb") as f:
            left = os.fstat(f.fileno()).st_size  # bytes not read yet
            while True:
                need = FRAME.size
                if pos + FRAME.size <= len(buf):
                    n, crc = FRAME.unpack_from(buf, pos)
                    need += n
                    if pos + need <= len(buf):
                        body = buf[pos + FRAME.size : pos + need]
                        if zlib.crc32(body) != crc:
                            break  # corrupt tail: never acknowledged
                        rows.append(Landed.decode(body))
                        pos += need
                        self.end += need
                        size += need
                        if size >= self.chunk_bytes:
                            yield rows
                            rows, size = [], 0
                        continue
                missing = need - (len(buf) - pos)
                if missing > left:
                    break  # torn tail (or the clean end)
                more = f.read(max(self.READ, missing))
                left -= len(more)
                buf = buf[pos:] + more
                pos = 0
        if rows:
            yield rows


def _bitmap(flags) -> tuple[pa.Buffer, int]:
    """An Arrow bitmap of an iterable of truth values, and how many were false."""
    bits, false = bytearray(), 0
    for i, flag in enumerate(flags):
        if i & 7 == 0:
            bits.append(0)
        if flag:
            bits[-1] |= 1 << (i & 7)
        else:
            false += 1
    return pa.py_buffer(bits), false


def _binary(values: list[bytes], typ: pa.DataType, valid: list | None = None) -> pa.Array:
    """A (string or binary) Arrow array straight from the bytes: one join, one offsets array."""
    offsets = array.array("i", [0])
    offsets.extend(itertools.accumulate(map(len, values)))
    if offsets[-1] >= 1 << 31:
        raise ValueError(f"{offsets[-1]} bytes in one column chunk: more than 2 GiB")
    validity, nulls = _bitmap(valid) if valid is not None else (None, 0)
    return pa.Array.from_buffers(
        typ, len(values), [validity, pa.py_buffer(offsets), pa.py_buffer(b"".join(values))], null_count=nulls
    )


def _fixed(values, typ: pa.DataType, code: str) -> pa.Array:
    """An int/timestamp Arrow array (None -> null) from an array.array of type code `code`."""
    values = list(values)
    validity, nulls = _bitmap(v is not None for v in values)
    data = array.array(code, [0 if v is None else v for v in values])
    return pa.Array.from_buffers(typ, len(values), [validity if nulls else None, pa.py_buffer(data)], null_count=nulls)


def _bools(values) -> pa.Array:
    values = list(values)
    return pa.Array.from_buffers(pa.bool_(), len(values), [None, _bitmap(values)[0]])


def to_table(rows: list[Landed], recorder: str, segment: int, first_offset: int = 0) -> pa.Table:
    """The landing rows of one chunk. Built from buffers (no per-row dict or Python list of
    rows for Arrow to copy again, and pyarrow's pa.array(list), which imports pandas:
    +47 MB of RSS, is never called)."""
    n = len(rows)
    offsets, keys, values = array.array("i", [0]), [], []  # user properties: flat key/value + offsets
    for r in rows:
        for k, v in r.user_properties:
            keys.append(k.encode())
            values.append(v.encode())
        offsets.append(len(keys))
    pairs = pa.StructArray.from_arrays(
        [_binary(keys, pa.string()), _binary(values, pa.string())], fields=list(USER_PROPERTY)
    )
    props = pa.Array.from_buffers(
        SCHEMA.field("user_properties").type, n, [None, pa.py_buffer(offsets)], children=[pairs]
    )
    content_types = [r.content_type for r in rows]
    return pa.Table.from_arrays(
        [
            _binary([r.topic.encode() for r in rows], pa.string()),
            _binary([bytes(r.payload) for r in rows], pa.binary()),
            props,
            _binary([(c or "").encode() for c in content_types], pa.string(), [c is not None for c in content_types]),
            _fixed((r.payload_format_indicator for r in rows), pa.int32(), "i"),
            _fixed((r.message_expiry_interval for r in rows), pa.int64(), "q"),
            _fixed((r.qos for r in rows), pa.int32(), "i"),
            _bools(r.retain for r in rows),
            _fixed((r.received_at_us for r in rows), pa.timestamp("us", tz="UTC"), "q"),
            _bools(r.dup for r in rows),
            _binary([recorder.encode()] * n, pa.string()),
            _fixed([segment] * n, pa.int64(), "q"),
            _fixed(range(first_offset, first_offset + n), pa.int64(), "q"),
        ],
        schema=SCHEMA,
    )


def write_parquet_atomic(table: pa.Table, directory: pathlib.Path, name: str) -> pathlib.Path:
    """Write `name` so that readers see either nothing or the complete file."""
    tmp = directory / f".{name}.tmp"
    final = directory / name
    with open(open_private(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), "wb") as f:  # 0600 whatever the umask
        pq.write_table(table, f, compression="zstd")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, final)
    _fsync_dir(directory)
    return final


class LandingWriter:
    """The open segment of one recorder: append, commit (fsync), roll into Parquet."""

    def __init__(
        self,
        directory: str | os.PathLike,
        recorder: str,
        roll_bytes: int = 64 << 20,
        roll_seconds: float = 60.0,
        chunk_bytes: int = 8 << 20,
        on_replay=None,
    ):
        """on_replay(rows): called at start for each chunk of rows (Landed with topic and user
        properties, payload left out) that the
        previous run's WAL segments held, as they are converted (the recorder acknowledges
        them end to end again: docs/e2e-ack.md)."""
        self.dir = pathlib.Path(directory)
        self.on_replay = on_replay
        self.recorder = check_name(recorder)
        self.roll_bytes = roll_bytes
        self.roll_seconds = roll_seconds
        self.chunk_bytes = chunk_bytes  # WAL bytes per Parquet row group when rolling (bounds memory)
        self.wal_dir = self.dir / WAL_DIR
        private_dir(self.dir)  # the folders it creates are 0700 (a folder the user made is left as it is)
        private_dir(self.wal_dir, tighten=True)
        lock_path = self.wal_dir / f"{recorder}.lock"
        try:
            lock_fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as e:  # a read-only or full disk: an existing lock file still locks
            if not (is_disk_error(e) and lock_path.exists()):
                raise
            lock_fd = os.open(lock_path, os.O_RDONLY)
        self._lock = open(lock_fd, "rb")
        try:
            fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._lock.close()
            raise RuntimeError(f"another recorder with id {recorder!r} is writing to {self.dir}") from None
        self.files_rolled = 0
        self.rows_landed = 0  # rows in the segments rolled by this writer
        self.torn: list[tuple[str, int]] = []  # (WAL name, bytes dropped) found at recovery
        # WAL segments closed but not yet in Parquet because the disk failed (converted by repair())
        self.unconverted: list[int] = []
        # the previous run's WAL could not be converted (a disk error): repair() retries it
        self.recovery_error: OSError | None = None
        self.recovered: list[pathlib.Path] = []
        try:
            self.recovered = self._recover()
        except OSError as e:
            if not is_disk_error(e):
                raise
            self.recovery_error = e
        self.segment = self._next_segment()
        self._wal: int | None = None  # file descriptor of the open WAL segment
        self._wal_rows = self._wal_size = 0
        self._pending = bytearray()  # frames appended since the last commit
        self._opened_at = 0.0
        self._roller: threading.Thread | None = None  # background roll (roll_in_background)
        self._roll_error: BaseException | None = None
        self.rolled: list[pathlib.Path | None] = []  # Parquet files written by background rolls

    # -- segments ------------------------------------------------------------
    def _segments(self, directory: pathlib.Path, name) -> list[int]:
        """Segment numbers of the files in `directory` called name(recorder, segment)."""
        rx = re.compile(re.escape(name(self.recorder, 0)).replace("00000000", r"(\d{8})", 1))
        return sorted(int(m.group(1)) for p in directory.iterdir() if (m := rx.fullmatch(p.name)))

    def _next_segment(self) -> int:
        used = self._segments(self.dir, parquet_name) + self._segments(self.wal_dir, wal_name)
        return (max(used) + 1) if used else 0

    def _recover(self) -> list[pathlib.Path]:
        done = [self._convert(seg, self.on_replay) for seg in self._segments(self.wal_dir, wal_name)]
        return [p for p in done if p is not None]

    def _convert(self, segment: int, on_rows=None) -> pathlib.Path | None:
        """WAL segment -> Parquet (atomic), then delete the WAL. None if it held no complete frame.
        Streamed: one row group per chunk of about chunk_bytes of WAL, so memory is bounded by
        chunk_bytes, not by the segment. A crash part-way leaves only the hidden .tmp file and
        the WAL; the next start converts the WAL again into the same name."""
        wal = self.wal_dir / wal_name(self.recorder, segment)
        reader = WalReader(wal, self.chunk_bytes)
        name = parquet_name(self.recorder, segment)
        tmp, final = self.dir / f".{name}.tmp", self.dir / name
        rows = 0
        replay: list[list[Landed]] = []  # for on_rows once the file is in place (a retried conversion: once)
        try:
            with open(open_private(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), "wb") as f:  # 0600
                with pq.ParquetWriter(f, SCHEMA, compression="zstd") as pw:
                    for chunk in reader.chunks():
                        pw.write_table(to_table(chunk, self.recorder, segment, rows), row_group_size=len(chunk))
                        rows += len(chunk)
                        if on_rows is not None:  # topic and properties only: no payloads kept
                            replay.append([Landed(m.topic, b"", m.user_properties) for m in chunk])
                f.flush()
                os.fsync(f.fileno())
        except OSError:
            tmp.unlink(missing_ok=True)  # give the space back; the WAL stays
            raise
        size = wal.stat().st_size
        if reader.end < size:  # a torn last frame: written, never fsync'd, never acknowledged
            self.torn.append((wal.name, size - reader.end))
        out = None
        if rows:
            os.replace(tmp, final)
            _fsync_dir(self.dir)
            out = final
            self.files_rolled += 1
            self.rows_landed += rows
        else:
            tmp.unlink()
        wal.unlink()
        _fsync_dir(self.wal_dir)
        for chunk in replay:
            assert on_rows is not None
            on_rows(chunk)
        return out

    # -- the open segment ----------------------------------------------------
    def append(self, msg: Landed) -> None:
        """Buffer one message for the open WAL segment (written and durable only at commit())."""
        self._check_roller()
        if self._wal is None:
            self._wal = os.open(
                self.wal_dir / wal_name(self.recorder, self.segment), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600
            )
            self._wal_rows = self._wal_size = 0
            self._opened_at = time.monotonic()
            _fsync_dir(self.wal_dir)
        body = msg.encode()
        self._pending += FRAME.pack(len(body), zlib.crc32(body))
        self._pending += body
        self._wal_rows += 1

    def commit(self) -> None:
        """Write what was appended in one system call and fsync it: it survives a crash.
        (One write per group, not per message: each I/O call releases the GIL, and getting
        it back from paho's busy network thread costs up to the switch interval.)"""
        if self._wal is None:
            return
        whole = view = memoryview(self._pending)
        try:
            while view:
                view = view[os.write(self._wal, view) :]
        finally:  # released even if a write fails (the traceback keeps this frame; abandon() clears the buffer)
            view.release()
            whole.release()
        os.fsync(self._wal)
        self._wal_size += len(self._pending)  # durable only now (abandon() cuts back to it)
        self._pending.clear()

    def abandon(self) -> None:
        """After a failed append or commit: drop what was appended since the last commit
        (never acknowledged), cut the open segment back to what was committed and close
        it (a write after a failed fsync proves nothing: the next commit goes to a new
        segment); its committed frames are converted into Parquet by repair()."""
        self._pending.clear()
        if self._wal is None:
            return
        fd, self._wal = self._wal, None
        try:
            os.ftruncate(fd, self._wal_size)
        except OSError:
            pass  # a torn tail is dropped when the segment is read (CRC)
        try:
            os.close(fd)
        except OSError:
            pass
        self.unconverted.append(self.segment)
        self.segment += 1

    @property
    def needs_repair(self) -> bool:
        return self.recovery_error is not None or bool(self.unconverted)

    def repair(self) -> None:
        """Finish what a disk error interrupted: convert the previous run's WAL and the
        segments closed since. Raises the disk's error again while it lasts."""
        self.wait_rolled()
        if self.recovery_error is not None:
            self.recovered += self._recover()
            self.recovery_error = None
        while self.unconverted:
            self._convert(self.unconverted[0])
            self.unconverted.pop(0)

    @property
    def pending_rows(self) -> int:
        return self._wal_rows if self._wal is not None else 0

    def due(self) -> bool:
        return (
            self._wal is not None
            and self._wal_rows > 0
            and (self._wal_size >= self.roll_bytes or time.monotonic() - self._opened_at >= self.roll_seconds)
        )

    def _close_wal(self) -> int | None:
        """Commit and close the open segment; returns its number (None: no open segment)."""
        if self._wal is None:
            return None
        self.commit()
        os.close(self._wal)
        self._wal = None
        self.segment += 1
        return self.segment - 1

    def roll(self) -> pathlib.Path | None:
        """Close the open segment into a Parquet file; the next append opens a new one."""
        self.wait_rolled()
        segment = self._close_wal()
        return None if segment is None else self._convert(segment)

    def roll_in_background(self) -> bool:
        """Close the open segment and convert it in a thread, so that appends and commits
        (and so PUBACKs) go on meanwhile. At most one conversion runs: a second roll
        waits for the first. Crash safety is the same as roll(): the WAL is fsync'd and
        stays until its Parquet file is in place; a start converts what is left.
        Returns True if a segment was handed over."""
        self.wait_rolled()
        segment = self._close_wal()
        if segment is None:
            return False
        self._roller = threading.Thread(
            target=self._convert_in_thread, args=(segment,), name=f"landing-roll-{segment}", daemon=True
        )
        self._roller.start()
        return True

    def _convert_in_thread(self, segment: int) -> None:
        try:
            self.rolled.append(self._convert(segment))
        except OSError as e:
            if is_disk_error(e):  # the WAL stays: repair() converts it once the disk is back
                self.unconverted.append(segment)
            self._roll_error = e  # reported by the writer's next call (_check_roller)
        except BaseException as e:
            self._roll_error = e

    def _check_roller(self) -> None:
        if self._roll_error is not None:
            e, self._roll_error = self._roll_error, None
            text = f"rolling a segment into Parquet failed (its WAL is kept): {type(e).__name__}: {e}"
            if isinstance(e, OSError) and e.errno is not None:  # kept: a disk error is waited out (is_disk_error)
                raise OSError(e.errno, text) from e
            raise OSError(text) from e

    def wait_rolled(self) -> None:
        """Wait for a background roll to finish; raise its error if it failed."""
        if self._roller is not None:
            self._roller.join()
            self._roller = None
        self._check_roller()

    def close(self) -> pathlib.Path | None:
        try:
            out = self.roll()
        finally:
            fcntl.flock(self._lock, fcntl.LOCK_UN)
            self._lock.close()
        return out


def read_landing(directory: str | os.PathLike) -> pa.Table:
    """All complete landing files of a directory as one table (tests, tools)."""
    files = sorted(pathlib.Path(directory).glob("landing-*.parquet"))
    odd = [f.name for f in files if not f.is_file()]
    if odd:  # never skipped in silence: a folder named like a landing file is not one
        raise ValueError(f"{directory}: {', '.join(odd[:5])} named like landing files but not regular files")
    if not files:
        return SCHEMA.empty_table()
    return pa.concat_tables([pq.read_table(f, schema=SCHEMA) for f in files])
