"""`mqbatch deploy` points at what an installation has: --print-template prints the board's
config template (deploy --help named boards/BOARD/config.template.json, a path wheel users
do not have) and --print-mip prints `mpremote mip install` lines of this installation's own
package.json files (the docs said github:OWNER/REPO, a placeholder that installs nothing)."""

import json
import shlex
import subprocess
import time

from mqbatch.util.paths import BOARDS, FIRMWARE
from mqbatch_testing import VENV_BIN


def mqbatch(*args) -> subprocess.CompletedProcess:
    return subprocess.run([str(VENV_BIN / "mqbatch"), *args], capture_output=True, text=True, timeout=120)


def test_help_points_at_a_command_not_at_a_checkout_path():
    proc = mqbatch("deploy", "--help")
    assert proc.returncode == 0
    assert "boards/BOARD/config.template.json" not in proc.stdout
    assert "--print-template" in proc.stdout and "--print-mip" in proc.stdout


def test_print_template_is_the_boards_template():
    for board in ("esp32", "rp2040", "unix"):
        proc = mqbatch("deploy", "--board", board, "--print-template")
        assert proc.returncode == 0, proc.stderr
        assert json.loads(proc.stdout) == json.loads((BOARDS / board / "config.template.json").read_text())


def test_deploy_without_port_or_config_names_the_flags():
    proc = mqbatch("deploy", "--board", "unix")
    assert proc.returncode == 2
    assert proc.stderr.strip() == "mqbatch deploy: --port and --config required (or --print-template / --print-mip)"


def test_print_mip_names_real_packages_for_wifi_boards():
    proc = mqbatch("deploy", "--board", "esp32", "--print-mip")
    lines = proc.stdout.strip().splitlines()
    assert proc.returncode == 0 and len(lines) == 3 and "OWNER" not in proc.stdout
    for line in lines:
        path = shlex.split(line)[-1]
        assert json.loads(open(path).read())["urls"], line  # a package.json that exists
    assert lines[1].endswith("boards/common/package.json") and lines[2].endswith("boards/esp32/package.json")


def test_print_mip_lines_install_the_modules_on_a_virtual_board(tmp_path):
    """Run the printed lines as a user would (with the venv's mpremote) against a virtual board."""
    from mqbatch.lab.vboard import VirtualBoard

    flash = tmp_path / "board"
    with VirtualBoard(flash) as vb:
        proc = mqbatch("deploy", "--board", "unix", "--print-mip", "--port", str(vb.tty))
        assert proc.returncode == 0
        for line in proc.stdout.strip().splitlines():
            argv = shlex.split(line)
            assert argv[:3] == ["mpremote", "connect", str(vb.tty)]
            # `resume`: no soft reset of the board between the lines (the virtual board's boot.py would run)
            run = subprocess.run(
                [str(VENV_BIN / "mpremote"), *argv[1:3], "resume", *argv[3:]],
                capture_output=True,
                text=True,
                timeout=120,
            )
            assert run.returncode == 0, run.stdout + run.stderr
            time.sleep(0.2)
        # what landed in the board's own flash image (a vboard keeps its files in it, not on the host)
        for module in json.loads((FIRMWARE.parent / "package.json").read_text())["urls"]:
            assert vb.get("lib/" + module[0]) == (FIRMWARE.parent / module[1]).read_bytes(), module
        assert vb.get("lib/mqb_board.py") == (BOARDS / "unix" / "mqb_board.py").read_bytes()
