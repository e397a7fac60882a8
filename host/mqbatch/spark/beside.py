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
- What it writes it writes through publish(), which refuses once stop() began: after stop()
  the work writes nothing (its Spark jobs, running or still to come, are cancelled too).
- A failure is kept and raised in the stream's thread by raise_failure (the next
  micro-batch fails with it, as it would have inline); stop() cancels its jobs and waits."""

from __future__ import annotations

import itertools
import pathlib
import threading
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # submit.py reads SCHEDULER in a process without pyspark
    from pyspark.sql import SparkSession

POOL = "mqbatch-beside"  # its Spark jobs' scheduler pool (scheduler.xml gives it the idle cores)
GROUP = "mqbatch-beside"  # and their job group, GROUP-<n> for the n-th Beside of the process (stop
# cancels its future jobs too, for as long as the SparkContext lives: never another's)
_made = itertools.count(1)
SCHEDULER_XML = pathlib.Path(__file__).with_name("scheduler.xml")
# the launch settings that let a micro-batch go first (job.session and `mqbatch spark` set them
# unless the user set spark.scheduler.mode); a file: URI (a bare path would be read from the
# cluster's default file system)
SCHEDULER = {"spark.scheduler.mode": "FAIR", "spark.scheduler.allocation.file": SCHEDULER_XML.as_uri()}
STOP_WAIT_S = 60.0  # stop() waits this long for the work's thread after cancelling its jobs


def scheduler_conf(configured, say=None) -> dict[str, str]:
    """SCHEDULER, or nothing when `configured` (a launch conf's keys) already sets the mode or
    the pools' file; FAIR alone (every pool equal: the work beside the stream then takes
    half the cores) if scheduler.xml is missing (Spark would not start), said on `say`."""
    if "spark.scheduler.mode" in configured or "spark.scheduler.allocation.file" in configured:
        return {}
    if SCHEDULER_XML.is_file():
        return dict(SCHEDULER)
    if say is not None:
        say(f"mqbatch.spark: {SCHEDULER_XML} is missing: the report beside the stream shares the cores equally")
    return {"spark.scheduler.mode": "FAIR"}


class Beside:
    """At most one `work(session)` at a time in a daemon thread (start), its failure kept for
    raise_failure, stop() to cancel it. `say` gets one line when a run fails or is still
    running after stop's wait."""

    def __init__(self, spark: SparkSession, say=print):
        self.spark, self.say = spark, say
        self._thread: threading.Thread | None = None
        self._failure: BaseException | None = None
        self._stopping = False
        self._writing = threading.Lock()  # publish and stop: nothing is written after stop began
        self.group = f"{GROUP}-{next(_made)}"
        self._session: SparkSession | None = None  # one for every run: a new one each minute for months adds up

    def busy(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self, what: str, work) -> bool:
        """Runs work(session) beside the caller unless a run is busy (then False). `what` names
        it in the job group's description and in the line of a failure."""
        if self.busy() or self._stopping:
            return False
        from pyspark import InheritableThread  # (pyspark here only: submit.py imports this module without it)

        settings = self._sql_settings()
        self._thread = InheritableThread(target=self._run, args=(what, work, settings), name=POOL, daemon=True)
        self._thread.start()
        return True

    def _sql_settings(self) -> dict[str, str]:
        """The stream session's SQL settings now (the runtime ones it set and the launch ones)."""
        return {k: v for k, v in self.spark.conf.getAll.items() if k.startswith("spark.sql.")}

    def _run(self, what: str, work, settings: dict[str, str]) -> None:
        from pyspark.errors import AnalysisException

        sc = self.spark.sparkContext
        try:
            # not the micro-batch's properties this thread inherited (its SQL execution, query id)
            sc._jsc.sc().setLocalProperties(sc._jvm.java.util.Properties())  # type: ignore[union-attr]
            sc.setLocalProperty("spark.scheduler.pool", POOL)
            sc.setJobGroup(self.group, what, interruptOnCancel=True)
            if self._session is None:
                self._session = self.spark.newSession()
            for key, value in settings.items():
                if self._session.conf.get(key, None) != value:
                    try:
                        self._session.conf.set(key, value)
                    except AnalysisException:  # a static setting: the session has the launch value
                        pass
            work(self._session)
        except BaseException as e:  # raised in the stream's thread (raise_failure), unless stopped
            if not self._stopping:
                self.say(f"telemetry_job: {what} failed beside the stream: {type(e).__name__}: {e}", flush=True)
                self._failure = e

    def publish(self, write) -> bool:
        """Calls write() (what the work writes: its results) unless stop() began; False then."""
        with self._writing:
            if self._stopping:
                return False
            write()
            return True

    def raise_failure(self) -> None:
        """Raises the last run's failure (once), if it failed."""
        failure, self._failure = self._failure, None
        if failure is not None:
            raise RuntimeError(f"telemetry_job: work beside the stream failed: {failure}") from failure

    def stop(self, wait_s: float = STOP_WAIT_S) -> None:
        """No new run; the running one's Spark jobs cancelled (when the JVM is still there) and
        its thread waited for, at most wait_s (a run cancelled keeps no failure)."""
        with self._writing:  # a publish under way ends first; none after it
            self._stopping = True
        if not self.busy():
            return
        try:  # its running jobs and any it would start (cancelJobGroup alone stops only running ones)
            self.spark.sparkContext._jsc.sc().cancelJobGroupAndFutureJobs(self.group)
        except Exception:  # noqa: BLE001 - after a stop signal the JVM may be gone: its jobs with it
            pass
        assert self._thread is not None
        self._thread.join(wait_s)
        if self._thread.is_alive():
            self.say(f"telemetry_job: the work beside the stream did not end within {wait_s:g} s", flush=True)
