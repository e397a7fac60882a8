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
# or present). Writing: the new value goes into BOTH slots, one after the other
# (open "wb", write, flush, close each): first the slot holding the lower value
# (or the invalid one), then the other. While the first is written, the second
# still holds the current value; while the second is written, the first already
# holds the new one. So a power cut at any point leaves a valid slot holding at
# least the current value, and a value is returned by BootCounter.next() only
# after it is on flash: a torn write can never make a used boot number repeat.
# (No temp file + rename: that would need rename to be atomic, which FAT does not
# promise; the two slots need only that writing one file leaves another intact.)
#
# Failure model: power cut or process kill at any point, and any ONE slot that
# rots on flash afterwards (a flipped bit or byte, a truncated or deleted file):
# after a complete store both slots hold the value, so the other slot still has
# it. A counter whose slots are not two equal valid copies is "in doubt" (a store
# was cut short, or a slot rotted): BootCounter then skips one number, so even a
# rotted slot of the old one-slot-per-store layout cannot repeat a boot.
# (Counted by tests/mpy/mp_test_boot.py's bit-flip campaign: every bit of every
# slot, 0 repeated boot numbers, 0 counters gone back.)
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
    """A u32 counter persisted in two slot files holding the same value (see the top of this file).

    path: file name prefix (the directory must exist); tag: 4 bytes.
    value: the current value (0 when nothing valid is stored yet).
    doubt: True when the slots are not two equal valid copies (a store was cut
    short, or a slot rotted): the value may have been one store higher.
    """

    def __init__(self, path, tag):
        if len(tag) != 4:
            raise ValueError("slot tag must be 4 bytes, got %r" % (tag,))
        self.path = path
        self.tag = bytes(tag)
        self._buf = bytearray(SLOT_SIZE)
        a = self._read(0)
        b = self._read(1)
        self._slot = 0 if a <= b else 1     # the slot store() writes first
        self.value = max(a, b, 0)
        self.doubt = a != b

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
        """Persist value (>= the current value) into both slots, the lower one first;
        returns when both are on flash."""
        if value < self.value or value > U32_MAX:
            raise ValueError("%s: new value %d must be >= current %d and <= %d"
                             % (self.path, value, self.value, U32_MAX))
        struct.pack_into("<4sI", self._buf, 0, self.tag, value)
        struct.pack_into("<I", self._buf, 8, crc32(memoryview(self._buf)[:8]))
        for slot in (self._slot, 1 - self._slot):
            with open(self._name(slot), "wb") as f:
                f.write(self._buf)
                f.flush()  # littlefs: commit; VfsPosix: fsync
        self.value = value
        self.doubt = False


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
        """Persist and return the next boot number (1 on a fresh flash; one more is
        skipped when the counter is in doubt, so a rotted slot never repeats a boot)."""
        v = self._c.value + (2 if self._c.doubt else 1)
        self._c.store(v)
        return v
