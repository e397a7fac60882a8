"""The stream-kills scenario's final check (mqbatch.scenarios.streamkills.check_outputs,
issue 22): report.json, records/ and what landed must agree per device, with every
accounting balanced. Fed here with hand-made outputs: consistent ones pass, and each way
they can be broken is named."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from mqbatch.scenarios.streamkills import StreamJob, alive, check_outputs, descendants
from mqbatch.spark.accounting import balance

LANDED = {("dev-001", 1, s) for s in range(10)} | {("dev-002", 1, s) for s in range(5)}


def write_outputs(out, keys, report_unique=None, accounting=None):
    """OUT/records/date=.../part.parquet with `keys`, and a report.json saying `report_unique`
    per device (default: what records/ holds), with `accounting` per device (default balanced)."""
    part = out / "records" / "date=2026-11-26"
    part.mkdir(parents=True)
    keys = sorted(keys)
    table = pa.table(
        {
            "device": [k[0] for k in keys],
            "boot": pa.array([k[1] for k in keys], pa.int64()),
            "seq": pa.array([k[2] for k in keys], pa.int64()),
        }
    )
    pq.write_table(table, part / "b0000000000-part-0.parquet")
    devices = {}
    for dev in sorted({k[0] for k in keys}):
        n = sum(k[0] == dev for k in keys)
        unique = (report_unique or {}).get(dev, n)
        devices[dev] = {"unique": unique, "accounting": (accounting or {}).get(dev, balance(unique, 0, 0, 0))}
    report = {"records": {"unique": sum(d["unique"] for d in devices.values())}, "devices": devices}
    (out / "report.json").write_text(json.dumps(report))


def test_consistent_outputs_pass(tmp_path):
    write_outputs(tmp_path, LANDED)
    figures, problems = check_outputs(tmp_path, LANDED)
    assert problems == []
    assert figures["records_rows"] == figures["report_unique"] == figures["landed_unique"] == 15
    assert (figures["report_lost"], figures["devices_balanced"]) == (0, "2/2")


@pytest.mark.parametrize(
    "case,expected",
    [
        ("stale report", "dev-001: report unique 7, rows in records/ 10, unique landed 10"),
        ("record missing from records/", "dev-002: report unique 4, rows in records/ 4, unique landed 5"),
        ("duplicate row", "records/ holds 1 rows whose (device, boot, seq) is there already"),
        ("lost", "dev-001: accounting not balanced"),
        ("no report", "report.json cannot be read"),
    ],
)
def test_each_broken_output_is_named(tmp_path, case, expected):
    keys = list(LANDED)
    kwargs = {}
    if case == "stale report":
        kwargs["report_unique"] = {"dev-001": 7}
    elif case == "record missing from records/":
        keys.remove(("dev-002", 1, 4))
    elif case == "duplicate row":
        keys.append(("dev-001", 1, 3))
        kwargs["report_unique"] = {"dev-001": 10}
    elif case == "lost":
        kwargs["accounting"] = {"dev-001": balance(10, 3, 1, 0)}  # 3 absent, 1 counted dropped: 2 lost
    write_outputs(tmp_path, keys, **kwargs)
    if case == "no report":
        (tmp_path / "report.json").unlink()
    figures, problems = check_outputs(tmp_path, LANDED)
    assert any(expected in p for p in problems), problems
    if case == "lost":
        assert figures["report_lost"] == 2 and figures["devices_balanced"] == "1/2"


def test_phase_names_what_the_job_was_doing_when_killed(tmp_path):
    job = StreamJob(tmp_path / "landing", tmp_path / "out", tmp_path / "spark.log")
    log = tmp_path / "spark.log"
    said = ["", "telemetry_job: streaming L -> O (every 5 s)\n", "batch 3: started, 2 new landing files\n"]
    said += [
        "batch 3: 2 files (0 quarantined), 40 landed rows, 800 new records, 0 quarantined rows, in records/ after 7.0 s, report.json after 9.1 s\n"
    ]
    phases = []
    for line in said:
        with open(log, "a") as f:
            f.write(line)
        phases.append(job.phase())
    assert phases == ["starting", "idle", "in batch 3", "after batch 3"]


def test_a_child_that_outlives_its_parent_is_seen(tmp_path):
    """The orphan detector of the kills: a shell's background sleep outlives the shell's SIGKILL
    (nothing ties it to its parent), so `alive` must still list it."""
    parent = subprocess.Popen(["sh", "-c", "sleep 30 & wait"], start_new_session=True)
    deadline = time.monotonic() + 10
    while not descendants(parent.pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    kids = descendants(parent.pid)
    assert kids, "the shell's child was not found"
    try:
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait(10)
        time.sleep(0.2)
        assert alive(kids) == kids
    finally:
        os.killpg(parent.pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while alive(kids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert alive(kids) == []
