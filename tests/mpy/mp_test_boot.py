# MicroPython tests of firmware/mqb_boot.py (run in the Unix port by tests/conftest.py):
# on the host filesystem and on littlefs over a RAM flash with power cuts.
import errno
import os
import struct
from binascii import crc32
from mqb_boot import BootCounter, SlotCounter, SLOT_SIZE
from lfs_flash import RAMFlash, formatted_image, mount, unmount
from outbox_util import TmpDir, raises




def _slot(tag, value):
    b = bytearray(struct.pack("<4sI", tag, value))
    return bytes(b) + struct.pack("<I", crc32(b))


def test_first_boot_is_1_and_each_boot_adds_1():
    with TmpDir("boot1") as d:
        p = d + "/boot"
        assert BootCounter(p).value == 0
        got = [BootCounter(p).next() for _ in range(5)]
        assert got == [1, 2, 3, 4, 5]
        assert BootCounter(p).value == 5
        # the slots alternate: one holds 5, the other 4
        with open(p + ".0", "rb") as f:
            a = f.read()
        with open(p + ".1", "rb") as f:
            b = f.read()
        assert sorted((a, b)) == sorted((_slot(b"BOOT", 5), _slot(b"BOOT", 4)))


def test_torn_or_foreign_slots_never_lower_or_repeat():
    with TmpDir("boot2") as d:
        p = d + "/boot"
        bc = BootCounter(p)
        for _ in range(6):
            bc.next()                                      # 6 in slot 1, 5 in slot 0
        newest = 1 if BootCounter(p)._c._slot == 1 else 0
        older = 1 - newest
        good = {}
        for s in (0, 1):
            with open("%s.%d" % (p, s), "rb") as f:
                good[s] = f.read()
        # every torn form of the slot being written (the older one): prefixes, garbage, empty
        for cut in range(SLOT_SIZE + 1):
            with open("%s.%d" % (p, older), "wb") as f:
                f.write(_slot(b"BOOT", 7)[:cut])
            v = BootCounter(p).value
            assert v == (7 if cut == SLOT_SIZE else 6), (cut, v)
        with open("%s.%d" % (p, older), "wb") as f:
            f.write(_slot(b"BOOT", 99)[:8] + b"\x00\x00\x00\x00")   # CRC wrong
        assert BootCounter(p).value == 6
        with open("%s.%d" % (p, older), "wb") as f:
            f.write(_slot(b"DROP", 99))                               # another counter's slot
        assert BootCounter(p).value == 6
        with open("%s.%d" % (p, older), "wb") as f:
            f.write(_slot(b"BOOT", 99) + b"x")                        # longer than a slot
        assert BootCounter(p).value == 6
        # next() writes the invalid slot, leaving the valid newest one alone
        assert BootCounter(p).next() == 7
        with open("%s.%d" % (p, newest), "rb") as f:
            assert f.read() == good[newest]
        assert BootCounter(p).next() == 8


def test_an_io_error_is_not_taken_for_a_missing_slot():
    """Only ENOENT means "no slot": any other error propagates (else an older slot
    could win and a boot number repeat)."""
    with TmpDir("boot3") as d:
        p = d + "/boot"
        BootCounter(p).next()
        BootCounter(p).next()
        os.remove(p + ".1")
        os.mkdir(p + ".1")                     # open() of a directory fails with EISDIR
        e = raises(OSError, BootCounter, p)
        assert e.args[0] == errno.EISDIR, e.args
        os.rmdir(p + ".1")
        # slot 1 (value 2) is really gone now, so 2 comes again: deleting the
        # counter's files by hand repeats numbers (docs/outbox.md says not to)
        assert BootCounter(p).next() == 2


def test_slot_counter_refuses_to_go_back():
    with TmpDir("boot4") as d:
        c = SlotCounter(d + "/c", b"TEST")
        c.store(10)
        e = raises(ValueError, c.store, 9)
        assert "must be >= current 10" in str(e), e
        c.store(10)
        assert SlotCounter(d + "/c", b"TEST").value == 10
        assert "4 bytes" in str(raises(ValueError, SlotCounter, d + "/c", b"LONGTAG"))
        assert "<= 4294967295" in str(raises(ValueError, c.store, 1 << 32))


def _boot_ops(image):
    """Flash operations the next next() performs on this image (a dry run on a copy)."""
    dev = RAMFlash(4096, 16, image)
    mount(dev)
    try:
        ops0 = dev.ops
        BootCounter("/flash/boot").next()
        return dev.ops - ops0
    finally:
        unmount()


def test_power_cut_at_every_flash_operation_never_repeats_a_boot():
    """Boot 300 times on littlefs; before each boot, cut the power (torn or
    clean) at every flash operation that boot's next() performs, powering up on
    what the flash holds after each cut. Usually next() is one metadata commit
    (the 12-byte slot is inlined); the chain runs through littlefs metadata
    compactions, where it is several. A returned number is never returned
    again, and the counter never goes back."""
    image = formatted_image(4096, 16)
    returned = [0]
    cuts = 0
    per_boot = []
    for i in range(300):
        n_ops = _boot_ops(image)
        per_boot.append(n_ops)
        for k in range(n_ops):
            dev = RAMFlash(4096, 16, image)
            dev.cut_after(k, (i + k) % 2 == 0)
            mount(dev)
            try:
                BootCounter("/flash/boot").next()
            except Exception as e:
                # the cut reaches the firmware as PowerCut, or as the OSError
                # littlefs makes of a failed erase: either way only after it
                if not dev.dead:
                    raise
            finally:
                unmount()
            assert dev.dead, "operation %d of %d was not cut" % (k, n_ops)
            cuts += 1
            image = dev.image               # power up on what the flash holds
            dev = RAMFlash(4096, 16, image)
            mount(dev)
            try:
                assert BootCounter("/flash/boot").value >= max(returned), "counter went back"
            finally:
                unmount()
        dev = RAMFlash(4096, 16, image)
        mount(dev)
        try:
            v = BootCounter("/flash/boot").next()
            assert v > max(returned), (v, returned)
            returned.append(v)
        finally:
            unmount()
        image = dev.image
    assert len(set(returned)) == len(returned)
    assert max(per_boot) > 1, "the chain never met a metadata compaction"
    per_boot.sort()
    print("BOOT_SWEEP %d boots returned, %d power cuts (one at every flash operation of every next()), "
          "last boot %d; flash operations per next(): median %d min %d max %d" % (
              len(returned) - 1, cuts, returned[-1], per_boot[len(per_boot) // 2], per_boot[0], per_boot[-1]))
