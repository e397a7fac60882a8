"""`mqbatch bench ingest --quick` runs end to end against a real Mosquitto (TLS, the
stack's dynamic-security policy) and prints its figures. No timing is asserted:
figures are for reading (docs/ingest.md), not for failing a loaded CI machine.
The run is the ingest section of the shared `bench all --quick` (tests/bench/conftest.py)."""

from __future__ import annotations

import json
import re

import pytest


def test_bench_ingest_quick_prints_rates_rss_and_ratio(bench_all_quick):
    text = bench_all_quick.section("ingest")
    doc = json.loads((bench_all_quick.out / "ingest.json").read_text())
    assert doc["command"] == bench_all_quick.command("ingest", "--quick") and doc["quick"] is True
    number = r"[\d,.]+"
    for what in (
        "counting subscriber",
        "recorder \\(fsync before PUBACK; timed until every row is in Parquet, the stop and final roll included\\)",
    ):
        assert re.search(
            rf"^{what}: {number} PUBLISH/s \[{number}-{number}\] = {number} records/s "
            rf"\[{number}-{number}\], peak RSS {number} MB \[{number}-{number}\]",
            text,
            re.M,
        ), text
    assert re.search(rf"^ratio recorder/counter \(same repetition\): {number} \[{number}-{number}\]$", text, re.M), text
    assert re.search(
        rf"^CPU per 1,000 PUBLISHes \(all threads\): counter {number} s \[{number}-{number}\], "
        rf"recorder {number} s \[{number}-{number}\], ratio recorder/counter {number} \[",
        text,
        re.M,
    ), text
    assert len(re.findall(r"^  rep \d+: ", text, re.M)) == 2


def test_commit_wait_ms_is_refused_outside_the_recorders_own_bound(monkeypatch):
    """`bench ingest --commit-wait-ms` takes RecorderConfig's range (COMMIT_WAIT_MAX_S, one
    bound for both) and refuses anything else in one line before a child starts."""
    import argparse

    from mqbatch.bench import ingest
    from mqbatch.ingest import recorder

    assert ingest._commit_wait_ms("0") == 0 and ingest._commit_wait_ms("100") == 100
    for bad in ("100.5", "-1", "x"):
        with pytest.raises((argparse.ArgumentTypeError, ValueError)):
            ingest._commit_wait_ms(bad)
    monkeypatch.setattr(recorder, "COMMIT_WAIT_MAX_S", 0.05)  # the recorder's bound moves: so does the bench's
    with pytest.raises(argparse.ArgumentTypeError, match=r"must be 0\.\.50 ms"):
        ingest._commit_wait_ms("60")
