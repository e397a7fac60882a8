"""A throw-away certificate authority for tests and the local demo.

`make_pki(directory)` writes, with the `cryptography` package:

- a CA (``ca.crt`` PEM and ``ca.der``), and a second, unrelated CA
  (``other-ca.crt``/``.der``) for "wrong CA" tests;
- a server certificate for ``localhost`` / ``127.0.0.1`` (SAN DNS + IP);
- an expired server certificate for the same names;
- client certificates, one per name (CN = the name, which Mosquitto's
  ``use_identity_as_username`` turns into the username).

Every certificate and key is written both as PEM (``.crt``/``.key``, for
Mosquitto and paho) and as DER (``.der``/``.key.der``, for MicroPython boards,
where DER saves RAM). Keys are EC P-256 (small, fast on microcontrollers) in
PKCS#8, unencrypted, mode 0600 (owner only: Mosquitto runs as the same user,
mqbatch.lab.broker writes `user <current user>`); certificates are public, 0644.

Example::

    from mqbatch.fleet.pki import make_pki
    pki = make_pki(tmp_dir, clients=["dev-1", "dev-2"])
    pki.ca_cert                  # Path to ca.crt
    pki.server.cert, pki.server.key
    pki.expired_server.cert
    pki.client("dev-1").cert_der, pki.client("dev-1").key_der
"""

from __future__ import annotations

import datetime as _dt
import ipaddress
import os
import pathlib
from dataclasses import dataclass, field

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from mqbatch.util.private import private_dir, write_private

SERVER_NAMES = ("localhost", "127.0.0.1")


@dataclass(frozen=True)
class CertPair:
    """One certificate and its private key, as PEM and DER files."""

    name: str
    cert: pathlib.Path  # PEM
    key: pathlib.Path  # PEM, PKCS#8
    cert_der: pathlib.Path
    key_der: pathlib.Path  # DER, PKCS#8


@dataclass(frozen=True)
class Pki:
    """The files written by make_pki()."""

    directory: pathlib.Path
    ca: CertPair  # the CA that signed everything below
    other_ca: CertPair  # an unrelated CA: a client trusting only this must reject the server
    server: CertPair  # valid now, SAN localhost + 127.0.0.1
    expired_server: CertPair  # same names, expired yesterday
    clients: dict[str, CertPair] = field(default_factory=dict)

    @property
    def ca_cert(self) -> pathlib.Path:
        return self.ca.cert

    def client(self, name: str) -> CertPair:
        try:
            return self.clients[name]
        except KeyError:
            raise KeyError(f"no client certificate {name!r}; have {sorted(self.clients)}") from None


def _name(cn: str, org: str = "mqbatch test") -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, org), x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _write(directory: pathlib.Path, stem: str, cert: x509.Certificate, key: ec.EllipticCurvePrivateKey) -> CertPair:
    paths = CertPair(
        stem,
        directory / f"{stem}.crt",
        directory / f"{stem}.key",
        directory / f"{stem}.der",
        directory / f"{stem}.key.der",
    )
    pkcs8 = serialization.PrivateFormat.PKCS8
    none = serialization.NoEncryption()
    for path, data, mode in (
        (paths.cert, cert.public_bytes(serialization.Encoding.PEM), 0o600),  # public, yet 0600: private at rest
        (paths.cert_der, cert.public_bytes(serialization.Encoding.DER), 0o600),
        (paths.key, key.private_bytes(serialization.Encoding.PEM, pkcs8, none), 0o600),
        (paths.key_der, key.private_bytes(serialization.Encoding.DER, pkcs8, none), 0o600),
    ):
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
        os.fchmod(fd, mode)  # also when the file existed with other permissions
        with open(fd, "wb") as f:
            f.write(data)
    return paths


def _san(name: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(name))
    except ValueError:
        return x509.DNSName(name)


def _issue(
    subject: str,
    issuer_name: x509.Name | None,
    issuer_key,
    *,
    ca: bool,
    server: bool = False,
    not_before: _dt.datetime,
    not_after: _dt.datetime,
    names=SERVER_NAMES,
    org: str = "mqbatch test",
):
    key = ec.generate_private_key(ec.SECP256R1())
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(subject, org))
        .issuer_name(issuer_name or _name(subject, org))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before)
        .not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=ca, path_length=0 if ca else None), critical=True)
    )
    if ca:
        builder = builder.add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_cert_sign=True,
                crl_sign=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        builder = builder.add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
    else:
        builder = builder.add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_cert_sign=False,
                crl_sign=False,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        usage = ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH
        builder = builder.add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
    if server:
        builder = builder.add_extension(x509.SubjectAlternativeName([_san(n) for n in names]), critical=False)
    cert = builder.sign(issuer_key or key, hashes.SHA256())
    return cert, key


def make_pki(
    directory: str | os.PathLike, clients: list[str] | tuple[str, ...] = ("device-1", "device-2"), days: int = 30
) -> Pki:
    """Create a CA, a second unrelated CA, a server cert, an expired server cert
    and one client cert per name in `clients`, all under `directory` (created).
    Valid certificates start one hour ago (clock skew) and last `days` days."""
    directory = pathlib.Path(directory)
    private_dir(directory, tighten=True)
    now = _dt.datetime.now(_dt.timezone.utc)
    start, end = now - _dt.timedelta(hours=1), now + _dt.timedelta(days=days)

    ca_cert, ca_key = _issue("mqbatch test CA", None, None, ca=True, not_before=start, not_after=end)
    ca = _write(directory, "ca", ca_cert, ca_key)
    other_cert, other_key = _issue("unrelated test CA", None, None, ca=True, not_before=start, not_after=end)
    other = _write(directory, "other-ca", other_cert, other_key)

    srv_cert, srv_key = _issue(
        "localhost", ca_cert.subject, ca_key, ca=False, server=True, not_before=start, not_after=end
    )
    server = _write(directory, "server", srv_cert, srv_key)
    old_cert, old_key = _issue(
        "localhost",
        ca_cert.subject,
        ca_key,
        ca=False,
        server=True,
        not_before=now - _dt.timedelta(days=30),
        not_after=now - _dt.timedelta(days=1),
    )
    expired = _write(directory, "server-expired", old_cert, old_key)

    issued = {}
    for name in clients:
        if not name or "/" in name or name.startswith("."):
            raise ValueError(f"client name {name!r} is not usable as a file name")
        c_cert, c_key = _issue(name, ca_cert.subject, ca_key, ca=False, not_before=start, not_after=end)
        issued[name] = _write(directory, f"client-{name}", c_cert, c_key)
    return Pki(directory, ca, other, server, expired, issued)


# -- a long-lived CA and server certificate for a real broker (mqbatch fleet) -----------


def _validity(days: int) -> tuple[_dt.datetime, _dt.datetime]:
    now = _dt.datetime.now(_dt.timezone.utc)
    return now - _dt.timedelta(hours=1), now + _dt.timedelta(days=days)


def make_ca(directory: str | os.PathLike, common_name: str, days: int = 3650, stem: str = "ca") -> CertPair:
    """A new CA (EC P-256, may sign end-entity certificates only) in `directory`:
    <stem>.crt/.der public (0644), <stem>.key/.key.der private (0600)."""
    start, end = _validity(days)
    cert, key = _issue(common_name, None, None, ca=True, not_before=start, not_after=end, org="mqbatch")
    return _write(pathlib.Path(directory), stem, cert, key)


def load_ca(cert_path: str | os.PathLike, key_path: str | os.PathLike, key_password: bytes | None = None):
    """The (certificate, private key) of an existing CA from PEM files. Raises
    ValueError saying why they cannot sign (not a CA, expired, key does not match,
    key type without a SHA-256 signature)."""
    cert = x509.load_pem_x509_certificate(pathlib.Path(cert_path).read_bytes())
    key = serialization.load_pem_private_key(pathlib.Path(key_path).read_bytes(), password=key_password)
    try:
        is_ca = cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    except x509.ExtensionNotFound:
        is_ca = False
    if not is_ca:
        raise ValueError(f"{cert_path} is not a CA certificate (no BasicConstraints CA:TRUE)")
    if cert.not_valid_after_utc <= _dt.datetime.now(_dt.timezone.utc):
        raise ValueError(f"{cert_path} expired on {cert.not_valid_after_utc:%Y-%m-%d}")
    if not isinstance(key, (ec.EllipticCurvePrivateKey, rsa.RSAPrivateKey)):
        raise ValueError(f"{key_path}: only EC and RSA CA keys are supported (signatures are SHA-256)")
    if key.public_key().public_numbers() != cert.public_key().public_numbers():  # type: ignore[union-attr]  # EC/RSA
        raise ValueError(f"{key_path} is not the private key of {cert_path}")
    return cert, key


def issue_server(
    directory: str | os.PathLike,
    names: list[str] | tuple[str, ...],
    ca_cert: x509.Certificate,
    ca_key,
    days: int = 825,
    stem: str = "server",
) -> CertPair:
    """A server certificate (EC P-256, serverAuth) for `names` (CN = the first; SAN: an IP
    address entry for each IP, a DNS entry for each other name), signed by the CA,
    valid `days` days (not beyond the CA) from one hour ago."""
    if not names:
        raise ValueError("a server certificate needs at least one name")
    start, end = _validity(days)
    end = min(end, ca_cert.not_valid_after_utc)
    cert, key = _issue(
        names[0],
        ca_cert.subject,
        ca_key,
        ca=False,
        server=True,
        not_before=start,
        not_after=end,
        names=tuple(names),
        org="mqbatch",
    )
    return _write(pathlib.Path(directory), stem, cert, key)


def issue_client(
    directory: str | os.PathLike, name: str, ca_cert: x509.Certificate, ca_key, days: int = 825, stem: str = "client"
) -> CertPair:
    """A client certificate (EC P-256, clientAuth) with CN `name`, signed by the CA: with
    Mosquitto's use_identity_as_username the CN is the account."""
    start, end = _validity(days)
    cert, key = _issue(
        name,
        ca_cert.subject,
        ca_key,
        ca=False,
        not_before=start,
        not_after=min(end, ca_cert.not_valid_after_utc),
        org="mqbatch",
    )
    return _write(pathlib.Path(directory), stem, cert, key)


def write_crl(path: str | os.PathLike, ca_cert: x509.Certificate, ca_key, revoked_serials) -> pathlib.Path:
    """A CRL (PEM) signed by the CA that revokes `revoked_serials`; it stays valid as
    long as the CA (an expired CRL would make OpenSSL refuse every client certificate)."""
    now = _dt.datetime.now(_dt.timezone.utc)
    builder = (
        x509.CertificateRevocationListBuilder()
        .issuer_name(ca_cert.subject)
        .last_update(now - _dt.timedelta(hours=1))
        .next_update(ca_cert.not_valid_after_utc)
    )
    for serial in sorted(set(revoked_serials)):
        builder = builder.add_revoked_certificate(
            x509.RevokedCertificateBuilder().serial_number(serial).revocation_date(now - _dt.timedelta(hours=1)).build()
        )
    path = pathlib.Path(path)
    write_private(path, builder.sign(ca_key, hashes.SHA256()).public_bytes(serialization.Encoding.PEM))
    return path
