"""Test support shared by the CPython test modules (not shipped)."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

from mqbatch.util.paths import ROOT, micropython_env, micropython_exe

VENV_BIN = pathlib.Path(sys.executable).parent
MICROPYTHON = micropython_exe()
VECTORS = ROOT / "tests" / "vectors"
MPY_TESTS = ROOT / "tests" / "mpy"


def mpy_env(*extra: str | os.PathLike, **overrides: str) -> dict:
    """Environment for device code under test: extra paths, tests/mpy, firmware, boards/unix."""
    env = micropython_env("unix", *extra, MPY_TESTS)
    env.update(overrides)
    return env


def run_mpy(
    script: str | os.PathLike,
    *args: str,
    heapsize: str | None = None,
    timeout: float = 300,
    cwd: str | os.PathLike | None = None,
    extra_path=(),
    input: str | None = None,
) -> subprocess.CompletedProcess:
    """Run a MicroPython script in the Unix port and return the finished process."""
    cmd = [str(MICROPYTHON)] + (["-X", f"heapsize={heapsize}"] if heapsize else []) + [str(script), *args]
    return subprocess.run(
        cmd, env=mpy_env(*extra_path), capture_output=True, text=True, timeout=timeout, cwd=cwd or ROOT, input=input
    )


def load_vectors() -> list[dict]:
    with open(VECTORS / "batch_v1.json", encoding="utf-8") as f:
        return json.load(f)["vectors"]


def run_bench(*args: str, timeout: float = 900) -> str:
    """`mqbatch bench ARGS` from this venv: its stdout (printed, for -s); fails the test,
    with the end of both streams, unless it exits 0."""
    proc = subprocess.run([str(VENV_BIN / "mqbatch"), "bench", *args], capture_output=True, text=True, timeout=timeout)
    print(proc.stdout)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout
