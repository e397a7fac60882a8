# mqb_outbox_recover: opening an outbox. Rebuilds an Outbox's RAM index from its
# segment files (read with mqb_outbox_format): drops torn tails, applies the ack
# files, counts once what damage made unreadable, cleans up. Never refuses to
# open because of what a segment holds (docs/outbox.md "Reading a segment on
# open", "Damage on flash"): one flipped bit in a header is corrected (CRC-32);
# past unreadable headers the reader resynchronises on the next good one; every
# entry it cannot read back is counted as dropped once and listed in ob.damage.
#
# Functions of the Outbox `ob` (mqb_outbox) that its constructor calls once:
# they use its index and its state changes (_discard, _write_ack, count_dropped,
# _trim...), passed in as the object; nothing here imports mqb_outbox.
import os
from mqb_outbox_format import SEG_HEADER_SIZE, _remove, _scan, _seg_first, _seg_path

_ACK_SIZE = const(4)
# Outbox._state values (mqb_outbox)
_FREE = const(0)
_PENDING = const(1)
_DONE = const(2)
_LOST = const(3)       # an entry that cannot be read back (counted dropped, then acked)
# what _scan finds at a place in a segment (item[7]; mqb_outbox_format)
_GOOD = const(0)
_SHORT = const(2)
_UNREADABLE = const(3)
_BLANK = const(4)


def load(ob):
    """Rebuild the index from the files: drop torn tails, apply acks, count what
    damage made unreadable, clean up. Never refuses to open because of what a
    segment holds (docs/outbox.md "Reading a segment on open")."""
    segs = []
    acks = []
    for name in os.listdir(ob.root):
        if len(name) == 9 and name[0] in "sa":
            try:
                num = int(name[1:], 16)
            except ValueError:
                continue
            (segs if name[0] == "s" else acks).append(num)
    segs.sort()
    scratch = bytearray(256)
    damaged = []   # ids of entries with a good header but a bad or short payload
    runs = []      # ids lost to unreadable headers: [start, end, P boot, P last seq, N boot, N first seq, est]
    ob._p = [-1, -1]   # boot and last seq of the last readable header (the lower neighbour of a run)
    tail = None    # the newest segment so far ends in something unreadable: (est, offset)
    unknown = -1   # segment number of an unreadable oldest segment whose ids cannot be known
    for sno in segs:
        ob._next_sno = max(ob._next_sno, sno + 1)
        path = _seg_path(ob.root, sno)
        first = _seg_first(ob._hdr, path, sno)
        prev_end = -1
        lo = 0
        hi = 1 << 30
        if ob._nseg:
            nw = ob._newest()
            prev_end = ob._sfirst[nw] + ob._sn[nw]
            lo = ob._sfirst[ob._tail]
            hi = lo + len(ob._state)
            if not lo <= first < hi:
                first = -1            # a header that survived its CRC with a foreign id: use the entries'
        items = _scan(ob._hdr, path, first, lo, hi, scratch)
        e0 = None
        for it in items:
            if it[0] >= 0:
                e0 = it
                break
        if first < 0:
            if e0 is not None and e0[1] == SEG_HEADER_SIZE:
                first = e0[0]
            elif e0 is not None and 0 <= prev_end <= e0[0]:
                first = prev_end
            elif e0 is not None:
                first = max(e0[0] - 1, lo)    # at least one unreadable entry before it
            elif prev_end >= 0:
                first = prev_end
            else:
                # nothing readable and no segment before it: which ids it held is unknown
                # (noted if a later segment shows it was not simply the newest, torn)
                if os.stat(path)[6]:
                    unknown = sno
                os.remove(path)
                continue
        if e0 is None and ob._nseg and first <= prev_end and not (items and items[-1][7] == _UNREADABLE):
            ob._next_id = max(ob._next_id, first)
            os.remove(path)                  # holds no returned append (nor anything lost)
            continue
        if ob._nseg:
            if first < prev_end:
                _supersede(ob, first, damaged, runs)
            elif first > prev_end:
                est, off = tail if tail is not None else (-1, ob._ssize[ob._newest()])
                _lose(ob, ob._newest(), prev_end, first, est, off, runs)
        if ob._nseg == ob.max_segments:
            raise ValueError("outbox %s holds more than max_segments=%d segments: open it with a larger "
                             "max_segments to drain it" % (ob.root, ob.max_segments))
        s = (ob._tail + ob._nseg) % ob.max_segments
        ob._nseg += 1
        ob._sno[s] = sno
        ob._sfirst[s] = first
        ob._sn[s] = 0
        ob._spend[s] = 0
        ob._srec[s] = 0
        ob._ssize[s] = SEG_HEADER_SIZE
        ob.bytes_used += SEG_HEADER_SIZE
        tail = None
        expect = first
        clean = True
        short = False                        # the last entry is cut short by the end of the file
        resynced = False
        for it in items:
            eid, off, end, rec, boot, fseq, lseq, kind = it
            if eid < 0:                      # unreadable region up to the next entry (or the end)
                tail = (rec, off)
                clean = False
                short = False
                resynced = True
                continue
            if eid - first >= ob.max_entries and not resynced:
                raise ValueError("outbox %s: segment %s holds more than max_entries=%d entries: open it with "
                                 "a larger max_entries" % (ob.root, path, ob.max_entries))
            if eid > expect:
                est, roff = tail if tail is not None else (-1, off)
                _lose(ob, s, expect, eid, est, roff, runs)
            tail = None
            for r in runs:                   # the upper neighbour of the runs before it
                if r[4] < 0:
                    r[4] = boot
                    r[5] = fseq
            slot = eid % len(ob._state)
            ob._off[slot] = off
            ob._cnt[slot] = rec
            ob._state[slot] = _PENDING
            ob._sn[s] = eid - first + 1
            ob._spend[s] += 1
            ob._srec[s] += rec
            ob.depth += 1
            ob.pending_records += rec
            size = end - ob._ssize[s]
            ob._ssize[s] = end
            ob.bytes_used += size
            ob._p[0] = boot
            ob._p[1] = lseq
            if kind != _GOOD:
                damaged.append(eid)
                clean = False
            short = kind == _SHORT
            expect = eid + 1
        if items and items[-1][7] == _BLANK:
            tail = None                      # a torn tail: nothing to count if nothing follows
            clean = False
        ob._sealed = not clean
    if ob._nseg:
        s = ob._newest()
        end = ob._sfirst[s] + ob._sn[s]
        if tail is not None:
            # unreadable bytes end the newest segment: not a torn append (that leaves a
            # good header, or bytes never written); count one entry lost there
            _lose(ob, s, end, end + 1, tail[0], tail[1], runs)
        elif short:
            damaged.pop()                    # the newest append, torn: it never returned
            _unindex_from(ob, s, end - 1)
        ob._next_id = ob._sfirst[s] + ob._sn[s]
        if ob._sn[s] == 0:                 # holds no returned append
            ob._delete_oldest() if ob._nseg == 1 else _drop_newest(ob)
    if unknown >= 0 and ob._nseg:
        ob._damage("segment", unknown, -1, -1)   # its entries are lost, uncounted (ids unknown)
    for sno in acks:
        s = _seg_index(ob, sno)
        if s < 0:
            _remove(_seg_path(ob.root, sno, "a"))     # its segment is gone
        else:
            _apply_acks(ob, s)
    _count_runs(ob, runs)
    for eid in damaged:   # not acked before: count once, persist as done
        s = ob._find(eid)
        if s >= 0:
            ob._damage("payload", eid, eid + 1, ob._cnt[eid % len(ob._state)])
            ob._discard(s, eid, True)
    ob._p = None
    ob._trim()


def _drop_newest(ob):
    """Forget the newest segment (it holds nothing) and delete its file."""
    s = ob._newest()
    ob._seal()
    os.remove(_seg_path(ob.root, ob._sno[s]))
    ob.bytes_used -= ob._ssize[s]
    ob._nseg -= 1
    ob._sealed = True


def _lose(ob, s, start, end, est, off, runs):
    """Entries start..end-1 of segment s cannot be read back: mark them lost."""
    for e in range(start, end):
        slot = e % len(ob._state)
        ob._state[slot] = _LOST
        ob._off[slot] = off
        ob._cnt[slot] = 0
    ob._sn[s] = end - ob._sfirst[s]
    if runs and runs[-1][1] == start and runs[-1][4] < 0:
        runs[-1][1] = end          # no readable header between: one run, the same neighbours
        runs[-1][6] = -1
    else:
        runs.append([start, end, ob._p[0], ob._p[1], -1, -1, est])


def _count_runs(ob, runs):
    """Count the records of lost entries that no ack record covers: all of them
    first (persisted), then an ack record each so no later open counts them again."""
    total = 0
    for r in runs:
        start, end, pboot, plast, nboot, nfirst, est = r
        k = 0
        for e in range(start, end):
            if ob._state[e % len(ob._state)] == _LOST:
                k += 1
        if not k:
            continue
        if pboot >= 0 and nboot == pboot and nfirst > plast:
            rec = nfirst - plast - 1        # the seq numbers between the readable neighbours
        elif end - start == 1 and est >= 0:
            rec = est                       # what the damaged header itself says
        else:
            rec = k                         # at least one record per lost entry
        r[6] = rec
        total += rec
        ob._damage("unreadable", start, end, rec)
    ob.count_dropped(total)
    for r in runs:
        for e in range(r[0], r[1]):
            if ob._state[e % len(ob._state)] == _LOST:
                s = _seg_of(ob, e)
                if s >= 0:
                    ob._write_ack(s, e)
                ob._state[e % len(ob._state)] = _DONE


def _seg_of(ob, eid):
    for i in range(ob._nseg):
        s = (ob._tail + i) % ob.max_segments
        if ob._sfirst[s] <= eid < ob._sfirst[s] + ob._sn[s]:
            return s
    return -1


def _supersede(ob, first, damaged, runs):
    """A segment starts at entry `first`, below where the segments before end:
    those entries' append() never returned (a torn last write, or a write error
    after the data got there) and the ids were given out again: forget the old
    copies."""
    for i in range(ob._nseg - 1, -1, -1):
        s = (ob._tail + i) % ob.max_segments
        if ob._sfirst[s] + ob._sn[s] <= first:
            break
        _unindex_from(ob, s, max(first, ob._sfirst[s]))
    damaged[:] = [d for d in damaged if d < first]
    runs[:] = [r for r in runs if r[0] < first]
    for r in runs:
        if r[1] > first:
            r[1] = first
    ob._p[0] = -1        # the lower neighbour is no longer known


def _unindex_from(ob, s, eid):
    """Forget the entries eid.. of segment s (appends that never returned)."""
    end = ob._sfirst[s] + ob._sn[s]
    if eid >= end:
        return
    for e in range(eid, end):
        slot = e % len(ob._state)
        if ob._state[slot] == _PENDING:
            cnt = ob._cnt[slot]
            ob._spend[s] -= 1
            ob._srec[s] -= cnt
            ob.depth -= 1
            ob.pending_records -= cnt
        ob._state[slot] = _FREE
    ob._sn[s] -= end - eid
    cut = ob._ssize[s] - ob._off[eid % len(ob._state)]
    if cut > 0:
        ob._ssize[s] -= cut
        ob.bytes_used -= cut


def _seg_index(ob, sno):
    for i in range(ob._nseg):
        s = (ob._tail + i) % ob.max_segments
        if ob._sno[s] == sno:
            return s
    return -1


def _apply_acks(ob, s):
    with open(_seg_path(ob.root, ob._sno[s], "a"), "rb") as f:
        data = f.read()
    first = ob._sfirst[s]
    for p in range(0, len(data) - _ACK_SIZE + 1, _ACK_SIZE):
        idx = data[p] | data[p + 1] << 8
        if (data[p + 2] | data[p + 3] << 8) != idx ^ 0xFFFF or idx >= ob._sn[s]:
            continue   # torn or stray record: the entry stays pending (at-least-once)
        slot = (first + idx) % len(ob._state)
        st = ob._state[slot]
        if st == _LOST:
            ob._state[slot] = _DONE   # counted (or acked) when an earlier open found it
        elif st == _PENDING:
            ob._state[slot] = _DONE
            cnt = ob._cnt[slot]
            ob._spend[s] -= 1
            ob._srec[s] -= cnt
            ob.depth -= 1
            ob.pending_records -= cnt
