"""Regenerate the authorisation matrix of docs/security.md.

Starts the local secured stack (mqbatch.lab.stack.LocalStack: a real Mosquitto with
the policy of mqbatch.fleet.brokerconf) in a temporary directory, probes every
(role, action) with paho-mqtt (mqbatch.scenarios.secmatrix), prints the table and writes
it between the `<!-- matrix:begin -->` / `<!-- matrix:end -->` markers of
docs/security.md. Exits 1 if any answer differs from the policy.

    .venv/bin/python tools/security_matrix.py            # rewrite docs/security.md
    .venv/bin/python tools/security_matrix.py --check    # only compare, exit 1 if the doc is stale
"""

from __future__ import annotations

import argparse
import pathlib
import re
import sys
import tempfile

from mqbatch.lab.stack import LocalStack
from mqbatch.scenarios.secmatrix import markdown, run_matrix
from mqbatch.util.paths import ROOT

DOC = ROOT / "docs" / "security.md"
SECTION = re.compile(r"(<!-- matrix:begin -->\n)(.*?)(<!-- matrix:end -->)", re.S)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="do not write; exit 1 if docs/security.md differs")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="mqbatch-secmatrix-") as tmp:
        stack = LocalStack(pathlib.Path(tmp), ["dev-001", "dev-002"])
        stack.broker.start()
        try:
            rows = run_matrix(stack)
        finally:
            stack.broker.stop()
    table = markdown(rows)
    print(table, end="")
    doc = DOC.read_text(encoding="utf-8")
    if not SECTION.search(doc):
        print(f"{DOC}: no <!-- matrix:begin --> ... <!-- matrix:end --> section", file=sys.stderr)
        return 1
    new = SECTION.sub(lambda m: m.group(1) + table + m.group(3), doc)
    if args.check:
        if new != doc:
            print(f"{DOC} is out of date: run tools/security_matrix.py", file=sys.stderr)
            return 1
    elif new != doc:
        DOC.write_text(new, encoding="utf-8")
        print(f"wrote {DOC}")
    bad = [r for r in rows if not r.ok]
    if bad:
        print(f"{len(bad)} answers differ from the policy", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
