"""`mqbatch deploy` for real: mpy-cross compiles the firmware, mpremote copies it to a
virtual board (the MicroPython Unix port on a pseudo-terminal, mpremote in `resume`
mode), the files are verified by SHA-256, the board is reset, and the application
starts and publishes to a real Mosquitto over TLS."""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
import time

import pytest

from mqbatch.lab.vboard import VirtualBoard
from mqbatch.util.paths import BOARDS, FIRMWARE
from mqbatch.wire import codec, records
from mqbatch_testing import VENV_BIN


def test_deploy_to_virtual_board_then_app_publishes(mosquitto, subscriber, pki, tmp_path):
    creds = {"dev-042": "pw-42"}
    broker = mosquitto(
        tls=True,
        allow_anonymous=False,
        users={**creds, "reader": "rpw"},
        acl="user reader\ntopic read mqbatch/#\n\npattern write mqbatch/%u/#\n",
    )
    sub = subscriber(broker, "mqbatch/+/telemetry", username="reader", password="rpw")
    cfg_dir = tmp_path / "cfg"
    cfg_dir.mkdir()
    cfg = json.loads((BOARDS / "unix" / "config.template.json").read_text())
    cfg["device_id"] = "dev-042"
    cfg["broker"].update(port=broker.port, password="pw-42", username="dev-042", ca="ca.pem")
    cfg.update(sample_hz=20, flush={"max_count": 20, "max_bytes": 2048, "max_age_ms": 1000})
    (cfg_dir / "ca.pem").write_bytes(pki.ca_cert.read_bytes())
    (cfg_dir / "config.json").write_text(json.dumps(cfg))
    flash = tmp_path / "board"
    with VirtualBoard(flash) as vb:  # the default heap: the deployed firmware runs in it over TLS
        proc = subprocess.run(
            [
                str(VENV_BIN / "mqbatch"),
                "deploy",
                "--port",
                str(vb.tty),
                "--board",
                "unix",
                "--config",
                str(cfg_dir / "config.json"),
                "--build-dir",
                str(tmp_path / "build"),
            ],
            capture_output=True,
            text=True,
            timeout=180,
        )
        assert proc.returncode == 0, proc.stderr + proc.stdout
        assert "verified" in proc.stdout and "board reset" in proc.stdout
        # what landed on the board is exactly the build, byte for byte
        built = {
            p.name: hashlib.sha256(p.read_bytes()).hexdigest()
            for p in (tmp_path / "build").iterdir()
            if not p.name.startswith(".")
        }  # the .mqbatch-run marker marks the folder, stays on the host
        assert {"main.py", "mqb_app.mpy", "mqb_board.mpy", "mqb_codec.mpy", "config.json", "ca.pem"} <= set(built)
        landed = {n: hashlib.sha256(vb.get(n) or b"").hexdigest() for n in built}  # from its flash image
        assert landed == built
        vb.wait_boot(2)  # the reset restarted the interpreter, which runs main.py
        msgs = sub.wait_for(2, timeout=30)
    assert len(msgs) >= 2, (flash / "console.log").read_text()[-2000:]
    for m in msgs:
        assert m.topic == "mqbatch/dev-042/telemetry"
        res = codec.decode(m.user_properties, m.payload, topic=m.topic)
        assert res.status == codec.OK
        recs = [records.parse(x) for x in res.messages]
        assert all(r.boot == 1 for r in recs)  # first boot of this board's flash


def test_deploy_never_wipes_a_folder_it_did_not_make(tmp_path):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "thesis.tex").write_text("precious")
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"device_id": "d", "broker": {"host": "h", "tls": False}, "topic": "t"}))
    proc = subprocess.run(
        [
            str(VENV_BIN / "mqbatch"),
            "deploy",
            "--port",
            str(tmp_path / "nope"),
            "--board",
            "unix",
            "--config",
            str(cfg),
            "--build-dir",
            str(mine),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 1 and "not made by mqbatch" in proc.stderr
    assert (mine / "thesis.tex").read_text() == "precious"


def test_deploy_reports_bad_config_and_port(tmp_path):
    bad = tmp_path / "config.json"
    bad.write_text(json.dumps({"device_id": "d", "broker": {"host": "h", "ca": "missing.pem"}, "topic": "t"}))
    proc = subprocess.run(
        [
            str(VENV_BIN / "mqbatch"),
            "deploy",
            "--port",
            str(tmp_path / "nope"),
            "--board",
            "unix",
            "--config",
            str(bad),
            "--build-dir",
            str(tmp_path / "b"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 1 and "missing.pem" in proc.stderr and "does not exist" in proc.stderr
    (tmp_path / "missing.pem").write_text("x")
    proc = subprocess.run(
        [
            str(VENV_BIN / "mqbatch"),
            "deploy",
            "--port",
            str(tmp_path / "nope"),
            "--board",
            "unix",
            "--config",
            str(bad),
            "--build-dir",
            str(tmp_path / "b"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 1 and "no serial port" in proc.stderr


def test_every_board_compiles_with_mpy_cross(tmp_path):
    """The esp32 and rp2040 board modules cannot run here (no hardware); this at least
    compiles them and their shared Wi-Fi module for their architectures."""
    from mqbatch.fleet.deploy import BOARD_NAMES, compile_firmware

    for board in BOARD_NAMES:
        files = compile_firmware(board, tmp_path / board)
        assert "mqb_board.mpy" in files and "mqb_app.mpy" in files and "main.py" in files
        if board != "unix":
            assert "mqb_wifi.mpy" in files
        assert all(p.stat().st_size > 0 for p in files.values())


def deploy_cmd(tmp_path, config: dict, port: str | None = None, *extra: str) -> subprocess.CompletedProcess:
    (tmp_path / "config.json").write_text(json.dumps(config))
    return subprocess.run(
        [
            str(VENV_BIN / "mqbatch"),
            "deploy",
            "--port",
            port or str(tmp_path / "nope"),
            "--board",
            "unix",
            "--config",
            str(tmp_path / "config.json"),
            "--build-dir",
            str(tmp_path / "build"),
            *extra,
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.fast
def test_deploy_refuses_a_config_the_firmware_would_refuse(tmp_path):
    """The firmware's own rules (mqb_config.make_config, run in the Unix port) decide, before
    anything is built or copied; the message names the key and the type it must have."""
    base = json.loads((BOARDS / "unix" / "config.template.json").read_text())
    no_host = json.loads(json.dumps(base))
    del no_host["broker"]["host"]
    proc = deploy_cmd(tmp_path, no_host)
    assert proc.returncode == 1
    assert "config lacks broker.host (a string" in proc.stderr and "mqb_config.make_config" in proc.stderr
    assert not (tmp_path / "build").exists()
    for key, value, message in [
        ("sample_hz", "ten", "sample_hz must be a number, got 'ten'"),
        ("flush", {"max_bytes": "2k"}, "flush.max_bytes must be a number, got '2k'"),
        ("require_subscribers", "yes", "require_subscribers must be a boolean"),
        ("topic", 7, "topic must be a string, got 7"),
    ]:
        cfg = dict(base, **{key: value})
        proc = deploy_cmd(tmp_path, cfg)
        assert proc.returncode == 1 and message in proc.stderr, (key, proc.stderr)
        assert len(proc.stderr.strip().splitlines()) == 1
    port = json.loads(json.dumps(base))
    port["broker"]["port"] = "8883"
    proc = deploy_cmd(tmp_path, port)
    assert proc.returncode == 1 and "broker.port must be a number, got '8883'" in proc.stderr


def test_deploy_refuses_an_unknown_key_naming_its_path_and_the_closest(tmp_path):
    """broker.prot for broker.port: `mqbatch deploy` reported success and the device retried
    port 8883 forever (issue 26.1). Unknown keys anywhere are refused, before anything is
    built, by the firmware's own schema (mqb_config, run in the Unix port)."""
    base = json.loads((BOARDS / "unix" / "config.template.json").read_text())
    nested = json.loads(json.dumps(base))
    nested["broker"]["prot"] = 1883
    for cfg, message in [
        (nested, "unknown key 'broker.prot' (did you mean 'broker.port'?)"),
        (dict(base, sampel_hz=5), "unknown key 'sampel_hz' (did you mean 'sample_hz'?)"),
        (dict(base, flush={"max_count": 10, "max_byte": 512}), "unknown key 'flush.max_byte' (did you mean"),
        (dict(base, wifi={"ssid": "home", "password": "pw"}), "unknown key 'wifi' (a setting of another board"),
        (dict(base, colour="red"), "unknown key 'colour' (the firmware's own check"),
    ]:
        proc = deploy_cmd(tmp_path, cfg)
        assert proc.returncode == 1 and message in proc.stderr, (message, proc.stderr)
        assert len(proc.stderr.strip().splitlines()) == 1 and "config " in proc.stderr
        assert not (tmp_path / "build").exists()


def test_every_board_template_passes_the_firmware_config_check_once_filled_in(tmp_path):
    """The templates hold only known keys; the Wi-Fi boards' placeholders are refused by
    name (issue 26.2: a board given your-ssid never joins) until real ones replace them."""
    from mqbatch.fleet.deploy import BOARD_NAMES, DeployError, check_config

    for board in BOARD_NAMES:
        template = BOARDS / board / "config.template.json"
        if board == "unix":
            assert check_config(template, board)["broker"]["host"]
            continue
        with pytest.raises(DeployError, match="wifi.ssid is the template's placeholder 'your-ssid'"):
            check_config(template, board)
        cfg = json.loads(template.read_text())
        cfg["wifi"]["ssid"] = "home"
        (tmp_path / "c.json").write_text(json.dumps(cfg))
        with pytest.raises(DeployError, match="wifi.password is the template's placeholder"):
            check_config(tmp_path / "c.json", board)
        cfg["wifi"]["password"] = "a-real-one"
        (tmp_path / "c.json").write_text(json.dumps(cfg))
        assert check_config(tmp_path / "c.json", board)["wifi"]["ssid"] == "home"
        # the other board's pins are not this board's
        cfg["hw"] = {"vsys_adc_pin": 26} if board == "esp32" else {"vbat_adc_pin": 35}
        (tmp_path / "c.json").write_text(json.dumps(cfg))
        with pytest.raises(DeployError, match="unknown key 'hw.v.*' \\(a setting of another board"):
            check_config(tmp_path / "c.json", board)


def test_a_board_booting_a_refused_config_says_why_and_stays_reachable(tmp_path):
    """On the device (a config copied by hand, or by an older mqbatch): the firmware's
    check at boot logs one named line and does not run, instead of rebooting every 5 s;
    the board stays at its REPL, where a corrected deploy reaches it."""
    cfg = json.loads((BOARDS / "unix" / "config.template.json").read_text())
    cfg["broker"].update(tls=False, ca=None, port=1)
    (tmp_path / "good.json").write_text(json.dumps(cfg))
    cfg["broker"]["prot"] = cfg["broker"].pop("port")
    (tmp_path / "bad.json").write_text(json.dumps(cfg))
    flash = tmp_path / "board"
    with VirtualBoard(flash) as vb:
        ok = deploy_cmd(tmp_path, json.loads((tmp_path / "good.json").read_text()), str(vb.tty), "--no-reset")
        assert ok.returncode == 0, ok.stderr
    vb.put({"config.json": tmp_path / "bad.json"})  # past the host's check
    seen = vb.console_log.stat().st_size  # the deploy's mpremote session is in the log too
    with VirtualBoard(flash) as vb:
        vb.wait_boot(1)
        deadline = time.monotonic() + 30
        log = ""
        while "mqb: config.json refused" not in log and time.monotonic() < deadline:
            time.sleep(0.2)
            log = vb.console_log.read_bytes()[seen:].decode(errors="replace")
        time.sleep(6)  # longer than the 5 s a fatal error waits before its reset
        log = vb.console_log.read_bytes()[seen:].decode(errors="replace")
        assert "mqb: config.json refused, not running: unknown key 'broker.prot' (did you mean 'broker.port'?)" in log
        assert "restarting" not in log and "Traceback" not in log and vb.boots == 1, log
        # still a board: the corrected config deploys and verifies
        fixed = deploy_cmd(tmp_path, json.loads((tmp_path / "good.json").read_text()), str(vb.tty), "--config-only")
        assert fixed.returncode == 0, fixed.stderr
        assert "verified" in fixed.stdout


def test_wrong_port_is_one_clear_line(tmp_path):
    base = json.loads((BOARDS / "unix" / "config.template.json").read_text())
    base["broker"].update(tls=False, ca=None)
    proc = deploy_cmd(tmp_path, base, str(tmp_path / "ttyUSB9"))
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines() == [proc.stderr.strip()]
    assert "no serial port" in proc.stderr and "ttyUSB9" in proc.stderr and "import" not in proc.stderr
    not_a_tty = tmp_path / "plainfile"
    not_a_tty.write_text("")
    proc = deploy_cmd(tmp_path, base, str(not_a_tty))
    assert proc.returncode == 1 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "reading the board type" in proc.stderr and "mpremote failed" in proc.stderr  # the first step
    assert "os.remove" not in proc.stderr


def test_config_only_deploy_removes_module_files_that_would_shadow_frozen_ones(tmp_path):
    """--config-only (a frozen image or mip in /lib): main.py, config.json and the cert
    files are copied and verified; every firmware/board module file in the flash root
    (stale .mpy or .py from an earlier full deploy) is removed, nothing else."""
    cfg = json.loads((BOARDS / "unix" / "config.template.json").read_text())
    cfg["broker"].update(tls=False, ca=None, port=1)
    flash = tmp_path / "board"
    with VirtualBoard(flash) as vb:
        full = deploy_cmd(tmp_path, cfg, str(vb.tty), "--no-reset")
        assert full.returncode == 0, full.stderr
        assert {"mqb_app.mpy", "mqb_board.mpy"} <= set(vb.listdir())
        put = subprocess.run(
            [
                str(VENV_BIN / "mpremote"),
                "connect",
                str(vb.tty),
                "resume",
                "exec",
                "for n, t in (('mqb_codec.py', '# stale source'), ('notes.txt', 'mine')):\n"
                "    with open(n, 'w') as f:\n        f.write(t)",
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert put.returncode == 0, put.stderr
        cfg["sample_hz"] = 5
        only = deploy_cmd(tmp_path, cfg, str(vb.tty), "--config-only", "--no-reset")
        assert only.returncode == 0, only.stderr
        assert "verified 2 files" in only.stdout
    left = vb.listdir()
    assert not [n for n in left if n.startswith("mqb_")], left
    assert json.loads(vb.get("config.json"))["sample_hz"] == 5
    assert vb.get("main.py") == (FIRMWARE / "main.py").read_bytes()
    assert vb.get("notes.txt") == b"mine"


def test_deploy_names_the_wrong_board_type(tmp_path):
    """An esp32 build sent to a unix board is refused before anything is copied, naming
    what the board is (it used to fail later with a bare OSError [Errno 5])."""
    cfg = json.loads((BOARDS / "esp32" / "config.template.json").read_text())
    cfg["broker"].update(tls=False, ca=None, port=1)
    cfg["wifi"].update(ssid="home", password="a-real-one")  # the template's placeholders are refused first
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with VirtualBoard(tmp_path / "board") as vb:
        proc = subprocess.run(
            [
                str(VENV_BIN / "mqbatch"),
                "deploy",
                "--port",
                str(vb.tty),
                "--board",
                "esp32",
                "--config",
                str(tmp_path / "config.json"),
                "--build-dir",
                str(tmp_path / "build"),
            ],
            capture_output=True,
            text=True,
            timeout=180,
        )
        names = vb.listdir()
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "is not a esp32 board: it runs MicroPython for linux (--board unix)" in proc.stderr, proc.stderr
    assert "Errno" not in proc.stderr and names == [], names


def _figures(text: str) -> tuple[int, int]:
    m = re.search(r"needs about ([\d,]+) B of heap and the board has ([\d,]+) B", text)
    assert m, text
    return int(m.group(1).replace(",", "")), int(m.group(2).replace(",", ""))


def test_deploy_refuses_a_config_the_board_heap_cannot_hold(tmp_path):
    """Issue 25.3: deploy reads the board's free heap (mpremote exec) before copying and
    refuses, in one line with both figures and the largest term, a config that cannot fit;
    --force deploys anyway with a warning. A virtual board with a 96 KB heap: the firmware as
    .mpy files (about 104 KB) cannot run there, and with --force it indeed fails at start-up
    with a MemoryError; in the default heap (256 KB) the same deploy passes."""
    cfg = json.loads((BOARDS / "unix" / "config.template.json").read_text())
    cfg["broker"].update(tls=False, ca=None, port=1)
    with VirtualBoard(tmp_path / "small", heapsize="96K") as vb:
        proc = deploy_cmd(tmp_path, cfg, str(vb.tty), "--no-reset")
        assert proc.returncode == 1 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
        assert "does not fit the heap of the board" in proc.stderr and "--force" in proc.stderr
        assert "largest term: firmware (measured, 64-bit Unix port, .mpy files)" in proc.stderr
        need, have = _figures(proc.stderr)
        assert have < need and 80_000 < have < 98_304, (need, have)
        assert not [n for n in vb.listdir() if n.startswith("mqb_")], "nothing is copied"
        seen = vb.console_log.stat().st_size if vb.console_log.exists() else 0
        forced = deploy_cmd(tmp_path, cfg, str(vb.tty), "--force")
        assert forced.returncode == 0, forced.stderr
        assert "warning: the config does not fit the board's heap, deploying anyway (--force)" in forced.stdout
        deadline = time.monotonic() + 30
        log = ""
        while "MemoryError" not in log and time.monotonic() < deadline:
            time.sleep(0.2)
            log = vb.console_log.read_bytes()[seen:].decode(errors="replace")
        assert "MemoryError" in log, log[-1500:]  # the refusal was right: it does not start
    with VirtualBoard(tmp_path / "default") as vb:
        ok = deploy_cmd(tmp_path, cfg, str(vb.tty), "--no-reset")
        assert ok.returncode == 0, ok.stderr
        need_ok, have_ok = _figures(ok.stdout)
        assert need_ok == need and need_ok < have_ok, ok.stdout
        # the need follows the config: 2 x 100 KB batch buffers do not fit 256 KB
        big = deploy_cmd(tmp_path, dict(cfg, flush={"max_bytes": 100_000}), str(vb.tty), "--no-reset")
        assert big.returncode == 1 and "does not fit the heap" in big.stderr, big.stderr
        assert "largest term: batch buffers 2 x (100000 + 160) 200,320 B" in big.stderr
