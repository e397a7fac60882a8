"""`mqbatch bench all --quick` (what `make bench` runs, at smoke-test sizes): every
target runs end to end and prints its figures. No timing is asserted: figures are
for reading (docs/), not for failing a loaded CI machine."""
from __future__ import annotations

import re
import subprocess

from mqbatch_testing import VENV_BIN


def test_bench_all_quick_runs_every_target_and_prints_figures():
    out = subprocess.run([str(VENV_BIN / "mqbatch"), "bench", "all", "--quick"],
                         capture_output=True, text=True, timeout=900)
    text = out.stdout
    print(text)
    assert out.returncode == 0, text[-3000:] + out.stderr[-3000:]
    headers = re.findall(r"^== mqbatch bench (\w+)", text, re.M)
    assert headers == ["device", "ingest", "spark"], headers
    n = r"[\d,.]+"
    assert re.search(rf"^ratio recorder/counter \(same repetition\): {n} \[{n}-{n}\]$", text, re.M), text
    for what in ("\\(a\\) mqbatch decode\\+validate\\+explode", "\\(b\\) from_json\\+explode",
                 "\\(c\\) full batch job"):
        assert re.search(rf"^{what}.*: {n} records/s \[{n}-{n}\]", text, re.M), what
    assert re.search(rf"^ratio \(a\)/\(b\) records/s, medians of this run: {n}$", text, re.M), text
    device = text[text.index("== mqbatch bench device"):text.index("== mqbatch bench ingest")]
    assert re.search(r"\d", device), device
