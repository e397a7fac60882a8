"""`mqbatch fleet`, the walk-through of docs/fleet.md: init a fleet directory, add two
unix devices, start the REAL Mosquitto from the generated mosquitto.conf (as a user
would: `mosquitto -c DIR/broker/mosquitto.conf`), run the recorder with the
generated recorder credentials and the devices (the firmware in the MicroPython
Unix port) with their generated config.json, and check that what they had
acknowledged lands; secrets are 0600, and a device cannot use another's client id."""

from __future__ import annotations

import json
import pathlib
import socket
import stat
import subprocess

import pytest

from mqbatch.cli import main
from mqbatch.ingest import landing
from mqbatch.ingest.recorder import RecorderConfig
from mqbatch.lab.broker import MOSQUITTO, free_port
from mqbatch.lab.devices import from_fleet
from mqbatch.scenarios.secmatrix import Probe, wait_until
from mqbatch.util.paths import BOARDS
from mqbatch.util.procs import end_process
from mqbatch.wire import codec, integrity
from mqbatch_testing.broker import RecorderThread

pytestmark = pytest.mark.broker

DEVICES = ["kitchen-1", "garage-2"]
PUBLIC = {"fleet.json", "ca.crt", "ca.der", "server.crt", "server.der"}  # no secrets, yet 0600 (private at rest)


def start_mosquitto(conf: pathlib.Path, port: int) -> subprocess.Popen:
    """`mosquitto -c conf`, as the docs say; returns once it listens on the port."""
    log = conf.parent / "mosquitto.log"
    offset = log.stat().st_size if log.exists() else 0

    def new_log() -> str:
        return log.read_bytes()[offset:].decode(errors="replace") if log.exists() else ""

    proc = subprocess.Popen(
        [str(MOSQUITTO), "-c", str(conf)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    ok = wait_until(lambda: proc.poll() is not None or (" running" in new_log() and accepts(port)), 15)
    assert ok and proc.poll() is None, f"mosquitto did not start:\n{new_log()}"
    return proc


def accepts(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        return True
    except OSError:
        return False


@pytest.fixture
def fleet_dir(tmp_path):
    port = free_port()
    d = tmp_path / "fleet"
    assert (
        main(["fleet", "init", str(d), "--broker-host", "127.0.0.1", "--port", str(port), "--bind", "127.0.0.1"]) == 0
    )
    assert main(["fleet", "add", str(d), *DEVICES, "--board", "unix"]) == 0
    return d, port


def test_files_are_private_and_secrets_never_leave_0600_files(fleet_dir, capsys):
    d, port = fleet_dir
    main(["fleet", "show", str(d)])
    shown = capsys.readouterr().out
    secrets = [(d / "recorder" / "password").read_text().strip()] + [
        json.loads((d / "devices" / dev / "config.json").read_text())["broker"]["password"] for dev in DEVICES
    ]
    assert all(len(s) >= 20 for s in secrets) and len(set(secrets)) == 3
    # each device's batch-hmac key: in its config and in the Spark job's keys file, 32 random bytes
    keys = json.loads((d / "recorder" / "hmac-keys.json").read_text())
    assert keys == {dev: json.loads((d / "devices" / dev / "config.json").read_text())["hmac_key"] for dev in DEVICES}
    assert all(len(integrity.parse_key(k)) == 32 for k in keys.values()) and len(set(keys.values())) == 2
    secrets += list(keys.values())
    assert f"--hmac-keys {d / 'recorder' / 'hmac-keys.json'}" in shown
    modes = {}
    for path in [d, *d.rglob("*")]:
        mode = stat.S_IMODE(path.stat().st_mode)
        modes[str(path.relative_to(d))] = oct(mode)
        if path.is_dir():
            assert mode == 0o700, f"{path}: {oct(mode)}"
        elif path.name in PUBLIC:
            assert mode == 0o600, f"{path}: {oct(mode)}"
            data = path.read_bytes()
            assert not [s for s in secrets if s.encode() in data], f"{path} (public) holds a password"
        else:
            assert mode == 0o600, f"{path}: {oct(mode)}"
    print(json.dumps(modes, indent=1))
    assert not [s for s in secrets if s in shown], "fleet show printed a password"
    for dev in DEVICES:
        assert f"{d / 'devices' / dev / 'config.json'}" in shown
    assert "BEGIN" not in shown and "PRIVATE" not in shown
    # no password in clear in the broker's files; the plugin holds hashes
    policy = json.loads((d / "broker" / "dynamic-security.json").read_text())
    assert {c["username"]: c["clientid"] for c in policy["clients"]} == {
        "recorder": "mqbatch-recorder-1",
        "kitchen-1": "kitchen-1",
        "garage-2": "garage-2",
        "mqbatch-admin": "mqbatch-admin",  # live provisioning (tests/fleet/test_fleet_live.py)
    }
    assert all("salt" in c and "password" in c for c in policy["clients"])


def test_add_refuses_an_existing_device_unless_rotate(fleet_dir, capsys):
    d, _ = fleet_dir
    cfg = d / "devices" / "kitchen-1" / "config.json"
    before = cfg.read_text()
    policy_before = (d / "broker" / "dynamic-security.json").read_text()
    assert main(["fleet", "add", str(d), "kitchen-1", "new-3"]) == 1
    assert "already in the fleet: kitchen-1" in capsys.readouterr().err
    assert cfg.read_text() == before and not (d / "devices" / "new-3").exists()
    assert (d / "broker" / "dynamic-security.json").read_text() == policy_before
    assert main(["fleet", "add", str(d), "../x"]) == 1
    assert "not usable" in capsys.readouterr().err
    for name, why in (
        ("recorder", "the recorder's account"),
        ("mqbatch-recorder-1", "the recorder's client id"),
        ("127.0.0.1", "a name of the broker's certificate"),
    ):
        assert main(["fleet", "add", str(d), name]) == 1
        assert why in capsys.readouterr().err
    keys_before = json.loads((d / "recorder" / "hmac-keys.json").read_text())
    assert main(["fleet", "add", str(d), "kitchen-1", "--rotate"]) == 0
    assert json.loads(cfg.read_text())["broker"]["password"] != json.loads(before)["broker"]["password"]
    keys = json.loads((d / "recorder" / "hmac-keys.json").read_text())  # a new key for the rotated device only
    assert keys["kitchen-1"] == json.loads(cfg.read_text())["hmac_key"] != keys_before["kitchen-1"]
    assert keys["garage-2"] == keys_before["garage-2"]
    state = json.loads((d / "fleet.json").read_text())
    assert "rotated" in state["devices"]["kitchen-1"] and "rotated" not in state["devices"]["garage-2"]
    # the other accounts keep their hashes (their passwords keep working)
    old = {c["username"]: c["password"] for c in json.loads(policy_before)["clients"]}
    new = {
        c["username"]: c["password"]
        for c in json.loads((d / "broker" / "dynamic-security.json").read_text())["clients"]
    }
    assert new["garage-2"] == old["garage-2"] and new["recorder"] == old["recorder"]
    assert new["kitchen-1"] != old["kitchen-1"]
    assert main(["fleet", "init", str(d), "--broker-host", "x"]) == 1
    assert "is a fleet already" in capsys.readouterr().err
    for bad in ("bröker.lan", "two words", "-x.lan", "a..b"):
        assert main(["fleet", "init", str(d.parent / "new"), f"--broker-host={bad}"]) == 1
        assert "--broker-host" in capsys.readouterr().err and not (d.parent / "new").exists()


def test_walk_through_devices_land_through_the_generated_broker(fleet_dir, tmp_path):
    d, port = fleet_dir
    conf = d / "broker" / "mosquitto.conf"
    assert f"listener {port} 127.0.0.1" in conf.read_text()
    broker = start_mosquitto(conf, port)
    rec = None
    try:
        cfg = {dev: json.loads((d / "devices" / dev / "config.json").read_text()) for dev in DEVICES}
        ca = d / "pki" / "ca.crt"
        # a device cannot connect with the other device's client id; with its own it can
        thief = Probe("127.0.0.1", port, ca, "garage-2", "kitchen-1", cfg["kitchen-1"]["broker"]["password"])
        thief.close()
        own = Probe("127.0.0.1", port, ca, "kitchen-1", "kitchen-1", cfg["kitchen-1"]["broker"]["password"])
        own.close()
        assert (thief.connack, own.connack) == ("0x87 Not authorized", "0x00 Success")
        # the recorder, with the generated recorder credentials
        state = json.loads((d / "fleet.json").read_text())
        rec = RecorderThread(
            RecorderConfig(
                host=state["broker"]["hosts"][0],
                port=port,
                landing=str(tmp_path / "landing"),
                client_id=state["recorder"]["client_id"],
                cafile=str(ca),
                username=state["recorder"]["username"],
                password=(d / state["recorder"]["password_file"]).read_text().strip(),
                progress_seconds=3600,
                roll_seconds=0.5,
            )
        ).start()
        # the devices: the firmware in the Unix port with the generated config.json
        # (`mqbatch fleet run`: the firmware in the MicroPython Unix port, as docs/fleet.md says)
        rc = main(["fleet", "run", str(d), *DEVICES, "--duration", "2", "--run-dir", str(tmp_path / "run")])
        consoles = {dev: (tmp_path / "run" / dev / "console.log").read_text() for dev in DEVICES}
        assert rc == 0, {dev: text[-1500:] for dev, text in consoles.items()}
        sums = {
            dev: json.loads([ln for ln in text.splitlines() if ln.startswith("MQB-SUMMARY ")][-1][12:])
            for dev, text in consoles.items()
        }
        for dev in DEVICES:
            assert sums[dev]["outbox_depth"] == 0 and sums[dev]["acked_records"] > 0, (sums, consoles)
        total = sum(sums[dev]["acked_records"] for dev in DEVICES)
        batches = sum(sums[dev]["acked_batches"] for dev in DEVICES)

        keys = {dev: bytes.fromhex(k) for dev, k in json.loads((d / "recorder" / "hmac-keys.json").read_text()).items()}

        def landed() -> dict[str, int]:
            rows = landing.read_landing(tmp_path / "landing").to_pylist()
            batches = {(r["topic"], r["payload"]): r for r in rows}  # a resent batch counts once
            out = {}
            for (topic, payload), r in batches.items():
                props = [(p["key"], p["value"]) for p in r["user_properties"]]
                assert integrity.verify(keys[topic.split("/")[1]], topic, props, payload) is None  # signed
                res = codec.decode(props, payload)
                out[topic] = out.get(topic, 0) + len(res.messages)
            return out

        wait_until(lambda: rec.recorder.acked >= batches, 20)
        rec.stop()
        rec = None
        got = landed()
        print(f"acknowledged by the broker: {total} records; landed: {got}")
        assert got == {f"mqbatch/{dev}/telemetry": sums[dev]["acked_records"] for dev in DEVICES}
    finally:
        if rec is not None:
            rec.stop()
        end_process(broker, timeout=10)
    log = (d / "broker" / "mosquitto.log").read_text()
    # refused once (the client-id thief); nothing dropped (the TLS error lines are start_mosquitto's TCP probe)
    assert log.count("not authorised") == 1 and "dropped" not in log, log


def test_add_and_rotate_take_effect_at_once_and_after_a_restart(fleet_dir):
    # `fleet add` while the broker runs changes it live (the plugin's control topic,
    # tests/fleet/test_fleet_live.py); the file it writes gives the same after a restart
    d, port = fleet_dir
    conf, ca = d / "broker" / "mosquitto.conf", d / "pki" / "ca.crt"

    def password(dev):
        return json.loads((d / "devices" / dev / "config.json").read_text())["broker"]["password"]

    def connack(dev, pw):
        p = Probe("127.0.0.1", port, ca, dev, dev, pw)
        p.close()
        return p.connack

    old_garage = password("garage-2")
    broker = start_mosquitto(conf, port)
    try:
        assert main(["fleet", "add", str(d), "new-3"]) == 0
        assert main(["fleet", "add", str(d), "garage-2", "--rotate"]) == 0
        before = (connack("new-3", password("new-3")), connack("garage-2", old_garage))
        end_process(broker, timeout=10)
        broker = start_mosquitto(conf, port)
        after = (
            connack("new-3", password("new-3")),
            connack("garage-2", old_garage),
            connack("garage-2", password("garage-2")),
            connack("kitchen-1", password("kitchen-1")),
        )
        # remove: the account is gone at the restart, and so are the device's files
        new3 = password("new-3")
        assert main(["fleet", "remove", str(d), "new-3"]) == 0
        assert (
            not (d / "devices" / "new-3").exists()
            and "new-3" not in json.loads((d / "fleet.json").read_text())["devices"]
        )
        assert sorted(json.loads((d / "recorder" / "hmac-keys.json").read_text())) == ["garage-2", "kitchen-1"]
        end_process(broker, timeout=10)
        broker = start_mosquitto(conf, port)
        removed = connack("new-3", new3)
    finally:
        end_process(broker, timeout=10)
    print(f"before the restart: {before}; after: {after}")
    assert before[0] == "0x00 Success" and before[1] != "0x00 Success"  # live: no restart needed
    assert after[0] == "0x00 Success" and after[1] != "0x00 Success"
    assert after[2:] == ("0x00 Success", "0x00 Success")
    assert removed != "0x00 Success", removed
    assert main(["fleet", "remove", str(d), "new-3"]) == 1


def test_esp32_device_config_from_the_template(fleet_dir, tmp_path, capsys):
    d, port = fleet_dir
    wifi = tmp_path / "wifi.txt"
    wifi.write_text("wifi-secret-123\n")
    assert (
        main(
            [
                "fleet",
                "add",
                str(d),
                "porch-4",
                "--board",
                "esp32",
                "--wifi-ssid",
                "home",
                "--wifi-password-file",
                str(wifi),
            ]
        )
        == 0
    )
    cfg = json.loads((d / "devices" / "porch-4" / "config.json").read_text())
    template = json.loads((BOARDS / "esp32" / "config.template.json").read_text())
    assert set(cfg) == set(template) | {"hmac_key", "e2e_ack"} and cfg["hw"] == template["hw"]
    assert cfg["e2e_ack"] == {"enabled": True, "resend_after_s": 30}
    assert cfg["wifi"] == dict(template["wifi"], ssid="home", password="wifi-secret-123")
    b = cfg["broker"]
    assert (b["host"], b["server_hostname"], b["port"], b["username"], b["ca"], b["tls"]) == (
        "127.0.0.1",
        "127.0.0.1",
        port,
        "porch-4",
        "ca.der",
        True,
    )
    assert (d / "devices" / "porch-4" / "ca.der").read_bytes() == (d / "pki" / "ca.der").read_bytes()
    assert "wifi-secret-123" not in capsys.readouterr().out
    assert main(["fleet", "add", str(d), "porch-4", "--board", "esp32", "--rotate"]) == 0  # keeps the Wi-Fi
    rotated = json.loads((d / "devices" / "porch-4" / "config.json").read_text())
    assert rotated["wifi"] == cfg["wifi"] and rotated["broker"]["password"] != b["password"]
    assert main(["fleet", "add", str(d), "porch-5", "--board", "unix", "--wifi-ssid", "home"]) == 1
    assert "no Wi-Fi settings" in capsys.readouterr().err and not (d / "devices" / "porch-5").exists()


def test_add_checks_each_config_with_the_firmware_rules_before_any_change(fleet_dir, monkeypatch):
    """`fleet add` writes configs from the board's template: each is checked by the
    firmware's own schema (mqb_config in the Unix port) before anything changes, so a
    template the board would refuse (a typo'd key, the Wi-Fi placeholders) fails here,
    not at the board's boot."""
    from mqbatch.fleet import provision

    d, _ = fleet_dir
    before = {p: p.read_bytes() for p in d.rglob("*") if p.is_file()}
    with pytest.raises(provision.FleetError, match="wifi.ssid is the template's placeholder 'your-ssid'"):
        provision.add(d, ["porch-9"], board="esp32")  # the API without Wi-Fi (the CLI asks for --wifi-ssid)
    real = provision._device_config

    def typo(*args):
        cfg = real(*args)
        cfg["broker"]["prot"] = cfg["broker"].pop("port")
        return cfg

    monkeypatch.setattr(provision, "_device_config", typo)
    with pytest.raises(provision.FleetError, match=r"porch-9: config: unknown key 'broker.prot' \(did you mean"):
        provision.add(d, ["porch-9"], board="unix")
    assert {p: p.read_bytes() for p in d.rglob("*") if p.is_file()} == before


def test_init_with_your_own_ca_and_a_dns_name(tmp_path, capsys):
    from cryptography import x509

    from mqbatch.fleet.pki import make_pki

    theirs = make_pki(tmp_path / "theirs", clients=[])
    d = tmp_path / "fleet"
    # a certificate that is not a CA is refused before anything is written
    assert (
        main(
            [
                "fleet",
                "init",
                str(d),
                "--broker-host",
                "mq.example.lan",
                "--ca-cert",
                str(theirs.server.cert),
                "--ca-key",
                str(theirs.server.key),
            ]
        )
        == 1
    )
    assert "not a CA certificate" in capsys.readouterr().err and not d.exists()
    assert (
        main(
            [
                "fleet",
                "init",
                str(d),
                "--broker-host",
                "mq.example.lan",
                "--broker-host",
                "10.1.2.3",
                "--ca-cert",
                str(theirs.ca.cert),
                "--ca-key",
                str(theirs.ca.key),
            ]
        )
        == 0
    )
    assert not (d / "pki" / "ca.key").exists(), "your CA's key must not be copied"
    assert (d / "pki" / "ca.crt").read_bytes() == theirs.ca.cert.read_bytes()
    server = x509.load_pem_x509_certificate((d / "pki" / "server.crt").read_bytes())
    ca = x509.load_pem_x509_certificate(theirs.ca.cert.read_bytes())
    server.verify_directly_issued_by(ca)
    san = server.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.DNSName) == ["mq.example.lan"]
    assert [str(ip) for ip in san.get_values_for_type(x509.IPAddress)] == ["10.1.2.3"]
    state = json.loads((d / "fleet.json").read_text())
    assert state["ca"] == {"cert": "pki/ca.crt", "key": None, "own": False}
    assert "listener 8883\n" in (d / "broker" / "mosquitto.conf").read_text()  # default: all addresses


def test_mutual_tls_device_runs_with_its_client_certificate(tmp_path):
    # `fleet init --mtls-port`: a second listener where the certificate's CN is the
    # account and the client id; `fleet add --client-cert`: the device's config names its
    # certificate and key instead of a password
    port, mtls_port = free_port(), free_port()
    d = tmp_path / "fleet"
    assert (
        main(
            [
                "fleet",
                "init",
                str(d),
                "--broker-host",
                "127.0.0.1",
                "--port",
                str(port),
                "--bind",
                "127.0.0.1",
                "--mtls-port",
                str(mtls_port),
            ]
        )
        == 0
    )
    assert main(["fleet", "add", str(d), "cert-1", "--client-cert"]) == 0
    assert main(["fleet", "add", str(d), "pw-2"]) == 0
    dev = d / "devices" / "cert-1"
    cfg = json.loads((dev / "config.json").read_text())["broker"]
    assert (cfg["port"], cfg["client_cert"], cfg["client_key"], cfg["password"]) == (
        mtls_port,
        "client.der",
        "client.key.der",
        None,
    )
    assert {p.name: oct(stat.S_IMODE(p.stat().st_mode)) for p in dev.iterdir()} == {
        "ca.der": "0o600",
        "config.json": "0o600",
        "client.crt": "0o600",
        "client.der": "0o600",
        "client.key": "0o600",
        "client.key.der": "0o600",
    }
    broker = start_mosquitto(d / "broker" / "mosquitto.conf", port)
    rec = None
    try:
        ca, key, crt = d / "pki" / "ca.crt", dev / "client.key", dev / "client.crt"
        # the CN is the identity: whatever client id it asks for, it is cert-1 and may write only its topics
        p = Probe("127.0.0.1", mtls_port, ca, "pw-2", None, None, certfile=crt, keyfile=key)
        own = p.publish("mqbatch/cert-1/telemetry", b"x")
        other = p.publish("mqbatch/pw-2/telemetry", b"x")
        p.close()
        nocert = Probe(
            "127.0.0.1",
            mtls_port,
            ca,
            "pw-2",
            "pw-2",
            json.loads((d / "devices" / "pw-2" / "config.json").read_text())["broker"]["password"],
        )
        nocert.close()
        print(
            f"cert-1 on the mTLS port: CONNACK {p.connack}, own topic {own}, pw-2's topic {other}; "
            f"a password client there: {nocert.connack}"
        )
        assert p.connack == "0x00 Success" and other.startswith("0x87")
        assert int(own.split()[0], 16) < 0x80
        assert nocert.connack != "0x00 Success"
        state = json.loads((d / "fleet.json").read_text())
        rec = RecorderThread(
            RecorderConfig(
                host="127.0.0.1",
                port=port,
                landing=str(tmp_path / "landing"),
                client_id=state["recorder"]["client_id"],
                cafile=str(ca),
                username="recorder",
                password=(d / "recorder" / "password").read_text().strip(),
                progress_seconds=3600,
                roll_seconds=0.5,
            )
        ).start()
        with from_fleet(d, ["cert-1"], tmp_path / "run", run_for_s=1, sample_hz=10) as devs:
            devs.start()
            codes = devs.wait(120)
            s = devs.summaries().get("cert-1", {})
            console = devs.console("cert-1")[-1500:]
        assert codes == {"cert-1": 0} and s.get("outbox_depth") == 0 and s.get("acked_records", 0) > 0, console
        wait_until(lambda: rec.recorder.acked >= s["acked_batches"], 20)
        rec.stop()
        rec = None
        topics = {r["topic"] for r in landing.read_landing(tmp_path / "landing").to_pylist()}
        assert topics == {"mqbatch/cert-1/telemetry"}
        # rotating the device's certificate revokes the old one (CRL) at the broker's restart
        old = tmp_path / "old"
        old.mkdir()
        for name in ("client.crt", "client.key"):
            (old / name).write_bytes((dev / name).read_bytes())
        assert main(["fleet", "add", str(d), "cert-1", "--client-cert", "--rotate"]) == 0
        end_process(broker, timeout=10)
        broker = start_mosquitto(d / "broker" / "mosquitto.conf", port)
        answers = []
        for folder in (old, dev):
            p = Probe(
                "127.0.0.1",
                mtls_port,
                ca,
                "cert-1",
                None,
                None,
                certfile=folder / "client.crt",
                keyfile=folder / "client.key",
            )
            p.close()
            answers.append(p.connack)
        print(f"after rotation: old certificate {answers[0]}, new certificate {answers[1]}")
        assert answers[0] != "0x00 Success" and answers[1] == "0x00 Success"
        assert json.loads((d / "fleet.json").read_text())["revoked"][0]["device"] == "cert-1"
    finally:
        if rec is not None:
            rec.stop()
        end_process(broker, timeout=10)
