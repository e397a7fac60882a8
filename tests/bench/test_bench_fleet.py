"""`mqbatch bench fleet` (issue 24): simulated devices -> Mosquitto (TLS, e2e acks) ->
recorder -> streaming job -> records/. The loss counter is shown to fail: on made-up
accounting input, and on a real run's records/ with one file deleted. No timing is asserted."""

from __future__ import annotations

import json
import re
import shutil
import subprocess

import numpy as np
import pytest

from mqbatch_testing import VENV_BIN, run_bench
from mqbatch_testing.bench import landed_batches


def _table(rows):
    dev, boot, seq, seen = zip(*rows) if rows else ((), (), (), ())
    return {
        "device": np.asarray(dev, dtype=object),
        "boot": np.asarray(boot),
        "seq": np.asarray(seq),
        "latency_ms": np.full(len(rows), 100.0),
        "seen_ms": np.asarray(seen, dtype=np.int64),
    }


@pytest.mark.fast
def test_account_counts_lost_extra_and_duplicate_rows():
    from mqbatch.bench.fleet import account

    samples = {"a": np.array([1000, 2000, 3000]), "b": np.array([1500])}
    full = [("a", 1, 0, 5000), ("a", 1, 1, 5000), ("a", 1, 2, 9000), ("b", 1, 0, 4000)]
    ok = account(samples, _table(full))
    assert (ok["stored"], ok["found"], ok["lost"], ok["extra_rows"], ok["duplicate_rows"]) == (4, 4, 0, 0, 0)
    assert ok["time_to_table_s"]["max"] == 6.0 and ok["time_to_table_s"]["n"] == 4

    broken = account(samples, _table(full[1:]))  # a row missing: the counter must see it
    assert broken["lost"] == 1 and broken["lost_devices"] == {"a": 1}

    odd = account(
        samples,
        _table(full + [("a", 1, 0, 9999), ("a", 2, 0, 1), ("a", 1, 3, 1), ("zz", 1, 0, 1)]),
    )  # a second copy (counted once, first sighting kept), another boot, a seq never stored, a stranger
    assert odd["lost"] == 0 and odd["duplicate_rows"] == 1 and odd["extra_rows"] == 3
    assert odd["time_to_table_s"]["max"] == 6.0

    window = account(samples, _table(full), since_ms=1500, until_ms=3000)
    assert window["time_to_table_s"]["n"] == 2  # a@2000 and b@1500


@pytest.mark.fast
def test_load_samples_keeps_one_copy_of_a_workers_samples(tmp_path):
    """A 5,000-device run was OOM-killed at 19.5 GB, its --check at 24 GB: load_samples read the whole
    sample array from the .npz again for every device and kept each copy alive through its
    slice (memory devices x samples). Now one array per worker file, sliced into views."""
    import tracemalloc

    from mqbatch.bench.fleet import load_samples

    n_dev, per = 400, 250
    names = [f"sim-{i}" for i in range(n_dev)]
    sample_ms = np.arange(n_dev * per, dtype=np.int64)  # 800 kB
    np.savez(
        tmp_path / "samples-0.npz",
        names=np.asarray(names),
        counts=np.full(n_dev, per, dtype=np.int64),
        sample_ms=sample_ms,
    )
    tracemalloc.start()
    try:
        samples = load_samples(tmp_path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert list(samples) == names and all(len(v) == per for v in samples.values())
    assert np.array_equal(np.concatenate(list(samples.values())), sample_ms)
    assert peak < 8 * sample_ms.nbytes, f"peak {peak:,} B to load {sample_ms.nbytes:,} B of samples"


@pytest.mark.slow
@pytest.mark.long  # 150 s in CI: `make test-long`; its loss accounting is tested above without a fleet
@pytest.mark.broker
def test_bench_fleet_smoke_loses_nothing_and_check_sees_a_deleted_file(tmp_path):
    """With lost connections: records/ must hold every record once, resends and all."""
    run = tmp_path / "run"
    out = run_bench(
        "fleet",
        "--devices",
        "20",
        "--minutes",
        "0.25",
        "--rate",
        "2",
        "--roll-seconds",
        "3",
        "--trigger-seconds",
        "3",
        "--report-seconds",  # micro-batches after the first write rows and commits only
        "30",
        "--cut-after",  # lost connections: resends the streaming job must drop (some land as copies)
        "1",
        "--run-dir",
        str(run),
        "--out",
        str(tmp_path),
        timeout=900,
    )
    assert re.search(r"LOST 0; rows not stored by any device 0; duplicate rows 0; device outboxes hold 0 ", out), out
    assert re.search(r"time to table, all \(sampled on the device -> row readable in records/", out)
    doc = json.loads((tmp_path / "fleet.json").read_text())
    f = doc["figures"]
    # how many were stored depends on the machine's load (worker start-up eats into the window): >= 1 batch
    assert f["lost"] == 0 and f["stored"] >= 10 and f["found"] == f["stored"]
    assert f["device_totals"]["acked"] == f["stored"] and f["broker_connections_max"] >= 20
    assert f["device_totals"]["cuts"] > 0 and f["device_totals"]["republished"] > 0 and f["duplicate_rows"] == 0
    landed = landed_batches(run / "landing")  # copies landed: the job had some to drop
    assert sum(n - 1 for n in landed.values()) > 0, f["device_totals"]
    assert (tmp_path / "fleet.png").stat().st_size > 10_000

    # the same run, one records/ file gone: --check must count what it held as lost and exit 1
    files = sorted((run / "spark-out" / "records").rglob("*.parquet"))
    assert files
    aside = run / "aside.parquet"
    files[0].rename(aside)
    proc = subprocess.run(
        [str(VENV_BIN / "mqbatch"), "bench", "fleet", "--check", str(run)], capture_output=True, text=True, timeout=120
    )
    m = re.search(r"LOST ([\d,]+)", proc.stdout)
    assert proc.returncode == 1 and m and int(m.group(1).replace(",", "")) > 0, proc.stdout + proc.stderr

    # the file back, and one written twice (its rows in records/ twice, none lost): exit 1 too
    aside.rename(files[0])
    shutil.copy(files[0], files[0].with_name("copy-" + files[0].name))
    proc = subprocess.run(
        [str(VENV_BIN / "mqbatch"), "bench", "fleet", "--check", str(run)], capture_output=True, text=True, timeout=120
    )
    m = re.search(r"LOST ([\d,]+).*duplicate rows ([\d,]+)", proc.stdout)
    assert proc.returncode == 1 and m and m.group(1) == "0" and m.group(2) != "0", proc.stdout + proc.stderr


@pytest.mark.fast
def test_a_dead_streaming_job_is_named_with_its_error(tmp_path):
    """bench fleet's table wait stops when the streaming job exits and says why (a 10,000-device
    run waited out 600 s for a job that had died of a Java heap OutOfMemoryError 9 minutes before)."""
    from mqbatch.bench.fleet import job_failure

    log = tmp_path / "spark.log"
    log.write_text(
        "WARN NativeCodeLoader: Unable to load native-hadoop library\n"
        "26/11/27 02:22:58 ERROR Executor: Exception in task 0.0 in stage 136.0\n"
        "java.lang.OutOfMemoryError: Java heap space\n"
        "\tat java.base/java.util.Arrays.copyOf(Arrays.java:3541)\n"
    )
    assert job_failure(log) == "its log: java.lang.OutOfMemoryError: Java heap space"
    log.write_text("batch 3: started, 2 new landing files\n")
    assert job_failure(log) == "its log ends: batch 3: started, 2 new landing files"
    log.write_text("")
    assert job_failure(log) == "its log is empty"


def test_the_table_rate_is_over_the_window_not_a_median_of_one_second_samples():
    """records/ grows a micro-batch at a time: 50,000 rows every 5 s, sampled every second.
    The rate the bench prints is 10,000 rows/s; the median of the per-second rates it printed
    before is 0 (the 10,000-device run of 2026-11-27 printed "0/s median while sampling")."""
    from mqbatch.bench import fleet

    series = [{"t": 120.0 + i, "table_rows": 50_000 * (i // 5)} for i in range(61)]
    assert fleet.window_rate(series, "table_rows") == pytest.approx(10_000)
    per_sample = [(b["table_rows"] - a["table_rows"]) / (b["t"] - a["t"]) for a, b in zip(series, series[1:])]
    assert fleet._median(per_sample) == 0  # what the old figure showed for the same samples
    assert fleet.window_rate(series[:1], "table_rows") is None
