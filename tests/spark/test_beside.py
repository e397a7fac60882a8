"""mqbatch.spark.beside, the work beside the stream (its report.json with --report-seconds):
once a stop began, it writes nothing and starts no Spark job; before it, its jobs run in its
own pool and session, without the properties of the micro-batch that started it, and its
failure is raised once in the stream's thread."""

from __future__ import annotations

import threading
import time

import pytest

pytestmark = pytest.mark.spark


def _held(aside, after_gate) -> threading.Event:
    """Starts work that waits for the returned gate, then calls after_gate(session)."""
    gate = threading.Event()

    def work(session):
        assert gate.wait(120), "the test never opened the gate"
        after_gate(session)

    assert aside.start("a test's work", work)
    return gate


def _stopped_while_held(aside, gate: threading.Event) -> None:
    """stop() begins while the work waits; the gate opens after that; stop() returns."""
    stopper = threading.Thread(target=aside.stop, kwargs={"wait_s": 120})
    stopper.start()
    deadline = time.monotonic() + 60
    while not aside._stopping and time.monotonic() < deadline:
        time.sleep(0.01)
    gate.set()
    stopper.join(180)
    assert not stopper.is_alive() and not aside.busy()


def test_after_a_stop_began_the_work_beside_writes_nothing_and_runs_no_spark_job(spark):
    from mqbatch.spark import beside

    aside, wrote = beside.Beside(spark), []
    gate = _held(aside, lambda session: wrote.append(aside.publish(lambda: wrote.append("written"))))
    _stopped_while_held(aside, gate)
    assert wrote == [False]  # refused, not written
    assert not aside.start("more work", lambda session: None)  # and nothing starts after a stop

    aside, ran = beside.Beside(spark), []
    gate = _held(aside, lambda session: ran.append(session.range(1000).count()))
    _stopped_while_held(aside, gate)
    assert ran == []  # a job started after the stop began is cancelled (not only the running ones)
    aside.raise_failure()  # and a cancelled run is no failure

    aside, ran = beside.Beside(spark), []  # another one in the same SparkContext is not cancelled
    assert aside.start("work after another's stop", lambda session: ran.append(session.range(10).count()))
    aside._thread.join(120)
    aside.raise_failure()
    assert ran == [10]


def test_the_work_beside_runs_in_its_pool_and_session_and_its_failure_is_raised_once(spark):
    from mqbatch.spark import beside

    sc, seen = spark.sparkContext, []
    aside = beside.Beside(spark, say=lambda *a, **k: seen.append(a[0]))

    def work(session):
        pool, inherited = sc.getLocalProperty("spark.scheduler.pool"), sc.getLocalProperty("mqbatch.test.inherited")
        seen.append((pool, inherited, session is spark, session.conf.get("spark.sql.session.timeZone")))
        assert aside.publish(lambda: seen.append("written"))
        raise ValueError("a broken report")

    sc.setLocalProperty("mqbatch.test.inherited", "the micro-batch's")  # as a micro-batch's SQL execution id
    try:
        assert aside.start("a test's work", work)
    finally:
        sc.setLocalProperty("mqbatch.test.inherited", None)
    aside._thread.join(120)
    assert seen[:2] == [(beside.POOL, None, False, spark.conf.get("spark.sql.session.timeZone")), "written"], seen
    assert seen[2].startswith("telemetry_job: a test's work failed beside the stream: ValueError: a broken report")
    with pytest.raises(RuntimeError, match="work beside the stream failed: a broken report"):
        aside.raise_failure()
    aside.raise_failure()  # once
