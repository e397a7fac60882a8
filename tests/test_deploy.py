"""`mqbatch deploy` for real: mpy-cross compiles the firmware, mpremote copies it to a
virtual board (the MicroPython Unix port on a pseudo-terminal, mpremote in `resume`
mode), the files are verified by SHA-256, the board is reset, and the application
starts and publishes to a real Mosquitto over TLS."""
from __future__ import annotations

import hashlib
import json
import subprocess

from mqbatch import codec, records
from mqbatch.vboard import VirtualBoard
from mqbatch_testing import VENV_BIN
from mqbatch.paths import BOARDS


def test_deploy_to_virtual_board_then_app_publishes(mosquitto, subscriber, pki, tmp_path):
    creds = {"dev-042": "pw-42"}
    broker = mosquitto(tls=True, allow_anonymous=False, users={**creds, "reader": "rpw"},
                       acl="user reader\ntopic read mqbatch/#\n\npattern write mqbatch/%u/#\n")
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
    with VirtualBoard(flash, heapsize=None) as vb:
        proc = subprocess.run([str(VENV_BIN / "mqbatch"), "deploy", "--port", str(vb.tty), "--board", "unix",
                               "--config", str(cfg_dir / "config.json"), "--build-dir", str(tmp_path / "build")],
                              capture_output=True, text=True, timeout=180)
        assert proc.returncode == 0, proc.stderr + proc.stdout
        assert "verified" in proc.stdout and "board reset" in proc.stdout
        # what landed on the board is exactly the build, byte for byte
        built = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in (tmp_path / "build").iterdir()
                 if not p.name.startswith(".")}        # .mqbatch-build marks the folder, stays on the host
        assert {"main.py", "mqb_app.mpy", "mqb_board.mpy", "mqb_codec.mpy", "config.json", "ca.pem"} <= set(built)
        landed = {n: hashlib.sha256((flash / n).read_bytes()).hexdigest() for n in built}
        assert landed == built
        vb.wait_boot(2)                      # the reset restarted the interpreter, which runs main.py
        msgs = sub.wait_for(2, timeout=30)
    assert len(msgs) >= 2, (flash / "console.log").read_text()[-2000:]
    for m in msgs:
        assert m.topic == "mqbatch/dev-042/telemetry"
        res = codec.decode(m.user_properties, m.payload, topic=m.topic)
        assert res.status == codec.OK
        recs = [records.parse(x) for x in res.messages]
        assert all(r.boot == 1 for r in recs)     # first boot of this board's flash


def test_deploy_never_wipes_a_folder_it_did_not_make(tmp_path):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "thesis.tex").write_text("precious")
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"device_id": "d", "broker": {"host": "h"}, "topic": "t"}))
    proc = subprocess.run([str(VENV_BIN / "mqbatch"), "deploy", "--port", str(tmp_path / "nope"), "--board", "unix",
                           "--config", str(cfg), "--build-dir", str(mine)], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 1 and "not made by mqbatch" in proc.stderr
    assert (mine / "thesis.tex").read_text() == "precious"


def test_deploy_reports_bad_config_and_port(tmp_path):
    bad = tmp_path / "config.json"
    bad.write_text(json.dumps({"device_id": "d", "broker": {"ca": "missing.pem"}, "topic": "t"}))
    proc = subprocess.run([str(VENV_BIN / "mqbatch"), "deploy", "--port", str(tmp_path / "nope"), "--board", "unix",
                           "--config", str(bad), "--build-dir", str(tmp_path / "b")], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 1 and "missing.pem" in proc.stderr and "does not exist" in proc.stderr
    (tmp_path / "missing.pem").write_text("x")
    proc = subprocess.run([str(VENV_BIN / "mqbatch"), "deploy", "--port", str(tmp_path / "nope"), "--board", "unix",
                           "--config", str(bad), "--build-dir", str(tmp_path / "b")], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 1 and "mpremote failed" in proc.stderr


def test_every_board_compiles_with_mpy_cross(tmp_path):
    """The esp32 and rp2040 board modules cannot run here (no hardware); this at least
    compiles them and their shared Wi-Fi module for their architectures."""
    from mqbatch.deploy import BOARD_NAMES, compile_firmware
    for board in BOARD_NAMES:
        files = compile_firmware(board, tmp_path / board)
        assert "mqb_board.mpy" in files and "mqb_app.mpy" in files and "main.py" in files
        if board != "unix":
            assert "mqb_wifi.mpy" in files
        assert all(p.stat().st_size > 0 for p in files.values())
