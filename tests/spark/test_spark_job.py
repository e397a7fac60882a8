"""The PySpark telemetry job (spark_jobs/telemetry_job.py) on the shared local SparkSession:
identical to the host decoder on tests/vectors/, exact records/quarantine/report on a
scenario landing zone, idempotent batch reruns, exactly-once streaming, `mqbatch spark`."""

from __future__ import annotations

import collections
import datetime as dt
import json
import os
import pathlib
import re
import shlex
import shutil
import subprocess
import time
import zipfile

import numpy as np
import pytest

from mqbatch.wire import codec, records
from mqbatch_testing import VENV_BIN, load_vectors
from mqbatch_testing.spark import T0_MS, cds_archive, health, landed, sample, write_landing

pytestmark = pytest.mark.spark


@pytest.fixture(scope="module")
def job(spark):
    import mqbatch.spark  # the pipeline's public API (spark_jobs/telemetry_job.py is its spark-submit entry)

    return mqbatch.spark


# -- tests/vectors: the job decodes exactly as mqbatch.wire.codec ------------------------

VECTORS = load_vectors()


def _vector_groups():
    groups = collections.defaultdict(list)
    for v in VECTORS:
        groups[json.dumps(v["options"], sort_keys=True)].append(v)
    return groups


def _vector_landing(directory: pathlib.Path, vectors) -> None:
    rows = [
        landed(
            f"mqbatch/vec-{i}/telemetry",
            [],
            T0_MS + i,
            props=v["user_properties"],
            payload=bytes.fromhex(v["payload_hex"]),
        )
        for i, v in enumerate(vectors)
    ]
    write_landing(directory, "vectors", 0, rows)


@pytest.mark.parametrize("options", sorted(_vector_groups()))
def test_job_decodes_vectors_exactly_as_host_decoder(job, spark, tmp_path, options):
    vectors = _vector_groups()[options]
    _vector_landing(tmp_path, vectors)
    opts = job.JobOptions(**json.loads(options))
    rows = job.decode(job.read_landing(spark, str(tmp_path)), opts).collect()
    by_vector = collections.defaultdict(list)
    for r in rows:
        by_vector[int(r["topic"].split("/")[1][4:])].append(r)
    assert sorted(by_vector) == list(range(len(vectors)))
    for i, v in enumerate(vectors):
        got = by_vector[i]
        host = codec.decode(v["user_properties"], bytes.fromhex(v["payload_hex"]), opts.decode_options())
        first = [r for r in got if r["landed_first"]]
        assert len(first) == 1, v["name"]
        batch_rows = [r for r in got if r["stage"] == "batch"]
        spark_result = (
            first[0]["batch_status"],
            batch_rows[0]["reason"] if batch_rows else None,
            [
                bytes(r["sub_payload"]).hex()
                for r in sorted(got, key=lambda r: r["sub_index"] or 0)
                if r["sub_index"] is not None
            ],
        )
        assert spark_result == (host.status, host.reason, [m.hex() for m in host.messages]), v["name"]
        assert spark_result == (v["expect"]["status"], v["expect"]["reason"], v["expect"]["messages_hex"]), v["name"]
        if batch_rows:
            assert batch_rows[0]["detail"] == host.log["detail"]
            assert bytes(batch_rows[0]["payload"]) == bytes.fromhex(v["payload_hex"])  # raw row kept


def test_job_report_on_vectors_matches_host_reference(job, spark, tmp_path):
    vectors = _vector_groups()["{}"]
    _vector_landing(tmp_path / "landing", vectors)
    report = job.run_batch(spark, str(tmp_path / "landing"), str(tmp_path / "out"), job.JobOptions())
    expected = collections.Counter()
    statuses = collections.Counter()
    for v in vectors:  # the host pipeline: codec.decode, then records.parse per sub-message
        res = codec.decode(v["user_properties"], bytes.fromhex(v["payload_hex"]))
        statuses[res.status] += 1
        if res.reason:
            expected[res.reason] += 1
        for m in res.messages:
            try:
                records.parse(m)
            except records.RecordError as e:
                expected[e.reason] += 1
    assert report["batches"] == dict(statuses)
    assert report["quarantine"]["by_reason"] == dict(expected)
    assert report["landed"] == len(vectors)


# -- scenario: duplicates, reordering, gaps, health, content errors, bad topic -------


def T(boot, seq):
    return T0_MS + boot * 100_000 + seq * 1000


A, B = "mqbatch/dev-a/telemetry", "mqbatch/dev-b/telemetry"
FUTURE = T(7, 3) + 100 + 2 * 86_400_000


def scenario_files():
    a2 = landed(A, [sample(1, 4)[0], sample(1, 5)[0]], T(1, 5) + 500)
    file1 = [
        landed(A, [sample(1, s)[0] for s in (0, 1, 2)], T(1, 2) + 500),
        a2,
        landed(A, [sample(1, 3)[0]], T(1, 5) + 1000),  # late: out of order
        landed(A, [], T(1, 5) + 2000, props=a2.user_properties, payload=a2.payload),  # redelivered copy
        landed(A, [sample(1, 8)[0], health(1, 9, dropped_total=2)[0]], T(1, 9) + 1000),  # 6, 7 never came
        landed(
            A,
            [],
            T(1, 11) + 500,
            props=[("batch-format", "v1"), ("batch-size", "3")],
            payload=codec.encode_payload([sample(1, 10)[0], sample(1, 11)[0]]),
        ),  # count mismatch
    ]
    file2 = [
        landed(A, [sample(2, 0)[0], sample(2, 1)[0], health(2, 2, dropped_total=1)[0]], T(2, 2) + 500),
        landed(
            B,
            [sample(7, 0, synced=False, fmt="json")[0], sample(7, 1, fmt="json")[0], sample(7, 2, fmt="json")[0]],
            T(7, 2) + 250,
        ),
        landed(
            B,
            [
                sample(7, 3)[0],
                sample(7, 4, temperature=20000)[0],
                b"\x02abc",
                records.encode_binary("sample", 7, 5, FUTURE, [(1, 2000)]),
            ],
            T(7, 3) + 100,
        ),
        landed("mqbatch/dev-c/status", [sample(1, 0)[0]], T(7, 3) + 200),
        landed(B, [], T(7, 3) + 300, props=[("batch-format", "v1")], payload=codec.encode_payload([sample(7, 6)[0]])),
        landed(B, [sample(7, 20)[0]], T(7, 20) + 700),
    ]
    return file1, file2


def _latency(values):
    a = np.array(values, dtype=float)
    return {
        "n": len(values),
        **{k: round(float(np.percentile(a, q)), 3) for k, q in (("p50", 50), ("p95", 95), ("p99", 99))},
    }


def _iso(ms):
    return dt.datetime.fromtimestamp(ms / 1000, dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _accounting(landed: int, absent: int, dropped: int, lost: int, dropped_landed: int) -> dict:
    """A device's report accounting (mqbatch.spark.accounting) when it released nothing."""
    return {
        "stored": landed + absent,
        "landed": landed,
        "absent": absent,
        "dropped": dropped,
        "released_unconfirmed": 0,
        "released_landed": 0,
        "released_not_landed": 0,
        "lost": lost,
        "dropped_landed": dropped_landed,
        "balanced": lost == 0 and dropped_landed == 0,
    }


# run_batch's steps, in order (its `seconds` keys and its progress lines)
STEPS = [
    "files.scan",
    "decode (to staging)",
    "deduplicate (keys)",
    "write records/",
    "write quarantine/",
    "build_report",
]


def expected_report(partial: bool, reorder_window: int = 3) -> dict:
    a_lat = [2500, 1500, 500, 1500, 500, 3000, 2000, 1000] + ([1500, 500] if partial else []) + [2500, 1500, 500]
    return {
        "options": {
            "partial": partial,
            "max_batch_size": 100,
            "max_payload_bytes": 65536,
            "allow_empty": True,
            "reorder_window": reorder_window,
            "max_future_s": 86400,
            "watermark": "1 hour",
        },
        "landed": 12,
        "received_at": {"min": _iso(T(1, 2) + 500), "max": _iso(T(7, 20) + 700)},
        "batches": {"ok": 10, "discarded": 1, "partial": 1} if partial else {"ok": 10, "discarded": 2},
        "records": {
            "received": 20 if partial else 18,
            "unique": 18 if partial else 16,
            "duplicates": 2,
            "key_collisions": 0,
        },
        "quarantine": {
            "rows": 6,
            "by_reason": {
                "MALFORMED_BATCH_COUNT_MISMATCH": 1,
                "MALFORMED_BATCH_MISSING_PROPERTY": 1,
                "RECORD_TIME_IN_FUTURE": 1,
                "RECORD_VALUE_OUT_OF_RANGE": 1,
                "TOPIC_NOT_TELEMETRY": 1,
                "UNKNOWN_RECORD_VERSION": 1,
            },
            "by_stage": {"batch": 2, "record": 3, "topic": 1},
            "files": 0,
            "files_by_reason": {},
        },
        "quarantined_files": [],
        "skipped_landing_entries": {"count": 0, "by_reason": {}, "entries": []},
        "devices": {
            "dev-a": {
                "boots": 2,
                "received": 15 if partial else 13,
                "unique": 13 if partial else 11,
                "duplicates": 2,
                "missing": 2 if partial else 1,
                "pending_gaps": 0 if partial else 1,
                "out_of_order": 1,
                "dropped_on_device": 3,
                "key_collisions": 0,
                "quarantined": 1,
                "latency_ms": _latency(a_lat),
                # 2 seqs absent (boot 1: 6, 7), 3 counted dropped: the counter says 1 more than is absent
                "accounting": _accounting(13 if partial else 11, 2, dropped=3, lost=0, dropped_landed=1),
            },
            "dev-b": {
                "boots": 1,
                "received": 5,
                "unique": 5,
                "duplicates": 0,
                "missing": 14,
                "pending_gaps": 2,
                "out_of_order": 0,
                "dropped_on_device": 0,
                "key_collisions": 0,
                "quarantined": 4,
                "latency_ms": _latency([1250, 250, 100, 700]),
                "accounting": _accounting(5, 16, dropped=0, lost=16, dropped_landed=0),
            },
        },
    }


@pytest.fixture(scope="module")
def scenario(tmp_path_factory):
    d = tmp_path_factory.mktemp("scenario")
    file1, file2 = scenario_files()
    write_landing(d, "r1", 0, file1)
    write_landing(d, "r1", 1, file2)
    return d


@pytest.fixture(scope="module")
def batch_default(job, spark, scenario, tmp_path_factory):
    """The batch job over the scenario with default options, run once for several tests."""
    out = tmp_path_factory.mktemp("batch-default")
    started = time.monotonic()
    report = job.run_batch(spark, str(scenario), str(out), job.JobOptions(reorder_window=3))
    print(f"batch job on the scenario landing zone: {time.monotonic() - started:.1f} s")
    return out, report


def _read(spark, path, *order):
    return [r.asDict(recursive=True) for r in spark.read.parquet(str(path)).orderBy(*order).collect()]


@pytest.mark.parametrize("partial", [pytest.param(False, marks=pytest.mark.fast), True], ids=["default", "partial"])
def test_scenario_records_quarantine_and_report_are_exact(job, spark, scenario, tmp_path, partial, request):
    if partial:
        report = job.run_batch(spark, str(scenario), str(tmp_path), job.JobOptions(partial=True, reorder_window=3))
    else:
        tmp_path, report = request.getfixturevalue("batch_default")
    assert report == expected_report(partial)
    assert json.loads((tmp_path / "report.json").read_text()) == report

    recs = _read(spark, tmp_path / "records", "device", "boot", "seq")
    a1 = [0, 1, 2, 3, 4, 5, 8, 9] + ([10, 11] if partial else [])
    assert [(r["device"], r["boot"], r["seq"]) for r in recs] == (
        [("dev-a", 1, s) for s in a1]
        + [("dev-a", 2, s) for s in (0, 1, 2)]
        + [("dev-b", 7, s) for s in (0, 1, 2, 3, 20)]
    )
    first = recs[0]
    assert first["kind"] == "sample" and first["synced"] and first["record_format"] == "binary"
    assert first["device_time"] == dt.datetime.fromtimestamp(T(1, 0) / 1000, dt.timezone.utc).replace(tzinfo=None)
    assert first["latency_ms"] == 2500.0 and first["sub_index"] == 0 and first["topic"] == A
    assert first["readings"] == [
        {"channel": 1, "name": "temperature", "value": 2150, "scaled": 21.5},
        {"channel": 3, "name": "supply_voltage", "value": 3300, "scaled": 3.3},
    ]
    seq3 = next(r for r in recs if (r["device"], r["boot"], r["seq"]) == ("dev-a", 1, 3))
    assert seq3["latency_ms"] == 3000.0 and seq3["offset"] == 2
    seq4 = next(r for r in recs if (r["device"], r["boot"], r["seq"]) == ("dev-a", 1, 4))
    assert seq4["offset"] == 1  # the first arrival is kept, not the redelivered copy (offset 3)
    json_rec = next(r for r in recs if r["device"] == "dev-b" and r["seq"] == 1)
    assert json_rec["record_format"] == "json"
    health_rec = next(r for r in recs if (r["device"], r["boot"], r["seq"]) == ("dev-a", 1, 9))
    assert (
        health_rec["kind"] == "health"
        and {"channel": 130, "name": "dropped_total", "value": 2, "scaled": 2.0} in health_rec["readings"]
    )

    quarantine = _read(spark, tmp_path / "quarantine", "segment", "offset", "sub_index")
    got = [
        (q["segment"], q["offset"], q["stage"], q["reason"], q["device"], q["sub_index"], q["batch_status"])
        for q in quarantine
    ]
    assert got == [
        (0, 5, "batch", "MALFORMED_BATCH_COUNT_MISMATCH", "dev-a", None, "partial" if partial else "discarded"),
        (1, 2, "record", "RECORD_VALUE_OUT_OF_RANGE", "dev-b", 1, "ok"),
        (1, 2, "record", "UNKNOWN_RECORD_VERSION", "dev-b", 2, "ok"),
        (1, 2, "record", "RECORD_TIME_IN_FUTURE", "dev-b", 3, "ok"),
        (1, 3, "topic", "TOPIC_NOT_TELEMETRY", None, None, "ok"),
        (1, 4, "batch", "MALFORMED_BATCH_MISSING_PROPERTY", "dev-b", None, "discarded"),
    ]
    file1, file2 = scenario_files()
    for q in quarantine:  # the raw landed row is kept as it was
        src = (file1, file2)[q["segment"]][q["offset"]]
        assert bytes(q["payload"]) == src.payload and q["topic"] == src.topic
        assert [(p["key"], p["value"]) for p in q["user_properties"]] == [tuple(p) for p in src.user_properties]
        assert q["detail"]
    assert bytes(quarantine[2]["sub_payload"]) == b"\x02abc"
    assert "temperature = 20000 is outside -5000..15000" in quarantine[1]["detail"]


def test_batch_rerun_is_idempotent(job, spark, scenario, batch_default):
    tmp_path, _ = batch_default
    opts = job.JobOptions(reorder_window=3)
    first = (
        (tmp_path / "report.json").read_bytes(),
        _read(spark, tmp_path / "records", "device", "boot", "seq"),
        _read(spark, tmp_path / "quarantine", "segment", "offset", "sub_index"),
    )
    job.run_batch(spark, str(scenario), str(tmp_path), opts)
    second = (
        (tmp_path / "report.json").read_bytes(),
        _read(spark, tmp_path / "records", "device", "boot", "seq"),
        _read(spark, tmp_path / "quarantine", "segment", "offset", "sub_index"),
    )
    assert first[0] == second[0]  # byte for byte
    assert first[1] == second[1] and len(second[1]) == 16  # overwritten, not appended
    assert first[2] == second[2] and len(second[2]) == 6


def test_batch_drops_later_copies_without_the_broadcast_hint_too(
    job, spark, scenario, batch_default, tmp_path, monkeypatch
):
    """Later copies of a record are dropped by row id with a broadcast anti-join when few
    (batch_default) and as Spark chooses beyond pipeline.BROADCAST_DUPLICATES: same output;
    the staged decoded rows are removed either way."""
    from mqbatch.spark import pipeline

    monkeypatch.setattr(pipeline, "BROADCAST_DUPLICATES", 0)
    seconds: dict = {}
    report = job.run_batch(spark, str(scenario), str(tmp_path), job.JobOptions(reorder_window=3), seconds)
    assert report == expected_report(False)
    batch_out, _ = batch_default
    for out in (tmp_path, batch_out):
        assert sorted(p.name for p in out.iterdir()) == ["quarantine", "records", "report.json"]
    assert _read(spark, tmp_path / "records", "device", "boot", "seq") == _read(
        spark, batch_out / "records", "device", "boot", "seq"
    )
    assert set(seconds) == set(STEPS)


@pytest.mark.slow
def test_stream_is_exactly_once_across_runs(job, spark, scenario, tmp_path, batch_default, monkeypatch, capsys):
    """Also time to table (issue 24): a micro-batch's rows are in records/ before its report
    is computed (the report reads the stream's whole history: its cost grows run after run)."""
    from mqbatch.spark import stream

    landing_dir, out = tmp_path / "landing", tmp_path / "out"
    landing_dir.mkdir()
    opts = job.JobOptions(reorder_window=3)
    shutil.copy(scenario / "landing-r1-00000000.parquet", landing_dir)
    report_of, in_records = stream._report_of, []

    def noting_records(*args):  # which batches' files records/ holds when a report starts
        in_records.append(sorted({p.name.split("-")[0] for p in (out / "records").rglob("*.parquet")}))
        return report_of(*args)

    monkeypatch.setattr(stream, "_report_of", noting_records)
    job.run_stream(spark, str(landing_dir), str(out), opts)
    assert in_records[0] == [stream._tag(0)], in_records  # batch 0's own report: its rows already there
    # ... and the only one: the run's last report.json is batch 0's (stream._current_report)
    assert len(in_records) == 1, in_records
    keys = [(r["device"], r["boot"], r["seq"]) for r in _read(spark, out / "records", "device", "boot", "seq")]
    assert keys == [("dev-a", 1, s) for s in (0, 1, 2, 3, 4, 5, 8, 9)]  # the redelivered copy dropped

    # the recorder renames complete files into place; a rerun picks up only the new one
    (landing_dir / ".landing-r1-00000001.parquet.tmp").write_bytes(
        (scenario / "landing-r1-00000001.parquet").read_bytes()
    )
    os.replace(landing_dir / ".landing-r1-00000001.parquet.tmp", landing_dir / "landing-r1-00000001.parquet")
    started = time.monotonic()
    report = job.run_stream(spark, str(landing_dir), str(out), opts)
    print(f"stream run over one new landing file: {time.monotonic() - started:.1f} s")
    assert len(in_records) == 2, in_records  # batch 1's report only: none at the restart, none at the end
    job.run_stream(spark, str(landing_dir), str(out), opts)  # nothing new: nothing written twice
    assert len(in_records) == 2, in_records  # ... nor a report computed again

    batch_out, batch_report = batch_default  # the same two files, read by the batch job
    assert report == batch_report == expected_report(False)
    cols = ["device", "boot", "seq", "batch_id", "sub_index", "received_at", "readings"]
    stream_recs = [{k: r[k] for k in cols} for r in _read(spark, out / "records", "device", "boot", "seq")]
    batch_recs = [{k: r[k] for k in cols} for r in _read(spark, batch_out / "records", "device", "boot", "seq")]
    assert stream_recs == batch_recs and len(stream_recs) == 16
    # each micro-batch's line counts what it wrote (observed while writing): they add up to the outputs
    lines = re.findall(r"^batch \d+: .*$", capsys.readouterr().out, re.M)
    done = [re.search(r"(\d+) landed rows, (\d+) new records, (\d+) quarantined rows", x) for x in lines]
    done = [tuple(map(int, m.groups())) for m in done if m]
    assert len(done) == 2, lines
    assert [sum(col) for col in zip(*done)] == [report["landed"], len(stream_recs), report["quarantine"]["rows"]], done
    q_cols = ["segment", "offset", "sub_index", "reason", "payload"]
    assert [{k: q[k] for k in q_cols} for q in _read(spark, out / "quarantine", *q_cols[:3])] == [
        {k: q[k] for k in q_cols} for q in _read(spark, batch_out / "quarantine", *q_cols[:3])
    ]


def _one_batch_streamed_then_a_second_file(job, spark, scenario, tmp_path):
    """The stream over the scenario's first landing file (batch 0, committed), then its second
    file in the landing zone: (landing, out, options, the report after batch 0)."""
    landing_dir, out = tmp_path / "landing", tmp_path / "out"
    landing_dir.mkdir()
    opts = job.JobOptions(reorder_window=3)
    shutil.copy(scenario / "landing-r1-00000000.parquet", landing_dir)
    first = job.run_stream(spark, str(landing_dir), str(out), opts)
    shutil.copy(scenario / "landing-r1-00000001.parquet", landing_dir)
    return landing_dir, out, opts, first


def test_report_seconds_commits_a_micro_batch_without_recomputing_the_report(
    job, spark, scenario, tmp_path, monkeypatch, capsys
):
    """--report-seconds (issue 24, time to table): a micro-batch within the interval writes its rows
    and its commit only; report.json stays the earlier commit's, and the report on the way out
    counts every commit (the report's cost grows with the history, the rows' time must not)."""
    from mqbatch.spark import stream

    landing_dir, out, opts, first = _one_batch_streamed_then_a_second_file(job, spark, scenario, tmp_path)
    report_of, seen = stream._report_of, []

    def noting(*args):  # what is committed, in report.json, and what a stop would say, when a report starts
        committed = sorted(p.name for p in (out / "_batches").glob("*.json"))
        seen.append((committed, json.loads((out / "report.json").read_text()), stream.report_behind(out)))
        return report_of(*args)

    monkeypatch.setattr(stream, "_report_of", noting)
    report = job.run_stream(spark, str(landing_dir), str(out), opts, report_seconds=3600)
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("batch 1: ") and "started" not in x)
    assert "in records/ after" in line and "report.json not recomputed (next in" in line, line
    assert stream._tag(1) in {p.name.split("-")[0] for p in (out / "records").rglob("*.parquet")}
    # one report in this run, the one on the way out: batch 1 was committed before it, and until
    # then report.json was batch 0's
    behind = "report.json counts 1 of the 2 committed micro-batches (--report-seconds)"
    assert [x[:2] for x in seen] == [(["0000000000.json", "0000000001.json"], first)], seen
    assert seen[0][2].startswith(behind), seen  # what a stop signal at that moment would print
    assert stream.report_behind(out) is None  # the report on the way out counts every commit
    assert report == json.loads((out / "report.json").read_text()) == expected_report(False) != first
    with pytest.raises(ValueError, match="report interval -1 s: must be >= 0"):
        stream.ReportCadence(-1)


def test_a_report_beside_the_stream_never_holds_a_micro_batch(job, spark, scenario, tmp_path, monkeypatch, capsys):
    """--report-seconds (issue 24): report.json is computed beside the stream. Its cost grows with
    the history (about a minute at 10,000 devices after 15 minutes, in the micro-batch's path):
    here a report held until the test lets it go must not keep the next micro-batch from its
    commit. The report runs in its own scheduler pool and session (a setting it changes does
    not reach the stream's), counts the commits up to its batch, and the one on the way out
    counts every commit."""
    import threading

    from mqbatch.spark import beside, stream

    landing_dir, out = tmp_path / "landing", tmp_path / "out"
    landing_dir.mkdir()
    for name in ("landing-r1-00000000.parquet", "landing-r1-00000001.parquet"):
        shutil.copy(scenario / name, landing_dir)
    gate, inside, real = threading.Event(), [], stream.build_report

    def held(decoded, *args, **kwargs):
        session = decoded.sparkSession
        session.conf.set("spark.sql.shuffle.partitions", "77")  # the report's own setting
        inside.append(
            (
                spark.sparkContext.getLocalProperty("spark.scheduler.pool"),
                session is spark,
                spark.conf.get("spark.sql.shuffle.partitions"),
            )
        )
        assert gate.wait(180), "the test never let the report go"
        return real(decoded, *args, **kwargs)

    monkeypatch.setattr(stream, "build_report", held)
    result: dict = {}
    opts = job.JobOptions(reorder_window=3)

    def run():
        try:
            result["report"] = job.run_stream(
                spark, str(landing_dir), str(out), opts, report_seconds=3600, max_bytes_per_trigger=1
            )
        except BaseException as e:  # noqa: BLE001 - asserted below
            result["error"] = e

    streaming = threading.Thread(target=run, daemon=True)
    streaming.start()
    try:
        committed = lambda: sorted(p.name for p in (out / "_batches").glob("*.json"))  # noqa: E731
        deadline = time.monotonic() + 90
        while len(committed()) < 2 and streaming.is_alive() and time.monotonic() < deadline:
            time.sleep(0.2)
        # both micro-batches committed while batch 0's report was held
        assert committed() == ["0000000000.json", "0000000001.json"], (committed(), result)
        assert not (out / "report.json").exists()
        assert inside and inside[0] == (beside.POOL, False, inside[0][2]) and inside[0][2] != "77", inside
    finally:
        gate.set()
        streaming.join(300)
    assert not streaming.is_alive() and "error" not in result, result
    lines = capsys.readouterr().out.splitlines()
    assert any(
        x.startswith("batch 0: ") and x.endswith("report.json being recomputed beside the stream") for x in lines
    ), lines
    assert any(
        x.startswith("batch 1: ") and "report.json not recomputed (the last one still running" in x for x in lines
    ), lines
    assert stream.report_behind(out) is None  # the report on the way out counts every commit
    assert result["report"] == json.loads((out / "report.json").read_text()) == expected_report(False)


def test_a_report_beside_the_stream_counts_its_commits_and_its_failure_fails_the_next_batch(
    job, spark, scenario, tmp_path, monkeypatch
):
    """The report beside the stream counts the commits up to its batch, whatever committed since
    (REPORT_STATE says so, and the report at the end is computed again); a report that fails
    fails the next micro-batch with the reason (inline, it failed its own)."""
    from mqbatch.spark import beside, stream

    landing_dir, out, opts, first = _one_batch_streamed_then_a_second_file(job, spark, scenario, tmp_path)
    shutil.rmtree(out)  # the same files again, as micro-batches called one by one
    files = lambda name: spark.createDataFrame([(str(landing_dir / name),)], "path string")  # noqa: E731
    aside, cadence = beside.Beside(spark), stream.ReportCadence(3600)
    step = lambda n, name: stream.process_batch(
        spark, files(name), n, str(out), opts, landing=str(landing_dir), cadence=cadence, beside=aside
    )  # noqa: E731
    real = stream._report_of
    gate = __import__("threading").Event()
    monkeypatch.setattr(stream, "_report_of", lambda *a, **k: (gate.wait(120), real(*a, **k))[1])
    step(0, "landing-r1-00000000.parquet")
    step(1, "landing-r1-00000001.parquet")  # committed while batch 0's report waits
    gate.set()
    aside._thread.join(120)
    assert json.loads((out / "report.json").read_text()) == first  # batch 0's commits only
    assert stream.report_behind(out).startswith("report.json counts 1 of the 2 committed micro-batches")
    assert stream.stream_report(spark, str(out), opts, str(landing_dir)) == expected_report(False)  # again: both

    def fails(*args, **kwargs):
        raise ValueError("a report that cannot be made")

    monkeypatch.setattr(stream, "_report_of", fails)
    cadence.last = None  # due again
    shutil.copy(landing_dir / "landing-r1-00000001.parquet", landing_dir / "landing-r1-00000002.parquet")
    step(2, "landing-r1-00000002.parquet")
    aside._thread.join(120)
    with pytest.raises(RuntimeError, match="work beside the stream failed: a report that cannot be made"):
        step(3, "landing-r1-00000002.parquet")
    assert not (out / "_batches" / "0000000003.json").exists()


def test_max_bytes_per_trigger_takes_a_backlog_in_bounded_steps(job, spark, scenario, tmp_path, capsys, batch_default):
    """--max-mb-per-trigger (issue 24): a 10,000-device stream's micro-batch of every file of a
    backlog ran out of heap. With a bound, each micro-batch takes at most that many bytes of
    landing files (at least one file): here one file each, the same outputs as the batch job."""
    landing_dir, out = tmp_path / "landing", tmp_path / "out"
    landing_dir.mkdir()
    for name in ("landing-r1-00000000.parquet", "landing-r1-00000001.parquet"):
        shutil.copy(scenario / name, landing_dir)
    report = job.run_stream(
        spark, str(landing_dir), str(out), job.JobOptions(reorder_window=3), max_bytes_per_trigger=1
    )
    done = re.findall(r"^batch \d+: (\d+) files", capsys.readouterr().out, re.M)
    assert done == ["1", "1"], done  # without the bound: one micro-batch of both files
    batch_out, batch_report = batch_default
    assert report == batch_report
    keys = lambda path: _read(spark, path / "records", "device", "boot", "seq")  # noqa: E731
    assert [(r["device"], r["boot"], r["seq"]) for r in keys(out)] == [
        (r["device"], r["boot"], r["seq"]) for r in keys(batch_out)
    ]


def test_report_behind_says_how_many_commits_report_json_counts(tmp_path):
    """No Spark: the line a stop prints when --report-seconds left report.json behind the commits."""
    from mqbatch.spark import stream

    (tmp_path / "_batches").mkdir()
    assert stream.report_behind(tmp_path) is None  # nothing committed: nothing to count
    for n in range(3):
        (tmp_path / "_batches" / f"{n:010d}.json").write_text("{}")
    assert stream.report_behind(tmp_path).startswith("report.json counts 0 of the 3 ")  # no report yet
    (tmp_path / stream.REPORT_STATE).write_text(json.dumps({"commits": [2, "0000000001.json"]}))
    assert stream.report_behind(tmp_path).startswith("report.json counts 2 of the 3 committed micro-batches")
    (tmp_path / stream.REPORT_STATE).write_text(json.dumps({"commits": [3, "0000000002.json"]}))
    assert stream.report_behind(tmp_path) is None


@pytest.mark.slow
def test_a_stop_between_a_commit_and_its_report_leaves_report_json_current(job, spark, scenario, tmp_path, monkeypatch):
    """Issue 22: a stop signal that lands between a micro-batch's commit and the rename of its
    report (simulated: the rename raises once) must not leave report.json describing the state
    before the batch. settle_report promotes the waiting report on the way out, without Spark."""
    from mqbatch.spark import stream

    landing_dir, out, opts, first = _one_batch_streamed_then_a_second_file(job, spark, scenario, tmp_path)
    promote = stream._promote
    calls = []

    def stopped_once(waiting, where):
        calls.append(waiting.name)
        if len(calls) == 1:
            raise RuntimeError("stopped right after the commit")  # a py4j callback must raise an Exception
        promote(waiting, where)

    monkeypatch.setattr(stream, "_promote", stopped_once)
    with pytest.raises(Exception):  # noqa: B017 - the query fails with whatever py4j makes of it
        job.run_stream(spark, str(landing_dir), str(out), opts)
    assert len(list((out / "_batches").glob("*.json"))) == 2, "the second batch was committed"
    assert calls and calls[0] == ".report.json.b0000000001"
    report = json.loads((out / "report.json").read_text())
    assert report != first and report == expected_report(False), "report.json stale after the stop"
    assert not list(out.glob(".report.json.b*"))
    # its mtime says when it took effect: not before the newest commit (what a poller compares;
    # equal within one tick of the file system's clock)
    newest_commit = max(c.stat().st_mtime_ns for c in (out / "_batches").glob("*.json"))
    assert (out / "report.json").stat().st_mtime_ns >= newest_commit


@pytest.mark.slow
def test_a_batch_moved_into_place_but_not_committed_is_neither_reported_nor_kept(
    job, spark, scenario, tmp_path, monkeypatch
):
    """A micro-batch's files are in place before its commit (time to table); a job that dies in
    between (simulated: its report fails) leaves them uncommitted. The restart reports the
    commits only and removes those files before Spark replays the batch, which writes them
    again: report.json never counts a batch that has no commit."""
    from mqbatch.spark import stream

    landing_dir, out, opts, first = _one_batch_streamed_then_a_second_file(job, spark, scenario, tmp_path)
    report_of, moved = stream._report_of, lambda: sorted((out / "records").rglob(f"{stream._tag(1)}-*"))

    def dies_after_the_move(*args):
        if moved():
            raise RuntimeError("died between the move and the commit")  # py4j: an Exception
        return report_of(*args)

    monkeypatch.setattr(stream, "_report_of", dies_after_the_move)
    with pytest.raises(Exception):  # noqa: B017 - the query fails with whatever py4j makes of it
        job.run_stream(spark, str(landing_dir), str(out), opts)
    assert moved() and not stream._commit_path(out, 1).exists()
    monkeypatch.setattr(stream, "_report_of", report_of)
    process_batch, at_replay = stream.process_batch, []

    def noting(spark_, df, batch_id, *args, **kw):
        at_replay.append((batch_id, json.loads((out / "report.json").read_text()), moved()))
        return process_batch(spark_, df, batch_id, *args, **kw)

    monkeypatch.setattr(stream, "process_batch", noting)
    final = job.run_stream(spark, str(landing_dir), str(out), opts)
    assert at_replay and at_replay[0] == (1, first, []), at_replay[:1]
    assert final == expected_report(False) and moved()


def test_report_json_is_reused_only_when_it_is_the_one_written_for_the_newest_commit(tmp_path):
    """A stream run with nothing new (and every restart) took report.json as current only if
    it is, byte for byte, what the job wrote after the newest commit for these options; any
    other report.json is computed again. Without Spark: the check reads files only."""
    import dataclasses

    from mqbatch.spark import stream
    from mqbatch.spark.files import skipped_report
    from mqbatch.spark.options import JobOptions

    out, landing = tmp_path / "out", tmp_path / "landing"
    (out / "_batches").mkdir(parents=True)
    landing.mkdir()
    opts = JobOptions(reorder_window=3)

    def commit(batch_id):
        (out / "_batches" / f"{batch_id:010d}.json").write_text(json.dumps({"batch_id": batch_id}))

    def reported(report):
        stream.write_report(report, out)
        stream._note_reported(out)
        return report

    commit(0)
    want = reported(
        {"options": opts.report_dict(), "landed": 6, "skipped_landing_entries": skipped_report(str(landing))}
    )
    assert stream._current_report(out, opts, str(landing)) == want
    no_landing = {k: v for k, v in want.items() if k != "skipped_landing_entries"}
    assert stream._current_report(out, opts, None) == no_landing

    (out / stream.REPORT_STATE).unlink()  # a stop before the state was written
    assert stream._current_report(out, opts, str(landing)) is None
    reported(want)
    (out / "report.json").write_text(json.dumps(want, indent=1))  # the same report, other bytes
    assert stream._current_report(out, opts, str(landing)) is None
    reported(want)
    commit(1)  # a batch committed after it
    assert stream._current_report(out, opts, str(landing)) is None
    reported(want)
    assert stream._current_report(out, dataclasses.replace(opts, reorder_window=4), str(landing)) is None
    (out / stream.REPORT_STATE).write_text("[1, 2]")  # not a state this job writes
    assert stream._current_report(out, opts, str(landing)) is None
    reported(want)
    state = json.loads((out / stream.REPORT_STATE).read_text())
    assert state["code_sha256"] == stream._report_code() is not None
    (out / stream.REPORT_STATE).write_text(json.dumps(dict(state, code_sha256="0" * 64)))  # other code wrote it
    assert stream._current_report(out, opts, str(landing)) is None

    reported(want)
    (landing / "_notes").mkdir()  # a new skipped entry: counted again, no Spark; report.json rewritten
    got = stream._current_report(out, opts, str(landing))
    assert got == dict(want, skipped_landing_entries=skipped_report(str(landing)))
    assert got["skipped_landing_entries"]["count"] == 1
    assert json.loads((out / "report.json").read_text()) == got
    assert stream._current_report(out, opts, str(landing)) == got  # and current again


def test_the_report_code_is_hashed_the_same_from_spark_submits_zip(tmp_path):
    """The driver under spark-submit imports mqbatch from the --py-files zip: the code a
    report was made by (stream.REPORT_CODE, the JVM pass's Java source too) must be readable
    there, or a stream never reuses its report.json (None: made anew at every report)."""
    from mqbatch.spark import stream, submit

    zipped = submit.build_pyfiles(tmp_path / "mqbatch.zip")
    probe = "from mqbatch.spark import stream; print(stream.__file__); print(stream._report_code())"
    env = dict(os.environ, PYTHONPATH=str(zipped))
    got = subprocess.run([str(VENV_BIN / "python"), "-c", probe], capture_output=True, text=True, env=env, timeout=60)
    where, code = got.stdout.split()
    assert str(zipped) in where, where  # imported from the zip
    assert code == stream._report_code() is not None, got.stderr


def test_metrics_spark_never_delivers_are_none_after_the_wait_not_a_hang(spark, monkeypatch):
    """A micro-batch's counts are observed while it writes (stream._observed); Observation.get
    alone waits for ever for metrics that never come. Here: a DataFrame no action ran on."""
    from pyspark.sql import Observation
    from pyspark.sql import functions as F

    from mqbatch.spark import stream

    monkeypatch.setattr(stream, "OBSERVED_WAIT_S", 0.3)
    observation = Observation("never")
    observed = spark.range(3).observe(observation, F.count(F.lit(1)).alias("rows"))
    started = time.monotonic()
    assert stream._observed(observation) is None and time.monotonic() - started < 5
    observed.collect()
    assert stream._observed(observation) == {"rows": 3}


def test_counts_spark_does_not_deliver_are_counted_again_from_the_staged_files(
    job, spark, scenario, tmp_path, monkeypatch, capsys
):
    from mqbatch.spark import stream

    monkeypatch.setattr(stream, "_observed", lambda observation: None)  # as if the metrics never came
    landing_dir, out = tmp_path / "landing", tmp_path / "out"
    landing_dir.mkdir()
    shutil.copy(scenario / "landing-r1-00000000.parquet", landing_dir)
    report = job.run_stream(spark, str(landing_dir), str(out), job.JobOptions(reorder_window=3))
    text = capsys.readouterr().out
    assert "batch 0: Spark did not report the batch's counts within 60 s: counted again" in text, text
    m = re.search(r"^batch 0: .* (\d+) landed rows, (\d+) new records, (\d+) quarantined rows", text, re.M)
    assert m and tuple(map(int, m.groups())) == (
        report["landed"],
        report["records"]["unique"],
        report["quarantine"]["rows"],
    ), text


def test_landed_rows_with_nulls_are_quarantined_not_fatal(job):
    """Landing files written by other tools may hold nulls where the recorder never does."""
    hostile = [
        {"topic": None, "user_properties": None, "payload": None, "received_at_us": None},
        {
            "topic": "mqbatch/d/telemetry",
            "user_properties": [None, {"key": None, "value": "1"}],
            "payload": b"\x01x",
            "received_at_us": None,
        },
        {
            "topic": "mqbatch/d/telemetry",
            "user_properties": [{"key": "batch-format", "value": "v1"}, {"key": "batch-size", "value": "1"}],
            "payload": codec.encode_payload([records.encode_binary("sample", 1, 1, T0_MS, [(1, 1)])]),
            "received_at_us": None,
        },
    ]
    got = [[(r.get("stage"), r.get("reason")) for r in job.decode_landed_row(row, job.JobOptions())] for row in hostile]
    assert got == [
        [("batch", "MALFORMED_BATCH_MISSING_PROPERTY")],
        [("batch", "MALFORMED_BATCH_MISSING_PROPERTY")],
        [(None, None)],
    ]


def test_landing_files_with_only_the_contract_columns(job, spark, tmp_path):
    """The nine contract columns are enough (another writer may omit the recorder's extras)."""
    from mqbatch.ingest import landing

    rows = [
        landed(A, [sample(1, s)[0] for s in range(3)], T(1, 2) + 500),
        landed(A, [sample(1, 2)[0], sample(1, 3)[0]], T(1, 3) + 500),
    ]
    table = landing.to_table(rows, "x", 0).select(landing.SCHEMA.names[:9])
    (tmp_path / "landing").mkdir()
    landing.write_parquet_atomic(table, tmp_path / "landing", "foreign.parquet")
    report = job.run_batch(spark, str(tmp_path / "landing"), str(tmp_path / "out"), job.JobOptions(reorder_window=0))
    assert report["records"] == {"received": 5, "unique": 4, "duplicates": 1, "key_collisions": 0}
    assert report["devices"]["dev-a"]["out_of_order"] == 0 and report["devices"]["dev-a"]["missing"] == 0


def test_bad_landing_path_is_a_clear_error(job, spark, tmp_path):
    with pytest.raises(SystemExit, match="is not a directory"):
        job.run_batch(spark, str(tmp_path / "missing"), str(tmp_path / "out"), job.JobOptions())


def test_mqbatch_spark_print_command_for_a_cluster_ships_the_package(tmp_path):
    """The CLI path for a cluster: the zip of mqbatch shipped with --py-files, the master
    passed through (the job run by spark-submit itself, in its own JVM, is
    test_spark_no_jdk.py::test_without_javac_under_umask_022_...)."""
    dry = subprocess.run(
        [
            str(VENV_BIN / "mqbatch"),
            "spark",
            "--landing",
            "L",
            "--out",
            "O",
            "--print-command",
            "--master",
            "spark://head:7077",
            "--pyfiles-zip",
            str(tmp_path / "mqbatch.zip"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert dry.returncode == 0, dry.stderr
    assert "--master spark://head:7077" in dry.stdout and f"--py-files {tmp_path / 'mqbatch.zip'} " in dry.stdout
    with zipfile.ZipFile(tmp_path / "mqbatch.zip") as z:  # what a cluster's workers import
        assert {"mqbatch/__init__.py", "mqbatch/wire/codec.py", "mqbatch/wire/records.py"} <= set(z.namelist())
    assert "telemetry_job.py --landing L --out O" in dry.stdout


def _boot_quality_by_hand(rows, window):
    """Per (device, boot): the report's boot figures computed row by row, in arrival order."""
    out = {}
    for device, boot in {(r[0], r[1]) for r in rows}:
        mine = sorted((r for r in rows if (r[0], r[1]) == (device, boot)), key=lambda r: r[3:])
        highest, late = -1, 0
        for r in mine:
            late += r[2] < highest
            highest = max(highest, r[2])
        seqs = sorted(r[2] for r in mine)
        limit = seqs[-1] - window
        missing = sum(1 for s in range(0, limit + 1) if s not in set(seqs))
        out[(device, boot)] = (len(seqs), late, missing, seqs[-1] + 1 - len(seqs) - missing, seqs[-1])
    return out


@pytest.mark.parametrize("way", ["jvm", "python"])
def test_boot_quality_counts_as_the_rows_say_in_arrival_order(spark, monkeypatch, way):
    """out_of_order, missing, pending of boot_quality (no window over a whole boot: counted
    streaming and from aggregates) equal a row-by-row count, boots split over partitions
    and Arrow batches; both ways: in the JVM (the session has the jar) and in Python workers
    (without it)."""
    from mqbatch.spark import JobOptions, jvm, pipeline

    if way == "python":
        monkeypatch.setattr(jvm, "registered", lambda spark, name=None: False)

    rng = np.random.default_rng(20261125)
    t0 = dt.datetime(2026, 11, 1, tzinfo=dt.timezone.utc)
    rows = []
    for d in range(4):
        for boot in range(2):
            n = int(rng.integers(1, 3000))
            for seq in rng.choice(n + int(rng.integers(0, 300)), size=n, replace=False):
                rows.append(
                    (
                        f"dev-{d}",
                        boot,
                        int(seq),
                        t0 + dt.timedelta(microseconds=int(rng.integers(0, 10**9))),
                        "r1",
                        0,
                        len(rows),
                        0,
                    )
                )
    df = spark.createDataFrame(
        rows,
        "device string, boot bigint, seq bigint, received_at timestamp, recorder string, "
        "segment bigint, offset bigint, sub_index int",
    ).repartition(3)
    df = df.withColumn("dropped_total", df["seq"] * 0)
    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "500")
    try:
        for window in (0, 10, 100):
            figures = pipeline.boot_quality(df, JobOptions(reorder_window=window))
            plan = figures._jdf.queryExecution().executedPlan().toString()
            assert ("MapPartitions " in plan) == (way == "jvm") and ("MapInArrow" in plan) == (way == "python"), plan
            got = {
                (r.device, r.boot): (r.unique, r.out_of_order, r.missing, r.pending, r.max_seq)
                for r in figures.collect()
            }
            assert got == _boot_quality_by_hand(rows, window)
    finally:
        spark.conf.unset("spark.sql.execution.arrow.maxRecordsPerBatch")
    assert sum(v[1] for v in got.values()) > 1000  # out of order in earnest
    # one shuffle and one pass over the rows (arrival.boot_figures): 2 Spark jobs; it was 9
    # (aggregates, a broadcast join, a pass for the order, joins), 1.9 s of a 5.5 s job over
    # the scenario's 11 landed rows, warm
    # (of its own: the input, with a shuffle of its own, is cached first)
    sc, cached = spark.sparkContext, df.persist()
    try:
        cached.count()
        sc.setJobGroup(f"boot-quality-jobs-{way}", "test")
        pipeline.boot_quality(cached, JobOptions()).collect()
        assert 1 <= len(sc.statusTracker().getJobIdsForGroup(f"boot-quality-jobs-{way}")) <= 2
    finally:
        sc.setLocalProperty("spark.jobGroup.id", None)
        cached.unpersist()


def test_the_reports_aggregates_run_together_in_order_in_the_callers_job_group(spark):
    """build_report's four collects run in threads (pipeline._collect_together): results in
    the order given, every job in the caller's job group (the benchmark counts jobs by it;
    plain threads lose it), and a failing collect fails the call instead of a None result."""
    from mqbatch.spark import pipeline

    sc = spark.sparkContext
    sc.setJobGroup("collect-together-test", "test")
    try:
        got = pipeline._collect_together(spark.range(3).collect, lambda: spark.range(5).count(), spark.range(1).collect)
        assert [len(got[0]), got[1], len(got[2])] == [3, 5, 1]
        assert len(sc.statusTracker().getJobIdsForGroup("collect-together-test")) >= 3
        with pytest.raises(ZeroDivisionError):
            pipeline._collect_together(spark.range(2).collect, lambda: 1 // 0)
    finally:
        sc.setLocalProperty("spark.jobGroup.id", None)


def test_the_session_jvm_runs_with_the_test_jvm_options(spark):
    """tests/conftest.py sets SPARK_SUBMIT_OPTS (C1 only) for every JVM the tests start: the
    suite's CPU depends on spark-submit passing it on to the shared session's JVM."""
    wanted = shlex.split(os.environ["SPARK_SUBMIT_OPTS"])
    runtime = spark.sparkContext._jvm.java.lang.management.ManagementFactory.getRuntimeMXBean()
    args = list(runtime.getInputArguments())
    assert wanted and all(opt in args for opt in wanted), (wanted, args)
    # and the class-data archive `make test` wrote (mqbatch.spark.cds) is mapped into it
    archive = cds_archive(skip=False)
    if archive is None:
        return
    assert f"-XX:SharedArchiveFile={archive}" in args, args
    assert str(archive) in _mapped_files(runtime.getPid()), "the session's JVM runs without the archive"


def _mapped_files(pid: int) -> set[str]:
    """The files a process has mapped (/proc/PID/maps)."""
    lines = pathlib.Path(f"/proc/{pid}/maps").read_text().splitlines()
    return {line.split(None, 5)[5] for line in lines if len(line.split(None, 5)) == 6}


def test_mapped_files_sees_a_mapping_and_its_absence(tmp_path):
    """The check above can fail: a file this process maps is seen, the same file unmapped is not."""
    import mmap

    path = tmp_path / "mapped.bin"
    path.write_bytes(b"x" * 4096)
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ):
        assert str(path) in _mapped_files(os.getpid())
    assert str(path) not in _mapped_files(os.getpid())
