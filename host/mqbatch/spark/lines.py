"""The lines the job prints that `mqbatch spark` acts on, across spark-submit (no pyspark here:
the command imports this before any JVM starts)."""

PROGRESS = "spark: "  # the start of the job's progress lines (`spark: <step> <seconds> s`), to stderr
# after each rewrite of report.json (on stdout): `mqbatch spark --stream` then writes the HTML report
REPORT_WRITTEN = "telemetry_job: report.json written"
LOCK_HELD = "telemetry_job: another job is streaming with the checkpoint"  # then the checkpoint, to stderr
