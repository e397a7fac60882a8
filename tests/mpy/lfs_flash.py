# lfs_flash: a NOR-flash stand-in in RAM for os.VfsLfs2, the boards' flash that
# cannot exist here, with power cuts.
#
# Block protocol of MicroPython's VFS (extended form): readblocks(block, buf,
# offset), writeblocks(block, buf, offset) programs without erasing,
# ioctl(6, block) erases a block to 0xFF. Every program and erase is one
# "operation"; cut_after(n) lets n operations complete and cuts the power in the
# (n+1)th: with torn=True the first half of that operation reaches the flash
# (a torn program or erase), then PowerCut is raised. (MicroPython's block device
# layer passes an exception from writeblocks through, but turns one from ioctl
# into an error code: a cut erase reaches the firmware as littlefs' OSError.
# Check `dead` to know the cut happened.) After the cut the device is
# dead: further programs and erases are ignored, reads still see the image, and
# `image` is what a remount after power-up sees.
import gc
import os


class PowerCut(Exception):
    """The simulated power cut (not an OSError: nothing in the firmware may catch it)."""


class RAMFlash:
    def __init__(self, block_size=4096, blocks=32, image=None):
        self.block_size = block_size
        self.blocks = blocks
        if image is None:
            self.image = bytearray(b"\xff" * (block_size * blocks))
        else:
            if len(image) != block_size * blocks:
                raise ValueError("image of %d bytes is not %d x %d" % (len(image), blocks, block_size))
            self.image = bytearray(image)
        self.countdown = -1     # operations left before the cut; -1: no cut planned
        self.torn = True
        self.dead = False
        self.ops = 0            # programs + erases so far
        self.prog_bytes = 0
        self.prog_calls = 0
        self.erases = 0
        self._ff = b"\xff" * block_size   # an erased block: made once, not per erase
        self.count_own = False      # count the heap bytes this stand-in's own Python allocates
        self.own_bytes = 0          # (a board's flash driver is C: tests subtract them)

    def cut_after(self, n, torn=True):
        self.countdown = n
        self.torn = torn

    def _cut_now(self):
        """Count one operation; True when this one is cut (the caller then tears it)."""
        self.ops += 1
        if self.countdown == 0:
            self.countdown = -1
            self.dead = True
            return True
        if self.countdown > 0:
            self.countdown -= 1
        return False

    def readblocks(self, block, buf, offset=0):
        m = gc.mem_alloc() if self.count_own else 0
        a = block * self.block_size + offset
        buf[:] = memoryview(self.image)[a:a + len(buf)]
        if self.count_own:
            self.own_bytes += gc.mem_alloc() - m

    # (the counting is written out in each method: a shared wrapper taking fn, *args would
    # allocate its bound method and tuple before it could measure, charged to the firmware)
    def writeblocks(self, block, buf, offset=None):
        if not self.count_own:
            return self._write(block, buf, offset)
        m = gc.mem_alloc()
        try:
            return self._write(block, buf, offset)
        finally:
            self.own_bytes += gc.mem_alloc() - m

    def _write(self, block, buf, offset):
        if self.dead:
            return
        if offset is None:   # simple protocol: erase, then program the whole block
            self._ioctl(6, block)
            offset = 0
        a = block * self.block_size + offset
        n = len(buf)
        if self._cut_now():
            if self.torn:
                self.image[a:a + n // 2] = memoryview(buf)[:n // 2]
            raise PowerCut("power cut in a %d-byte program at block %d + %d" % (n, block, offset))
        self.image[a:a + n] = buf
        self.prog_bytes += n
        self.prog_calls += 1

    def ioctl(self, op, arg):
        if op != 6 or not self.count_own:
            return self._ioctl(op, arg)
        m = gc.mem_alloc()
        try:
            return self._ioctl(op, arg)
        finally:
            self.own_bytes += gc.mem_alloc() - m

    def _ioctl(self, op, arg):
        if op == 4:   # block count
            return self.blocks
        if op == 5:   # block size
            return self.block_size
        if op == 6:   # erase
            if self.dead:
                return 0
            a = arg * self.block_size
            n = self.block_size
            if self._cut_now():
                if self.torn:
                    self.image[a:a + n // 2] = memoryview(self._ff)[:n // 2]
                raise PowerCut("power cut in the erase of block %d" % arg)
            self.image[a:a + n] = self._ff
            self.erases += 1
            return 0
        return 0      # 1 init, 2 deinit, 3 sync: nothing to do


def formatted_image(block_size=4096, blocks=32):
    """A freshly formatted littlefs v2 image."""
    dev = RAMFlash(block_size, blocks)
    os.VfsLfs2.mkfs(dev)
    return dev.image


def mount(dev, path="/flash"):
    os.mount(os.VfsLfs2(dev), path)


def unmount(path="/flash"):
    os.umount(path)
