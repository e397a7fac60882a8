# MicroPython checks of wasm32_prelude.py, the adapter run_wasm32.mjs loads before
# every test in the 32-bit WebAssembly port (run by test_wasm32.py).
import errno
import gc
import os

import micropython


def _errno_of(fn, *args):
    try:
        fn(*args)
    except OSError as e:
        return e.args[0]
    raise AssertionError("no OSError from %s%r" % (fn, args))


def test_filesystem_errors_carry_micropython_errno_numbers():
    os.mkdir("/tmp/pc")
    with open("/tmp/pc/f", "wb") as f:
        f.write(b"x")
    assert _errno_of(os.stat, "/tmp/pc/missing") == errno.ENOENT
    assert _errno_of(open, "/tmp/pc/missing", "rb") == errno.ENOENT
    assert _errno_of(os.mkdir, "/tmp/pc") == errno.EEXIST
    assert _errno_of(open, "/tmp/pc", "rb") == errno.EISDIR  # at open(), as on a board
    assert _errno_of(os.remove, "/tmp/pc/missing") == errno.ENOENT
    assert _errno_of(os.rename, "/tmp/pc/missing", "/tmp/pc/g") == errno.ENOENT
    with open("/tmp/pc/f", "rb") as f:  # the probe rewinds
        assert f.read() == b"x"
    os.remove("/tmp/pc/f")
    os.rmdir("/tmp/pc")


def test_the_errno_vfs_adds_no_allocation():
    with open("/tmp/pcw", "wb") as f:
        f.write(b"0")
    buf = b"0123456789"
    f = open("/tmp/pcw", "ab")
    gc.collect()
    gc.disable()
    try:
        before = gc.mem_alloc()
        for _ in range(100):
            f.write(buf)
            os.rename("/tmp/pcw", "/tmp/pcv")
            os.rename("/tmp/pcv", "/tmp/pcw")
        grew = gc.mem_alloc() - before
    finally:
        gc.enable()
    f.close()
    os.remove("/tmp/pcw")
    assert grew == 0, grew


def test_heap_lock_stand_in_passes_no_allocation():
    b = bytearray(8)
    micropython.heap_lock()
    try:
        for i in range(100):
            b[i & 7] = i
    finally:
        assert micropython.heap_unlock() == 0


def test_heap_lock_stand_in_fails_an_allocation():
    """The instrument can fail: one allocation under the lock raises MemoryError."""
    micropython.heap_lock()
    try:
        x = bytearray(16)
    except MemoryError:
        raise AssertionError("the stand-in raises at unlock, not at the allocation")
    try:
        micropython.heap_unlock()
    except MemoryError as e:
        assert "bytes allocated while locked" in str(e), str(e)
        assert len(x) == 16
        assert not micropython.heap_locked()
        return
    raise AssertionError("an allocation under heap_lock went unnoticed")


def test_gc_collect_keeps_recent_garbage_in_this_port():
    """Why "RAM held" figures (gc.collect() deltas) read high here: a bytearray just
    dropped is still counted after gc.collect() (stale pointers the conservative GC
    finds on the wasm stack). Allocation counts with the GC disabled are exact."""
    gc.collect()
    before = gc.mem_alloc()
    y = bytearray(1000)
    del y
    gc.collect()
    kept = gc.mem_alloc() - before
    print("WASM32_GC_KEPT %d B of a dropped 1000-byte bytearray" % kept)
    assert kept >= 1000, kept
