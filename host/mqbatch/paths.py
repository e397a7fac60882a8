"""Where the repository's device code and tools are, seen from the host package."""
from __future__ import annotations

import os
import pathlib
import shutil
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
FIRMWARE = ROOT / "firmware"
BOARDS = ROOT / "boards"


def venv_tool(name: str) -> pathlib.Path:
    """A console tool installed next to this Python (the venv), else on PATH."""
    here = pathlib.Path(sys.executable).parent / name
    if here.exists():
        return here
    found = shutil.which(name)
    if not found:
        raise FileNotFoundError(f"{name} not found next to {sys.executable} nor on PATH (run `make setup`)")
    return pathlib.Path(found)


def micropython_exe() -> pathlib.Path:
    return venv_tool("micropython")


def micropython_env(board: str = "unix", *extra: os.PathLike | str) -> dict:
    """Environment for running firmware in the Unix port: MICROPYPATH = extra, firmware, board."""
    env = dict(os.environ)
    env["MICROPYPATH"] = ":".join([str(e) for e in extra] + [".frozen", str(FIRMWARE), str(BOARDS / board)])
    return env
