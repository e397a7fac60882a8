"""The streaming job's warm-up (mqbatch.spark.warmup): two micro-batches of its own before it
takes the landing zone, so that the first landing files of a live table do not wait for a cold
JVM (docs/spark.md, docs/scale.md). It must do the work (valid records, a resend dropped by
the stream, a malformed PUBLISH; signed when the job checks batch-hmac; within the job's batch
limits), leave nothing in the job's outputs, and never stop the job."""

from __future__ import annotations

import argparse

import pytest

from mqbatch.spark import warmup
from mqbatch.wire import codec, integrity
from mqbatch_testing.spark import T0_MS, landed, sample, write_landing

KEY_A = bytes(range(32))
WARM_LINES = ("telemetry_job: warmed up", "telemetry_job: the warm-up")


def _landing(tmp_path, signed: bool):
    topic = "mqbatch/dev-a/telemetry"
    subs = [sample(1, s)[0] for s in range(5)]
    if signed:
        props, payload = codec.encode_batch(subs)
        props = list(props) + [integrity.sign(KEY_A, topic, props, payload)]
        row = landed(topic, [], T0_MS + 1000, props=props, payload=payload)
    else:
        row = landed(topic, subs, T0_MS + 1000)
    write_landing(tmp_path / "landing", "r1", 0, [row])
    return tmp_path / "landing"


def _stream(spark, landing, out, opts, **kw):
    from mqbatch import spark as S

    lines: list[str] = []
    reported: list[str] = []
    report = S.run_stream(
        spark,
        str(landing),
        str(out),
        opts,
        say=lambda line, **_: lines.append(line),
        on_report=reported.append,
        **kw,
    )
    return report, lines, reported


@pytest.mark.spark
@pytest.mark.parametrize("signed", [False, True], ids=["unsigned", "batch-hmac, 10 records a batch at most"])
def test_warm_up_does_the_work_of_two_micro_batches_and_leaves_nothing_behind(spark, tmp_path, signed):
    from mqbatch import spark as S

    landing = _landing(tmp_path, signed)
    opts = S.JobOptions(hmac_keys=(("dev-a", KEY_A),), max_batch_size=10) if signed else S.JobOptions()
    per = 10 if signed else warmup.PER_PUBLISH
    out = tmp_path / "o#1 %41"  # a URI would misread these: the warm-up's files go to Spark as file: URIs
    (out / warmup.DIRECTORY / "out" / "records").mkdir(parents=True)  # what a killed warm-up left
    report, lines, reported = _stream(spark, landing, out, opts, warm_up=True)

    said = [i for i, line in enumerate(lines) if line.startswith(WARM_LINES)]
    streaming = [i for i, line in enumerate(lines) if line.startswith("telemetry_job: streaming")]
    assert len(said) == 1 and streaming and said[0] < streaming[0], lines
    # its work: every valid record of each micro-batch written by the stream (its signatures
    # verified with a key of its own; within --max-batch-size), the resend of micro-batch 1
    # dropped by the stream (new records, not just the report's count), the malformed
    # PUBLISHes quarantined
    n = warmup.WARM_UP_PUBLISHES * per
    assert f"new records {n} + {n}, {per} duplicates, 2 quarantined (--no" in lines[said[0]], lines[said[0]]
    # nothing of it in the job's outputs: its one device, five records, no quarantined row
    assert set(report["devices"]) == {"dev-a"} and report["records"]["unique"] == 5, report["devices"].keys()
    assert report["quarantine"]["rows"] == 0 and report["landed"] == 1
    assert report["options"].get("hmac_keys") == (["dev-a"] if signed else None)
    assert [r.device for r in spark.read.parquet(str(out / "records")).select("device").distinct().collect()] == [
        "dev-a"
    ]
    assert spark.read.parquet(str(out / "quarantine")).count() == 0
    assert not (out / warmup.DIRECTORY).exists()
    assert reported and set(reported) == {str(out)}  # the report callback saw the job's outputs only


@pytest.mark.spark
def test_a_failing_warm_up_is_one_line_and_the_job_streams_cold(spark, tmp_path, monkeypatch):
    from mqbatch import spark as S

    def disk_error(*_a, **_k):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(warmup, "_landing_file", disk_error)  # a fault: the disk fills during the warm-up
    landing = _landing(tmp_path, False)
    out = tmp_path / "out"
    report, lines, _ = _stream(spark, landing, out, S.JobOptions(), warm_up=True)
    assert [line for line in lines if line.startswith(WARM_LINES)] == [
        "telemetry_job: the warm-up failed (OSError: [Errno 28] No space left on device); streaming cold"
    ]
    assert report["records"]["unique"] == 5 and not (out / warmup.DIRECTORY).exists()


@pytest.mark.spark
def test_no_warm_up_still_removes_what_a_killed_one_left_and_never_follows_a_link(spark, tmp_path):
    from mqbatch import spark as S

    landing = _landing(tmp_path, False)
    out, elsewhere = tmp_path / "out", tmp_path / "elsewhere"
    (elsewhere / "keep").mkdir(parents=True)
    out.mkdir(mode=0o700)
    (out / warmup.DIRECTORY).symlink_to(elsewhere)
    _, lines, _ = _stream(spark, landing, out, S.JobOptions())
    assert not (out / warmup.DIRECTORY).exists() and not (out / warmup.DIRECTORY).is_symlink()
    assert (elsewhere / "keep").is_dir()  # the link's target untouched
    assert not [line for line in lines if line.startswith(WARM_LINES)]


def test_no_warm_up_reaches_the_job_through_mqbatch_spark():
    from mqbatch.spark import options
    from mqbatch.spark.submit import job_arguments

    p = argparse.ArgumentParser()
    options.add_arguments(p)
    base = ["--landing", "l", "--out", "o", "--stream"]
    assert "--no-warm-up" in job_arguments(p.parse_args([*base, "--no-warm-up"]))
    assert "--no-warm-up" not in job_arguments(p.parse_args(base))
