"""Landing-zone writer (mqbatch.ingest.landing): WAL frames, rolling by size and age, atomic
Parquet files, recovery of a torn WAL after a crash, one writer per recorder id."""

from __future__ import annotations

import pathlib
import time

import pyarrow.parquet as pq
import pytest

from mqbatch.ingest import landing as L


def msg(i: int, size: int = 10) -> L.Landed:
    return L.Landed(
        f"mqbatch/d{i % 3}/telemetry",
        bytes([i % 256]) * size,
        [("batch-format", "v1"), ("k", "a"), ("k", "a"), ("batch-size", "1")],
        content_type="application/x" if i % 2 else None,
        payload_format_indicator=i % 2,
        message_expiry_interval=None if i % 2 else 3600,
        qos=1,
        retain=bool(i % 5 == 0),
        received_at_us=1_795_000_000_000_000 + i,
        dup=i % 7 == 0,
    )


def committed(directory, n: int) -> tuple[L.LandingWriter, pathlib.Path]:
    """A writer of recorder r1 with n messages appended and fsync'd, and its WAL path."""
    w = L.LandingWriter(directory, "r1")
    for i in range(n):
        w.append(msg(i))
    w.commit()
    return w, directory / "_wal" / "r1-00000000.wal"


def rows_of(directory):
    return L.read_landing(directory).to_pylist()


@pytest.mark.fast
def test_rolls_by_size_into_complete_parquet_files(tmp_path):
    w = L.LandingWriter(tmp_path, "r1", roll_bytes=300, roll_seconds=3600)
    rolled = []
    for i in range(10):
        w.append(msg(i, 100))
        w.commit()
        if w.due():
            rolled.append(w.roll())
    w.close()
    names = sorted(p.name for p in tmp_path.glob("landing-*.parquet"))
    assert len(rolled) >= 3 and names[0] == "landing-r1-00000000.parquet"
    rows = rows_of(tmp_path)
    assert [r["payload"] for r in rows] == [msg(i, 100).payload for i in range(10)]
    assert [(r["segment"], r["offset"]) for r in rows] == sorted((r["segment"], r["offset"]) for r in rows)
    first = rows[0]
    assert [(p["key"], p["value"]) for p in first["user_properties"]] == msg(0).user_properties
    assert (first["message_expiry_interval"], first["retain"], first["dup"], first["recorder"]) == (
        3600,
        True,
        True,
        "r1",
    )
    assert str(first["received_at"].tzinfo) == "UTC"
    assert not list(tmp_path.glob(".*")) and not list((tmp_path / "_wal").glob("*.wal"))
    assert pq.read_schema(tmp_path / names[0]) == L.SCHEMA


def test_rolls_by_age(tmp_path):
    w = L.LandingWriter(tmp_path, "r1", roll_bytes=1 << 30, roll_seconds=0.2)
    w.append(msg(1))
    w.commit()
    assert not w.due()
    time.sleep(0.25)
    assert w.due()
    assert w.roll().name == "landing-r1-00000000.parquet"
    assert not w.due() and w.roll() is None  # nothing open: nothing to roll
    w.close()


@pytest.mark.fast
def test_crash_recovery_keeps_committed_frames_and_drops_a_torn_tail(tmp_path):
    w, wal = committed(tmp_path, 5)
    with open(wal, "ab") as f:  # a frame cut short by the crash
        f.write(L.FRAME.pack(1000, 0) + b"partial")
    w._lock.close()  # the process died: its flock is gone
    w2 = L.LandingWriter(tmp_path, "r1")
    assert [p.name for p in w2.recovered] == ["landing-r1-00000000.parquet"]
    assert w2.torn == [("r1-00000000.wal", L.FRAME.size + len(b"partial"))]
    assert [r["payload"] for r in rows_of(tmp_path)] == [msg(i).payload for i in range(5)]
    w2.append(msg(9))
    w2.close()
    assert [r["segment"] for r in rows_of(tmp_path)] == [0] * 5 + [1]  # a new segment, never reusing 0


def test_repeated_conversion_after_a_crash_rewrites_the_same_file(tmp_path):
    w, wal = committed(tmp_path, 3)
    saved = wal.read_bytes()
    w.close()
    first = (tmp_path / "landing-r1-00000000.parquet").read_bytes()
    wal.write_bytes(saved)  # crash between rename and WAL deletion
    w2 = L.LandingWriter(tmp_path, "r1")
    w2.close()
    assert len(rows_of(tmp_path)) == 3
    assert L.read_landing(tmp_path).equals(L.to_table([msg(i) for i in range(3)], "r1", 0))
    assert (tmp_path / "landing-r1-00000000.parquet").read_bytes() == first


def test_corrupt_frame_ends_the_readable_wal(tmp_path):
    w, wal = committed(tmp_path, 3)
    data = bytearray(wal.read_bytes())
    data[-1] ^= 0xFF  # flip a byte of the last frame: CRC mismatch
    rows, end = L.read_wal_bytes(bytes(data))
    assert [r.payload for r in rows] == [msg(0).payload, msg(1).payload]
    assert end < len(data)
    w.close()


def test_one_writer_per_recorder_id(tmp_path):
    w = L.LandingWriter(tmp_path, "r1")
    with pytest.raises(RuntimeError, match="another recorder with id 'r1'"):
        L.LandingWriter(tmp_path, "r1")
    other = L.LandingWriter(tmp_path, "r2")  # a second recorder of the group: fine
    other.close()
    w.close()


@pytest.mark.parametrize("bad", ["", "a/b", "x" * 65, "rec 1", "../up"])
def test_recorder_ids_must_be_file_name_safe(tmp_path, bad):
    with pytest.raises(ValueError, match="recorder id"):
        L.LandingWriter(tmp_path, bad)


def reference_table(rows: list[L.Landed], recorder: str, segment: int, first: int = 0):
    """The landing table built row by row from Python lists (the way to_table used to)."""
    import pyarrow as pa

    return pa.Table.from_pydict(
        {
            "topic": [r.topic for r in rows],
            "payload": [r.payload for r in rows],
            "user_properties": [[{"key": k, "value": v} for k, v in r.user_properties] for r in rows],
            "content_type": [r.content_type for r in rows],
            "payload_format_indicator": [r.payload_format_indicator for r in rows],
            "message_expiry_interval": [r.message_expiry_interval for r in rows],
            "qos": [r.qos for r in rows],
            "retain": [r.retain for r in rows],
            "received_at": [r.received_at_us for r in rows],
            "dup": [r.dup for r in rows],
            "recorder": [recorder] * len(rows),
            "segment": [segment] * len(rows),
            "offset": list(range(first, first + len(rows))),
        },
        schema=L.SCHEMA,
    )


def test_columnar_to_table_equals_the_row_by_row_table(tmp_path):
    rows = [msg(i, size=i) for i in range(19)] + [
        L.Landed("mqbatch/ü/telemetry", b"", [], content_type="", qos=0),  # empty everything
        L.Landed("t", b"\0" * 70000, [("", "")] * 3, message_expiry_interval=2**32 - 1),
    ]
    table = L.to_table(rows, "r1", 7, first_offset=100)
    table.validate(full=True)
    assert table.equals(reference_table(rows, "r1", 7, 100))
    assert L.to_table([], "r1", 0).equals(L.SCHEMA.empty_table())


def test_roll_streams_the_wal_into_row_groups(tmp_path):
    w = L.LandingWriter(tmp_path, "r1", chunk_bytes=2000)
    rows = [msg(i, 300) for i in range(40)]
    for r in rows:
        w.append(r)
    w.commit()
    with open(tmp_path / "_wal" / "r1-00000000.wal", "ab") as f:  # a torn tail after the committed frames
        f.write(L.FRAME.pack(500, 0) + b"x" * 20)
    path = w.roll()
    meta = pq.ParquetFile(path).metadata
    assert meta.num_row_groups >= 5, "about chunk_bytes of WAL per row group"
    assert max(meta.row_group(i).num_rows for i in range(meta.num_row_groups)) <= 2000 // 300 + 1
    assert L.read_landing(tmp_path).equals(reference_table(rows, "r1", 0))
    assert w.torn == [("r1-00000000.wal", L.FRAME.size + 20)]
    w.close()


def test_background_roll_lets_appends_go_on(tmp_path):
    w = L.LandingWriter(tmp_path, "r1", chunk_bytes=4096)
    for i in range(30):
        w.append(msg(i, 200))
        w.commit()
        if i % 10 == 9:
            assert w.roll_in_background()
    w.close()  # waits for the last background roll, rolls the rest
    assert [p.name for p in w.rolled] == [L.parquet_name("r1", s) for s in range(3)]
    assert [r["payload"] for r in rows_of(tmp_path)] == [msg(i, 200).payload for i in range(30)]
    assert not list((tmp_path / "_wal").glob("*.wal")) and not list(tmp_path.glob(".*"))


def test_background_roll_failure_stops_the_writer_and_keeps_the_wal(tmp_path, monkeypatch):
    w = L.LandingWriter(tmp_path, "r1")
    w.append(msg(1))
    w.commit()

    def disk_full(*args, **kwargs):  # a full disk cannot be had here: injected
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(L.pq, "ParquetWriter", disk_full)
    assert w.roll_in_background()
    w._roller.join()
    with pytest.raises(OSError, match="rolling a segment into Parquet failed.*No space left"):
        w.append(msg(2))
    assert (tmp_path / "_wal" / "r1-00000000.wal").exists()
    monkeypatch.undo()
    w.close()
    w2 = L.LandingWriter(tmp_path, "r1")  # the next start converts the kept WAL
    assert [p.name for p in w2.recovered] == ["landing-r1-00000000.parquet"]
    w2.close()
    assert [r["payload"] for r in rows_of(tmp_path)] == [msg(1).payload]


def test_crash_mid_chunked_roll_is_redone_from_the_wal(tmp_path):
    w, wal = committed(tmp_path, 12)
    tmp = tmp_path / ".landing-r1-00000000.parquet.tmp"
    tmp.write_bytes(b"PAR1 half a row group")  # the roll was killed after its first row group
    w._lock.close()
    w2 = L.LandingWriter(tmp_path, "r1", chunk_bytes=100)
    assert [p.name for p in w2.recovered] == ["landing-r1-00000000.parquet"]
    assert not tmp.exists() and not wal.exists()
    assert L.read_landing(tmp_path).equals(reference_table([msg(i) for i in range(12)], "r1", 0))
    w2.close()


def test_read_landing_names_a_folder_named_like_a_landing_file(tmp_path):
    """Issue 23.5: no landing entry is skipped in silence (a folder `landing-*.parquet`)."""
    (tmp_path / "landing-x-00000000.parquet").mkdir()
    with pytest.raises(ValueError, match="landing-x-00000000.parquet named like landing files but not regular"):
        L.read_landing(tmp_path)


@pytest.mark.parametrize(
    "case, groups, slept",
    [
        ("wait", 1, [0]),  # the 5 arriving during the wait join the first message's group
        ("no wait", 2, []),  # commit_wait_s 0: they arrive while it is written, a group of their own
        # 20 (a fifth of receive_maximum) queued behind the first: no wait before the first group
        # (the second, with 4 behind its first, waits)
        ("enough waiting", 2, [1]),
        ("window full", 2, []),  # receive_maximum 1: the broker cannot send more, nothing to wait for
    ],
)
def test_group_commit_waits_only_when_more_can_come(tmp_path, monkeypatch, case, groups, slept):
    """RecorderConfig.commit_wait_s: woken by a message, the writer waits for more before the write
    and fsync, so they are one group (the bench's PUBLISHes per commit group), unless enough are
    queued already or the broker's window is full. Every message is landed once, in order.
    Deterministic: the recorder's sleep is replaced by one that delivers what arrives meanwhile."""
    import io
    import types

    from mqbatch.ingest import recorder as R

    queued_first = 20 if case == "enough waiting" else 0
    cfg = R.RecorderConfig(
        "127.0.0.1",
        1,
        str(tmp_path / "landing"),
        e2e_ack=False,
        commit_wait_s=0 if case == "no wait" else 0.001,
        receive_maximum=1 if case == "window full" else 100,
    )
    rec = R.Recorder(cfg, out=io.StringIO())
    item = lambda i: R._Item(L.Landed(f"mqbatch/dev-{i}/telemetry", b"x%d" % i, []), i + 1, 1, 0)  # noqa: E731
    n = 1 + queued_first + 5
    late = [item(i) for i in range(1 + queued_first, n)] + [None]
    calls = []

    def arrive():  # the messages right behind the first (and the end of the stream)
        while late:
            rec._queue.put(late.pop(0))

    def sleep(s):  # noted: how many groups were written before it
        assert s == 0.001
        calls.append(rec.commits)
        arrive()

    monkeypatch.setattr(R, "time", types.SimpleNamespace(**{**vars(R.time), "sleep": sleep}))
    real_append = rec.writer.append

    def append(msg):  # the first group is being written: the rest arrive now if not before
        arrive()
        return real_append(msg)

    rec.writer.append = append
    for i in range(1 + queued_first):
        rec._queue.put(item(i))
    rec._land_until_sentinel()
    assert calls == slept
    assert (rec.received, rec.landed, rec.commits) == (n, n, groups)
    rec.writer.close()
    assert [r["payload"] for r in L.read_landing(tmp_path / "landing").to_pylist()] == [b"x%d" % i for i in range(n)]


def test_group_commit_wait_is_bounded():
    from mqbatch.ingest.recorder import RecorderConfig

    for bad in (-0.001, 0.5):
        with pytest.raises(ValueError, match="commit_wait_s must be 0..0.1 s"):
            RecorderConfig("127.0.0.1", 1, "/nonexistent", commit_wait_s=bad)
