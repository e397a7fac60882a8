"""`mqbatch bench device --quick` (issue 15): the CI smoke run of the device benchmark.
It runs the real MicroPython Unix port against a real Mosquitto over TLS and must print
every figure; no timing is asserted (figures are read by people, see docs/records.md)."""

from __future__ import annotations

import re
import subprocess

from mqbatch_testing import VENV_BIN

NUMBER = r"[\d,]+(?:\.\d+)? \[[\d,]+(?:\.\d+)?\.\.[\d,]+(?:\.\d+)?\]"


def test_bench_device_quick_prints_every_figure():
    proc = subprocess.run(
        [str(VENV_BIN / "mqbatch"), "bench", "device", "--quick"], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    print(out)
    for label, unit in (
        ("RecordWriter.sample, 4 channels (38 B):", "us/record"),
        ("publish_batch, 100 records:", "us/batch"),
        ("sample -> encoder -> client, QoS 1, flush per batch:", "records/s"),
        ("stop-and-wait flush()", "records/s"),
        ("busy loop on service()", "records/s"),
        ("stop-and-wait / busy loop (per run, same run):", ""),
    ):
        assert re.search(re.escape(label) + " " + NUMBER + (" " + re.escape(unit) if unit else ""), out), (
            f"no figure for {label!r} in:\n{out}"
        )
    alloc = re.search(r"([\d.]+) \[[\d.]+\.\.[\d.]+\] heap bytes/record", out)
    assert alloc and float(alloc.group(1)) == 0.0, out  # the record hot path allocates nothing
