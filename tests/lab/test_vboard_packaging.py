"""MicroPython's own ways to install and freeze the firmware, on the virtual board:
`mpremote mip install` of the repository's package.json files (a local path: the
same files `mip install github:OWNER/REPO` reads), then `mqbatch deploy
--config-only`; and the boards' manifest.py files.

Manifests: MicroPython's manifest tool (tools/manifestfile.py of the micropython
repository) is not on PyPI and mpremote ships none, so `run_manifest` executes
each manifest.py with stand-ins for include/require/module/freeze/package/options
that follow the documented meaning (paths relative to the manifest's folder,
include options with defaults) and check that every referenced local file exists;
`$(PORT_DIR)`/`$(MPY_DIR)` paths (MicroPython's own tree) and require() names
(micropython-lib) are recorded, not checked."""

from __future__ import annotations

import json
import pathlib
import subprocess
import time

import pytest

from mqbatch.lab.vboard import VirtualBoard
from mqbatch.util.paths import BOARDS, CHECKOUT, FIRMWARE
from mqbatch_testing import VENV_BIN

FIRMWARE_MODULES = sorted(p.name for p in FIRMWARE.glob("mqb_*.py"))


class _Options:
    def __init__(self, **given):
        self._given, self._defaults = given, {}

    def defaults(self, **kw):
        self._defaults = kw

    def __getattr__(self, name):
        return self._given.get(name, self._defaults.get(name))


def run_manifest(path: pathlib.Path, **options) -> dict:
    """Execute a manifest.py like MicroPython's manifest tool; returns
    {"frozen": [absolute .py paths], "required": [names], "external": [includes]}."""
    out = {"frozen": [], "required": [], "external": []}

    def execute(manifest: pathlib.Path, **opts):
        here = manifest.parent

        def local(p: str) -> pathlib.Path | None:
            if p.startswith("$("):
                out["external"].append(p)
                return None
            return (here / p).resolve()

        def include(p, **kw):
            target = local(p)
            if target is not None:
                target = target / "manifest.py" if target.is_dir() else target
                assert target.is_file(), f"{manifest}: include({p!r}): {target} does not exist"
                execute(target, **kw)

        def module(name, base_path=".", opt=None):
            f = local(str(pathlib.Path(base_path) / name))
            assert f is not None and f.is_file() and f.suffix == ".py", f"{manifest}: module({name!r}): {f} missing"
            out["frozen"].append(f)

        def freeze(p, script=None, opt=None):
            d = local(p)
            assert d is not None and d.is_dir(), f"{manifest}: freeze({p!r}): not a folder"
            names = [script] if isinstance(script, str) else script or [f.name for f in d.glob("*.py")]
            for n in names:
                module(n, base_path=str(d))

        def package(name, files=None, base_path=".", opt=None):
            d = local(str(pathlib.Path(base_path) / name))
            assert d is not None and d.is_dir(), f"{manifest}: package({name!r}): {d} missing"
            out["frozen"].extend(d.rglob("*.py"))

        api = {
            "include": include,
            "require": lambda name, **kw: out["required"].append(name),
            "module": module,
            "freeze": freeze,
            "package": package,
            "metadata": lambda **kw: None,
            "options": _Options(**opts),
        }
        exec(compile(manifest.read_text(), str(manifest), "exec"), api)

    execute(path, **options)
    return out


def test_manifests_freeze_the_firmware_and_board_but_not_main_py():
    for board, extra in (("esp32", {"mqb_wifi.py"}), ("rp2040", {"mqb_wifi.py"}), ("unix", set())):
        got = run_manifest(BOARDS / board / "manifest.py")
        names = sorted(p.name for p in got["frozen"])
        assert names == sorted(FIRMWARE_MODULES + ["mqb_board.py", *extra]), (board, names)
        assert (BOARDS / board / "mqb_board.py").resolve() in got["frozen"]
        assert len(got["external"]) == 1  # the port's own manifest
        if board != "unix":
            assert got["required"] == ["ntptime"]
        with_main = run_manifest(BOARDS / board / "manifest.py", freeze_main=True)
        assert (FIRMWARE / "main.py").resolve() in with_main["frozen"]


@pytest.mark.fast
def test_manifest_check_catches_a_missing_file(tmp_path):
    bad = tmp_path / "manifest.py"
    bad.write_text('module("mqb_nothing.py")\n')
    try:
        run_manifest(bad)
    except AssertionError as e:
        assert "mqb_nothing.py" in str(e)
    else:
        raise AssertionError("a manifest naming a missing file passed the check")


def test_package_json_files_name_existing_files_and_the_whole_firmware():
    pkgs = {p: json.loads(p.read_text()) for p in [CHECKOUT / "package.json", *BOARDS.glob("*/package.json")]}
    for path, pkg in pkgs.items():
        assert pkg["version"] and pkg["urls"], path
        for dest, src in pkg["urls"]:
            assert (path.parent / src).is_file(), f"{path}: {src} does not exist"
            assert "/" not in dest and ".." not in src, (path, dest, src)  # flat in /lib; no URL walks up
    assert sorted(d for d, _ in pkgs[CHECKOUT / "package.json"]["urls"]) == FIRMWARE_MODULES
    for board in ("esp32", "rp2040", "unix"):
        assert [d for d, _ in pkgs[BOARDS / board / "package.json"]["urls"]] == ["mqb_board.py"]


def _mpremote(tty, *args):
    proc = subprocess.run(
        [str(VENV_BIN / "mpremote"), "connect", str(tty), "resume", *args], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def test_mip_install_then_config_only_deploy_runs_the_app(tmp_path, mosquitto):
    broker = mosquitto()  # plain TCP, anonymous: what is tested here is the install
    cfg = json.loads((BOARDS / "unix" / "config.template.json").read_text())
    cfg["broker"].update(host=broker.host, port=broker.port, tls=False, ca=None)
    (tmp_path / "dev.json").write_text(json.dumps(cfg))
    flash = tmp_path / "board"
    with VirtualBoard(flash) as vb:
        out = _mpremote(vb.tty, "mip", "install", str(CHECKOUT / "package.json"))
        out += _mpremote(vb.tty, "mip", "install", str(BOARDS / "unix" / "package.json"))
        assert out.count("Installing:") == len(FIRMWARE_MODULES) + 1, out
        for name in FIRMWARE_MODULES:  # in /lib of the board's flash image
            assert vb.get(f"lib/{name}") == (FIRMWARE / name).read_bytes()
        deploy = subprocess.run(
            [
                str(VENV_BIN / "mqbatch"),
                "deploy",
                "--port",
                str(vb.tty),
                "--board",
                "unix",
                "--config",
                str(tmp_path / "dev.json"),
                "--config-only",
                "--build-dir",
                str(tmp_path / "build"),
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert deploy.returncode == 0, deploy.stdout + deploy.stderr
        vb.wait_boot(2)
        deadline = time.monotonic() + 30
        while "mqb: connected" not in (flash / "console.log").read_text(errors="replace"):
            assert time.monotonic() < deadline, (flash / "console.log").read_text(errors="replace")[-3000:]
            time.sleep(0.2)
    assert [n for n in vb.listdir() if n.startswith("mqb_") and n.endswith((".py", ".mpy"))] == []  # lib/ only
