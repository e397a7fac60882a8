"""The report's accounting per device (issue 22, mqbatch.spark.accounting) on the real Spark
job: stored = landed + dropped + released-unconfirmed-not-landed to the record, `missing`
what is really absent, and the same landing zone with a broken counter fails the balance."""

from __future__ import annotations

import pytest

from mqbatch.wire import records
from mqbatch_testing.spark import T0_MS, landed, sample, write_landing

pytestmark = pytest.mark.spark


def _health(boot: int, seq: int, dropped: int, released: int) -> bytes:
    t = T0_MS + boot * 100_000 + seq * 1000
    return records.encode_binary("health", boot, seq, t, [(0x80, 40_000), (0x82, dropped), (0x87, released)])


def _device(name: str, dropped: int, released: int) -> list:
    """Boot 1 stored seqs 0..99 and a health record (seq 100). Seqs 10..19 never reached the
    broker (dropped: 10), 20..39 were PUBACKed and released unconfirmed (20), of which 20..31
    landed anyway and 32..39 did not. Boot 2: seqs 0..9 and a health record carrying nothing.
    `dropped` / `released`: what the device's counters say in boot 1's health record."""
    topic = f"mqbatch/{name}/telemetry"
    absent = set(range(10, 20)) | set(range(32, 40))
    seqs = [s for s in range(100) if s not in absent]
    rows = [
        landed(topic, [sample(1, s)[0] for s in seqs[i : i + 10]], T0_MS + 100_000 + seqs[i] * 1000 + 500)
        for i in range(0, len(seqs), 10)
    ]
    rows.append(landed(topic, [_health(1, 100, dropped, released)], T0_MS + 200_500))
    rows.append(landed(topic, [sample(2, s)[0] for s in range(10)] + [_health(2, 10, 0, 0)], T0_MS + 211_000))
    return rows


def test_report_accounting_balances_to_the_record_and_a_broken_counter_fails_it(spark, tmp_path):
    import mqbatch.spark as job

    land = tmp_path / "landing"
    write_landing(
        land,
        "r1",
        0,
        _device("dev-ok", dropped=10, released=20)
        + _device("dev-old", dropped=30, released=0)  # before issue 22: released counted as dropped
        + _device("dev-under", dropped=10, released=5),  # released under-counted: 3 records unaccounted
    )
    report = job.run_batch(spark, str(land), str(tmp_path / "out"), job.JobOptions(reorder_window=3))
    devices = report["devices"]
    ok = devices["dev-ok"]
    assert ok["missing"] == 18 and ok["pending_gaps"] == 0, ok  # what is really absent
    assert ok["accounting"] == {
        "stored": 112,  # boot 1: 101, boot 2: 11
        "landed": 94,
        "absent": 18,
        "dropped": 10,
        "released_unconfirmed": 20,
        "released_landed": 12,
        "released_not_landed": 8,
        "lost": 0,
        "dropped_landed": 0,
        "balanced": True,
    }
    a = ok["accounting"]
    assert a["stored"] == a["landed"] + a["dropped"] + a["released_not_landed"]

    old = devices["dev-old"]["accounting"]
    assert not old["balanced"] and old["dropped_landed"] == 12, old
    assert old["stored"] != old["landed"] + old["dropped"] + old["released_not_landed"]
    under = devices["dev-under"]["accounting"]
    assert not under["balanced"] and under["lost"] == 3 and under["released_not_landed"] == 5, under
    assert under["stored"] != under["landed"] + under["dropped"] + under["released_not_landed"]


def test_stream_accounting_is_the_batch_jobs(spark, tmp_path):
    """The streaming job's report reads the released_unconfirmed readings back from _decoded/
    (which keeps no other reading): its accounting is the batch job's, device by device, the
    unbalanced ones included (it fails if _decoded/ keeps none of the readings)."""
    import mqbatch.spark as job

    land = tmp_path / "landing"
    write_landing(
        land, "r1", 0, _device("dev-ok", dropped=10, released=20) + _device("dev-under", dropped=10, released=5)
    )
    opts = job.JobOptions(reorder_window=3)
    batch = job.run_batch(spark, str(land), str(tmp_path / "batch"), opts)["devices"]
    stream = job.run_stream(spark, str(land), str(tmp_path / "stream"), opts)["devices"]
    assert batch["dev-ok"]["accounting"]["released_unconfirmed"] == 20  # (the case the check is about)
    assert {d: v["accounting"] for d, v in stream.items()} == {d: v["accounting"] for d, v in batch.items()}


class _CountingRow(dict):
    """A collected row that counts every field read (pyspark's Row costs ~1 us a read)."""

    reads = 0

    def __getitem__(self, key):
        _CountingRow.reads += 1
        return super().__getitem__(key)


def _merge_reads(n: int) -> int:
    """Field reads of the report's driver-side merge (pipeline._devices) for n devices of one
    boot each (as build_report collects them: outcomes, per-boot figures, latency)."""
    from mqbatch.spark import pipeline

    outcomes = [
        _CountingRow(device=f"dev-{i:05d}", reason=None, is_sub=True, n=10, landed_first=True) for i in range(n)
    ]
    boot = dict(unique=10, missing=0, pending=0, out_of_order=0, dropped_on_device=0, key_collisions=0)
    boots = [_CountingRow(device=f"dev-{i:05d}", boot=1, **boot) for i in range(n)]
    latency = [_CountingRow(device=f"dev-{i:05d}", latency_n=10, lat=[1.0, 2.0, 3.0]) for i in range(n)]
    _CountingRow.reads = 0
    devices = pipeline._devices(outcomes, boots, latency)
    assert len(devices) == n and all(d["unique"] == 10 and d["received"] == 10 for d in devices.values())
    return _CountingRow.reads


def test_the_reports_merge_reads_each_row_a_bounded_number_of_times():
    """10,000 devices: the merge of the collected aggregates was quadratic (each device scanned
    every boot row: 10^8 row reads, about 170 s at 2 M records in the 10,000-device report).
    Each row is now read a bounded number of times, whatever the fleet's size: the reads per
    device are the same at 100 and at 3,000 devices (a quadratic merge reads 30x more per
    device at 3,000 and fails here)."""
    small, large = _merge_reads(100), _merge_reads(3000)
    assert large / 3000 <= 1.05 * small / 100, (small, large)
    assert large <= 30 * 3000  # a few reads per row of the three inputs
