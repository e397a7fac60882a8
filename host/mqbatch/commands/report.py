"""`mqbatch report --out DIR [--html FILE]`: the HTML report of a Spark output directory
(what `mqbatch spark --out DIR` wrote: records/, quarantine/, report.json), the same
report the demo makes, for your own fleet. See mqbatch.report.write_report."""

from __future__ import annotations

import argparse
import json
import sys

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
