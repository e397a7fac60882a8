"""Work beside the stream's micro-batches: one Spark computation at a time in a thread of
its own, so a micro-batch never waits for it (the stream's report.json with --report-seconds:
its cost grows with the history, and computed in the micro-batch's path it held the next
micro-batch for about a minute at 10,000 devices after a quarter of an hour, docs/scale.md).

- Its Spark jobs run in the scheduler pool POOL. In a session started with the job's
  settings (job.session, `mqbatch spark`: SCHEDULER, spark.scheduler.mode FAIR and
  scheduler.xml) the micro-batches' pool has every core it asks for first (its minShare),
  and the work takes the cores they leave idle; under Spark's default FIFO scheduling the
  work's tasks and a micro-batch's share the queue in the order they were submitted.
- It runs in a new session of the same SparkContext with a copy of the stream's SQL
  settings at its start (timeZone, shuffle partitions, ...), so settings it changes for
  itself (the report's shuffle partitions) never reach a micro-batch, nor theirs it.
- A failure is kept and raised in the stream's thread by raise_failure (the next
  micro-batch fails with it, as it would have inline); stop() cancels its jobs and waits."""

from __future__ import annotations

import pathlib
import threading
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # submit.py reads SCHEDULER in a process without pyspark
    from pyspark.sql import SparkSession

POOL = "mqbatch-beside"  # its Spark jobs' scheduler pool (scheduler.xml gives it the idle cores)
GROUP = "mqbatch-beside"  # and their job group (cancelled by stop)
SCHEDULER_XML = pathlib.Path(__file__).with_name("scheduler.xml")
# the launch settings that let a micro-batch go first (job.session and `mqbatch spark` set them
# unless the user set spark.scheduler.mode)
SCHEDULER = {"spark.scheduler.mode": "FAIR", "spark.scheduler.allocation.file": str(SCHEDULER_XML)}
STOP_WAIT_S = 60.0  # stop() waits this long for the work's thread after cancelling its jobs


def scheduler_conf(configured) -> dict[str, str]:
    """SCHEDULER, or nothing when `configured` (a launch conf's keys) already sets the mode;
    FAIR alone (every pool equal) if scheduler.xml is missing (Spark would not start)."""
    if "spark.scheduler.mode" in configured:
        return {}
    return {k: v for k, v in SCHEDULER.items() if k != "spark.scheduler.allocation.file" or SCHEDULER_XML.is_file()}


class Beside:
    """At most one `work(session)` at a time in a daemon thread (start), its failure kept for
    raise_failure, stop() to cancel it. `say` gets one line when a run fails or is still
    running after stop's wait."""

    def __init__(self, spark: SparkSession, say=print):
        self.spark, self.say = spark, say
        self._thread: threading.Thread | None = None
        self._failure: BaseException | None = None
        self._stopping = False

    def busy(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self, what: str, work) -> bool:
        """Runs work(session) beside the caller unless a run is busy (then False). `what` names
        it in the job group's description and in the line of a failure."""
        if self.busy() or self._stopping:
            return False
        from pyspark import InheritableThread

        settings = self._sql_settings()
        self._thread = InheritableThread(target=self._run, args=(what, work, settings), name=POOL, daemon=True)
        self._thread.start()
        return True

    def _sql_settings(self) -> dict[str, str]:
        """The stream session's SQL settings now (the runtime ones it set and the launch ones)."""
        return {k: v for k, v in self.spark.conf.getAll.items() if k.startswith("spark.sql.")}

    def _run(self, what: str, work, settings: dict[str, str]) -> None:
        sc = self.spark.sparkContext
        try:
            sc.setLocalProperty("spark.scheduler.pool", POOL)
            sc.setJobGroup(GROUP, what)
            session = self.spark.newSession()
            for key, value in settings.items():
                try:
                    session.conf.set(key, value)
                except Exception:  # noqa: BLE001 - a static setting: the new session has it already
                    pass
            work(session)
        except BaseException as e:  # raised in the stream's thread (raise_failure), unless stopped
            if not self._stopping:
                self.say(f"telemetry_job: {what} failed beside the stream: {type(e).__name__}: {e}", flush=True)
                self._failure = e

    def raise_failure(self) -> None:
        """Raises the last run's failure (once), if it failed."""
        failure, self._failure = self._failure, None
        if failure is not None:
            raise RuntimeError(f"telemetry_job: work beside the stream failed: {failure}") from failure

    def stop(self, wait_s: float = STOP_WAIT_S) -> None:
        """No new run; the running one's Spark jobs cancelled (when the JVM is still there) and
        its thread waited for, at most wait_s (a run cancelled keeps no failure)."""
        self._stopping = True
        if not self.busy():
            return
        try:
            self.spark.sparkContext.cancelJobGroup(GROUP)
        except Exception:  # noqa: BLE001 - after a stop signal the JVM may be gone: its jobs with it
            pass
        assert self._thread is not None
        self._thread.join(wait_s)
        if self._thread.is_alive():
            self.say(f"telemetry_job: the work beside the stream did not end within {wait_s:g} s", flush=True)
