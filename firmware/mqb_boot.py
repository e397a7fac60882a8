# mqb_boot: the persisted boot counter, and the two-slot counter file it is built on.
#
# A counter that must survive power cuts lives in two slot files, <path>.0 and
# <path>.1, 12 bytes each (little-endian):
#
#   offset size  field
#   0      4     tag: 4 bytes naming what is counted (b"BOOT", b"DROP", ...)
#   4      4     u32 value
#   8      4     u32 CRC-32 (binascii.crc32) of bytes 0..7
#
# Reading: a slot is valid if the file is exactly 12 bytes, the tag matches and
# the CRC matches; the counter is the highest valid value (0 if no slot is valid
# or present). Writing: the new value goes into the OTHER slot than the one
# holding the current value (open "wb", write, flush, close), so the current
# value is never touched. A power cut during the write leaves that slot torn
# (invalid) or old, and the untouched slot still holds the current value: the
# counter can never go back, and a value is returned by BootCounter.next() only
# after it is on flash, so a torn write can never make a used boot number repeat.
# (No temp file + rename: that would need rename to be atomic, which FAT does not
# promise; the two slots need only that writing one file leaves another intact.)
#
# Failure model: power cut or process kill at any point. Not covered: a slot
# that was written completely and later rots on flash (the older slot would then
# win, and one boot number could repeat).
import struct

try:
    from binascii import crc32
except ImportError:
    raise ImportError("mqb_boot/mqb_outbox need binascii.crc32: build MicroPython with "
                      "MICROPY_PY_BINASCII_CRC32 (on by default from ROM level EXTRA_FEATURES)")

SLOT_SIZE = 12
U32_MAX = 0xFFFFFFFF
_ENOENT = const(2)


class SlotCounter:
    """A u32 counter persisted in two alternating slot files (see the top of this file).

    path: file name prefix (the directory must exist); tag: 4 bytes.
    value: the current value (0 when nothing valid is stored yet).
    """

    def __init__(self, path, tag):
        if len(tag) != 4:
            raise ValueError("slot tag must be 4 bytes, got %r" % (tag,))
        self.path = path
        self.tag = bytes(tag)
        self._buf = bytearray(SLOT_SIZE)
        self.value = 0
        self._slot = -1          # slot holding value, -1: none
        for slot in (0, 1):
            v = self._read(slot)
            if v >= 0 and (self._slot < 0 or v > self.value):
                self.value = v
                self._slot = slot

    def _name(self, slot):
        return "%s.%d" % (self.path, slot)

    def _read(self, slot):
        """The value in one slot, or -1 if the slot is missing or not valid."""
        try:
            f = open(self._name(slot), "rb")
        except OSError as e:
            if e.args[0] == _ENOENT:
                return -1
            raise  # an I/O error must not be mistaken for "no slot": a boot number could repeat
        with f:
            n = f.readinto(self._buf)
            extra = f.read(1)
        if n != SLOT_SIZE or extra:
            return -1
        tag, value, crc = struct.unpack("<4sII", self._buf)
        if tag != self.tag or crc != crc32(memoryview(self._buf)[:8]):
            return -1
        return value

    def store(self, value):
        """Persist value (>= the current value) into the older slot; returns when it is on flash."""
        if value < self.value or value > U32_MAX:
            raise ValueError("%s: new value %d must be >= current %d and <= %d"
                             % (self.path, value, self.value, U32_MAX))
        slot = 1 - self._slot if self._slot >= 0 else 0
        struct.pack_into("<4sI", self._buf, 0, self.tag, value)
        struct.pack_into("<I", self._buf, 8, crc32(memoryview(self._buf)[:8]))
        with open(self._name(slot), "wb") as f:
            f.write(self._buf)
            f.flush()  # littlefs: commit; VfsPosix: fsync
        self.value = value
        self._slot = slot


class BootCounter:
    """The device's boot counter (docs/records.md `boot`), persisted at path.0/path.1.

    At each boot:   boot = BootCounter("/mqb_boot").next()
    next() persists the incremented counter before returning it, so every
    number it returns is unique for this flash, whatever the power does.
    """

    def __init__(self, path):
        self._c = SlotCounter(path, b"BOOT")

    @property
    def value(self):
        """The last boot number handed out (0: never)."""
        return self._c.value

    def next(self):
        """Persist and return the next boot number (1 on a fresh flash)."""
        v = self._c.value + 1
        self._c.store(v)
        return v
