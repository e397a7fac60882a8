"""report — the self-contained HTML report of a Spark output, and its SVG charts (product).

    from mqbatch.report import write_report
    write_report("out/")                    # out/report.html from out/records, quarantine, report.json

`mqbatch report --out DIR`, the demo, `fleet run` and the streaming job all use it.

May import: ``mqbatch.wire``, ``mqbatch.util``.
"""

from mqbatch.report.html import ReportError, RunInfo, write_report

__all__ = ["ReportError", "RunInfo", "write_report"]
