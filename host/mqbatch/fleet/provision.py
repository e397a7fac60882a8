"""Provision a real broker for your own devices: `mqbatch fleet init|add|remove|show|run`.

A fleet directory holds everything one Mosquitto 2.0 broker and its devices need::

    DIR/fleet.json                  state: broker names/port, recorder, devices (no secrets)
    DIR/pki/ca.crt, ca.der          the CA the devices and the recorder trust (public)
    DIR/pki/ca.key, ca.key.der      its key (0600; absent when you brought your own CA)
    DIR/pki/server.crt, server.key  the broker's certificate (SAN: the --broker-host names)
    DIR/broker/mosquitto.conf       start with `mosquitto -c DIR/broker/mosquitto.conf`
    DIR/broker/dynamic-security.json  accounts, password hashes, roles (0600)
    DIR/broker/data/                persistence
    DIR/broker/nftables.conf        per-source connection limits in front of the broker (`nft -f`, as root)
    DIR/recorder/password           the recorder's password (0600), for `mqbatch ingest --password-file`
    DIR/recorder/hmac-keys.json     every device's batch-hmac key (0600), for `mqbatch spark --hmac-keys`
    DIR/devices/<id>/config.json    the device's config (holds its password and hmac_key: 0600)
    DIR/devices/<id>/ca.der         the CA for the device (DER: no PEM parsing on the board)
    DIR/devices/<id>/client.*       with mutual TLS (init mtls_port, add client_cert): its certificate, key 0600
    DIR/pki/ca.crl                  with mutual TLS: the revoked client certificates

Directories are 0700, every file holding a secret 0600; passwords are random
(secrets.token_urlsafe) and never printed; so are the devices' batch-hmac keys
(32 random bytes each, new on --rotate, dropped by remove). The policy is mqbatch.fleet.brokerconf's:
dynamic-security plugin, one account per device (client id = username = device
id, writes only mqbatch/<id>/telemetry and /status, reads only its acks
mqbatch/<id>/ack), one recorder account (joins the recorders' share group, writes
the acks mqbatch/+/ack), TLS only, no anonymous access, every size and
queue limited. Only hashes are kept: adding a device regenerates the plugin's
file, keeping the other accounts' hashes. The plugin reads that file at start:
restart Mosquitto after `fleet add`.

    init(dir, ["broker.lan"], port=8883)          # CA, server cert, recorder, broker config
    add(dir, ["dev-001", "dev-002"], board="esp32", wifi_ssid="home", wifi_password=...)
    remove(dir, ["dev-002"])                       # account, certificate (revoked) and files gone
    show(dir)                                      # lines for the user, no secrets
    # virtual devices from the fleet's configs: mqbatch.lab.devices.from_fleet (`mqbatch fleet run`)
"""

from __future__ import annotations

import datetime as _dt
import ipaddress
import json
import os
import pathlib
import pwd
import re
import secrets
import shutil
from collections.abc import Sequence

from cryptography import x509
from cryptography.hazmat.primitives import serialization

from mqbatch.fleet import live, units
from mqbatch.fleet.brokerconf import RECORDER, RECORDER_CLIENT_ID, Policy, firewall_rules, password_hash
from mqbatch.fleet.deploy import BOARD_NAMES, DeployError, check_config_data
from mqbatch.fleet.pki import issue_client, issue_server, load_ca, make_ca, write_crl
from mqbatch.util.paths import BOARDS, DYNSEC_PLUGIN
from mqbatch.util.private import private_dir, write_private
from mqbatch.wire.device_id import device_id_problem
from mqbatch.wire.integrity import HMAC_KEY_BYTES, write_hmac_keys

FLEET_FILE = "fleet.json"
DEFAULT_PORT = 8883
AUTOSAVE_INTERVAL = 60  # seconds: what a broker crash can lose of the queued messages (Mosquitto's default: 1800)
# mosquitto.conf keys that belong to the listener; every other option is global
LISTENER_KEYS = (
    "certfile",
    "keyfile",
    "cafile",
    "tls_version",
    "ciphers",
    "require_certificate",
    "use_identity_as_username",
    "use_username_as_clientid",
    "max_connections",
)
_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
_DNS_NAME = re.compile(rf"{_LABEL}(?:\.{_LABEL})*\Z")


class FleetError(RuntimeError):
    """The fleet directory or a request is not usable; the message says why. Nothing was changed."""


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _private_dir(path: pathlib.Path) -> pathlib.Path:
    return private_dir(path, tighten=True)


def write_file(path: pathlib.Path, data: str | bytes, mode: int = 0o600) -> pathlib.Path:
    """Replace `path` atomically (temporary file, fsync, rename) with `data`, mode `mode`
    from the first byte on (a reader never sees a partial or world-readable secret)."""
    return write_private(path, data, mode)


def _host_ok(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
        return True
    except ValueError:
        return bool(_DNS_NAME.match(name)) and len(name) <= 253


def check_device_id(device_id: str) -> str:
    """A device id is also its username, client id, topic level and directory name: the
    one rule of mqbatch.wire.device_id (the Spark job checks topics with the same)."""
    problem = device_id_problem(device_id)
    if problem is not None:
        raise FleetError(f"not usable: {problem} (it names the account, the client id, the topic and a directory)")
    return device_id


class FleetDir:
    """The paths of one fleet directory (see the module docstring) and its state."""

    def __init__(self, root: str | os.PathLike):
        self.root = pathlib.Path(root).resolve()
        self.state_path = self.root / FLEET_FILE
        self.pki = self.root / "pki"
        self.broker = self.root / "broker"
        self.conf = self.broker / "mosquitto.conf"
        self.dynsec = self.broker / "dynamic-security.json"
        self.firewall = self.broker / "nftables.conf"
        self.recorder_password = self.root / "recorder" / "password"
        self.admin_password = self.root / "admin" / "password"
        self.hmac_keys = self.root / "recorder" / "hmac-keys.json"
        self.ca_cert = self.pki / "ca.crt"
        self.crl = self.pki / "ca.crl"

    def device_dir(self, device_id: str) -> pathlib.Path:
        return self.root / "devices" / check_device_id(device_id)

    def load(self) -> dict:
        try:
            state = json.loads(self.state_path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise FleetError(
                f"{self.root} is not a fleet directory (no {FLEET_FILE}): run `mqbatch fleet init` first"
            ) from None
        except (OSError, json.JSONDecodeError) as e:
            raise FleetError(f"cannot read {self.state_path}: {e}") from None
        if state.get("version") != 1:
            raise FleetError(f"{self.state_path}: unknown version {state.get('version')!r} (expected 1)")
        return state

    def save(self, state: dict) -> None:
        write_file(self.state_path, json.dumps(state, indent=1) + "\n", 0o600)

    def load_hmac_keys(self) -> dict[str, bytes]:
        """{device: key} of recorder/hmac-keys.json ({} before the first `fleet add`)."""
        try:
            doc = json.loads(self.hmac_keys.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return {}
        except (OSError, json.JSONDecodeError) as e:
            raise FleetError(f"cannot read {self.hmac_keys}: {e}") from None
        return {dev: bytes.fromhex(key) for dev, key in doc.items()}

    def update_hmac_keys(self, new: dict[str, bytes], removed: Sequence[str] = ()) -> None:
        keys = {d: k for d, k in self.load_hmac_keys().items() if d not in removed}
        write_hmac_keys(self.hmac_keys, dict(keys, **new))


# -- the broker's files ------------------------------------------------------------------


def _stored_hashes(fd: FleetDir) -> dict[str, dict]:
    """username -> {password, salt, iterations} from the current plugin file."""
    if not fd.dynsec.exists():
        return {}
    doc = json.loads(fd.dynsec.read_text(encoding="utf-8"))
    return {
        c["username"]: {k: c[k] for k in ("password", "salt", "iterations")}
        for c in doc.get("clients", [])
        if "password" in c
    }


def _policy(state: dict) -> Policy:
    policy = Policy()
    rec = state["recorder"]
    policy.add_recorder(rec["username"], None, client_id=rec["client_id"])
    for dev in state["devices"]:
        policy.add_device(dev, None)
    if state.get("admin"):
        policy.add_admin(state["admin"]["username"], None)
    return policy


def _dynamic_security(fd: FleetDir, policy: Policy, new_passwords: dict[str, str]) -> dict:
    """The plugin's document: new passwords hashed, every other account keeps its stored hash."""
    kept = _stored_hashes(fd)
    doc = policy.dynamic_security()
    hashed = {user: password_hash(password) for user, password in new_passwords.items()}
    for client in doc["clients"]:
        user = client["username"]
        source = hashed.get(user) or kept.get(user)
        if source is None:
            raise FleetError(
                f"{fd.dynsec} has no password hash for {user!r}; give it a new password "
                f"(`mqbatch fleet add {fd.root} {user} --rotate`)"
            )
        client.update({k: source[k] for k in ("password", "salt", "iterations")})
    return doc


def _conf_value(value) -> str:
    return ("true" if value else "false") if isinstance(value, bool) else str(value)


def _listener(fd: FleetDir, port: int, bind: str | None, options: dict) -> list[str]:
    return [
        f"listener {port}" + (f" {bind}" if bind else ""),
        f"certfile {fd.pki / 'server.crt'}",
        f"keyfile {fd.pki / 'server.key'}",
        f"cafile {fd.ca_cert}",
    ] + [f"{k} {_conf_value(v)}" for k, v in options.items() if k in LISTENER_KEYS]


def broker_conf(fd: FleetDir, state: dict, policy: Policy) -> str:
    """mosquitto.conf for the fleet: brokerconf's options (the plugin's file aside) as
    global and listener keys, persistence, logging; every file by absolute path. A
    second listener (mtls_port) authenticates by client certificate (CN = account)."""
    b = state["broker"]
    # no message_size_limit: Mosquitto 2.0.11 prints a deprecation note for it at every start
    options = policy.broker_options(save_every_change=b["save_every_change"], payload_limit=False)
    glob = [
        f"user {pwd.getpwuid(os.geteuid()).pw_name}",
        "per_listener_settings false",
        f"plugin {DYNSEC_PLUGIN}",
        f"plugin_opt_config_file {fd.dynsec}",
        "persistence true",
        f"persistence_location {fd.broker / 'data'}/",
        f"log_dest file {fd.broker / 'mosquitto.log'}",
        "log_type error",
        "log_type warning",
        "log_type notice",
        "log_type information",
        "connection_messages true",
        "log_timestamp_format %Y-%m-%dT%H:%M:%S",
    ]
    if "autosave_interval" not in options:  # save_every_change: brokerconf's value wins
        glob.append(f"autosave_interval {b['autosave_interval']}")
    glob += [f"{k} {_conf_value(v)}" for k, v in options.items() if k not in LISTENER_KEYS and k != "dynamic_security"]
    listeners = _listener(fd, b["port"], b.get("bind"), options)
    if b.get("mtls_port"):
        listeners += _listener(
            fd, b["mtls_port"], b.get("bind"), policy.broker_options(cert_identity=True, payload_limit=False)
        )
        listeners.append(f"crlfile {fd.crl}")
    head = [
        "# mqbatch fleet broker, generated by `mqbatch fleet`; `mqbatch fleet add` rewrites it.",
        f"# start: mosquitto -c {fd.conf}   (`mqbatch fleet add/remove` change a running broker live)",
    ]
    return "\n".join(head + glob + listeners) + "\n"


def _write_broker(fd: FleetDir, state: dict, new_passwords: dict[str, str]) -> None:
    if not DYNSEC_PLUGIN.exists():
        raise FleetError(f"the dynamic-security plugin {DYNSEC_PLUGIN} is missing (Debian package mosquitto)")
    try:
        policy = _policy(state)
    except ValueError as e:  # a name brokerconf refuses (e.g. a client id taken)
        raise FleetError(str(e)) from None
    doc = _dynamic_security(fd, policy, new_passwords)
    _private_dir(fd.broker / "data")
    write_file(fd.dynsec, json.dumps(doc, indent=1) + "\n", 0o600)
    write_file(fd.conf, broker_conf(fd, state, policy), 0o600)
    b = state["broker"]
    ports = [b["port"]] + ([b["mtls_port"]] if b.get("mtls_port") else [])
    write_file(fd.firewall, firewall_rules(ports, policy.limits), 0o600)
    if state["broker"].get("mtls_port"):  # the certificates of rotated devices are revoked
        ca_cert, ca_key = load_ca(fd.ca_cert, fd.root / state["ca"]["key"])
        write_crl(fd.crl, ca_cert, ca_key, [int(r["serial"], 16) for r in state.get("revoked", [])])


# -- commands ------------------------------------------------------------------------------


def init(
    root: str | os.PathLike,
    hosts: list[str],
    *,
    port: int = DEFAULT_PORT,
    bind: str | None = None,
    ca_cert: str | os.PathLike | None = None,
    ca_key: str | os.PathLike | None = None,
    ca_key_password: bytes | None = None,
    save_every_change: bool = False,
    autosave_interval: int = AUTOSAVE_INTERVAL,
    mtls_port: int | None = None,
) -> dict:
    """Create a fleet directory: CA (or the caller's), the broker's certificate for
    `hosts` (the first is what devices connect to and check), the recorder's account,
    mosquitto.conf and the plugin's file. mtls_port: a second listener where devices
    log in by client certificate (`add(client_cert=True)`); only with the fleet's own
    CA, since every certificate its CA signs logs in as its CN (a certificate your CA
    made for something else, CN "recorder", would be the recorder). Refuses an
    existing fleet or a non-empty DIR."""
    fd = FleetDir(root)
    if fd.state_path.exists():
        raise FleetError(f"{fd.root} is a fleet already ({FLEET_FILE} exists); add devices with `mqbatch fleet add`")
    if fd.root.exists() and any(fd.root.iterdir()):
        raise FleetError(f"{fd.root} is not empty; choose a new directory")
    bad = [h for h in hosts if not _host_ok(h)]
    if not hosts or bad:
        raise FleetError(
            f"--broker-host {', '.join(map(repr, bad))}: give the DNS name (ASCII) or IP address "
            "devices use to reach the broker"
        )
    if bind is not None and not _host_ok(bind):
        raise FleetError(f"--bind {bind!r}: give the IP address (or host name) the listener binds to")
    for p in (port, mtls_port):
        if p is not None and not 1 <= p <= 65535:
            raise FleetError(f"port {p} is not a TCP port (1-65535)")
    if mtls_port is not None and (mtls_port == port or ca_cert is not None):
        raise FleetError(
            "--mtls-port needs a port of its own and the fleet's own CA (with your CA, any "
            "certificate it signed would log in as the account its CN names)"
        )
    if autosave_interval < 1:
        raise FleetError(f"autosave interval {autosave_interval} s: must be >= 1")
    if (ca_cert is None) != (ca_key is None):
        raise FleetError("--ca-cert and --ca-key go together (your CA's certificate and its key)")
    if ca_cert is not None:  # check the caller's CA before creating anything
        try:
            assert ca_key is not None  # they go together (checked above)
            cert, key = load_ca(ca_cert, ca_key, ca_key_password)
        except (OSError, ValueError, TypeError) as e:
            raise FleetError(f"your CA cannot be used: {e}") from None
    if not DYNSEC_PLUGIN.exists():
        raise FleetError(f"the dynamic-security plugin {DYNSEC_PLUGIN} is missing (Debian package mosquitto)")
    existed = fd.root.exists()
    try:
        for d in (
            fd.root,
            fd.pki,
            fd.broker,
            fd.recorder_password.parent,
            fd.admin_password.parent,
            fd.root / "devices",
        ):
            _private_dir(d)
        if ca_cert is None:
            pair = make_ca(fd.pki, f"mqbatch fleet CA {hosts[0]}")
            cert, key = load_ca(pair.cert, pair.key)
        else:
            write_file(fd.ca_cert, cert.public_bytes(serialization.Encoding.PEM), 0o600)
            write_file(fd.pki / "ca.der", cert.public_bytes(serialization.Encoding.DER), 0o600)
        issue_server(fd.pki, hosts, cert, key)
        password = secrets.token_urlsafe(24)
        write_file(fd.recorder_password, password + "\n", 0o600)
        admin_password = secrets.token_urlsafe(32)
        write_file(fd.admin_password, admin_password + "\n", 0o600)
        state = {
            "version": 1,
            "created": _now(),
            "broker": {
                "hosts": list(hosts),
                "port": port,
                "mtls_port": mtls_port,
                "bind": bind,
                "save_every_change": save_every_change,
                "autosave_interval": autosave_interval,
            },
            "ca": {"cert": "pki/ca.crt", "key": "pki/ca.key" if ca_cert is None else None, "own": ca_cert is None},
            "recorder": {"username": RECORDER, "client_id": RECORDER_CLIENT_ID, "password_file": "recorder/password"},
            # live provisioning (mqbatch.fleet.live): may only send dynamic-security commands
            "admin": {"username": live.ADMIN, "password_file": "admin/password"},
            "devices": {},
        }
        _write_broker(fd, state, {RECORDER: password, live.ADMIN: admin_password})
        fd.save(state)
    except BaseException:
        _undo_init(fd, existed)  # nothing half-made is left behind
        raise
    return state


def _undo_init(fd: FleetDir, keep_root: bool) -> None:
    if not keep_root:
        shutil.rmtree(fd.root)
        return
    for child in fd.root.iterdir():
        if child.is_dir():
            shutil.rmtree(child)
        else:
            child.unlink()


def _device_config(
    board: str, device_id: str, password: str, state: dict, wifi_ssid: str | None, wifi_password: str | None
) -> dict:
    cfg = json.loads((BOARDS / board / "config.template.json").read_text(encoding="utf-8"))
    b = state["broker"]
    cfg["device_id"] = device_id
    cfg["broker"].update(
        host=b["hosts"][0],
        port=b["port"],
        tls=True,
        ca="ca.der",
        server_hostname=b["hosts"][0],
        client_cert=None,
        client_key=None,
        username=device_id,
        password=password,
    )
    # the fleet's recorder acknowledges what it landed: a batch leaves the device only then
    # (docs/e2e-ack.md; about 6 KB more device heap, docs/application.md; set enabled false to save it)
    cfg["e2e_ack"] = {"enabled": True, "resend_after_s": 30}
    if wifi_ssid is not None or wifi_password is not None:
        if "wifi" not in cfg:
            raise FleetError(
                f"board {board} has no Wi-Fi settings; --wifi-ssid/--wifi-password are for esp32 and rp2040"
            )
        if wifi_ssid is not None:
            cfg["wifi"]["ssid"] = wifi_ssid
        if wifi_password is not None:
            cfg["wifi"]["password"] = wifi_password
    return cfg


def add(
    root: str | os.PathLike,
    device_ids: list[str],
    *,
    board: str = "unix",
    rotate: bool = False,
    wifi_ssid: str | None = None,
    wifi_password: str | None = None,
    client_cert: bool = False,
) -> list[pathlib.Path]:
    """Give each device an account with a new random password and write its config.json
    (from boards/<board>/config.template.json) and ca.der. A device that exists is
    refused unless rotate (new password: the old one stops working when the broker
    restarts). client_cert: a client certificate (CN = device id) instead of the
    password in config.json, for the mTLS listener (init's mtls_port); the account
    keeps a password hash nobody knows. Rotating a device that had a certificate
    revokes it (pki/ca.crl, the mTLS listener's crlfile) at the broker's restart.
    Checks everything before changing anything.
    Returns the config paths."""
    fd = FleetDir(root)
    state = fd.load()
    if board not in BOARD_NAMES:
        raise FleetError(f"unknown board {board!r}; expected one of {', '.join(BOARD_NAMES)}")
    if not device_ids:
        raise FleetError("name at least one device")
    for dev in device_ids:
        check_device_id(dev)
    dupes = sorted({d for d in device_ids if device_ids.count(d) > 1})
    if dupes:
        raise FleetError(f"named more than once: {', '.join(dupes)}")
    taken = {
        state["recorder"]["username"]: "the recorder's account",
        state["recorder"]["client_id"]: "the recorder's client id",
        **{h: "a name of the broker's certificate" for h in state["broker"]["hosts"]},
    }
    clash = [f"{d!r} is {taken[d]}" for d in device_ids if d in taken]
    if clash:
        raise FleetError("; ".join(clash))
    if client_cert and not state["broker"].get("mtls_port"):
        raise FleetError("--client-cert needs a fleet made with `fleet init --mtls-port PORT`")
    existing = [d for d in device_ids if d in state["devices"]]
    if existing and not rotate:
        raise FleetError(f"already in the fleet: {', '.join(existing)} (give --rotate for new passwords)")
    configs = {}
    passwords = {dev: secrets.token_urlsafe(18) for dev in device_ids}
    hmac_keys = {dev: secrets.token_bytes(HMAC_KEY_BYTES) for dev in device_ids}
    fd.load_hmac_keys()  # raises before any change if the keys file is unreadable
    for dev in device_ids:
        ssid, wifi_pw = wifi_ssid, wifi_password
        old = fd.device_dir(dev) / "config.json"
        if dev in existing and board != "unix" and old.exists():  # a rotation keeps the Wi-Fi settings
            old_wifi = json.loads(old.read_text(encoding="utf-8")).get("wifi") or {}
            ssid = ssid if ssid is not None else old_wifi.get("ssid")
            wifi_pw = wifi_pw if wifi_pw is not None else old_wifi.get("password")
        configs[dev] = _device_config(board, dev, passwords[dev], state, ssid, wifi_pw)
        configs[dev]["hmac_key"] = hmac_keys[dev].hex()  # the device signs each batch (docs/format.md)
        try:  # the firmware's own rules (unknown keys, types, Wi-Fi placeholders), as the board at boot
            check_config_data(configs[dev], board, f"{dev}: config")
        except DeployError as e:
            raise FleetError(str(e)) from None
    ca_der = (fd.pki / "ca.der").read_bytes()
    now = _now()
    for dev in device_ids:
        entry = state["devices"].get(dev, {"added": now})
        _revoke(fd, state, dev, now)
        entry.update(
            board=board,
            dir=f"devices/{dev}",
            config=f"devices/{dev}/config.json",
            client_cert=f"devices/{dev}/client.crt" if client_cert else None,
        )
        if dev in existing:
            entry["rotated"] = now
        state["devices"][dev] = entry
    _write_broker(fd, state, passwords)  # raises before any device file if a hash is missing
    fd.save(state)  # with the revocations: a failure below needs a rerun with --rotate
    fd.update_hmac_keys(hmac_keys)  # before the configs: no device signs with a key the job lacks
    written = []
    for dev in device_ids:
        d = _private_dir(fd.device_dir(dev))
        write_file(d / "ca.der", ca_der, 0o600)
        if client_cert:
            ca_cert, ca_key = load_ca(fd.ca_cert, fd.root / state["ca"]["key"])
            issue_client(d, dev, ca_cert, ca_key)  # client.der/.crt 0644, client.key(.der) 0600
            configs[dev]["broker"].update(
                port=state["broker"]["mtls_port"],
                client_cert="client.der",
                client_key="client.key.der",
                username=None,
                password=None,
            )
        else:
            for stale in ("client.crt", "client.der", "client.key", "client.key.der"):
                (d / stale).unlink(missing_ok=True)  # a rotated device goes back to its password
        written.append(write_file(d / "config.json", json.dumps(configs[dev], indent=1) + "\n", 0o600))
    return written


def _revoke(fd: FleetDir, state: dict, dev: str, now: str) -> None:
    """List the device's current client certificate (if any) as revoked (the CRL is
    written with the broker's files)."""
    entry = state["devices"].get(dev) or {}
    if entry.get("client_cert"):
        old = x509.load_pem_x509_certificate((fd.root / entry["client_cert"]).read_bytes())
        state.setdefault("revoked", []).append({"device": dev, "serial": f"{old.serial_number:x}", "revoked": now})


def remove(root: str | os.PathLike, device_ids: list[str]) -> None:
    """Delete the devices' accounts (effective at the broker's restart), revoke their
    client certificates and delete their directories (they hold their secrets)."""
    fd = FleetDir(root)
    state = fd.load()
    unknown = [d for d in device_ids if d not in state["devices"]]
    if unknown or not device_ids:
        raise FleetError(f"not in the fleet: {', '.join(unknown) or '(no device named)'}")
    now = _now()
    for dev in device_ids:
        _revoke(fd, state, dev, now)
        del state["devices"][dev]
    _write_broker(fd, state, {})
    fd.save(state)
    fd.update_hmac_keys({}, removed=device_ids)
    for dev in device_ids:
        shutil.rmtree(fd.device_dir(dev), ignore_errors=False)


def live_update(
    root: str | os.PathLike, *, added: Sequence[str] = (), rotated: Sequence[str] = (), removed: Sequence[str] = ()
) -> str:
    """Apply what `add`/`remove` just wrote to the running broker, without a restart
    (mqbatch.fleet.live: the dynamic-security plugin's commands, as the fleet's admin
    account). Returns one line for the user; FleetError if a running broker refused.
    A broker that is not running loads the written file when it starts."""
    fd = FleetDir(root)
    state = fd.load()
    b = state["broker"]
    where = f"{b['hosts'][0]}:{b['port']}"
    admin = state.get("admin")
    if not admin:
        return f"this fleet has no admin account (made before live provisioning): restart mosquitto ({fd.conf})"
    password = (fd.root / admin["password_file"]).read_text(encoding="utf-8").strip()
    policy = _policy(state)
    commands: list[dict] = []
    for dev in list(added) + list(rotated):
        cfg = json.loads((fd.device_dir(dev) / "config.json").read_text(encoding="utf-8"))
        commands += live.device_commands(policy.accounts[dev], cfg["broker"].get("password"), new=dev in added)
    for dev in removed:
        commands += live.removal_commands(dev, f"device:{dev}")
    crl = (
        "; revoked client certificates are refused once the broker restarts (it reads its CRL at start)"
        if b.get("mtls_port") and (rotated or removed)
        else ""
    )
    if not commands:
        return "nothing to change on the running broker" + crl
    try:
        live.send(b["hosts"][0], b["port"], str(fd.ca_cert), password, commands)
    except live.LiveError as e:
        if e.unreachable:
            return f"no broker answers at {where} ({e}): it loads the change from {fd.dynsec} when it starts"
        raise FleetError(
            f"the running broker at {where} was not changed: {e}; restart it to load {fd.dynsec}"
        ) from None
    _write_broker(fd, state, {})  # the plugin saved its own state to the file: ours stays the reference
    return f"applied to the running broker at {where} ({len(commands)} plugin commands; no restart){crl}"


def ingest_args(fd: FleetDir, state: dict) -> list[str]:
    """`mqbatch ingest`'s arguments for this fleet's recorder (all but --landing)."""
    b, rec = state["broker"], state["recorder"]
    return [
        *("--host", b["hosts"][0], "--port", str(b["port"]), "--cafile", str(fd.ca_cert)),
        *("--username", rec["username"], "--password-file", str(fd.root / rec["password_file"])),
        *("--client-id", rec["client_id"]),
    ]


def ingest_command(fd: FleetDir, state: dict, landing: str = "LANDING_DIR") -> str:
    return " ".join(["mqbatch", "ingest", *ingest_args(fd, state), "--landing", landing])


def write_units(
    root: str | os.PathLike,
    *,
    landing: str | os.PathLike,
    spark_out: str | os.PathLike,
    user: str | None = None,
    mqbatch: str | None = None,
) -> list[pathlib.Path]:
    """Write DIR/systemd/*.service (mqbatch.fleet.units): the broker (and its firewall
    rules), the recorder into `landing`, the streaming Spark job into `spark_out`.
    user: the account the services run as (default: the owner of DIR)."""
    fd = FleetDir(root)
    state = fd.load()
    try:
        texts = units.units(
            fd.root,
            state,
            landing=pathlib.Path(landing).resolve(),
            spark_out=pathlib.Path(spark_out).resolve(),
            user=user or units.owner(fd.root),
            mqbatch=mqbatch or units.default_mqbatch(),
            ingest_args=ingest_args(fd, state),
        )
    except ValueError as e:
        raise FleetError(str(e)) from None
    out = _private_dir(fd.root / "systemd")
    return [write_file(out / name, text) for name, text in texts.items()]


def show(root: str | os.PathLike) -> list[str]:
    """What the fleet holds and where each file is; never a secret."""
    fd = FleetDir(root)
    state = fd.load()
    b = state["broker"]
    lines = [
        f"fleet {fd.root} (created {state['created']})",
        f"broker: {', '.join(b['hosts'])} port {b['port']}"
        + (f" (client certificates: port {b['mtls_port']})" if b.get("mtls_port") else "")
        + f", bound to {b.get('bind') or 'all addresses'}",
        f"  start:  mosquitto -c {fd.conf}",
        f"  policy: {fd.dynsec} (0600; `fleet add/remove` also change a running broker: admin account "
        f"{(state.get('admin') or {}).get('username', 'none: restart mosquitto after changes')})",
        f"  per-source connection limits: nft -f {fd.firewall}   (as root, before opening the port)",
        f"  CA:     {fd.ca_cert}" + ("" if state["ca"]["own"] else " (your CA; its key is not stored here)"),
        f"recorder: user {state['recorder']['username']}, client id {state['recorder']['client_id']}, "
        f"password in {fd.root / state['recorder']['password_file']}",
        f"  {ingest_command(fd, state)}",
        f"batch-hmac keys: {fd.hmac_keys} (0600): mqbatch spark --hmac-keys {fd.hmac_keys} ...",
        f"devices: {len(state['devices'])}",
    ]
    for dev, entry in sorted(state["devices"].items()):
        extra = f", rotated {entry['rotated']}" if entry.get("rotated") else ""
        if entry.get("client_cert"):
            extra += f", mutual TLS: {fd.root / entry['client_cert']}"
        lines.append(
            f"  {dev}: board {entry['board']}, config {fd.root / entry['config']} (added {entry['added']}{extra})"
        )
    return lines
