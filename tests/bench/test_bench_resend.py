"""`mqbatch bench resend` (issue 24): one streaming micro-batch over a history, without a
copy, with a PUBLISH of 15 s before sent again, of half the history back, and with the
oldest one sent again. The instrument checks every micro-batch's count of new records:
a look-back that misses the copy makes the run fail (shown here by one whose suspects are
always none, in the same process after a good run)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap

import pytest

from mqbatch_testing import ROOT

pytestmark = pytest.mark.spark

SCRIPT = textwrap.dedent(
    """
    import sys
    from mqbatch.cli import main
    argv = ["bench", "resend", "--devices", "40", "--batch", "3", "--history", "2,4", "--repeat", "1",
            "--master", "local[1]", "--out", sys.argv[1]]
    print("GOOD EXIT", main(argv), flush=True)
    from mqbatch.spark import seen
    seen.suspects = lambda *args: seen.SUSPECTS.empty_table()   # never looks back
    try:
        main(argv)
    except SystemExit as e:
        print("BROKEN EXIT", e, flush=True)
    """
)


def test_bench_resend_times_both_kinds_and_fails_when_a_copy_is_missed(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
    )
    out = proc.stdout
    print(out, proc.stderr[-2000:])
    assert "GOOD EXIT 0" in out, out + proc.stderr[-3000:]
    points = re.findall(
        r"history (\d+) micro-batches, ([\d,]+) records of 40 devices .*\n"
        r"    no record may be a copy: ([\d.]+) .*\n"
        r"    \+ one PUBLISH of 15 s before sent again: ([\d.]+) .*\n"
        r"    \+ one PUBLISH of half the history before \(\d+ min or more\) sent again: ([\d.]+) .*\n"
        r"    \+ one PUBLISH of micro-batch (\d+) sent again: ([\d.]+) ",
        out,
    )
    # (the timed micro-batches of a point are history for the next)
    assert [(p[0], p[1], p[5]) for p in points] == [("2", "120", "0"), ("6", "360", "0")], out
    figures = json.loads((tmp_path / "resend.json").read_text())["figures"]
    assert [p["history_batches"] for p in figures["points"]] == [2, 6]
    for p in figures["points"]:
        assert len(p["no_copy_s"]) == len(p["recent_resend_s"]) == len(p["half_history_resend_s"]) == 1, p
        assert len(p["old_resend_s"]) == 1, p
    broken = re.search(r"BROKEN EXIT (.*)", out)
    assert broken, out  # the run with a look-back that never looks must not pass
    assert "copies) said" in broken.group(1) and "expected" in broken.group(1), broken.group(1)
