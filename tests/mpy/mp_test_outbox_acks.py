# Flash rot in the outbox's ack files (issue 23): the segment files have their
# own campaign (outbox_campaign.py) and the two-slot counters theirs
# (mp_test_boot.py); this one damages every byte of every ack file.
#
# An ack record is 4 bytes, (index, index ^ 0xFFFF): one flipped bit can only make
# a record unreadable, never turn it into the ack of another entry. So after any
# single flip or any truncation the outbox must open, lose nothing that was not
# acked, deliver only what was stored, count no drop (nothing was lost: an ack that
# no longer reads sends its entry again, a duplicate the job removes), take an
# append, and count nothing on a second open.
import os
from array import array
from mqb_outbox import Outbox, DROP_OLDEST
from outbox_util import TmpDir, payload

CFG = dict(segment_size=300, max_segments=4, max_entries=4, policy=DROP_OLDEST)
BOOT = 7


def _files(root):
    out = {}
    for name in sorted(os.listdir(root)):
        with open(root + "/" + name, "rb") as f:
            out[name] = f.read()
    return out


def _restore(root, files, name=None, image=None):
    for n in os.listdir(root):
        os.remove(root + "/" + n)
    for n, data in files.items():
        with open(root + "/" + n, "wb") as f:
            f.write(image if n == name else data)


def _build(root):
    """9 entries over 3 segments, two of every three acked: every segment keeps an
    ack file next to entries still pending."""
    ob = Outbox(root, **CFG)
    data, seq = {}, 0
    for i in range(9):
        recs = 2 + i % 3
        d = payload(500 + i, 30 + (i * 17) % 40)
        eid = ob.append(d, recs, BOOT, seq, seq + recs - 1)
        seq += recs
        data[eid] = d
    acked = [e for e in data if e % 3 != 2]
    for e in acked:
        assert ob.ack(e) == 0, e
    ob.close()
    return data, set(acked)


def _pending(ob):
    ids = array("i", [0] * (ob.max_segments * ob.max_entries))
    return [ids[i] for i in range(ob.peek(ids))]


def _check(root, data, acked, tag, stats):
    ob = Outbox(root, **CFG)                               # never raises: a device must boot
    buf = bytearray(ob.max_payload)
    pending = _pending(ob)
    for eid in data:
        if eid not in acked:
            assert eid in pending, (tag, "an entry never acked is gone", eid, pending)
    for eid in pending:
        n = ob.read(eid, buf)
        assert n >= 0 and bytes(buf[:n]) == data[eid], (tag, "not delivered as stored", eid, n)
        if eid in acked:
            stats["resent"] += 1                           # its ack no longer reads: a duplicate
    assert ob.dropped_total == 0, (tag, "a drop counted where nothing was lost", ob.dropped_total)
    new = payload(77, 40)
    eid = ob.append(new, 3, BOOT + 1, 0, 2)
    assert eid >= 0 and ob.read(eid, buf) == 40 and bytes(buf[:40]) == new, (tag, "append", eid)
    before = _pending(ob)
    ob.close()
    ob = Outbox(root, **CFG)
    assert _pending(ob) == before and ob.dropped_total == 0, (tag, "a second open changed", _pending(ob), before)
    ob.close()
    stats["cases"] += 1


def test_every_bit_and_every_cut_of_every_ack_file_loses_and_counts_nothing():
    with TmpDir("acks") as root:
        data, acked = _build(root)
        files = _files(root)
        acks = [n for n in files if n[0] == "a"]
        assert len(acks) >= 2, ("the campaign needs ack files", sorted(files))
        stats = {"cases": 0, "flips": 0, "cuts": 0, "bytes": 0, "resent": 0}
        _restore(root, files)
        _check(root, data, acked, ("pristine",), stats)
        for name in acks:
            img = files[name]
            stats["bytes"] += len(img)
            for pos in range(len(img)):
                for bit in range(8):
                    bad = bytearray(img)
                    bad[pos] ^= 1 << bit
                    _restore(root, files, name, bytes(bad))
                    _check(root, data, acked, (name, "flip", pos, bit), stats)
                    stats["flips"] += 1
            for length in range(len(img)):
                _restore(root, files, name, img[:length])
                _check(root, data, acked, (name, "cut", length), stats)
                stats["cuts"] += 1
        print("ACK_CAMPAIGN", stats)
        assert stats["flips"] == 8 * stats["bytes"] and stats["cuts"] == stats["bytes"], stats
        assert stats["resent"] > 0, ("no damaged ack was ever noticed: the campaign did not reach the acks", stats)
