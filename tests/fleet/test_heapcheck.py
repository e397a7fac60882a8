"""The heap check of `mqbatch deploy` (mqbatch.fleet.heapcheck) per port, from readings as
the board script prints them. The check against a real board (a virtual board with a
small and a default heap) is tests/fleet/test_deploy.py::test_deploy_refuses_a_config_the_board_heap_cannot_hold."""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess
import sys

import pytest

from mqbatch.fleet import heapcheck
from mqbatch.fleet.deploy import check_config_data
from mqbatch.util.paths import BOARDS, micropython_exe

WIFI = {"ssid": "home", "password": "a-real-one", "timeout_ms": 10000}


def merged(board: str, **over) -> dict:
    """The board's template over the firmware's defaults, as mqb_config.make_config makes it."""
    cfg = json.loads((BOARDS / board / "config.template.json").read_text())
    if board != "unix":
        cfg["wifi"] = WIFI
    cfg.update(over)
    return check_config_data(cfg, board)


def reading(platform: str, free: int, bits: int = 32, **extra) -> dict:
    return {"platform": platform, "maxsize": 2**31 - 1 if bits == 32 else 2**63 - 1, "free": free, **extra}


def test_the_board_script_reads_the_unix_port():
    """BOARD_SCRIPT itself, in the Unix port: a 128 KB heap reports about that much free."""
    proc = subprocess.run(
        [str(micropython_exe()), "-X", "heapsize=128K", "-c", heapcheck.BOARD_SCRIPT],
        capture_output=True,
        text=True,
        timeout=30,
        cwd="/",
    )
    r = heapcheck.parse_reading(proc.stdout)
    assert r["platform"] == "linux" and r["maxsize"] > 2**31 and r["app"] is None
    assert 120_000 < r["free"] < 131_072 and r["alloc"] > 0
    with pytest.raises(heapcheck.HeapInfoError, match="did not report its heap"):
        heapcheck.parse_reading("Traceback ...\nMemoryError")


def test_the_board_script_reads_a_32_bit_port(tmp_path):
    """The same script in the 32-bit WebAssembly port (tests/mpy32): sys.maxsize 2**31 - 1
    makes the estimate take the 32-bit figures."""
    pkg = pathlib.Path(os.environ.get("MQBATCH_WASM32") or pathlib.Path(sys.prefix) / "wasm32")
    pkg = pkg / "node_modules" / "@micropython" / "micropython-webassembly-pyscript"
    if shutil.which("node") is None or not (pkg / "micropython.mjs").is_file():
        pytest.skip("node or the 32-bit WebAssembly MicroPython is not installed (tools/bootstrap.sh)")
    (tmp_path / "probe.py").write_text(heapcheck.BOARD_SCRIPT)
    runner = pathlib.Path(__file__).resolve().parents[1] / "mpy32" / "run_wasm32.mjs"
    proc = subprocess.run(
        [
            "node",
            str(runner),
            str(pkg),
            "--put",
            f"{tmp_path}=/flash",
            "--cwd",
            "/flash",
            "--script",
            "/flash/probe.py",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    r = heapcheck.parse_reading(proc.stdout)
    assert r["maxsize"] == 2**31 - 1 and r["free"] > 0 and r["app"] is None
    est = heapcheck.estimate(merged("unix"), r, "files")
    assert est.largest[0] == "firmware (measured, 32-bit WebAssembly port, .mpy files)"


def test_the_need_follows_the_config():
    base = heapcheck.estimate(merged("rp2040"), reading("rp2", 200_000), "files")
    terms = dict(base.terms)
    # the template: flush.max_bytes 2048, outbox 8 segments x the default 32 entries, TLS on
    assert terms["batch buffers 2 x (2048 + 160)"] == 4_416 and terms["outbox index 256 slots x 7"] == 1_792
    assert terms["TLS on the GC heap (mbedTLS record buffers, at least)"] == 20_480
    assert base.need == sum(terms.values())
    bigger = heapcheck.estimate(
        merged("rp2040", flush={"max_bytes": 8192}, hmac_key="ab" * 32, e2e_ack={"enabled": True}),
        reading("rp2", 200_000),
        "files",
    )
    e2e = heapcheck.E2E[(32, "files")] + 256 * heapcheck.E2E_SLOT  # the module, and its table per outbox slot
    assert bigger.need - base.need == 2 * (8192 - 2048) + heapcheck.HMAC[(32, "files")] + e2e
    # frozen (or ROMFS) keeps the bytecode in flash
    frozen = heapcheck.estimate(merged("rp2040"), reading("rp2", 200_000), "frozen")
    assert base.need - frozen.need == 43_664
    # e2e_ack present but disabled costs nothing (make_config drops it)
    off = heapcheck.estimate(merged("rp2040", e2e_ack={"enabled": False}), reading("rp2", 200_000), "files")
    assert off.need == base.need


def test_each_port_reads_its_own_free_heap():
    """rp2: the GC heap is all there is, and TLS allocates from it. esp32 (>= 1.21): the GC
    heap grows into the IDF heap, of which TLS keeps 45 KB. unix (the virtual board): TLS
    allocates outside the GC heap."""
    pico = heapcheck.estimate(merged("rp2040"), reading("rp2", 100_000), "files")
    assert not pico.fits and pico.available == 100_000
    assert "100,000 B free in the GC heap; rp2, 32-bit" in heapcheck.describe(pico)
    assert heapcheck.estimate(merged("rp2040"), reading("rp2", 200_000), "files").fits
    esp = merged("esp32")
    small = heapcheck.estimate(esp, reading("esp32", 60_000, idf_free=50_000), "files")
    assert small.available == 60_000 + 50_000 - 45_056 and not small.fits
    grown = heapcheck.estimate(esp, reading("esp32", 60_000, idf_free=120_000), "files")
    assert grown.available == 60_000 + 120_000 - 45_056 and grown.fits
    assert "IDF heap 120,000 B free, 45,056 B kept for TLS" in grown.basis
    assert not any("TLS" in name for name, _ in grown.terms)  # TLS is counted in the IDF heap
    plain = dict(esp, broker=dict(esp["broker"], tls=False))
    assert heapcheck.estimate(plain, reading("esp32", 60_000, idf_free=50_000), "files").available == 110_000
    vboard = heapcheck.estimate(merged("unix"), reading("linux", 252_000, bits=64), "files")
    assert vboard.fits and not any("TLS" in name for name, _ in vboard.terms)
    assert vboard.largest[0] == "firmware (measured, 64-bit Unix port, .mpy files)"


def test_where_the_modules_are():
    assert heapcheck.install_kind({"app": None}, copying_files=True) == "files"  # a full deploy copies .mpy
    assert heapcheck.install_kind({"app": None}, copying_files=False) == "frozen"  # not on the filesystem
    assert heapcheck.install_kind({"app": "/rom/mqb_app.mpy"}, copying_files=False) == "frozen"
    assert heapcheck.install_kind({"app": "/lib/mqb_app.mpy"}, copying_files=False) == "files"
    src = heapcheck.estimate(merged("rp2040"), reading("rp2", 200_000, app="/lib/mqb_app.py"), "files")
    assert src.notes == ["the modules are .py sources: compiling them on the board needs more than this"]
