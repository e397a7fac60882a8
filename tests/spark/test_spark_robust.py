"""Issue 10 findings on the Spark pipeline: one poison record, a bad landing file or a
hostile device id must cost only itself (a quarantine row or a quarantined file with a
reason), never the job or the valid records next to it."""

from __future__ import annotations

import json
import subprocess

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from mqbatch.ingest import landing
from mqbatch.spark import files
from mqbatch.wire import codec, records
from mqbatch_testing import VENV_BIN
from mqbatch_testing.spark import T0_MS, landed, sample, write_landing

POISON = b'{"v":1,"kind":"sample","boot":1,"seq":' + b"7" * 5000 + b',"ts_ms":1,"synced":true,"r":{}}'
A = "mqbatch/dev-a/telemetry"


def valid_rows(n_publishes=5, per=10, topic=A, boot=1):
    return [
        landed(topic, [sample(boot, p * per + s)[0] for s in range(per)], T0_MS + 100_000 * boot + 60_000 + p)
        for p in range(n_publishes)
    ]


# -- (3) poison record --------------------------------------------------------------------


def test_record_with_a_5000_digit_integer_is_a_record_error():
    with pytest.raises(records.RecordError) as e:
        records.parse(POISON)
    assert e.value.reason == records.MALFORMED and "5000 digits" in e.value.detail


def test_mqbatch_decode_reports_a_5000_digit_line_and_goes_on():
    good = json.dumps(
        {
            "topic": A,
            "user_properties": [["batch-format", "v1"], ["batch-size", "1"]],
            "payload_hex": codec.encode_payload([sample(1, 0)[0]]).hex(),
        }
    )
    poison = '{"topic": "' + A + '", "user_properties": [], "payload_hex": "", "n": ' + "9" * 5000 + "}"
    proc = subprocess.run(
        [str(VENV_BIN / "mqbatch"), "decode"],
        input=poison + "\n" + good + "\n",
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    out = [json.loads(line) for line in proc.stdout.splitlines()]
    assert [o["status"] for o in out] == ["error", "ok"] and "digits" in out[0]["error"]


def test_poison_record_is_quarantined_and_its_neighbours_kept(spark, tmp_path):
    from mqbatch.spark import JobOptions, run_batch

    rows = valid_rows()
    rows.insert(2, landed(A, [POISON], T0_MS + 160_000))
    write_landing(tmp_path / "landing", "r1", 0, rows)
    report = run_batch(spark, str(tmp_path / "landing"), str(tmp_path / "out"), JobOptions())
    assert report["records"] == {"received": 50, "unique": 50, "duplicates": 0, "key_collisions": 0}
    assert report["quarantine"]["by_reason"] == {"RECORD_MALFORMED": 1}
    bad = spark.read.parquet(str(tmp_path / "out" / "quarantine")).collect()
    assert [(q.stage, q.reason, q.offset, bytes(q.sub_payload)) for q in bad] == [
        ("record", "RECORD_MALFORMED", 2, POISON)
    ]
    assert "5000 digits" in bad[0].detail


# -- (8) device ids --------------------------------------------------------------------------

HOSTILE_IDS = {
    "control": "dev\x07a",
    "rtl-override": "dev\u202egnp.exe",
    "100k": "d" * 100_000,
    "newline": "dev\nb",
    "space": "dev a",
}


@pytest.mark.parametrize("device", list(HOSTILE_IDS.values()), ids=list(HOSTILE_IDS))
def test_hostile_device_ids_are_rejected_with_a_reason(device):
    with pytest.raises(records.RecordError) as e:
        records.device_from_topic(f"mqbatch/{device}/telemetry")
    assert e.value.reason == records.DEVICE_ID_INVALID
    assert e.value.detail.isprintable() and len(e.value.detail) < 200


def test_device_id_alphabet_and_length():
    assert records.device_from_topic("mqbatch/" + "a" * 64 + "/telemetry") == "a" * 64
    assert records.device_from_topic("mqbatch/dev_1.x-2/telemetry") == "dev_1.x-2"
    with pytest.raises(records.RecordError):
        records.device_from_topic("mqbatch/" + "a" * 65 + "/telemetry")
    # the rule of `fleet add` (mqbatch.wire.device_id, issue 23.5): no upper case, no `.`/`..`
    for device, why in (("Dev_1.x-2", "upper case"), (".", "must start with"), ("..", "must start with")):
        with pytest.raises(records.RecordError, match=why):
            records.device_from_topic(f"mqbatch/{device}/telemetry")


def test_landed_hostile_device_ids_are_quarantined(spark, tmp_path):
    from mqbatch.spark import JobOptions, run_batch

    rows = valid_rows(1) + [
        landed(f"mqbatch/{d}/telemetry", [sample(1, 50)[0]], T0_MS + 170_000) for d in HOSTILE_IDS.values()
    ]
    write_landing(tmp_path / "landing", "r1", 0, rows)
    report = run_batch(spark, str(tmp_path / "landing"), str(tmp_path / "out"), JobOptions())
    assert report["records"]["unique"] == 10 and list(report["devices"]) == ["dev-a"]
    assert report["quarantine"]["by_reason"] == {"TOPIC_DEVICE_ID_INVALID": len(HOSTILE_IDS)}
    bad = spark.read.parquet(str(tmp_path / "out" / "quarantine")).collect()
    assert sorted(q.offset for q in bad) == list(range(1, 1 + len(HOSTILE_IDS)))
    assert all(q.stage == "topic" and q.device is None for q in bad)


# -- (6) bad landing files ----------------------------------------------------------------


def _readme(d):
    (d / "README.txt").write_text("landing zone of site 4\n")


def _wrong_schema(d):
    pq.write_table(pa.table({"topic": [1, 2], "payload": ["a", "b"]}), d / "other-tool.parquet")


def _truncated(d):
    good = landing.to_table(valid_rows(2, topic="mqbatch/dev-t/telemetry"), "rt", 0)
    pq.write_table(good, d / "whole.tmpx")
    data = (d / "whole.tmpx").read_bytes()
    (d / "whole.tmpx").unlink()
    (d / "landing-rt-00000000.parquet").write_bytes(data[: len(data) // 2])


def _not_utf8(d):
    table = landing.to_table(valid_rows(1, topic="mqbatch/dev-u/telemetry"), "ru", 0)
    raw = pa.array([b"mqbatch/dev-\xff/telemetry"], pa.binary()).view(pa.string())
    table = table.set_column(0, pa.field("topic", pa.string(), nullable=False), [raw])
    pq.write_table(table, d / "landing-ru-00000000.parquet")


BAD_FILES = {
    "README.txt": (_readme, files.FILE_NOT_PARQUET),
    "other-tool.parquet": (_wrong_schema, files.FILE_WRONG_SCHEMA),
    "landing-rt-00000000.parquet": (_truncated, files.FILE_UNREADABLE),
    "landing-ru-00000000.parquet": (_not_utf8, files.FILE_NOT_UTF8),
}


@pytest.fixture(scope="module")
def bad_zone(spark, tmp_path_factory):
    """One landing zone: a valid recorder file next to one bad file of each class; one batch run."""
    from mqbatch.spark import JobOptions, run_batch

    d = tmp_path_factory.mktemp("bad-zone")
    write_landing(d / "landing", "r1", 0, valid_rows())
    for make, _ in BAD_FILES.values():
        make(d / "landing")
    report = run_batch(spark, str(d / "landing"), str(d / "out"), JobOptions())
    return d, report


@pytest.mark.parametrize("name", list(BAD_FILES))
def test_bad_file_is_detected_with_its_reason(tmp_path, name):
    make, reason = BAD_FILES[name]
    make(tmp_path)
    problem = files.check_file(str(tmp_path / name))
    assert problem is not None and problem.reason == reason and name in problem.detail


@pytest.mark.parametrize("name", list(BAD_FILES))
def test_bad_file_is_quarantined_and_the_rest_processed(bad_zone, name):
    d, report = bad_zone
    assert report["records"] == {"received": 50, "unique": 50, "duplicates": 0, "key_collisions": 0}
    assert report["quarantine"]["files"] == len(BAD_FILES)
    assert report["quarantine"]["files_by_reason"] == {r: 1 for _, r in BAD_FILES.values()}
    got = {q["file"]: q["reason"] for q in report["quarantined_files"]}
    assert got[str(d / "landing" / name)] == BAD_FILES[name][1]
    assert json.loads((d / "out" / "report.json").read_text()) == report


def test_recorder_files_pass_the_file_check(tmp_path):
    write_landing(tmp_path, "r1", 0, valid_rows(1))
    table = landing.to_table(valid_rows(1), "x", 1).select(landing.SCHEMA.names[:9])  # the contract only
    pq.write_table(table, tmp_path / "contract-only.parquet")
    assert files.split_files(files.landing_files(str(tmp_path))) == (
        [str(tmp_path / "contract-only.parquet"), str(tmp_path / "landing-r1-00000000.parquet")],
        [],
    )
