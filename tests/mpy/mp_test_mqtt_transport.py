# MicroPython tests of firmware/mqb_transport.py that need no network: the TLS
# configuration rules and the PEM-to-DER conversion of certificate files.
import binascii
from mqb_transport import Transport, TLSError, read_der, TLS_UNTRUSTED, TLS_HOSTNAME, TLS_EXPIRED, TLS_HANDSHAKE, \
    TLS_REJECTED
from outbox_util import TmpDir, str_raises


def test_tls_is_the_default_and_plain_tcp_must_be_explicit():
    msg = str_raises(ValueError, Transport, "broker.example")
    assert "TLS needs cafile" in msg and "plain_tcp=True" in msg, msg
    t = Transport("broker.example", plain_tcp=True)
    assert t.port == 1883 and not t.is_open
    assert "choose one" in str_raises(ValueError, Transport, "b", cafile="ca.der", plain_tcp=True)


def test_mutual_tls_needs_cert_and_key():
    with TmpDir("tls") as d:
        ca = d + "/ca.der"
        with open(ca, "wb") as f:
            f.write(b"\x30\x03\x02\x01\x00")  # a DER SEQUENCE that is not a certificate
        assert "not usable" in str_raises(ValueError, Transport, "b", cafile=ca)
        assert "both certfile and keyfile" in str_raises(ValueError, Transport, "b", cafile=ca, certfile=ca)


def test_pem_files_are_converted_to_der():
    der = bytes(range(256)) * 3
    b64 = binascii.b2a_base64(der).strip()
    pem = b"-----BEGIN CERTIFICATE-----\r\n"
    for i in range(0, len(b64), 64):
        pem += b64[i:i + 64] + b"\r\n"
    pem += b"-----END CERTIFICATE-----\r\n"
    with TmpDir("pem") as d:
        for name, data in (("a.pem", b"junk before\n" + pem), ("a.der", der)):
            with open(d + "/" + name, "wb") as f:
                f.write(data)
            assert read_der(d + "/" + name) == der, name
        with open(d + "/bad.pem", "wb") as f:
            f.write(b"-----BEGIN CERTIFICATE-----\nAAAA\n")
        assert "without END line" in str_raises(ValueError, read_der, d + "/bad.pem")
        with open(d + "/empty", "wb") as f:
            pass
        assert "is empty" in str_raises(ValueError, read_der, d + "/empty")


def test_tls_error_kinds_from_mbedtls_texts():
    cases = (("\nThe certificate is not correctly signed by the trusted CA\n", TLS_UNTRUSTED),
             ("\nThe certificate Common Name (CN) does not match with the expected CN\n", TLS_HOSTNAME),
             ("\nThe certificate validity has expired\n", TLS_EXPIRED),
             ("MBEDTLS_ERR_SSL_CONN_EOF", TLS_HANDSHAKE))
    for text, kind in cases:
        e = TLSError(ValueError(text), "h:8883")
        assert e.kind == kind and "h:8883" in str(e), (kind, str(e))
    assert "wrong CA file" in str(TLSError(ValueError(cases[0][0]), "x"))
    # a broker that requires a client certificate closes the handshake: mbedTLS says only EPIPE (32)
    # (or, if the broker's alert is read first, a fatal alert)
    for exc in (OSError(32), OSError(-30592, "MBEDTLS_ERR_SSL_FATAL_ALERT_MESSAGE")):
        e = TLSError(exc, "h:8883")
        assert e.kind == TLS_REJECTED and "client certificate" in str(e), str(e)
    assert TLSError(OSError(104), "h:8883").kind == TLS_HANDSHAKE    # a reset (broker restarting) is not that
