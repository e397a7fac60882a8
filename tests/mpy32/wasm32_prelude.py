# wasm32_prelude: makes the WebAssembly port (32-bit, run by run_wasm32.mjs) look
# like a board to the firmware and to tests/mpy, without changing what is measured.
#
# - Filesystem errors: this port's files are Emscripten's, whose OSError numbers are
#   Emscripten's own (ENOENT 44, EEXIST 20), while its `errno` module and every board
#   filesystem (littlefs, FAT) use MicroPython's (ENOENT 2, EEXIST 17). The root is
#   remounted through ErrnoVfs, which translates the numbers and adds no allocation
#   (shown by test_wasm32.py::test_errno_vfs_*).
# - micropython.heap_lock(): hangs in this port (its GC cannot run the lock's
#   MemoryError path). The stand-in disables the GC and, at heap_unlock(), raises
#   MemoryError if gc.mem_alloc() grew while locked: the same verdict, given at the
#   unlock instead of at the allocation.
# - os.getenv, os.urandom: absent here; an `os` stand-in answers getenv from the
#   variables the runner was given, urandom from `random` (temporary names only).
# - socket: absent here; socket_stub.py next to this file (the port's `socket`) lets the firmware's transport
#   import, and raises on any use (these runs test what needs no network).
import gc
import os
import sys

# Emscripten errno -> MicroPython's (Linux) numbering
EMSCRIPTEN_ERRNO = {
    63: 1,
    44: 2,
    29: 5,
    8: 9,
    48: 12,
    2: 13,
    20: 17,
    75: 18,
    54: 20,
    31: 21,
    28: 22,
    51: 28,
    69: 30,
    37: 36,
    55: 39,
}


_PROBE = bytearray(1)


def _oserror(e):
    return OSError(EMSCRIPTEN_ERRNO.get(e.errno, e.errno))


class ErrnoVfs:
    """The port's own VfsPosix behind MicroPython's VFS protocol, errors renumbered."""

    def __init__(self, inner):
        self.inner = inner

    def mount(self, readonly, mkfs):
        pass

    def umount(self):
        pass

    def open(self, path, mode):
        try:
            f = self.inner.open(path, mode)
            if "r" in mode:
                # a board's open() of a directory fails (EISDIR); here only the first
                # read does: probe one byte into a preallocated buffer, then rewind
                f.readinto(_PROBE)
                f.seek(0)
            return f
        except OSError as e:
            raise _oserror(e)

    def ilistdir(self, path):
        try:
            return self.inner.ilistdir(path)
        except OSError as e:
            raise _oserror(e)

    def stat(self, path):
        try:
            return self.inner.stat(path)
        except OSError as e:
            raise _oserror(e)

    def statvfs(self, path):
        try:
            return self.inner.statvfs(path)
        except OSError as e:
            raise _oserror(e)

    def mkdir(self, path):
        try:
            return self.inner.mkdir(path)
        except OSError as e:
            raise _oserror(e)

    def rmdir(self, path):
        try:
            return self.inner.rmdir(path)
        except OSError as e:
            raise _oserror(e)

    def remove(self, path):
        try:
            return self.inner.remove(path)
        except OSError as e:
            raise _oserror(e)

    def rename(self, old, new):
        try:
            return self.inner.rename(old, new)
        except OSError as e:
            raise _oserror(e)

    def chdir(self, path):
        try:
            return self.inner.chdir(path)
        except OSError as e:
            raise _oserror(e)

    def getcwd(self):
        return self.inner.getcwd()


class _HeapLock:
    """micropython.heap_lock()/heap_unlock()/heap_locked() by gc.mem_alloc() deltas."""

    def __init__(self):
        self.depth = 0
        self.start = 0
        self.was_enabled = True

    def lock(self):
        if self.depth == 0:
            self.was_enabled = gc.isenabled()
            gc.disable()
            self.start = gc.mem_alloc()
        self.depth += 1

    def unlock(self):
        if self.depth == 0:
            return 0
        self.depth -= 1
        if self.depth == 0:
            grew = gc.mem_alloc() - self.start
            if self.was_enabled:
                gc.enable()
            if grew:
                raise MemoryError(
                    "memory allocation failed, heap is locked (wasm32 stand-in: %d bytes allocated while locked)" % grew
                )
        return self.depth

    def locked(self):
        return self.depth


class _Module:
    pass


def _urandom(n):
    import random

    return bytes(random.getrandbits(8) for _ in range(n))


def setup(env, cwd):
    import micropython as real

    shim = _Module()
    for name in dir(real):
        if not name.startswith("__"):
            setattr(shim, name, getattr(real, name))
    lock = _HeapLock()
    shim.heap_lock = lock.lock
    shim.heap_unlock = lock.unlock
    shim.heap_locked = lock.locked
    sys.modules["micropython"] = shim
    if not hasattr(os, "getenv"):
        os_shim = _Module()
        for name in dir(os):
            if not name.startswith("__"):
                setattr(os_shim, name, getattr(os, name))
        os_shim.getenv = lambda name, default=None: env.get(name, default)
        os_shim.urandom = _urandom
        sys.modules["os"] = os_shim
    os.umount("/")
    os.mount(ErrnoVfs(os.VfsPosix()), "/")
    os.chdir(cwd)


def run_tests(module, names):
    from mpyunit import run  # tests/mpy/mpyunit.py, as in the Unix port

    run(module, names)


def run_script(path, args):
    sys.argv[:] = [path] + list(args)
    with open(path) as f:
        src = f.read()
    exec(src, {"__name__": "__main__", "__file__": path})
