# MicroPython tests of firmware/mqb_outbox.py (run in the Unix port by tests/conftest.py):
# on the host filesystem (VfsPosix, the unix board's flash) and on littlefs over a
# RAM flash with power cuts (lfs_flash.py).
import errno
import gc
import json
import os
import time
from array import array
from mqb_boot import BootCounter
from mqb_outbox import Outbox, OK, FULL, UNKNOWN, CORRUPT, TOO_SMALL, DROP_OLDEST, STOP
from mqb_outbox_format import SEG_HEADER_SIZE, ENTRY_HEADER_SIZE
from lfs_flash import RAMFlash, formatted_image, mount, unmount
from outbox_util import TmpDir, payload, alloc_over, str_raises, raises




def _pending(ob):
    out = array("i", [0] * (ob.max_segments * ob.max_entries))
    k = ob.peek(out)
    return list(out[:k])


def _contents(ob):
    """{id: (payload, records, boot, first_seq, last_seq)} of every pending entry."""
    buf = bytearray(ob.max_payload)
    got = {}
    for eid in _pending(ob):
        n = ob.read(eid, buf)
        assert n >= 0, "read(%d) returned %d" % (eid, n)
        got[eid] = (bytes(buf[:n]), ob.entry_records, ob.entry_boot, ob.entry_first_seq, ob.entry_last_seq)
    return got


def test_append_peek_read_ack_round_trip():
    with TmpDir("ob1") as d:
        ob = Outbox(d + "/ob", segment_size=512, max_segments=4, max_entries=8)
        assert ob.depth == 0 and ob.dropped_total == 0
        assert ob.max_payload == 512 - SEG_HEADER_SIZE - ENTRY_HEADER_SIZE == 460
        ids = []
        for i in range(10):
            eid = ob.append(payload(i, 20 + 7 * i), i + 1, 3, 100 + i, 110 + i)
            ids.append(eid)
        assert ids == list(range(10)), ids
        assert ob.depth == 10 and ob.pending_records == 55
        got = _contents(ob)
        for i in range(10):
            assert got[i] == (payload(i, 20 + 7 * i), i + 1, 3, 100 + i, 110 + i), i
        assert ob.records(4) == 5 and ob.records(99) == UNKNOWN
        # peek: limit and after
        out = [0] * 4
        assert ob.peek(out) == 4 and out == [0, 1, 2, 3]
        assert ob.peek(out, 2, 5) == 2 and out[:2] == [6, 7]
        assert ob.peek(out, -1, 9) == 0
        # ack in order and out of order; a second ack is UNKNOWN
        assert ob.ack(0) == OK and ob.ack(0) == UNKNOWN
        assert ob.ack(5) == OK and ob.ack(77) == UNKNOWN
        assert _pending(ob) == [1, 2, 3, 4, 6, 7, 8, 9]
        assert ob.depth == 8 and ob.pending_records == 55 - 1 - 6
        small = bytearray(5)
        assert ob.read(3, small) == TOO_SMALL and ob.depth == 8
        assert ob.read(5, bytearray(100)) == UNKNOWN
        ob.close()


def test_reopen_rebuilds_index_and_applies_acks():
    with TmpDir("ob2") as d:
        root = d + "/ob"
        ob = Outbox(root, segment_size=400, max_segments=4, max_entries=5)
        for i in range(12):
            ob.append(payload(i, 50), 2, 9, i, i)
        before = _contents(ob)
        for eid in (0, 1, 3, 7, 11):
            assert ob.ack(eid) == OK
        for eid in (0, 1, 3, 7, 11):
            del before[eid]
        ob.close()
        ob = Outbox(root, segment_size=400, max_segments=4, max_entries=5)
        assert _contents(ob) == before
        assert ob.depth == len(before) and ob.pending_records == 2 * len(before)
        # ids continue after the last one on flash
        assert ob.append(b"next", 1) == 12
        ob.close()
        # fully acked segments are deleted, never rewritten
        ob = Outbox(root, segment_size=400, max_segments=4, max_entries=5)
        for eid in _pending(ob):
            assert ob.ack(eid) == OK
        names = sorted(n for n in os.listdir(root) if n[0] in "sa")
        # only the newest segment is kept (it carries the entry ids on), with its acks
        assert ob.depth == 0 and names == ["a00000002", "s00000002"], names
        ob.close()
        ob = Outbox(root, segment_size=400, max_segments=4, max_entries=5)
        assert _pending(ob) == [] and ob.append(b"x", 1) == 13
        ob.close()


def _segment_files(root):
    return sorted(n for n in os.listdir(root) if n[0] == "s")


def test_torn_tail_at_every_byte_is_dropped_never_read():
    """Cut the last entry's bytes at every length: reopen keeps exactly the complete
    entries, returns no garbage, and never appends behind the torn tail."""
    with TmpDir("ob3") as d:
        root = d + "/ob"
        ob = Outbox(root, segment_size=4096, max_segments=2, max_entries=8)
        for i in range(3):
            ob.append(payload(i, 40), 1, 1, i, i)
        ob.close()
        seg = root + "/" + _segment_files(root)[0]
        with open(seg, "rb") as f:
            full = f.read()
        good = SEG_HEADER_SIZE + 2 * (ENTRY_HEADER_SIZE + 40)    # two complete entries
        assert len(full) == good + ENTRY_HEADER_SIZE + 40
        for cut in range(good, len(full)):
            with open(seg, "wb") as f:
                f.write(full[:cut])
            ob = Outbox(root, segment_size=4096, max_segments=2, max_entries=8)
            got = _contents(ob)
            assert sorted(got) == [0, 1], (cut, sorted(got))
            assert got[1][0] == payload(1, 40)
            if cut > good:   # torn tail: the next append goes to a new segment
                assert ob.append(b"after", 1) == 2
                assert len(_segment_files(root)) == 2
                assert _contents(ob)[2][0] == b"after"
                ob.close()
                os.remove(root + "/" + _segment_files(root)[1])
            else:
                ob.close()
        # one flipped payload bit in the last entry: dropped as a torn tail
        bad = bytearray(full)
        bad[-5] ^= 0x10
        with open(seg, "wb") as f:
            f.write(bad)
        ob = Outbox(root, segment_size=4096, max_segments=2, max_entries=8)
        assert sorted(_contents(ob)) == [0, 1]
        ob.close()


def _flip(root, seg_index, entry_in_seg, entry_size, at=10):
    """Flip one payload bit of an entry on flash (flash rot)."""
    seg = root + "/" + _segment_files(root)[seg_index]
    with open(seg, "rb") as f:
        data = bytearray(f.read())
    data[SEG_HEADER_SIZE + entry_in_seg * entry_size + ENTRY_HEADER_SIZE + at] ^= 1
    with open(seg, "wb") as f:
        f.write(data)


def test_damaged_entries_are_discarded_counted_once_and_never_hide_others():
    with TmpDir("ob4") as d:
        root = d + "/ob"
        cfg = dict(segment_size=300, max_segments=4, max_entries=3)
        size = ENTRY_HEADER_SIZE + 60
        ob = Outbox(root, **cfg)
        for i in range(6):                 # segment 0: ids 0..2, segment 1: ids 3..5
            ob.append(payload(i, 60), 4, 1, i, i)
        _flip(root, 0, 1, size)            # entry 1 rots while the outbox is open
        buf = bytearray(300)
        assert ob.read(0, buf) == 60
        assert ob.read(1, buf) == CORRUPT
        assert ob.read(1, buf) == UNKNOWN
        assert ob.dropped_total == 4 and ob.dropped_since_open == 4
        assert _pending(ob) == [0, 2, 3, 4, 5]
        ob.close()
        ob = Outbox(root, **cfg)           # reopen: entry 1 stays done, not counted again
        assert _pending(ob) == [0, 2, 3, 4, 5] and ob.dropped_total == 4
        ob.close()
        _flip(root, 0, 2, size)            # the last entry of a segment with a successor: accepted, damaged
        _flip(root, 1, 1, size)            # an entry in the middle of the newest segment
        ob = Outbox(root, **cfg)
        assert _pending(ob) == [0, 3, 5], _pending(ob)
        assert ob.dropped_total == 12 and ob.dropped_since_open == 8
        got = _contents(ob)
        for e in (0, 3, 5):
            assert got[e][0] == payload(e, 60)
        ob.close()
        ob = Outbox(root, **cfg)           # counted once
        assert _pending(ob) == [0, 3, 5] and ob.dropped_total == 12
        ob.close()
        # the newest entry of the newest segment, complete with a bad payload: not a
        # torn append (that ends the file inside the entry, or leaves nothing on
        # littlefs): damaged, counted like the others (issue 10 finding 7)
        _flip(root, 1, 2, size)
        ob = Outbox(root, **cfg)
        assert _pending(ob) == [0, 3] and ob.dropped_total == 16
        assert ob.damage == [("payload", 5, 6, 4)], ob.damage
        assert ob.append(b"new", 1) == 6   # its id stays taken; the segment takes no more appends
        assert len(_segment_files(root)) == 3
        ob.close()
        ob = Outbox(root, **cfg)
        assert _pending(ob) == [0, 3, 6] and ob.dropped_total == 16 and ob.damage == []
        ob.close()


class _FlushFailsAfterWriting:
    """Fault injection on the real file: flush() gets the data to the file, then
    reports an error (as an fsync or a littlefs commit can)."""

    def __init__(self, f):
        self.f = f

    def write(self, b):
        return self.f.write(b)

    def flush(self):
        self.f.flush()
        raise OSError(errno.EIO)

    def close(self):
        self.f.close()


def test_append_that_raised_after_writing_is_superseded_not_duplicated():
    """append() raised, but its entry reached the file: the segment is sealed and
    the next append reuses the id in a new segment. Reopening keeps the entry
    append() returned for that id, forgets the other, and never refuses to open.
    A raised append whose entry is complete and last stays, like an append in
    flight at a power cut (at-least-once, docs/outbox.md)."""
    with TmpDir("ob11") as d:
        root = d + "/ob"
        cfg = dict(segment_size=1024, max_segments=4, max_entries=8)
        ob = Outbox(root, **cfg)
        assert ob.append(b"zero", 1) == 0 and ob.append(b"one", 1) == 1
        ob._hf.f = _FlushFailsAfterWriting(ob._hf.f)
        assert raises(OSError, ob.append, b"raised A", 1).args[0] == errno.EIO     # id 2 in segment A
        assert ob.append(b"two", 1) == 2                                    # id 2 again, segment B
        ob._hf.f = _FlushFailsAfterWriting(ob._hf.f)
        assert raises(OSError, ob.append, b"raised B", 1).args[0] == errno.EIO     # id 3 in segment B
        assert ob.append(b"three", 1) == 3                                  # id 3 again, segment C
        ob._hf.f = _FlushFailsAfterWriting(ob._hf.f)
        assert raises(OSError, ob.append, b"raised C", 1).args[0] == errno.EIO     # id 4, last in C
        assert {e: v[0] for e, v in _contents(ob).items()} == {0: b"zero", 1: b"one", 2: b"two", 3: b"three"}
        ob.close()
        ob = Outbox(root, **cfg)
        got = {e: v[0] for e, v in _contents(ob).items()}
        assert got == {0: b"zero", 1: b"one", 2: b"two", 3: b"three", 4: b"raised C"}, got
        assert ob.append(b"five", 1) == 5
        ob.close()
        ob = Outbox(root, **cfg)
        assert len(_contents(ob)) == 6 and ob.dropped_total == 0
        ob.close()


def test_drop_oldest_counts_records_and_count_survives_reboot():
    with TmpDir("ob5") as d:
        root = d + "/ob"
        ob = Outbox(root, segment_size=200, max_segments=3, max_entries=2, policy=DROP_OLDEST)
        for i in range(6):                       # fills 3 segments of 2 entries
            assert ob.append(payload(i, 50), 10 + i, 1, i, i) == i
        assert ob.dropped_total == 0
        assert ob.append(payload(6, 50), 16) == 6      # drops segment 0: entries 0, 1
        assert ob.dropped_total == 10 + 11 and ob.dropped_since_open == 21
        assert _pending(ob) == [2, 3, 4, 5, 6]
        assert ob.ack(2) == OK
        assert ob.append(payload(7, 50), 17) == 7 and ob.dropped_total == 21   # room in segment 3
        assert ob.append(payload(8, 50), 18) == 8 and ob.dropped_total == 21 + 13   # segment 1 held 2 (acked), 3
        assert _pending(ob) == [4, 5, 6, 7, 8]
        ob.count_dropped(5)
        assert ob.dropped_total == 39
        ob.close()
        ob = Outbox(root, segment_size=200, max_segments=3, max_entries=2, policy=DROP_OLDEST)
        assert ob.dropped_total == 39 and ob.dropped_since_open == 0
        assert _pending(ob) == [4, 5, 6, 7, 8]
        ob.close()


def test_dropped_report_is_per_boot_and_carries_unreported_drops():
    """dropped_report() restarts each boot (docs/records.md: "since boot") but
    carries the drops no health record of an earlier boot got to carry, so the
    sum over boots of each boot's highest report is the exact total."""
    with TmpDir("ob10") as d:
        root = d + "/ob"
        cfg = dict(segment_size=200, max_segments=3, max_entries=2, policy=DROP_OLDEST)
        ob = Outbox(root, **cfg)
        assert ob.dropped_report() == 0
        ob.append(payload(0, 50), 1, 1, 0, 0, 0)        # a health batch reporting 0: nothing persisted
        assert "reported.0" not in os.listdir(root) and "reported.1" not in os.listdir(root)
        for i in range(1, 7):
            ob.append(payload(i, 50), 5, 1, i, i)
        boot1 = ob.dropped_report()
        assert boot1 == ob.dropped_total == 6            # segment 0: 1 + 5 records
        ob.append(payload(7, 50), 1, 1, 7, 7, boot1)     # the health record carrying 6 is on flash
        assert "more than dropped_report" in str_raises(ValueError, ob.append, b"h", 1, 1, 8, 8, boot1 + 1)
        ob.append(payload(8, 50), 5, 1, 8, 8)            # more drops, never reported in boot 1
        after = ob.dropped_total
        assert after > boot1
        ob.close()
        ob = Outbox(root, **cfg)                          # boot 2
        boot2 = ob.dropped_report()
        assert boot2 == after - boot1, (boot2, after, boot1)
        assert boot1 + boot2 == ob.dropped_total          # sum over boots == total dropped
        ob.append(payload(9, 50), 1, 2, 0, 0, boot2)
        ob.rebase()                                       # the boot number moved on (seq limit)
        assert ob.dropped_report() == 0
        ob.close()
        ob = Outbox(root, **cfg)
        assert ob.dropped_report() == 0 and ob.dropped_total == boot1 + boot2
        ob.close()


def test_stop_policy_refuses_then_resumes_after_ack():
    with TmpDir("ob6") as d:
        root = d + "/ob"
        ob = Outbox(root, segment_size=200, max_segments=2, max_entries=2, policy=STOP)
        for i in range(4):
            assert ob.append(payload(i, 50), 1) == i
        assert ob.append(payload(4, 50), 1) == FULL
        assert ob.append(payload(4, 50), 1) == FULL
        assert ob.dropped_total == 0 and ob.depth == 4 and _pending(ob) == [0, 1, 2, 3]
        assert ob.ack(1) == OK
        assert ob.append(payload(4, 50), 1) == FULL      # segment 0 still holds entry 0
        assert ob.ack(0) == OK                           # segment 0 deleted
        assert ob.append(payload(4, 50), 1) == 4
        assert _pending(ob) == [2, 3, 4] and ob.dropped_total == 0
        ob.close()


def test_bad_input_gets_clear_errors():
    with TmpDir("ob7") as d:
        root = d + "/ob"
        msg = str_raises(ValueError, Outbox, root, segment_size=40)
        assert "segment_size 40" in msg, msg
        assert "at least 2" in str_raises(ValueError, Outbox, root, max_segments=1)
        assert "max_entries" in str_raises(ValueError, Outbox, root, max_entries=0)
        assert "policy" in str_raises(ValueError, Outbox, root, policy="keep")
        assert "cannot fit" in str_raises(ValueError, Outbox, root, segment_size=(1 << 30) - 1, max_segments=1 << 20)
        ob = Outbox(root, segment_size=200, max_segments=2, max_entries=4)
        msg = str_raises(ValueError, ob.append, bytes(149), 1)
        assert "149 bytes" in msg and "max payload 148" in msg, msg
        assert ob.append(bytes(148), 1) == 0
        assert "records" in str_raises(ValueError, ob.append, b"x", 70000)
        assert "records" in str_raises(ValueError, ob.count_dropped, -1)
        ob.close()
        # a smaller configuration than what is on flash is refused, not truncated
        root = d + "/ob2"
        ob = Outbox(root, segment_size=200, max_segments=4, max_entries=4)
        for i in range(12):
            ob.append(bytes(10), 1)        # 4 entries of 42 bytes per segment
        ob.close()
        assert len(_segment_files(root)) == 3
        msg = str_raises(ValueError, Outbox, root, segment_size=200, max_segments=2, max_entries=4)
        assert "larger max_segments" in msg, msg
        msg = str_raises(ValueError, Outbox, root, segment_size=200, max_segments=4, max_entries=2)
        assert "larger max_entries" in msg, msg
        ob = Outbox(root, segment_size=200, max_segments=4, max_entries=4)
        assert len(_pending(ob)) == 12
        ob.close()


def test_allocation_append_read_ack_steady_state():
    """Bytes allocated per operation on VfsPosix (GC disabled), within one segment
    and one ack file (the steady state) and across segment changes."""
    with TmpDir("ob8") as d:
        ob = Outbox(d + "/ob", segment_size=65536, max_segments=4, max_entries=400)
        data = memoryview(bytearray(payload(1, 1000)))
        dest = bytearray(2000)
        exact = bytearray(1000)
        ob.append(data, 10, 1, 0, 9)                       # opens the segment file
        res = {}
        res["append"] = alloc_over(50, lambda i: ob.append(data, 10, 1, i, i))
        base = 1
        res["read_verify_exact_buf"] = alloc_over(50, lambda i: ob.read(base + i, exact))
        res["read_no_verify"] = alloc_over(50, lambda i: ob.read(base + i, dest, False))
        res["read_verify"] = alloc_over(50, lambda i: ob.read(base + i, dest))
        ob.ack(0)                                          # opens the ack file
        res["ack"] = alloc_over(40, lambda i: ob.ack(base + i))
        out = array("i", [0] * 10)
        res["peek"] = alloc_over(50, lambda i: ob.peek(out, 10))
        ob.close()
        # across segment changes: 60 appends of 1000 bytes into 4 KiB segments, drop_oldest
        ob = Outbox(d + "/ob2", segment_size=4096, max_segments=3, max_entries=8)
        ob.append(data, 10)
        res["append_with_rollover_and_drops_per_60"] = alloc_over(60, lambda i: ob.append(data, 10))
        ob.close()
        print("OUTBOX_ALLOC_BYTES", json.dumps(res))
        assert res["append"] == 0, res
        assert res["read_no_verify"] == 0 and res["read_verify_exact_buf"] == 0, res
        assert res["ack"] == 0 and res["peek"] == 0, res
        assert res["read_verify"] <= 50 * 64, res   # one memoryview per read (measured 32 B)


def _alloc_net(dev, n, fn):
    """alloc_over(n, fn) less what the RAM flash stand-in `dev` (if any) allocated itself."""
    if dev is None:
        return alloc_over(n, fn)
    dev.count_own, dev.own_bytes = True, 0
    try:
        return alloc_over(n, fn) - dev.own_bytes
    finally:
        dev.count_own = False


def _roll_budget(root, dev):
    """What a segment change needs, measured here in bytes (GC off): a file name and an open
    file for the new segment and for its ack file, a name and a removal for the old segment
    and for its ack file. No exception, no name made twice."""
    import mqb_outbox_format as F
    name = _alloc_net(dev, 1, lambda i: F._seg_path(root, 7))
    path = F._seg_path(root, 7, "b")
    opened = [None]

    def make(i):
        opened[0] = open(path, "ab")

    new_file = _alloc_net(dev, 1, make)
    opened[0].close()
    remove = _alloc_net(dev, 1, lambda i: os.remove(path))
    return 2 * (name + new_file) + 2 * (name + remove), (name, new_file, remove)


def _app_pattern_per_roll(root, dev, batches):
    """Bytes per segment change of append + read + ack per batch, as the App runs (a batch
    acked before the next is sealed), segments of 4 batches."""
    ob = Outbox(root, segment_size=4 * (1000 + ENTRY_HEADER_SIZE) + SEG_HEADER_SIZE, max_segments=4, max_entries=8)
    data = memoryview(bytearray(payload(1, 1000)))
    dest = bytearray(1000)

    def batch(i):
        eid = ob.append(data, 10, 1, 10 * i, 10 * i + 9)
        ob.read(eid, dest)
        ob.ack(eid)

    for i in range(8):                  # warm: the first segment changes, the ring full
        batch(i)
    rolls = ob._next_sno
    used = _alloc_net(dev, batches, lambda i: batch(8 + i))
    rolls = ob._next_sno - rolls
    ob.close()
    assert rolls == batches // 4, (rolls, batches)
    return used / rolls


def _check_roll(fs, root, dev):
    budget, parts = _roll_budget(root, dev)
    got = _app_pattern_per_roll(root + "/ob", dev, 40)
    print("OUTBOX_ROLL_BYTES %s: %d per segment change, budget %d (name %d, open %d, remove %d)"
          % ((fs, got, budget) + parts))
    assert got <= budget, (fs, got, budget, parts)


def test_a_segment_change_allocates_only_its_files_and_names():
    """Appends, reads and acks allocate nothing; a segment change allocates what it must
    (MicroPython's open() takes a str name and returns a new file object): the new segment's
    name and file, its ack file's, and the names of the old segment and ack file it deletes.
    Nothing else: no exception (a removal of a file that is not there) and no name made
    twice. Budget measured in the same run. The instrument: the stale-file removals each
    change made before (two names, two OSErrors) and the header's memoryview fail it."""
    with TmpDir("ob_roll") as d:
        _check_roll("VfsPosix", d, None)


def test_a_segment_change_allocates_only_its_files_and_names_littlefs():
    """The same on littlefs (the boards' filesystem), less what the RAM flash stand-in's own
    Python allocates (a board's flash driver is C)."""
    dev = RAMFlash(4096, 64, formatted_image(4096, 64))
    mount(dev)
    try:
        _check_roll("littlefs", "/flash", dev)
    finally:
        unmount()


def test_stray_files_at_the_next_numbers_are_never_appended_to_or_inherited():
    """A segment change opens the next number's files without removing anything first:
    load() leaves no file numbered at or above the next segment (a stray segment is read
    and numbered past, a stray ack file of no segment is deleted). Planted: a segment of
    garbage numbered next but one, and ack files that ack every entry of the segments
    numbered next and past the garbage. Every entry appended after the reopen stays pending and readable, none counted
    dropped. Fails if load() keeps an orphan ack file, or numbers past readable segments only."""
    import mqb_outbox_format as F
    import struct
    with TmpDir("ob_stray") as d:
        root = d + "/ob"
        cfg = dict(segment_size=2 * (100 + ENTRY_HEADER_SIZE) + SEG_HEADER_SIZE, max_segments=8, max_entries=4)
        ob = Outbox(root, **cfg)
        ob.append(payload(0, 100), 1)
        nxt = ob._next_sno
        ob.close()
        for sno in (nxt, nxt + 2, nxt + 3, nxt + 4):
            with open(F._seg_path(root, sno, "a"), "wb") as f:
                for idx in range(4):
                    f.write(struct.pack("<HH", idx, idx ^ 0xFFFF))
        with open(F._seg_path(root, nxt + 1), "wb") as f:
            f.write(b"\x5a" * 60)                            # not a segment: damage, numbered past
        ob = Outbox(root, **cfg)
        dropped = ob.dropped_total       # (what the garbage segment may have held, counted)
        ids = [ob.append(payload(i, 100), 1) for i in range(1, 9)]    # four segment changes
        want = {e: payload(i + 1, 100) for i, e in enumerate(ids)}
        ob.close()
        ob = Outbox(root, **cfg)
        got = {e: v[0] for e, v in _contents(ob).items()}
        for e in ids:
            assert got.get(e) == want[e], (e, got.get(e))
        assert ob.dropped_total == dropped, (ob.dropped_total, dropped)
        ob.close()


def test_ram_cost_of_the_index():
    """Heap taken by an open Outbox (index + buffers + objects), by configuration."""
    with TmpDir("ob9") as d:
        res = {}
        for k, e in ((4, 8), (8, 32), (16, 64)):
            gc.collect()
            before = gc.mem_alloc()
            ob = Outbox(d + "/ob%d_%d" % (k, e), segment_size=16384, max_segments=k, max_entries=e)
            ob.append(b"x" * 100, 1)          # opens the newest segment
            ob.read(0, bytearray(100))
            gc.collect()
            res["%dx%d" % (k, e)] = gc.mem_alloc() - before - 100   # minus the read buffer
            ob.close()
            del ob
        print("OUTBOX_RAM_BYTES", json.dumps(res))
        # the index costs 7 bytes per entry slot (+ array rounding); the rest is fixed
        per_entry = (res["16x64"] - res["8x32"]) / (16 * 64 - 8 * 32)
        fixed = res["4x8"] - 7 * 4 * 8
        print("OUTBOX_RAM per entry slot %.2f B, fixed part about %d B" % (per_entry, fixed))
        assert 7 <= per_entry < 8, per_entry


# ---- littlefs with power cuts ------------------------------------------------------

SEG, NSEG, NENT = 1024, 3, 6


class Life:
    """What the application was told: the test's memory of the device across cuts."""

    def __init__(self, stats):
        self.stats = stats        # counts of the cases met, over a whole sweep
        self.boots = []
        self.expect = {}          # id -> payload of every pending entry append() returned
        self.records = {}         # id -> records
        self.appending = None     # payload of an append() that has not returned
        self.acked = {}           # id -> payload of entries whose ack() returned
        self.acking = -1          # id of an ack() that has not returned
        self.dropped = 0          # dropped_total last returned
        self.ob = None


def _sync_after_op(life, ob):
    """After an op returned: pending == expect minus drops, and drops are counted."""
    pend = _pending(ob)
    gone = [e for e in life.expect if e not in pend]
    lost = 0
    for e in gone:
        lost += life.records.pop(e)
        del life.expect[e]
        life.stats["dropped_entries"] += 1
    assert ob.dropped_total - life.dropped == lost, (ob.dropped_total, life.dropped, lost)
    life.dropped = ob.dropped_total
    assert sorted(life.expect) == pend, (sorted(life.expect), pend)


def _work(dev, life, n_appends, seed, policy):
    mount(dev)
    try:
        boot = BootCounter("/flash/boot").next()
        assert not life.boots or boot > max(life.boots), (boot, life.boots)
        life.boots.append(boot)
        life.ob = None
        ob = Outbox("/flash/ob", segment_size=SEG, max_segments=NSEG, max_entries=NENT, policy=policy)
        life.ob = ob
        _verify_reopened(life, ob)
        out = [0]
        for i in range(n_appends):
            data = payload(seed * 1000 + i, 40 + (seed * 7 + i * 37) % 200)
            recs = 1 + i % 5
            life.appending = data
            eid = ob.append(data, recs, boot, i, i)
            life.appending = None
            if eid == FULL:
                assert policy == STOP
                life.stats["append_full"] += 1
            else:
                life.acked.pop(eid, None)          # an id is given out again only after a torn append
                life.expect[eid] = data
                life.records[eid] = recs
            _sync_after_op(life, ob)
            if i % 3 == 2 or eid == FULL:
                if ob.peek(out, 1):
                    life.acking = out[0]
                    assert ob.ack(out[0]) == OK
                    life.acking = -1
                    life.acked[out[0]] = life.expect[out[0]]
                    del life.expect[out[0]]
                    del life.records[out[0]]
                    _sync_after_op(life, ob)
        ob.close()
    finally:
        unmount()


def _verify_reopened(life, ob):
    """After a (possible) power cut: exactly the entries append() returned and
    ack() did not, byte for byte; the in-flight append only if complete; the
    in-flight ack either way; drops only oldest-first and always counted."""
    got = _contents(ob)
    if life.acking >= 0:
        if life.acking in got:
            life.stats["cut_ack_not_applied"] += 1
        else:
            life.stats["cut_ack_applied"] += 1
            del life.expect[life.acking]
            del life.records[life.acking]
    life.acking = -1
    extra = [e for e in got if e not in life.expect]
    assert len(extra) <= 1, ("entries nobody appended", extra)
    if life.appending is not None and not extra:
        life.stats["cut_append_absent"] += 1
    for e in extra:
        assert life.acked.get(e) != got[e][0], "entry %d came back after its ack() returned" % e
        assert life.appending is not None and got[e][0] == life.appending, "garbage entry %d" % e
        life.stats["cut_append_present"] += 1
        life.expect[e] = got[e][0]
        life.records[e] = got[e][1]
    life.appending = None
    missing = sorted(e for e in life.expect if e not in got)
    lost = 0
    for e in missing:
        assert ob.policy == DROP_OLDEST, ("entry lost", e)
        life.stats["cut_during_drop"] += 1
        assert all(e < g for g in got), ("a dropped entry is not among the oldest", e, sorted(got))
        lost += life.records.pop(e)
        del life.expect[e]
    assert ob.dropped_total >= life.dropped + lost, ("dropped records not counted", ob.dropped_total, life.dropped, lost)
    if ob.dropped_total > life.dropped + lost:
        life.stats["cut_drop_counted_entries_kept"] += 1   # counted first, cut before the delete
    life.dropped = ob.dropped_total
    for e, data in life.expect.items():
        assert got[e][0] == data, "entry %d changed" % e


def _sweep(policy, n_appends, step):
    stats = {"append_full": 0, "dropped_entries": 0, "cut_ack_applied": 0, "cut_ack_not_applied": 0,
             "cut_append_present": 0, "cut_append_absent": 0, "cut_during_drop": 0,
             "cut_drop_counted_entries_kept": 0, "close_failed_after_cut": 0}
    base = formatted_image(4096, 24)
    dry = RAMFlash(4096, 24, base)
    _work(dry, Life(stats), n_appends, 1, policy)
    total = dry.ops
    cuts = 0
    t0 = time.ticks_ms()
    for k in range(0, total, step):
        dev = RAMFlash(4096, 24, base)
        dev.cut_after(k, torn=k % 2 == 0)
        life = Life(stats)
        try:
            _work(dev, life, n_appends, 1, policy)
        except Exception:
            if not dev.dead:
                raise
            if life.ob is not None:
                # the device is dead: nothing written now reaches the image, but
                # littlefs may refuse to close after a cut in the middle of an operation
                try:
                    life.ob.close()
                except OSError:
                    stats["close_failed_after_cut"] += 1
        assert dev.dead, "cut %d of %d never happened" % (k, total)
        cuts += 1
        # power up: the same flash, reopened; then carry on and reboot once more
        dev2 = RAMFlash(4096, 24, dev.image)
        _work(dev2, life, 4, 2, policy)
        dev3 = RAMFlash(4096, 24, dev2.image)
        _work(dev3, life, 0, 3, policy)
        assert len(life.boots) in (2, 3)    # 2: the cut came before next() returned in life 1
        assert life.boots == sorted(set(life.boots)), life.boots
    ms = time.ticks_diff(time.ticks_ms(), t0)
    return total, cuts, ms, stats


def test_power_cut_sweep_littlefs_stop():
    """policy stop: nothing may be lost, at every cut point of a whole workload."""
    total, cuts, ms, stats = _sweep(STOP, 40, 1)
    print("LFS_SWEEP stop: %d flash operations in the workload, %d cut points, %d ms" % (total, cuts, ms))
    print("LFS_SWEEP stop cases:", json.dumps(stats))
    assert cuts == total and total > 200
    # the sweep met the cases it is meant to check. (On littlefs an append whose
    # commit completed always returns: no flash operation follows the commit, so
    # "complete but not returned" cannot occur here; test_outbox_crash.py meets it.)
    assert stats["append_full"] and stats["cut_append_absent"], stats
    assert stats["cut_ack_applied"] and stats["cut_ack_not_applied"], stats
    assert stats["dropped_entries"] == 0 and stats["cut_during_drop"] == 0, stats


def test_power_cut_sweep_littlefs_drop_oldest():
    """policy drop_oldest: entries go only oldest-first and every dropped record is counted."""
    total, cuts, ms, stats = _sweep(DROP_OLDEST, 40, 1)
    print("LFS_SWEEP drop_oldest: %d flash operations in the workload, %d cut points, %d ms" % (total, cuts, ms))
    print("LFS_SWEEP drop_oldest cases:", json.dumps(stats))
    assert cuts == total and total > 200
    assert stats["dropped_entries"] and stats["cut_during_drop"] and stats["cut_drop_counted_entries_kept"], stats
    assert stats["cut_append_absent"] and stats["append_full"] == 0, stats


def test_flash_writes_per_append_and_ack_littlefs():
    """Bytes programmed and blocks erased per append/ack, and that they do not grow
    with the segment's fill level (no rewrite of a segment)."""
    dev = RAMFlash(4096, 64, formatted_image(4096, 64))
    mount(dev)
    try:
        ob = Outbox("/flash/ob", segment_size=16384, max_segments=4, max_entries=16)
        data = payload(5, 1000)
        per = []
        for i in range(14):
            p0, e0 = dev.prog_bytes, dev.erases
            ob.append(data, 30, 1, i * 30, i * 30 + 29)
            per.append((dev.prog_bytes - p0, dev.erases - e0))
        acks = []
        for i in range(12):
            p0, e0 = dev.prog_bytes, dev.erases
            ob.ack(i)
            acks.append((dev.prog_bytes - p0, dev.erases - e0))
        ob.close()
    finally:
        unmount()
    prog = sorted(p for p, e in per[1:])
    aprog = sorted(p for p, e in acks[1:])
    print("LFS_WRITES append 1000 B + 32 B header (30 records): programmed bytes median %d min %d max %d,"
          " erases total %d over %d appends; first append %d B" % (
              prog[len(prog) // 2], prog[0], prog[-1], sum(e for p, e in per), len(per), per[0][0]))
    print("LFS_WRITES ack: programmed bytes median %d min %d max %d, erases total %d over %d acks" % (
        aprog[len(aprog) // 2], aprog[0], aprog[-1], sum(e for p, e in acks), len(acks)))
    # the last appends into a nearly full segment cost no more than the early ones
    late = max(p for p, e in per[10:])
    early = max(p for p, e in per[1:5])
    assert late <= early + 4096, (per,)
    # an ack is a small record, never a rewrite of the 1 KiB entry or the segment
    assert aprog[len(aprog) // 2] < 1028, acks


# ---- flash rot: a device must always boot (issue 10 finding 7) ---------------------

def test_damage_campaign_every_byte_always_opens_and_counts_every_loss():
    """Flipped bits / byte patterns (a sample; with MQBATCH_OUTBOX_CAMPAIGN=full every
    bit and two byte patterns at every byte) and truncation at every fifth (full:
    every) length of each file of a 3-segment
    outbox: it always opens, delivers only what was stored, counts every record it
    cannot deliver (stored = delivered + counted dropped) and takes appends."""
    from outbox_campaign import run
    full = os.getenv("MQBATCH_OUTBOX_CAMPAIGN") == "full"
    stats = run(full)
    print("OUTBOX_CAMPAIGN", "full" if full else "bounded", json.dumps(stats))
    assert stats["cases"] == stats["flips"] + stats["cuts"] + 1, stats
    if full:   # 8 single bits + 2 byte patterns at every byte, a cut at every length
        assert stats["flips"] == 10 * stats["bytes"] and stats["cuts"] == stats["bytes"], stats
    assert stats["cases"] > 500, stats


def test_lost_segment_and_acked_entries_in_a_lost_run():
    """A whole middle segment file gone and an unreadable header next to acked
    entries: the outbox opens; the records of the lost entries are counted from
    the seq numbers of their readable neighbours; acked entries are never
    counted nor sent again; a reboot counts nothing twice."""
    with TmpDir("ob12") as d:
        root = d + "/ob"
        cfg = dict(segment_size=300, max_segments=5, max_entries=3)
        ob = Outbox(root, **cfg)
        seq = 0
        for i in range(12):            # 4 segments of 3 entries, 2 records each
            ob.append(payload(i, 50), 2, 4, seq, seq + 1)
            seq += 2
        assert ob.ack(9) == OK and ob.ack(10) == OK
        ob.close()
        names = _segment_files(root)
        assert len(names) == 4, names
        os.remove(root + "/" + names[1])                     # entries 3..5: 6 records
        seg = root + "/" + names[2]                         # entries 6..8
        with open(seg, "rb") as f:
            img = bytearray(f.read())
        img[SEG_HEADER_SIZE + 2] ^= 0xFF                    # entry 6's header: 3 bits, not correctable
        with open(seg, "wb") as f:
            f.write(img)
        seg = root + "/" + names[3]                         # entries 9..11; 9 and 10 acked
        with open(seg, "rb") as f:
            img = bytearray(f.read())
        img[SEG_HEADER_SIZE + ENTRY_HEADER_SIZE + 50 + 5] ^= 0x0F   # entry 10's header (acked)
        with open(seg, "wb") as f:
            f.write(img)
        ob = Outbox(root, **cfg)
        assert _pending(ob) == [0, 1, 2, 7, 8, 11], _pending(ob)
        assert ob.dropped_total == 8, (ob.dropped_total, ob.damage)  # 3..5 and 6: 4 entries x 2 records
        assert ("unreadable", 3, 7, 8) in ob.damage, ob.damage
        got = _contents(ob)
        for e in (0, 1, 2, 7, 8, 11):
            assert got[e][0] == payload(e, 50), e
        assert ob.append(b"more", 1) == 12
        ob.close()
        ob = Outbox(root, **cfg)
        assert _pending(ob) == [0, 1, 2, 7, 8, 11, 12] and ob.dropped_total == 8 and ob.damage == []
        ob.close()


def test_one_flipped_header_bit_is_corrected_on_every_read():
    """A single flipped bit in an entry header is corrected (CRC-32) at open and at
    each read(): the entry is delivered, nothing counted; the flash keeps the bit."""
    with TmpDir("ob13") as d:
        root = d + "/ob"
        ob = Outbox(root, segment_size=400, max_segments=3, max_entries=4)
        for i in range(3):
            ob.append(payload(i, 40), 5, 1, i * 5, i * 5 + 4)
        seg = root + "/" + _segment_files(root)[0]
        for at in (0, 5, 13, 20, 24, 30):              # length, id, first seq, records, payload CRC, header CRC
            with open(seg, "rb") as f:
                img = bytearray(f.read())
            img[SEG_HEADER_SIZE + ENTRY_HEADER_SIZE + 40 + at] ^= 0x08   # entry 1
            with open(seg, "wb") as f:
                f.write(img)
            buf = bytearray(100)
            assert ob.read(1, buf) == 40 and bytes(buf[:40]) == payload(1, 40), at   # the open outbox
            assert ob.entry_records == 5 and ob.entry_first_seq == 5
            ob.close()
            ob = Outbox(root, segment_size=400, max_segments=3, max_entries=4)
            assert _contents(ob)[1][0] == payload(1, 40) and ob.dropped_total == 0 and ob.damage == [], at
            img[SEG_HEADER_SIZE + ENTRY_HEADER_SIZE + 40 + at] ^= 0x08
            with open(seg, "wb") as f:
                f.write(img)
        ob.close()


def test_open_time_healthy_and_damaged_figures():
    """Figures: how long Outbox() takes on 4 full 16 KiB segments (VfsPosix), healthy,
    with one flipped bit in every entry header (corrected), and with the first
    entry header of every segment unreadable (a byte-by-byte resynchronisation)."""
    with TmpDir("ob14") as d:
        root = d + "/ob"
        cfg = dict(segment_size=16384, max_segments=5, max_entries=32)
        ob = Outbox(root, **cfg)
        for i in range(16):                       # 4 entries of 3,500 B per segment
            ob.append(payload(i, 3500), 100, 1, i * 100, i * 100 + 99)
        ob.close()
        names = _segment_files(root)
        images = []
        for n in names:
            with open(root + "/" + n, "rb") as f:
                images.append(f.read())

        def put(mutate):
            for n, img in zip(names, images):
                b = bytearray(img)
                mutate(b)
                with open(root + "/" + n, "wb") as f:
                    f.write(b)
            for n in os.listdir(root):
                if n[0] != "s":
                    os.remove(root + "/" + n)

        def one_bit(b):
            off = SEG_HEADER_SIZE
            while off < len(b):
                n = b[off] | b[off + 1] << 8
                b[off + 13] ^= 0x04
                off += ENTRY_HEADER_SIZE + n

        def first_header(b):
            b[SEG_HEADER_SIZE + 9] ^= 0xFF

        res = {}
        for name, mutate in (("healthy", lambda b: None), ("one_bit_every_header", one_bit),
                             ("first_header_unreadable", first_header)):
            put(mutate)
            runs = []
            for k in range(5):                    # the first open counts and acks; later ones only read
                t0 = time.ticks_us()
                ob = Outbox(root, **cfg)
                runs.append(time.ticks_diff(time.ticks_us(), t0))
                if k == 0:
                    res[name + "_first_open_us"] = runs[0]
                    res[name + "_pending"] = ob.depth
                    res[name + "_dropped"] = ob.dropped_total
                ob.close()
            runs.sort()
            res[name + "_reopen_us_median_min_max"] = (runs[2], runs[0], runs[-1])
        print("OUTBOX_OPEN 4 x 16 KiB segments, 16 entries:", json.dumps(res))
        assert res["healthy_pending"] == res["one_bit_every_header_pending"] == 16, res
        assert res["one_bit_every_header_dropped"] == 0, res
        assert res["first_header_unreadable_pending"] == 12, res
        assert res["first_header_unreadable_dropped"] == 400, res   # 4 entries x 100 records (seq bound or header)


def test_erased_bytes_inside_a_segment_and_an_unreadable_oldest_segment():
    """Bytes read back as erased (0xFF) inside a segment are not a torn tail when
    entries follow: the entry there is counted, the ones after are kept. An oldest
    segment cut below its header is noted in ob.damage (its ids are unknown)."""
    with TmpDir("ob15") as d:
        root = d + "/ob"
        cfg = dict(segment_size=400, max_segments=4, max_entries=3)
        ob = Outbox(root, **cfg)
        for i in range(9):
            ob.append(payload(i, 60), 3, 2, i * 3, i * 3 + 2)
        ob.close()
        names = _segment_files(root)
        with open(root + "/" + names[1], "rb") as f:      # entries 3..5
            img = bytearray(f.read())
        a = SEG_HEADER_SIZE + ENTRY_HEADER_SIZE + 60      # entry 4, header and payload
        img[a:a + ENTRY_HEADER_SIZE + 60] = b"\xff" * (ENTRY_HEADER_SIZE + 60)
        with open(root + "/" + names[1], "wb") as f:
            f.write(img)
        ob = Outbox(root, **cfg)
        assert _pending(ob) == [0, 1, 2, 3, 5, 6, 7, 8] and ob.dropped_total == 3, (_pending(ob), ob.damage)
        assert ob.damage == [("unreadable", 4, 5, 3)], ob.damage
        ob.close()
        with open(root + "/" + names[0], "wb") as f:      # the oldest segment: 10 bytes left
            f.write(b"MQBS\x01\x00\x00\x00\x00\x00")
        ob = Outbox(root, **cfg)
        assert _pending(ob) == [3, 5, 6, 7, 8] and ob.dropped_total == 3, _pending(ob)
        assert ob.damage == [("segment", 0, -1, -1)], ob.damage
        assert ob.append(b"x", 1) == 9
        ob.close()


# -- CRC-32 in two 16-bit halves (mqb_outbox_format._crc): 0 B per batch on 32-bit ports --

# An outbox written by the firmware before _crc (4877cc1, binascii.crc32 and
# struct.pack_into): segment_size 400, max_segments 2, max_entries 4, three appends
# of bytes(range(40 i, 40 i + 37 + i)) with records 3 + i, boot 7, seqs 100 i..100 i + 2 + i,
# then ack(1). The file bytes on flash must stay exactly these.
_GOLD = {
    "a00000000": "0100feff",
    "s00000000": "4d514253010000000000000000000000a0e4df73250000000000000007000000000000000200000003000000"
                 "e9ef2282ccdf909f000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f2021222324"
                 "26000000010000000700000064000000670000000400000084d0581286e18b8828292a2b2c2d2e2f3031323334"
                 "35363738393a3b3c3d3e3f404142434445464748494a4b4c4d270000000200000007000000c8000000cc000000"
                 "05000000dc2e7bcc5f112f96505152535455565758595a5b5c5d5e5f606162636465666768696a6b6c6d6e6f70"
                 "717273747576",
}


def _crc_paths():
    """(name, value of mqb_outbox_format._C): the machine-code CRC (mqb_native)
    where this port has a native emitter, and the tables in Python everywhere (the
    only path of a port without one, e.g. the WebAssembly port)."""
    import mqb_outbox_format as F
    paths = [("tables", None)]
    if F._C is not None:
        paths.insert(0, ("native", F._C))
    else:
        assert not __import__("sys").implementation._mpy >> 10   # only where no machine code runs
        print("SKIP native CRC: this port runs no machine code (only the table path runs here)")
    return paths


def test_crc_paths_match_binascii():
    import mqb_outbox_format as F
    import struct
    from binascii import crc32
    saved = F._C
    try:
        for name, c in _crc_paths():
            F._C = c
            x = 7
            for n in list(range(0, 70)) + [255, 256, 1000, 2049]:
                buf = bytearray(n + 3)
                for i in range(len(buf)):
                    x = (x * 1103515245 + 12345) & 0x3FFFFFFF
                    buf[i] = x >> 16 & 0xFF
                out = bytearray(6)
                assert F._crc(buf, n, out, 1, True)
                want = struct.pack("<I", crc32(memoryview(buf)[:n]))
                assert bytes(out[1:5]) == want, (name, n, bytes(out[1:5]), want)
                assert F._crc(buf, n, out, 1, False), (name, n)
                out[1 + n % 4] ^= 1 << (n % 8)                 # a stored CRC one bit off
                assert not F._crc(buf, n, out, 1, False), (name, n)
                if n:
                    out[1 + n % 4] ^= 1 << (n % 8)
                    buf[n - 1] ^= 0x80                           # the data one bit off
                    assert not F._crc(buf, n, out, 1, False), (name, n)
                    buf[n - 1] ^= 0x80
                mv = memoryview(buf)[3:]                         # a view at an offset (a payload view)
                assert F._crc(mv, n, out, 1, True)
                assert bytes(out[1:5]) == struct.pack("<I", crc32(memoryview(buf)[3:3 + n])), (name, n)
    finally:
        F._C = saved


def test_on_flash_bytes_are_the_same_on_either_crc_path():
    """Existing outboxes stay readable: both paths write the bytes the firmware wrote
    before (_GOLD) and read them back."""
    import mqb_outbox_format as F
    from binascii import hexlify
    saved = F._C
    try:
        for name, c in _crc_paths():
            F._C = c
            with TmpDir("obcrc") as d:
                root = d + "/ob"
                ob = Outbox(root, segment_size=400, max_segments=2, max_entries=4)
                for i in range(3):
                    ob.append(bytes(range(i * 40, i * 40 + 37 + i)), 3 + i, 7, 100 * i, 100 * i + 2 + i)
                ob.ack(1)
                ob.close()
                got = {}
                for f in sorted(os.listdir(root)):
                    with open(root + "/" + f, "rb") as fh:
                        got[f] = hexlify(fh.read()).decode()
                assert got == _GOLD, (name, got)
                ob = Outbox(root, segment_size=400, max_segments=2, max_entries=4)
                assert _contents(ob) == {0: (bytes(range(0, 37)), 3, 7, 0, 2),
                                         2: (bytes(range(80, 119)), 5, 7, 200, 204)}, name
                ob.close()
    finally:
        F._C = saved


def test_no_allocation_per_batch_on_either_crc_path():
    """append, read (checked or not, into a buffer of any size) and ack allocate
    nothing on either CRC path (the machine code, or the tables a port without a
    native emitter uses), on a 64-bit and a 32-bit port alike. The instrument: the
    same counter sees the memoryview binascii.crc32 would need for a read into a
    larger buffer (the 64-bit path before mqb_native)."""
    import mqb_outbox_format as F
    from binascii import crc32
    saved = F._C
    try:
        with TmpDir("ob32") as d:
            ob = Outbox(d + "/ob", segment_size=65536, max_segments=4, max_entries=400)
            data = memoryview(bytearray(payload(1, 1000)))
            dest = bytearray(2000)
            exact = bytearray(1000)
            ob.append(data, 10, 1, 0, 9)
            res = {}
            first = 1
            for name, c in _crc_paths():
                F._C = c
                res[name + " append"] = alloc_over(20, lambda i: ob.append(data, 10, 1, i, i))
                res[name + " read_verify"] = alloc_over(20, lambda i, f=first: ob.read(f + i, dest))
                res[name + " read_verify_exact_buf"] = alloc_over(20, lambda i, f=first: ob.read(f + i, exact))
                res[name + " read_no_verify"] = alloc_over(20, lambda i, f=first: ob.read(f + i, dest, False))
                ob.ack(first - 1)
                res[name + " ack"] = alloc_over(19, lambda i, f=first: ob.ack(f + i))
                first += 20
            seen = alloc_over(5, lambda i: crc32(memoryview(dest)[:1000]))
            ob.close()
        print("OUTBOX_ALLOC_BYTES_BY_CRC_PATH", json.dumps(res), "a memoryview for binascii.crc32, 5 times:", seen)
        assert res == {k: 0 for k in res}, res
        assert seen > 0, seen
    finally:
        F._C = saved

