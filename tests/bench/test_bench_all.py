"""`mqbatch bench all --quick` (what `make bench` runs, at smoke-test sizes): every
target runs end to end, prints its figures and writes OUT/TARGET.json, and the report
(benchmarks.md with its PNG plots) is rendered into OUT, not docs/. No timing is
asserted: figures are for reading (docs/), not for failing a loaded CI machine."""

from __future__ import annotations

import json
import os
import re


def test_bench_all_quick_runs_every_target_and_prints_figures(bench_all_quick):
    text, tmp_path = bench_all_quick.text, bench_all_quick.out  # the shared run, tests/bench/conftest.py
    headers = re.findall(r"^== mqbatch bench (\w+)", text, re.M)
    assert headers == ["wire", "device", "ingest", "spark", "report"], headers
    assert re.search(r"^mqbatch +100 +[\d.]+ \[[\d.]+\.\.[\d.]+\] +38\.0 +1\.00 ", text, re.M), text  # wire split
    n = r"[\d,.]+"
    assert re.search(rf"^ratio recorder/counter \(same repetition\): {n} \[{n}-{n}\]$", text, re.M), text
    for what in (
        "\\(a\\) mqbatch decode\\+validate\\+explode",
        "\\(b\\) from_json\\+explode",
        "\\(c\\) full batch job",
    ):
        assert re.search(
            rf"^{what}.*: {n} records/s \[{n}-{n}\] \({n} s \[{n}-{n}\]\); machine CPU {n} \[{n}\.\.{n}\] s", text, re.M
        ), what
    assert re.search(rf"^ratio \(a\)/\(b\) records/s, medians of this run: {n}$", text, re.M), text
    device = text[text.index("== mqbatch bench device") : text.index("== mqbatch bench ingest")]
    assert re.search(r"\d", device), device
    for target in ("wire", "device", "ingest", "spark"):
        doc = json.loads((tmp_path / f"{target}.json").read_text())
        assert doc["quick"] is True and doc["figures"], target
        assert doc["command"].startswith(f"mqbatch bench {target}") and "bench all --quick" in doc["command"]
        assert doc["machine"]["cpu"] and doc["versions"]["mqbatch"], target
    md = (tmp_path / "benchmarks.md").read_text()
    assert f"report: {tmp_path / 'benchmarks.md'}" in text  # --quick never writes docs/
    for png in ("wire_bytes", "records_per_s", "heap"):
        data = (tmp_path / "benchmarks" / f"{png}.png").read_bytes()
        assert data.startswith(b"\x89PNG\r\n\x1a\n") and len(data) > 10_000, png
        assert f"](benchmarks/{png}.png)" in md
    # one provenance block per section: wire bytes and device rates (both from wire.json), device, ingest, spark
    assert md.count("*Command:* `mqbatch bench ") == 5 and md.count("*Machine:* ") == 5
    # the test JVMs' C1-only JIT (tests/conftest.py) is named with the figures it shaped (Spark's only)
    assert md.count(f"JVM options `SPARK_SUBMIT_OPTS={os.environ['SPARK_SUBMIT_OPTS']}`") == 1, md
    spark_block = md[md.index("## Spark pipeline") :]
    assert "SPARK_SUBMIT_OPTS=" in spark_block[: spark_block.index("*Versions:*")], spark_block[:2000]
    for heading in (
        "## Bytes per record on the wire",
        "## Records per second",
        "## Device CPU per record",
        "## Recorder vs a counting subscriber",
        "## Spark pipeline",
        "## End-to-end latency",
    ):
        assert heading in md, heading


def test_each_target_is_checked_on_its_own_section_only(tmp_path):
    """The per-target tests read their section of the shared run: a figure printed by another
    target is not in it, and a target that printed no section fails the test."""
    import pytest

    from mqbatch_testing.bench import BenchRun

    run = BenchRun("== mqbatch bench wire --quick\nwire row\n== mqbatch bench device --quick\ndevice row\n", tmp_path)
    assert run.section("wire") == "\nwire row\n" and run.section("device") == "\ndevice row\n"
    with pytest.raises(AssertionError, match="no section for bench ingest"):
        run.section("ingest")
    assert (
        run.command("wire", "--quick")
        == f"mqbatch bench wire --quick (part of: mqbatch bench all --quick --out {tmp_path})"
    )
