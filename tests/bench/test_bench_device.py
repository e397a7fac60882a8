"""`mqbatch bench device --quick` (issue 15): the CI smoke run of the device benchmark.
It runs the real MicroPython Unix port against a real Mosquitto over TLS and must print
every figure; no timing is asserted (figures are read by people, see docs/records.md).
The run is the device section of the shared `bench all --quick` (tests/bench/conftest.py)."""

from __future__ import annotations

import json
import re

import pytest

NUMBER = r"[\d,]+(?:\.\d+)? \[[\d,]+(?:\.\d+)?\.\.[\d,]+(?:\.\d+)?\]"


def test_bench_device_quick_prints_every_figure(bench_all_quick):
    out = bench_all_quick.section("device")
    doc = json.loads((bench_all_quick.out / "device.json").read_text())
    assert doc["command"] == bench_all_quick.command("device", "--quick") and doc["quick"] is True
    for label, unit in (
        ("RecordWriter.sample, 4 channels (38 B):", "us/record"),
        ("publish_batch, 100 records:", "us/batch"),
        ("sample -> encoder -> client, QoS 1, flush per batch:", "records/s"),
        (
            "the app's per-record path: sample -> outbox append (flushed per batch) -> read back -> PUBLISH "
            "QoS 1 -> PUBACK -> outbox ack, 100-record batches:",
            "records/s",
        ),
        (
            "ONE prebuilt batch (100 x 24 B) republished, no record sampled, stored or encoded (PUBLISH/s x 100): "
            "stop-and-wait flush()",
            "PUBLISH/s",
        ),  # labelled as what it is: not a per-record rate
        ("busy loop on service()", "PUBLISH/s"),
        ("stop-and-wait / busy loop (per run, same run):", ""),
        ("the same path's heap, GC off:", "bytes/record"),
        (
            "the same path, the outbox on littlefs (os.VfsLfs2, the boards' filesystem) over a RAM flash "
            "stand-in in Python (CPU time only: a real flash adds its program and erase time):",
            "records/s",
        ),
        ("flash per 100-record batch:", "bytes programmed"),
        (
            "the App itself (firmware/main.py in a virtual device, heap 96K): 1,000 samples/s of 4 channels "
            "into 100-record batches, outbox, TLS, QoS 1, batch-hmac, health records, no e2e acks:",
            "us of process CPU per stored record",
        ),
    ):
        assert re.search(re.escape(label) + " " + NUMBER + (" " + re.escape(unit) if unit else ""), out), (
            f"no figure for {label!r} in:\n{out}"
        )
    alloc = re.search(r"([\d.]+) \[[\d.]+\.\.[\d.]+\] heap bytes/record", out)
    assert alloc and float(alloc.group(1)) == 0.0, out  # the record hot path allocates nothing


def test_the_app_paths_steps_add_up_to_its_total(bench_all_quick):
    """The app path's figure by step (sample, append+fsync, read, publish, PUBACK wait, ack+fsync)
    must account for the path's total time: none left out, none counted twice."""
    fig = json.loads((bench_all_quick.out / "device.json").read_text())["figures"]["variants"]["firmware/"]
    for path, steps_of in (("app_path", "app_parts"), ("lfs_path", "lfs_parts")):  # host disk, littlefs
        parts = fig[steps_of]
        assert list(parts) == ["sample", "append+fsync", "read", "publish", "puback_wait", "ack+fsync"]
        for run, rate in enumerate(fig[path]):
            total = 1e6 / rate  # us per record over the whole timed loop
            steps = sum(v[run] for v in parts.values())
            # the steps are disjoint parts of the timed loop, on the same clock: only the loop's own
            # few instructions lie between them (leaving out the smallest step, read, drops 2 %)
            assert 0.98 * total <= steps <= total * (1 + 1e-9), (path, steps, total, parts)
    # the littlefs run's flash counters see the appends: a batch programs at least its own bytes
    assert all(b >= 100 * 38 for b in fig["lfs_programmed"]), fig["lfs_programmed"]


def test_the_app_paths_heap_is_measured_by_step_and_sees_what_allocates(bench_all_quick):
    """Issue 24's "0 B" is of the whole app path, not of the record writer alone: the bench
    measures each step's heap with the GC off. The instrument sees allocation where there is
    some (the outbox opens a segment file every few batches: a file object and its path) and
    none where there is none (the record writer), so it can fail either way."""
    fig = json.loads((bench_all_quick.out / "device.json").read_text())["figures"]["variants"]["firmware/"]
    heap = fig["app_heap"]
    assert list(heap) == ["sample", "append+fsync", "read", "publish", "puback_wait", "ack+fsync"]
    assert all(v == 0 for v in heap["sample"]), heap
    assert all(v > 0 for v in heap["append+fsync"]), heap
    for run, per_record in enumerate(fig["app_heap_per_record"]):
        assert per_record * 100 == pytest.approx(sum(v[run] for v in heap.values()))


def test_the_apps_cpu_instrument_counts_records_and_cpu_and_nothing_else():
    """The App's figure is CPU seconds of its process (/proc) over the records its MQB-STORED
    lines report (mqbatch.lab.devices.stored_in, also Fleet.stored): a torn or foreign line
    must not count, and CPU spent must show."""
    import os

    from mqbatch.bench.device import _cpu_s
    from mqbatch.lab.devices import stored_in

    console = "\n".join(
        [
            "MQB-STORED 0 1 0 99",
            "mqb: connected",
            "MQB-STORED 1 1 100 199",
            "MQB-STORED 2 1 200",  # torn by a kill
            "MQB-STORED 3 1 300 2",  # last below first: not a batch
            "xMQB-STORED 4 1 0 9",
            "MQB-STORED 6 1 4OO 409",  # not numbers: not the firmware's
            "MQB-STORED 5 1 300 349",
        ]
    )
    assert len(stored_in(console)) == 250
    before = _cpu_s(os.getpid())
    x = 0
    for i in range(3_000_000):
        x += i
    after = _cpu_s(os.getpid())
    assert sum(after) - sum(before) > 0.02 and after[0] > before[0], (before, after)


def test_the_apps_cpu_figure_is_refused_when_the_app_did_not_deliver(tmp_path):
    """The App's CPU figure is labelled "TLS, QoS 1": a run whose batches were never
    acknowledged (here PUBACK 0x10, nobody subscribed, taken as not delivered) must not
    yield one."""
    from mqbatch.bench.device import _app_cpu

    with pytest.raises(RuntimeError, match="the App did not"):
        _app_cpu(tmp_path, 4.0, 1.0, config={"require_subscribers": True, "drain_timeout_s": 2})
