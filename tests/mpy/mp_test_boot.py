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
        # both slots hold 5: one rotted slot leaves the other
        with open(p + ".0", "rb") as f:
            a = f.read()
        with open(p + ".1", "rb") as f:
            b = f.read()
        assert a == b == _slot(b"BOOT", 5), (a, b)


def test_torn_or_foreign_slots_never_lower_or_repeat():
    """Each slot in turn torn (every prefix of the next value), foreign or malformed:
    the value is never lower than the last one returned, and next() never repeats."""
    with TmpDir("boot2") as d:
        p = d + "/boot"
        bc = BootCounter(p)
        for _ in range(6):
            bc.next()                                      # both slots hold 6
        cur = 6
        returned = set(range(1, 7))
        for s in (0, 1):
            name = "%s.%d" % (p, s)
            forms = [_slot(b"BOOT", cur + 1)[:cut] for cut in range(SLOT_SIZE + 1)]
            forms += [_slot(b"BOOT", 99)[:8] + b"\x00\x00\x00\x00",  # CRC wrong
                      _slot(b"DROP", 99),                             # another counter's slot
                      _slot(b"BOOT", 99) + b"x"]                      # longer than a slot
            for form in forms:
                with open(name, "wb") as f:
                    f.write(form)
                v = BootCounter(p).value
                assert v == (cur + 1 if form == _slot(b"BOOT", cur + 1) else cur), (s, form, v)
                with open(name, "wb") as f:
                    f.write(_slot(b"BOOT", cur))
            with open(name, "wb") as f:
                f.write(_slot(b"BOOT", 99)[:5])            # torn: in doubt
            n = BootCounter(p).next()
            assert n not in returned and n > cur, (n, returned)
            returned.add(n)
            with open(p + ".0", "rb") as f0, open(p + ".1", "rb") as f1:
                assert f0.read() == f1.read() == _slot(b"BOOT", n)   # next() healed both
            cur = n
        assert BootCounter(p).next() == max(returned) + 1     # not in doubt: one step


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
        # slot 1 is really gone now: slot 0 still holds 2, and the counter, in
        # doubt, skips one (a deleted slot never repeats a boot number)
        assert BootCounter(p).next() == 4


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
        k = 0
        while k < n_ops:
            dev = RAMFlash(4096, 16, image)
            dev.cut_after(k, (i + k) % 2 == 0)
            mount(dev)
            try:
                BootCounter("/flash/boot").next()
            except Exception:
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
            k += 1
            n_ops = _boot_ops(image)        # what the next() on the image after this cut performs
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


def _flip_campaign(path, check):
    """Flip every bit of every slot file of a counter, one at a time, each time on
    the consistent state the counter's own code left (both slots read just before):
    `check(path, snapshot)` boots or reads on the rotted state; it must put back
    `snapshot` ({slot: bytes}) if it did not store a new value itself."""
    flips = 0
    for s in (0, 1):
        for i in range(SLOT_SIZE):
            for bit in range(8):
                snap = {}
                for k in (0, 1):
                    with open("%s.%d" % (path, k), "rb") as f:
                        snap[k] = f.read()
                bad = bytearray(snap[s])
                bad[i] ^= 1 << bit
                with open("%s.%d" % (path, s), "wb") as f:
                    f.write(bad)
                check(path, snap)
                flips += 1
    return flips


def test_bit_flip_campaign_never_repeats_a_boot_nor_loses_a_count():
    """Issue 23: every single-bit flip of every slot of the boot counter and of a
    counter like the outbox's dropped counter (192 flips each, at several values):
    0 repeated boot numbers, 0 counters gone back."""
    with TmpDir("boot5") as d:
        returned = []
        repeats = [0]
        p = d + "/boot"
        bc = BootCounter(p)
        for _ in range(3):
            returned.append(bc.next())

        def boot_ok(path, snap):
            n = BootCounter(path).next()        # the device boots on the rotted state
            if n in returned:
                repeats[0] += 1
            returned.append(n)
        flips = 0
        for _ in range(3):
            flips += _flip_campaign(p, boot_ok)
        assert repeats[0] == 0, repeats
        assert len(set(returned)) == len(returned)

        q = d + "/dropped"
        c = SlotCounter(q, b"DROP")
        went_back = [0]
        for total in (4, 64, 1 << 20, 0xFFFFFF00):
            c.store(total)

            def drop_ok(path, snap, total=total):
                if SlotCounter(path, b"DROP").value < total:
                    went_back[0] += 1
                for k in (0, 1):
                    with open("%s.%d" % (path, k), "wb") as f:
                        f.write(snap[k])
            flips += _flip_campaign(q, drop_ok)
        assert went_back[0] == 0, went_back
        print("BIT_FLIPS %d single-bit flips of boot and dropped counter slots: "
              "0 repeated boot numbers, 0 counts gone back" % flips)


def test_an_old_layout_with_its_newer_slot_rotted_does_not_repeat():
    """Devices written by the old code alternate slots (v in one, v-1 in the other);
    if the newer one rots, the counter is in doubt and skips, so v never comes again."""
    with TmpDir("boot6") as d:
        p = d + "/boot"
        with open(p + ".0", "wb") as f:
            f.write(_slot(b"BOOT", 5))
        bad = bytearray(_slot(b"BOOT", 6))
        bad[5] ^= 0x10
        with open(p + ".1", "wb") as f:
            f.write(bad)
        assert BootCounter(p).next() == 7
