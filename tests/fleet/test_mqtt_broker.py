"""mqbatch.lab.broker / mqbatch.fleet.pki against the real Mosquitto and paho-mqtt."""

from __future__ import annotations

import ssl

import paho.mqtt.client as mqtt
import pytest
from cryptography import x509
from paho.mqtt.enums import CallbackAPIVersion

from mqbatch.lab.broker import BrokerError, Mosquitto, password_line

pytestmark = pytest.mark.broker


def _connect_rc(broker, *, username=None, password=None, cafile=None, certfile=None, keyfile=None, wait=10.0):
    """CONNACK reason code name seen by paho, or the exception text if TLS failed."""
    import threading

    done = threading.Event()
    out = {}
    c = mqtt.Client(CallbackAPIVersion.VERSION2, client_id="probe", protocol=mqtt.MQTTv5)
    if broker.tls:
        c.tls_set(ca_certs=str(cafile), certfile=certfile and str(certfile), keyfile=keyfile and str(keyfile))
    if username:
        c.username_pw_set(username, password)

    def on_connect(client, userdata, flags, rc, props):
        out["rc"] = rc.getName()
        done.set()

    c.on_connect = on_connect
    try:
        c.connect(broker.host, broker.port)
    except (ssl.SSLError, OSError) as e:
        return f"error: {e}"
    c.loop_start()
    done.wait(wait)
    c.loop_stop()
    c.disconnect()
    return out.get("rc", "no CONNACK")


def test_pki_files_and_names(pki):
    srv = x509.load_pem_x509_certificate(pki.server.cert.read_bytes())
    san = srv.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "localhost" in san.get_values_for_type(x509.DNSName)
    assert [str(a) for a in san.get_values_for_type(x509.IPAddress)] == ["127.0.0.1"]
    old = x509.load_pem_x509_certificate(pki.expired_server.cert.read_bytes())
    assert old.not_valid_after_utc < srv.not_valid_before_utc.replace(year=srv.not_valid_before_utc.year)
    der = x509.load_der_x509_certificate(pki.client("device-1").cert_der.read_bytes())
    assert der.subject.rfc4514_string().startswith("CN=device-1")
    with pytest.raises(KeyError, match="no client certificate 'nobody'"):
        pki.client("nobody")


def test_password_line_rejects_bad_usernames():
    assert password_line("dev", "pw").startswith("dev:$7$101$")
    with pytest.raises(ValueError, match="cannot be stored"):
        password_line("a:b", "pw")


def test_option_errors_are_explained(tmp_path):
    with pytest.raises(BrokerError, match="both certfile and keyfile"):
        Mosquitto(tmp_path, certfile="x.crt")
    with pytest.raises(BrokerError, match="need a TLS listener"):
        Mosquitto(tmp_path, require_certificate=True)
    with pytest.raises(BrokerError, match="max_qos"):
        Mosquitto(tmp_path, max_qos=3)


def test_bad_config_fails_start_with_log(mosquitto):
    with pytest.raises(BrokerError, match="exited with status"):
        mosquitto(extra=["no_such_option 1"])


def test_passwords_acl_tls_and_restart_on_same_port(mosquitto, pki):
    b = mosquitto(
        tls=True,
        allow_anonymous=False,
        users={"device-1": "s3cret"},
        acl="user device-1\ntopic write mqbatch/device-1/telemetry\n",
        persistence=True,
    )
    assert "user " in b.config and "password_file" in b.config and "acl_file" in b.config
    assert _connect_rc(b, username="device-1", password="s3cret", cafile=pki.ca_cert) == "Success"
    assert _connect_rc(b, username="device-1", password="wrong", cafile=pki.ca_cert) == "Not authorized"
    assert _connect_rc(b, username="device-1", password="s3cret", cafile=pki.other_ca.cert).startswith("error:")
    port = b.port
    b.restart()
    assert b.port == port and b.running
    assert _connect_rc(b, username="device-1", password="s3cret", cafile=pki.ca_cert) == "Success"
    b.kill()
    assert not b.running
    b.start()
    assert b.port == port
    assert (b.directory / "data" / "mosquitto.db").exists()  # saved by the graceful restart


def test_mutual_tls_identity_as_username(mosquitto, pki):
    b = mosquitto(tls=True, require_certificate=True, use_identity_as_username=True, allow_anonymous=False)
    dev = pki.client("device-1")
    assert _connect_rc(b, cafile=pki.ca_cert, certfile=dev.cert, keyfile=dev.key) == "Success"
    # no client certificate: with TLS 1.3 the refusal arrives after the handshake, so no CONNACK
    refused = _connect_rc(b, cafile=pki.ca_cert, wait=2.0)
    assert refused == "no CONNACK" or refused.startswith("error:"), refused
    assert "as probe" in b.logs() and "u'device-1'" in b.logs()
