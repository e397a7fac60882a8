"""Issue 10: the authorisation matrix of the secured broker (mqbatch.fleet.brokerconf via
mqbatch.lab.stack), probed with paho-mqtt against a real Mosquitto: for each role and
action the broker's answer must be the expected one. docs/security.md shows the
same rows (regenerate with `tools/security_matrix.py`); a test checks it is current."""

from __future__ import annotations

import re

import pytest

from mqbatch.fleet.brokerconf import Policy
from mqbatch.scenarios.secmatrix import Probe, markdown, run_matrix
from mqbatch.util.paths import ROOT

pytestmark = pytest.mark.broker

DOC = ROOT / "docs" / "security.md"


@pytest.mark.fast
def test_every_role_can_do_exactly_what_the_policy_allows(secure_stack):
    stack = secure_stack(["dev-001", "dev-002"])
    rows = run_matrix(stack)
    print(markdown(rows))
    bad = [r for r in rows if not r.ok]
    assert not bad, "broker answers differ from the policy:\n" + markdown(bad)
    # each role's rows are all there (nothing silently skipped)
    assert {r.role for r in rows} == {"device", "recorder", "unknown account", "wrong password", "no username"}
    assert len(rows) == 2 * 19 + 1 + 3
    table = DOC.read_text(encoding="utf-8")
    documented = re.search(r"<!-- matrix:begin -->\n(.*?)<!-- matrix:end -->", table, re.S)
    assert documented, f"{DOC} has no generated matrix section"
    assert documented.group(1) == markdown(rows), f"{DOC} is out of date: run tools/security_matrix.py"


def test_certificate_identity_binds_the_client_id_to_the_cn(mosquitto, pki):
    # mutual TLS, CN = username (broker_options(cert_identity=True)): whatever client id a
    # device sends, the broker uses its CN, so device-2 cannot take over device-1's session
    policy = Policy()
    for name in ("device-1", "device-2"):
        policy.add_device(name, None)
    policy.add_recorder("reader", None)
    b = mosquitto(tls=True, **policy.broker_options(cert_identity=True))

    def probe(name, client_id):
        c = pki.client(name)
        return Probe(b.host, b.port, pki.ca_cert, client_id, None, None, certfile=c.cert, keyfile=c.key)

    d1 = probe("device-1", "device-1")
    answers = [
        d1.connack,
        d1.publish("mqbatch/device-1/telemetry"),
        d1.publish("mqbatch/device-2/telemetry"),
        d1.subscribe(policy.share_subscription),
    ]
    d2 = probe("device-2", "device-1")
    rec = probe("reader", "anything")
    answers += [d2.connack, rec.subscribe(policy.share_subscription), rec.subscribe("#")]
    print(answers)
    assert answers == [
        "0x00 Success",
        "0x10 No matching subscribers",
        "0x87 Not authorized",
        "0x87 Not authorized",
        "0x00 Success",
        "0x01 Granted QoS 1",
        "0x87 Not authorized",
    ]
    assert d1.connected, "device-2 presenting device-1's client id took device-1's connection over"
    assert "as device-2 (" in b.logs() and "as reader (" in b.logs()
    for p in (d1, d2, rec):
        p.close()
