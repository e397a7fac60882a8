"""Shared pytest set-up.

MicroPython tests: files tests/mpy/mp_test_*.py are MicroPython modules. Each
top-level `def test_*` becomes one pytest item that runs in the real Unix-port
interpreter (`micropython` from the venv) through tests/mpy/mpyunit.py. They are
never imported into CPython.
"""

from __future__ import annotations

import ast
import os
import pathlib
import subprocess

import pytest

from mqbatch_testing import MICROPYTHON, ROOT, mpy_env

pytest_plugins = ["mqbatch_testing.fixtures", "mqbatch_testing.broker", "mqbatch_testing.spark"]


class MpyFile(pytest.File):
    def collect(self):
        tree = ast.parse(self.path.read_text(encoding="utf-8"))
        for node in tree.body:
            if isinstance(node, ast.FunctionDef) and node.name.startswith("test_"):
                yield MpyItem.from_parent(self, name=node.name)


class MpyFailure(Exception):
    pass


class MpyItem(pytest.Item):
    def runtest(self):
        module = self.path.stem
        heap = os.environ.get("MQBATCH_MPY_HEAP")
        cmd = (
            [str(MICROPYTHON)]
            + (["-X", f"heapsize={heap}"] if heap else [])
            + [str(ROOT / "tests" / "mpy" / "mpyunit.py"), module, self.name]
        )
        proc = subprocess.run(cmd, cwd=self.path.parent, env=mpy_env(), capture_output=True, text=True, timeout=600)
        # show what the test printed (figures, logs) in pytest's captured output
        print(proc.stdout, end="")
        if proc.stderr:
            print(proc.stderr, end="")
        if f"MPYTEST PASS {self.name}" not in proc.stdout:
            raise MpyFailure(f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}")

    def repr_failure(self, excinfo):
        if isinstance(excinfo.value, MpyFailure):
            return f"MicroPython test failed: {excinfo.value}"
        return super().repr_failure(excinfo)

    def reportinfo(self):
        return self.path, 0, f"[micropython] {self.name}"


def pytest_collect_file(parent, file_path: pathlib.Path):
    if file_path.suffix == ".py" and file_path.name.startswith("mp_test_"):
        return MpyFile.from_parent(parent, path=file_path)
    return None
