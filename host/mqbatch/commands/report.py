"""`mqbatch report --out DIR [--html FILE]`: the HTML report of a Spark output directory
(what `mqbatch spark --out DIR` wrote: records/, quarantine/, report.json), the same
report the demo makes, for your own fleet. See mqbatch.report.write_report."""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading

from mqbatch.util.argtypes import directory


def run(args: argparse.Namespace) -> int:
    from mqbatch.report import ReportError, write_report

    try:
        path = write_report(args.out, args.html)
    except ReportError as e:
        print(f"report: {e}", file=sys.stderr)
        return 2
    rep = json.loads((path.parent / "report.json").read_text()) if args.html is None else None
    what = (
        f" ({len(rep.get('devices', {}))} devices, {rep.get('records', {}).get('unique', 0)} curated records)"
        if rep
        else ""
    )
    print(f"report: {path}{what}")
    return 0


class HtmlReport:
    """The HTML report (mqbatch.report.write_report) of a Spark output `out`, 0600, for the
    commands that run or feed a job (`mqbatch spark`, `fleet run`): write() now, or on_line()
    asks for it when a line of the job starts with `signal` (the stream rewrote report.json);
    a worker thread writes it (a slow write never blocks the job's output) and close() waits
    for what was asked. A failure is one line on stderr, never an exception."""

    def __init__(self, out: str, who: str, signal: str = ""):
        self.out, self.who, self.signal = str(out), who, signal.encode()
        self.wanted, self.asked, self.written, self.done = threading.Event(), 0, 0, False
        self.worker: threading.Thread | None = None

    def write(self):
        from mqbatch.report import ReportError, write_report

        if "://" in self.out:
            return None  # not a local folder
        try:
            path = write_report(self.out)
            os.chmod(path, 0o600)
        except (ReportError, OSError) as e:
            print(f"{self.who}: no HTML report: {e}", file=sys.stderr, flush=True)
            return None
        print(f"{self.who}: HTML report {path}", file=sys.stderr, flush=True)
        return path

    def on_line(self, line: bytes) -> None:
        if not self.signal or not line.startswith(self.signal):
            return
        self.asked += 1
        if self.worker is None:
            self.worker = threading.Thread(target=self._work, name="html-report", daemon=True)
            self.worker.start()
        self.wanted.set()

    def _work(self) -> None:
        while True:
            self.wanted.wait()
            self.wanted.clear()
            while self.asked > self.written:
                n = self.asked
                self.write()
                self.written = n
            if self.done:
                return

    def close(self) -> None:
        if self.worker is not None:
            self.done = True
            self.wanted.set()
            self.worker.join()


def register(sub) -> None:
    p = sub.add_parser(
        "report",
        help="HTML report of a Spark output directory (records, quarantine, device health)",
        description=__doc__.split("\n\n")[0],
    )
    p.add_argument(
        "--out",
        required=True,
        type=directory,
        metavar="DIR",
        help="the Spark job's output directory (`mqbatch spark --out DIR`)",
    )
    p.add_argument("--html", metavar="FILE", help="where to write the report (default DIR/report.html)")
    p.set_defaults(func=run)
