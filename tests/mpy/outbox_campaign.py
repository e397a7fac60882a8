# outbox_campaign: damage a 3-segment outbox on flash in every way a campaign
# allows (flipped bits or byte patterns at every byte, truncation at every
# length) and check, after each case, that the device could go on:
#
#   - Outbox() opens (never raises: a device must always boot);
#   - every entry read() returns is byte for byte the payload stored under that id;
#   - records stored == records delivered (readable) + records counted dropped,
#     exactly, except in the classes docs/outbox.md names as bounded-only
#     ("TRUNC_NEWEST", "TRUNC_OLDEST_HEAD", "EDGE_HEADER"), where the loss
#     must stay confined to what the class names;
#   - append() works and the new entry reads back; reopening counts nothing twice.
#
# Run by tests/mpy/mp_test_outbox.py (bounded: a sample of cases, seconds) or in full:
#   MQBATCH_OUTBOX_CAMPAIGN=full .venv/bin/python -m pytest tests/mpy -k campaign -s
import os
import time
from array import array
from mqb_outbox import Outbox, DROP_OLDEST
from mqb_outbox_format import SEG_HEADER_SIZE, ENTRY_HEADER_SIZE
from outbox_util import payload, rmtree

CFG = dict(segment_size=300, max_segments=4, max_entries=4, policy=DROP_OLDEST)
BOOT = 7
N_ENTRIES = 9


def _files(root):
    return sorted(n for n in os.listdir(root) if n[0] == "s")


def _write(path, data):
    with open(path, "wb") as f:
        f.write(data)


class Pristine:
    """The undamaged outbox: 9 entries in 3 segments, one boot, contiguous seqs."""

    def __init__(self, root):
        self.root = root
        ob = Outbox(root, **CFG)
        self.data = {}      # id -> payload
        self.recs = {}      # id -> records
        self.where = {}     # id -> (segment index, offset of its header, end)
        seq = 0
        for i in range(N_ENTRIES):
            data = payload(900 + i, 30 + (i * 23) % 45)
            recs = 2 + i % 3           # > 1: a fallback of one record per lost entry shows as off
            eid = ob.append(data, recs, BOOT, seq, seq + recs - 1)
            seq += recs
            self.data[eid] = data
            self.recs[eid] = recs
        ob.close()
        self.names = _files(root)
        assert len(self.names) == 3, self.names
        self.images = []
        eid = 0
        for k, name in enumerate(self.names):
            with open(root + "/" + name, "rb") as f:
                img = f.read()
            self.images.append(img)
            off = SEG_HEADER_SIZE
            while off < len(img):
                n = img[off] | img[off + 1] << 8
                self.where[eid] = (k, off, off + ENTRY_HEADER_SIZE + n)
                off += ENTRY_HEADER_SIZE + n
                eid += 1
        assert eid == N_ENTRIES
        self.stored = sum(self.recs.values())

    def restore(self, k=-1, image=None):
        """Put the pristine files back, segment k replaced by image."""
        for name in os.listdir(self.root):
            os.remove(self.root + "/" + name)
        for i, name in enumerate(self.names):
            _write(self.root + "/" + name, image if i == k else self.images[i])

    def entry_at(self, k, pos):
        """(id, offset in the entry) of the entry of segment k holding byte pos, or (-1, pos)."""
        for eid, (s, off, end) in self.where.items():
            if s == k and off <= pos < end:
                return eid, pos - off
        return -1, pos


def _check(p, cls, affected, stats, tag):
    """Open the damaged outbox and check the case (see the top of this file)."""
    ob = Outbox(p.root, **CFG)
    cap = ob.max_segments * ob.max_entries
    ids = array("i", [0] * cap)
    buf = bytearray(ob.max_payload)
    delivered = 0
    got = []
    for i in range(ob.peek(ids)):
        eid = ids[i]
        n = ob.read(eid, buf)
        if n >= 0:
            assert eid in p.data and bytes(buf[:n]) == p.data[eid], (tag, "garbage delivered as entry", eid)
            assert ob.entry_records == p.recs[eid] and ob.entry_boot == BOOT, (tag, eid)
            delivered += p.recs[eid]
            got.append(eid)
    dropped = ob.dropped_total
    if cls == "EXACT":
        assert delivered + dropped == p.stored, (tag, "stored", p.stored, "delivered", delivered,
                                                 "dropped", dropped, got)
    else:
        # bounded-only classes: everything outside the affected entries is delivered,
        # and no more is counted than could have been lost
        lost = sum(p.recs[e] for e in affected)
        assert delivered == p.stored - lost, (tag, cls, "delivered", delivered, "expected", p.stored - lost, got)
        if cls == "TRUNC_NEWEST":
            assert dropped == 0, (tag, cls, dropped)
        elif cls == "TRUNC_OLDEST_HEAD":
            # counted: one record per lost entry when the segment header still gives
            # the first id (a lower bound), nothing when the ids are unknown
            assert dropped == (len(affected) if len(p.images[0]) and tag[2] >= SEG_HEADER_SIZE else 0), \
                (tag, cls, dropped)
        else:
            assert dropped >= 1, (tag, cls, dropped)
        stats["bounded_" + cls] = stats.get("bounded_" + cls, 0) + 1
        if dropped != lost:
            stats["count_off_" + cls] = stats.get("count_off_" + cls, 0) + 1
    # the device goes on sampling: append works and reads back
    new = payload(77, 40)
    eid = ob.append(new, 3, BOOT + 1, 0, 2)
    assert eid >= 0, (tag, "append refused", eid)
    assert ob.read(eid, buf) == 40 and bytes(buf[:40]) == new, (tag, "new entry")
    total = ob.dropped_total
    pend = ob.peek(ids)
    ob.close()
    ob = Outbox(p.root, **CFG)               # counted once: a reboot adds nothing
    assert ob.dropped_total == total and ob.peek(ids) == pend, (tag, "reopen changed", total, ob.dropped_total)
    ob.close()
    stats["cases"] += 1


def _classify_flip(p, k, pos, pattern):
    """The class of a flip of byte pos in segment k with pattern (XOR mask)."""
    single = pattern & (pattern - 1) == 0
    if single:
        return "EXACT", ()
    eid, at = p.entry_at(k, pos)
    if eid >= 0 and at < ENTRY_HEADER_SIZE and eid in (0, N_ENTRIES - 1):
        # an unreadable header with no readable neighbour on one side: its record
        # count is bounded only by its own (damaged) header
        return "EDGE_HEADER", (eid,)
    return "EXACT", ()


def _classify_cut(p, k, length):
    if k == len(p.names) - 1:
        # the newest segment cut short looks exactly like an append that never returned
        return "TRUNC_NEWEST", tuple(e for e, (s, off, end) in p.where.items() if s == k and end > length)
    if k == 0 and length < SEG_HEADER_SIZE + ENTRY_HEADER_SIZE:
        # no entry header of the oldest segment is left: nothing on flash bounds the
        # records of its entries from below
        return "TRUNC_OLDEST_HEAD", tuple(e for e, (s, off, end) in p.where.items() if s == 0)
    return "EXACT", ()


def run(full):
    """Returns the stats dict; raises AssertionError on the first failing case."""
    base = os.getenv("TMPDIR") or "/tmp"
    root = "%s/mqbt-campaign-%d" % (base, time.ticks_ms())
    os.mkdir(root)
    stats = {"cases": 0, "flips": 0, "cuts": 0}
    t0 = time.ticks_ms()
    try:
        p = Pristine(root + "/ob")
        for k, img in enumerate(p.images):
            for pos in range(len(img)):
                if full:
                    patterns = (1, 2, 4, 8, 16, 32, 64, 128, 0xFF, 0x5A)
                else:
                    # every header byte: one bit (rotating), every other one also all 8 bits;
                    # every 8th payload byte: one bit
                    eid, at = p.entry_at(k, pos)
                    if eid < 0 or at < ENTRY_HEADER_SIZE:
                        patterns = (1 << (pos + k) % 8,) + ((0xFF,) if pos % 2 else ())
                    else:
                        patterns = (1 << (pos + k) % 8,) if pos % 8 == 0 else ()
                for pat in patterns:
                    bad = bytearray(img)
                    bad[pos] ^= pat
                    p.restore(k, bad)
                    cls, affected = _classify_flip(p, k, pos, pat)
                    _check(p, cls, affected, stats, ("flip", k, pos, pat))
                    stats["flips"] += 1
            step = 1 if full else 5
            for length in range(0, len(img), step):
                p.restore(k, img[:length])
                cls, affected = _classify_cut(p, k, length)
                _check(p, cls, affected, stats, ("cut", k, length))
                stats["cuts"] += 1
        p.restore()
        _check(p, "EXACT", (), stats, ("pristine",))
    finally:
        rmtree(root)
    stats["ms"] = time.ticks_diff(time.ticks_ms(), t0)
    stats["bytes"] = sum(len(i) for i in p.images)
    return stats
