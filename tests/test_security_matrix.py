"""Issue 10: the authorisation matrix of the secured broker (mqbatch.brokerconf via
mqbatch.stack), probed with paho-mqtt against a real Mosquitto: for each role and
action the broker's answer must be the expected one. docs/security.md shows the
same rows (regenerate with `tools/security_matrix.py`); a test checks it is current."""
from __future__ import annotations

import re

import pytest

from mqbatch.paths import ROOT
from mqbatch.secmatrix import markdown, run_matrix

pytestmark = pytest.mark.broker

DOC = ROOT / "docs" / "security.md"


def test_every_role_can_do_exactly_what_the_policy_allows(secure_stack):
    stack = secure_stack(["dev-001", "dev-002"])
    rows = run_matrix(stack)
    print(markdown(rows))
    bad = [r for r in rows if not r.ok]
    assert not bad, "broker answers differ from the policy:\n" + markdown(bad)
    # each role's rows are all there (nothing silently skipped)
    assert {r.role for r in rows} == {"device", "recorder", "unknown account", "wrong password", "no username"}
    assert len(rows) == 2 * 14 + 3
    table = DOC.read_text(encoding="utf-8")
    documented = re.search(r"<!-- matrix:begin -->\n(.*?)<!-- matrix:end -->", table, re.S)
    assert documented, f"{DOC} has no generated matrix section"
    assert documented.group(1) == markdown(rows), f"{DOC} is out of date: run tools/security_matrix.py"
