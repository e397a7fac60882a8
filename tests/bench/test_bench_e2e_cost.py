"""`mqbatch bench e2e-cost` (issue 24): the wire bytes end-to-end acks add, measured with
and without them through the inspecting proxy. The figure must be positive: a run where
both sides were measured alike (e2e acks on twice) would print ~0 and fail here."""

from __future__ import annotations

import json
import re

import pytest

from mqbatch_testing import run_bench


@pytest.mark.broker
def test_bench_e2e_cost_measures_the_ack_bytes(tmp_path):
    out = run_bench("e2e-cost", "--sizes", "10", "--batches", "5", "--out", str(tmp_path), timeout=300)
    m = re.search(r"e2e acks add ([\d,.]+) B/batch = ([\d.]+) B/record \(TLS bytes alone: ([\d,.]+) B/batch\)", out)
    assert m, out
    tls = float(m.group(3).replace(",", ""))
    # batch-seq (~25 B) + the ack PUBLISH (~44 B MQTT) + its PUBACK (4 B), each TLS record >= 22 B of overhead
    assert 70 < tls < 400, tls
    row = json.loads((tmp_path / "e2e-cost.json").read_text())["figures"]["rows"][0]
    assert row["with"]["s2c"]["tls_bytes"] > row["without"]["s2c"]["tls_bytes"]  # the ack PUBLISH comes down
