"""Issue 10, finding 8 (TLS): the broker offers TLS 1.2+ with AEAD suites only,
and a device without the client certificate a broker requires is told so by
name (it used to say only "TLS handshake failed: 32")."""

from __future__ import annotations

import socket
import ssl

import pytest
from test_mqtt_client import errors, of, plan

from mqbatch.fleet.brokerconf import Policy
from mqbatch_testing.broker import run_drive

pytestmark = pytest.mark.broker


def _handshake(broker, pki, **ctx_opts) -> str:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.load_verify_locations(str(pki.ca_cert))
    for k, v in ctx_opts.items():
        if k == "ciphers":
            ctx.set_ciphers(v)
        else:
            setattr(ctx, k, v)
    try:
        with ctx.wrap_socket(
            socket.create_connection((broker.host, broker.port), timeout=5), server_hostname="localhost"
        ) as s:
            return f"{s.version()} {s.cipher()[0]}"
    except (ssl.SSLError, OSError) as e:
        return f"refused: {type(e).__name__}"


def test_only_tls12_plus_with_aead_suites(mosquitto, pki):
    opts = Policy().broker_options()
    b = mosquitto(tls=True, tls_version=opts["tls_version"], ciphers=opts["ciphers"])
    cbc = _handshake(
        b,
        pki,
        maximum_version=ssl.TLSVersion.TLSv1_2,
        ciphers="ECDHE-ECDSA-AES128-SHA:ECDHE-ECDSA-AES256-SHA:ECDHE-ECDSA-AES128-SHA256",
    )
    gcm = _handshake(b, pki, maximum_version=ssl.TLSVersion.TLSv1_2)
    print(f"CBC-SHA1/SHA256 suites: {cbc}; TLS 1.2 default: {gcm}")
    assert cbc.startswith("refused")
    assert gcm.startswith("TLSv1.2 ECDHE-ECDSA-") and ("GCM" in gcm or "CHACHA20" in gcm)


def test_missing_client_certificate_is_named(mosquitto, pki, tmp_path):
    b = mosquitto(tls=True, require_certificate=True, use_identity_as_username=True, allow_anonymous=False)
    ev = run_drive(
        plan(b.host, b.port, [["connect", {}]], tls={"cafile": str(pki.ca_cert), "server_hostname": "localhost"}),
        tmp_path,
    )
    (err,) = errors(ev)
    print(err["message"])
    assert err["type"] == "TLSError" and err["kind"] == "rejected", err
    assert "client certificate" in err["message"]
    assert not of(ev, "connack")
