# outbox_util: helpers shared by the MicroPython tests of the outbox, boot counter
# and record writer (temporary directories, deterministic payloads, allocation).
import binascii
import gc
import os


def tmpdir(tag):
    """A new empty directory under $TMPDIR (or /tmp)."""
    base = os.getenv("TMPDIR") or "/tmp"
    path = "%s/mqbt-%s-%s" % (base, tag, binascii.hexlify(os.urandom(6)).decode())
    os.mkdir(path)
    return path


class TmpDir:
    """with TmpDir("tag") as d: ... -- a new directory, removed afterwards."""

    def __init__(self, tag):
        self.tag = tag

    def __enter__(self):
        self.path = tmpdir(self.tag)
        return self.path

    def __exit__(self, *exc):
        rmtree(self.path)
        return False


def rmtree(path):
    for name in os.listdir(path):
        p = path + "/" + name
        if os.stat(p)[0] & 0x4000:
            rmtree(p)
        else:
            os.remove(p)
    os.rmdir(path)


def raises(exc, fn, *args, **kw):
    """The exception fn(*args, **kw) raises, which must be an exc."""
    try:
        fn(*args, **kw)
    except exc as e:
        return e
    raise AssertionError("expected %s from %s" % (exc.__name__, fn))


def str_raises(exc, fn, *args, **kw):
    """The message of the exc that fn(*args, **kw) raises."""
    return str(raises(exc, fn, *args, **kw))


def payload(seed, n):
    """n deterministic bytes for seed (a different seed gives different bytes)."""
    b = bytearray(n)
    x = (seed * 2654435761 + 12345) & 0xFFFFFFF
    for i in range(n):
        x = (x * 1103515245 + 12345) & 0x7FFFFFF
        b[i] = x >> 19 & 0xFF
    return bytes(b)


def assert_no_alloc(fn, n=2000, locked=500):
    """fn(i) allocates nothing: 0 bytes over n calls with the GC disabled, then
    `locked` calls under micropython.heap_lock() (any allocation raises MemoryError)."""
    import micropython
    fn(0)
    used = alloc_over(n, fn)
    assert used == 0, "%d bytes allocated over %d calls" % (used, n)
    micropython.heap_lock()
    try:
        for i in range(locked):
            fn(i)
    finally:
        micropython.heap_unlock()


def alloc_over(n, fn):
    """Bytes allocated by n calls fn(i), with the GC disabled."""
    gc.collect()
    gc.disable()
    try:
        before = gc.mem_alloc()
        for i in range(n):
            fn(i)
        return gc.mem_alloc() - before
    finally:
        gc.enable()
