"""The heap figures of docs/application.md ("Heap on 32-bit boards") and their tools:
tools/heap_app.py (--files: .mpy on a filesystem; --port wasm32) and tools/mpy_sizes.py
(what loading .mpy files puts into the heap that frozen/ROMFS code keeps in flash)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from test_wasm32 import _require

from mqbatch.fleet.deploy import compile_firmware
from mqbatch_testing import ROOT

TOOLS = ROOT / "tools"
APP_MODULES = [
    "mqb_app",
    "mqb_board",
    "mqb_boot",
    "mqb_client",
    "mqb_codec",
    "mqb_flush",
    "mqb_inflight",
    "mqb_net",
    "mqb_outbox",
    "mqb_outbox_format",
    "mqb_packet",
    "mqb_packet_build",
    "mqb_record",
    "mqb_transport",
]  # what `import mqb_app` loads with the default config


def _tool(*args: str) -> str:
    proc = subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    print(proc.stdout)
    return proc.stdout


def _heap(*args: str) -> dict:
    out = _tool(str(TOOLS / "heap_app.py"), *args)
    return json.loads(next(x for x in out.splitlines() if x.startswith("HEAP "))[5:])


def test_mpy_sizes_reads_every_module_and_refuses_a_damaged_file(tmp_path):
    sys.path.insert(0, str(TOOLS))
    try:
        from mpy_sizes import MpyError, parse
    finally:
        sys.path.remove(str(TOOLS))
    files = compile_firmware("unix", tmp_path / "fw")
    native = set()
    for name, path in files.items():
        if name.endswith(".mpy"):
            data = path.read_bytes()
            if data[2] >> 2:  # machine code (mpy-cross -march): not in the bytecode model, refused
                native.add(name)
                with pytest.raises(MpyError, match="native code"):
                    parse(data)
                continue
            got = parse(data)
            assert got["bytecode"] and sum(got["bytecode"]) < path.stat().st_size, name
    assert native == {"mqb_native.mpy"}, native  # the one module of machine code (docs/outbox.md)
    data = files["mqb_boot.mpy"].read_bytes()
    for bad in (data[:-3], data + b"\x00", b"M\x05" + data[2:], data[:40]):
        with pytest.raises(MpyError):
            parse(bad)


def test_mpy_sizes_explains_what_files_cost_over_romfs_on_64bit(tmp_path):
    """The model (bytecode + str/bytes constants, 32-byte blocks) against the measured
    difference between .mpy files and ROMFS in the 64-bit Unix port: within 5 %."""
    romfs = _heap()
    files = _heap("--files")
    compile_firmware("unix", tmp_path / "fw")
    out = _tool(str(TOOLS / "mpy_sizes.py"), str(tmp_path / "fw"), *APP_MODULES)
    model = json.loads(out.split("MPY_SIZES ", 1)[1])
    measured = files["imports"] - romfs["imports"]
    print(
        f"HEAP64 imports ROMFS {romfs['imports']} B, files {files['imports']} B: files cost {measured} B more; "
        f"model {model['heap_64bit']} B ({model['functions']} functions, {model['bytecode_bytes']} B bytecode, "
        f"{model['constant_bytes']} B in {model['str_bytes_constants']} constants); 32-bit model {model['heap_32bit']} B"
    )
    assert abs(model["heap_64bit"] - measured) <= 0.05 * measured, (model, measured)


def test_app_heap_on_32bit_with_bytecode_in_the_heap():
    """As `mqbatch deploy` installs it (.mpy files): imports + App on the 32-bit port."""
    _require()
    h = _heap("--port", "wasm32")
    print(
        f"HEAP32 files: imports {h['imports']} B, App {h['app']} B, live {h['live']} B "
        f"(of which before imports {h['before_imports']} B: interpreter, the two batch buffers)"
    )
    assert h["modules"] == APP_MODULES, h["modules"]
    assert 40_000 < h["imports"] < 120_000 and 2_000 < h["app"] < 20_000, h
