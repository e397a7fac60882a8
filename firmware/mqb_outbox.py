# mqb_outbox: the durable outbox. Batches that are not yet acknowledged live on
# flash in a bounded set of append-only segment files; docs/outbox.md gives the
# on-flash format byte by byte, what it costs and what happens on an outage.
#
#   ob = Outbox("/outbox", segment_size=16384, max_segments=8, max_entries=32)
#   eid = ob.append(payload, records, boot, first_seq, last_seq)   # id, or FULL
#   k = ob.peek(ids, n)                # oldest pending ids, for Receive Maximum
#   n = ob.read(eid, dest)             # payload into the caller's buffer
#   ob.ack(eid)                        # after a PUBACK with a success code
#
# Power cuts: append() returns only after the entry is flushed (littlefs commit,
# fsync on VfsPosix); each entry carries its length and a CRC-32, so a torn tail
# is detected on reopen, dropped and never read back. An ack writes a 4-byte ack
# record (or deletes the segment when that was its last pending entry): acks
# never rewrite a segment. See docs/outbox.md for which duplicates a power cut
# can cause (never losses).
#
# Flash rot: opening never fails on what a segment holds. One flipped bit in a
# header is corrected (CRC-32); past unreadable headers the reader
# resynchronises on the next good one; every entry it cannot read back is
# counted as dropped once and listed in ob.damage (docs/outbox.md "Damage on flash").
import os
import struct
from array import array
from micropython import const
from mqb_boot import SlotCounter, crc32

# Results (entry ids are >= 0)
OK = 0
FULL = -1       # append: policy "stop" and no room; nothing was written
UNKNOWN = -2    # no pending entry with this id (never appended, acked, or dropped)
CORRUPT = -3    # read: the entry failed its check on flash; discarded, records counted dropped
TOO_SMALL = -4  # read: the entry is larger than the caller's buffer (its size: entry_bytes); nothing changed

DROP_OLDEST = "drop_oldest"
STOP = "stop"

_FORMAT_VERSION = const(1)
_SEG_MAGIC = const(b"MQBS")
SEG_HEADER_SIZE = 20
ENTRY_HEADER_SIZE = 32
_ACK_SIZE = const(4)
_SEG_FMT = const("<4sB3xII")        # magic, version, 3 zero bytes, segment number, first entry id (+ u32 CRC)
_ENTRY_FMT = const("<IIIIIHHI")     # length, id, boot, first_seq, last_seq, records, flags, payload CRC (+ header CRC)

_ENOENT = const(2)
_ENOSPC = const(28)
_FREE = const(0)
_PENDING = const(1)
_DONE = const(2)
_LOST = const(3)       # on open: an entry that cannot be read back (counted dropped, then acked)
# what _scan finds at a place in a segment (item[7])
_GOOD = const(0)       # an entry, header and payload good
_BAD = const(1)        # an entry with a good header whose payload fails its CRC
_SHORT = const(2)      # an entry with a good header whose payload the file ends inside
_UNREADABLE = const(3) # a region with no readable entry header (rot, truncation)
_BLANK = const(4)      # the file ends inside a header, or in bytes never written: a torn tail


def _u32(b, p):
    return b[p] | b[p + 1] << 8 | b[p + 2] << 16 | b[p + 3] << 24


def _fix(buf, n):
    """buf[0:n] and the u32 CRC-32 of it stored at buf[n:n+4]: True if they match,
    or once one flipped bit (in the data or in the CRC) is found and corrected in
    buf. CRC-32 has a Hamming distance of at least 4 over these short headers, so
    one bit is corrected without ambiguity and two are never miscorrected. Error
    path only (up to 8 n CRCs)."""
    view = memoryview(buf)[:n]
    stored = _u32(buf, n)
    syn = crc32(view) ^ stored
    if not syn:
        return True
    if not syn & (syn - 1):          # one bit of the stored CRC
        struct.pack_into("<I", buf, n, stored ^ syn)
        return True
    for i in range(n):
        for bit in range(8):
            buf[i] ^= 1 << bit
            if crc32(view) == stored:
                return True
            buf[i] ^= 1 << bit
    return False


def _remove(path):
    """Delete a file; a missing file is not an error."""
    try:
        os.remove(path)
    except OSError as e:
        if e.args[0] != _ENOENT:
            raise


class _OpenFile:
    """One open file kept between calls, and the segment number it belongs to."""

    def __init__(self):
        self.f = None
        self.sno = -1

    def open(self, path, mode, sno):
        self.close()
        self.f = open(path, mode)
        self.sno = sno
        return self.f

    def close(self):
        if self.f is not None:
            f = self.f
            self.f = None
            self.sno = -1
            f.close()


class Outbox:
    """Bounded, power-cut-safe FIFO of batch payloads on flash (docs/outbox.md).

    root: directory (created if missing). segment_size: bytes per segment file,
    including its 20-byte header. max_segments (>= 2) x segment_size bounds the
    flash used. max_entries: entries per segment (bounds the RAM index:
    max_segments x max_entries x 7 bytes). policy: DROP_OLDEST (when full, delete
    the oldest segment and count its pending records as dropped) or STOP (append
    returns FULL; the caller stops sampling until acks free room).
    """

    def __init__(self, root, segment_size=16384, max_segments=8, max_entries=32, policy=DROP_OLDEST):
        if not SEG_HEADER_SIZE + ENTRY_HEADER_SIZE + 1 <= segment_size < (1 << 30):
            raise ValueError("segment_size %d: must be %d..%d bytes" % (
                segment_size, SEG_HEADER_SIZE + ENTRY_HEADER_SIZE + 1, (1 << 30) - 1))
        if max_segments < 2:
            raise ValueError("max_segments %d: at least 2 (one to fill while the oldest drains)" % max_segments)
        if not 1 <= max_entries <= 0xFFFF:
            raise ValueError("max_entries %d: must be 1..65535 per segment" % max_entries)
        if policy not in (DROP_OLDEST, STOP):
            raise ValueError("policy %r: must be %r or %r" % (policy, DROP_OLDEST, STOP))
        self.root = root
        self.segment_size = segment_size
        self.max_segments = max_segments
        self.max_entries = max_entries
        self.policy = policy
        self.max_payload = segment_size - SEG_HEADER_SIZE - ENTRY_HEADER_SIZE
        self._mkdir()
        self._check_capacity()
        cap = max_segments * max_entries
        self._cap = cap
        # RAM index, a ring by entry id (id % cap): ids of live entries are consecutive
        # zero-filled from bytes: a [0] * cap list would take 8 B per slot on 64-bit ports
        self._off = array("i", bytes(4 * cap))    # file offset of the entry header
        self._cnt = array("H", bytes(2 * cap))    # records in the entry
        self._state = bytearray(cap)          # _FREE / _PENDING / _DONE
        # segments, a ring of max_segments, oldest at _tail
        k = max_segments
        self._sno = array("i", bytes(4 * k))      # segment number (file name)
        self._sfirst = array("i", bytes(4 * k))   # id of its first entry
        self._sn = array("i", bytes(4 * k))       # entries in it
        self._spend = array("i", bytes(4 * k))    # pending entries
        self._srec = array("i", bytes(4 * k))     # pending records
        self._ssize = array("i", bytes(4 * k))    # bytes (the valid part of the file)
        self._tail = 0
        self._nseg = 0
        self._sealed = True                   # the newest segment takes no more appends
        self._hf = _OpenFile()                # the newest segment, "a+b"
        self._rf = _OpenFile()                # reader of an older segment
        self._af = _OpenFile()                # appender of an ack file
        self._hdr = bytearray(ENTRY_HEADER_SIZE)
        self._hdr28 = memoryview(self._hdr)[:28]
        self._ackbuf = bytearray(_ACK_SIZE)
        self._next_id = 0
        self._next_sno = 0
        self.depth = 0              # pending entries
        self.pending_records = 0    # records in pending entries
        self.bytes_used = 0         # bytes of segment files on flash
        self.dropped_since_open = 0
        # metadata of the entry last read()
        self.entry_records = 0
        self.entry_bytes = 0        # payload size of the entry a read() found TOO_SMALL
        self.entry_boot = 0
        self.entry_first_seq = 0
        self.entry_last_seq = 0
        # what opening found damaged (docs/outbox.md "Flash rot"): (reason, first id,
        # end id, records counted dropped); read() adds what it discards as CORRUPT
        self.damage = []
        self._dropped = SlotCounter(root + "/dropped", b"DROP")
        self._reported = SlotCounter(root + "/reported", b"RPTD")
        self._base = self._reported.value
        self._load()

    # ---- public API ------------------------------------------------------------

    @property
    def dropped_total(self):
        """Records dropped since this outbox was created (persisted across reboots)."""
        return self._dropped.value

    def dropped_report(self):
        """The value for the health record's dropped_total channel (docs/records.md,
        "since boot"): records dropped since this boot, plus those dropped in
        earlier boots after the last health record appended there. Pass it back
        as append(..., reported=value) with the batch that carries it."""
        return self._dropped.value - self._base

    def rebase(self):
        """Start the dropped_report() count again from what was reported: call it
        when the boot number changes without a reboot (RecordWriter.renew_boot)."""
        self._base = self._reported.value

    def append(self, payload, records=0, boot=0, first_seq=0, last_seq=0, reported=-1):
        """Store one batch payload (bytes, bytearray or memoryview) and its metadata.

        Returns the entry id (>= 0) once the entry is on flash, or FULL (policy
        STOP, no room: nothing written). With DROP_OLDEST, making room may delete
        the oldest segment; its pending records are added to dropped_total first.
        reported: the dropped_report() value a health record in this batch
        carries (-1: none); once the entry is on flash it becomes the mark the
        next boot counts from (persisted only when it changed).
        """
        n = len(payload)
        if n > self.max_payload:
            raise ValueError("batch of %d bytes does not fit a %d-byte segment (max payload %d bytes)"
                             % (n, self.segment_size, self.max_payload))
        if not 0 <= records <= 0xFFFF:
            raise ValueError("records %d: must be 0..65535" % records)
        if reported > self._dropped.value - self._base:
            raise ValueError("reported %d is more than dropped_report() = %d"
                             % (reported, self._dropped.value - self._base))
        h = self._newest()
        if (self._sealed or self._sn[h] >= self.max_entries
                or self._ssize[h] + ENTRY_HEADER_SIZE + n > self.segment_size):
            if self._roll() == FULL:
                return FULL
            h = self._newest()
        eid = self._next_id
        hdr = self._hdr
        struct.pack_into(_ENTRY_FMT, hdr, 0, n, eid, boot, first_seq, last_seq, records, 0, crc32(payload))
        struct.pack_into("<I", hdr, 28, crc32(self._hdr28))
        f = self._head_file()
        try:
            ok = f.write(hdr) == ENTRY_HEADER_SIZE and f.write(payload) == n
            if ok:
                f.flush()
        except OSError:
            self._seal()  # what reached the file is unknown: never append behind it
            raise
        if not ok:
            self._seal()
            raise OSError(_ENOSPC)
        slot = eid % self._cap
        self._off[slot] = self._ssize[h]
        self._cnt[slot] = records
        self._state[slot] = _PENDING
        self._sn[h] += 1
        self._spend[h] += 1
        self._srec[h] += records
        self._ssize[h] += ENTRY_HEADER_SIZE + n
        self.bytes_used += ENTRY_HEADER_SIZE + n
        self.depth += 1
        self.pending_records += records
        self._next_id = eid + 1
        if reported >= 0 and self._base + reported > self._reported.value:
            self._reported.store(self._base + reported)
        return eid

    def peek(self, out, n=-1, after=-1):
        """Write the ids of the oldest pending entries with id > after into out
        (a list or array("i") the caller owns), at most n (or len(out)).
        Returns how many were written. No allocation."""
        limit = len(out) if n < 0 or n > len(out) else n
        k = 0
        for i in range(self._nseg):
            if k >= limit:
                break
            s = (self._tail + i) % self.max_segments
            eid = self._sfirst[s]
            end = eid + self._sn[s]
            if eid <= after:
                eid = after + 1
            while eid < end and k < limit:
                if self._state[eid % self._cap] == _PENDING:
                    out[k] = eid
                    k += 1
                eid += 1
        return k

    def records(self, eid):
        """Records in a pending entry (for batch-size), or UNKNOWN."""
        if self._find(eid) < 0:
            return UNKNOWN
        return self._cnt[eid % self._cap]

    def read(self, eid, dest, verify=True):
        """Read a pending entry's payload into dest[0:n] (bytearray or memoryview
        the caller owns) and return n; its metadata is then in entry_records,
        entry_boot, entry_first_seq, entry_last_seq. Returns UNKNOWN, TOO_SMALL
        (nothing changed but entry_bytes, the payload size), or CORRUPT (the stored entry failed its check: it is
        discarded and its records counted as dropped).
        verify checks the payload CRC; it allocates one memoryview unless
        len(dest) equals the payload length (docs/outbox.md)."""
        s = self._find(eid)
        if s < 0:
            return UNKNOWN
        f = self._reader(s)
        f.seek(self._off[eid % self._cap])
        hdr = self._hdr
        if (f.readinto(hdr) != ENTRY_HEADER_SIZE
                or crc32(self._hdr28) != _u32(hdr, 28) and not _fix(hdr, 28)
                or _u32(hdr, 4) != eid):
            return self._corrupt(s, eid)
        n = _u32(hdr, 0)
        if n > len(dest):
            self.entry_bytes = n
            return TOO_SMALL
        if f.readinto(dest, n) != n:
            return self._corrupt(s, eid)
        if verify:
            view = dest if len(dest) == n else memoryview(dest)[:n]
            if crc32(view) != _u32(hdr, 24):
                return self._corrupt(s, eid)
        self.entry_boot = _u32(hdr, 8)
        self.entry_first_seq = _u32(hdr, 12)
        self.entry_last_seq = _u32(hdr, 16)
        self.entry_records = hdr[20] | hdr[21] << 8
        return n

    def ack(self, eid):
        """Remove a pending entry after its PUBACK with a success code: OK or UNKNOWN."""
        s = self._find(eid)
        if s < 0:
            return UNKNOWN
        return self._discard(s, eid, False)

    def discard(self, eid):
        """Remove a pending entry without delivery (e.g. the broker refused it for
        good); its records are counted as dropped. OK or UNKNOWN."""
        s = self._find(eid)
        if s < 0:
            return UNKNOWN
        return self._discard(s, eid, True)

    def count_dropped(self, records):
        """Add records the application dropped itself (e.g. a batch it gave up on)."""
        if records < 0:
            raise ValueError("records %d: must be >= 0" % records)
        if records:
            self._dropped.store(self._dropped.value + records)
            self.dropped_since_open += records

    def close(self):
        """Close the files (everything is already on flash). All are closed even
        if one fails; the first error is raised after."""
        err = None
        for h in (self._hf, self._rf, self._af):
            try:
                h.close()
            except OSError as e:
                err = err or e
        if err is not None:
            raise err

    # ---- segments ----------------------------------------------------------------

    def _seg_path(self, sno):
        return "%s/s%08x" % (self.root, sno)

    def _ack_path(self, sno):
        return "%s/a%08x" % (self.root, sno)

    def _newest(self):
        return (self._tail + self._nseg - 1) % self.max_segments

    def _find(self, eid):
        """Ring index of the segment holding pending entry eid, or -1."""
        for i in range(self._nseg):
            s = (self._tail + i) % self.max_segments
            first = self._sfirst[s]
            if first <= eid < first + self._sn[s]:
                return s if self._state[eid % self._cap] == _PENDING else -1
        return -1

    def _head_file(self):
        if self._hf.f is None:
            sno = self._sno[self._newest()]
            if self._rf.sno == sno:
                self._rf.close()
            self._hf.open(self._seg_path(sno), "a+b", sno)
        return self._hf.f

    def _reader(self, s):
        if s == self._newest() and not self._sealed:
            return self._head_file()   # one handle sees its own appends (littlefs)
        sno = self._sno[s]
        if self._rf.sno != sno:
            self._rf.open(self._seg_path(sno), "rb", sno)
        return self._rf.f

    def _seal(self):
        self._sealed = True
        self._hf.close()

    def _roll(self):
        """Start a new newest segment, making room first. OK or FULL."""
        if self._nseg == self.max_segments:
            t = self._tail
            if self._spend[t]:
                if self.policy == STOP:
                    return FULL
                self.count_dropped(self._srec[t])   # counted before the data goes
            self._delete_oldest()
        self._seal()
        sno = self._next_sno
        path = self._seg_path(sno)
        _remove(path)                  # nothing should be there; never append to a stranger
        _remove(self._ack_path(sno))   # nor inherit its acks
        s = (self._tail + self._nseg) % self.max_segments
        self._sno[s] = sno
        self._sfirst[s] = self._next_id
        self._sn[s] = 0
        self._spend[s] = 0
        self._srec[s] = 0
        self._ssize[s] = SEG_HEADER_SIZE
        self._nseg += 1
        self._next_sno = sno + 1
        self._sealed = False
        hdr = self._hdr
        struct.pack_into(_SEG_FMT, hdr, 0, _SEG_MAGIC, _FORMAT_VERSION, sno, self._next_id)
        struct.pack_into("<I", hdr, 16, crc32(memoryview(hdr)[:16]))
        f = self._head_file()
        try:
            ok = f.write(memoryview(hdr)[:SEG_HEADER_SIZE]) == SEG_HEADER_SIZE
        except OSError:
            self._seal()
            raise
        if not ok:
            self._seal()
            raise OSError(_ENOSPC)
        self.bytes_used += SEG_HEADER_SIZE   # flushed together with the first entry
        self._trim()
        return OK

    def _delete_oldest(self):
        t = self._tail
        sno = self._sno[t]
        if self._rf.sno == sno:
            self._rf.close()
        if self._af.sno == sno:
            self._af.close()
        if self._nseg == 1:
            self._seal()
        os.remove(self._seg_path(sno))      # the segment first: an orphan ack file is harmless
        _remove(self._ack_path(sno))
        self.depth -= self._spend[t]
        self.pending_records -= self._srec[t]
        self.bytes_used -= self._ssize[t]
        self._tail = (t + 1) % self.max_segments
        self._nseg -= 1

    def _trim(self):
        """Delete the oldest segments while nothing in them is pending (the
        newest only when sealed: it keeps the entry ids going)."""
        while self._nseg and self._spend[self._tail] == 0 and (self._nseg > 1 or self._sealed):
            self._delete_oldest()

    def _discard(self, s, eid, dropped):
        """Make pending entry eid (in segment s) done: acked, or dropped (counted)."""
        slot = eid % self._cap
        cnt = self._cnt[slot]
        if dropped:
            self.count_dropped(cnt)   # counted before the entry goes
        last = self._spend[s] == 1 and s == self._tail and (self._nseg > 1 or self._sealed)
        if not last:
            self._write_ack(s, eid)   # the segment stays (deleting it would be enough otherwise)
        self._state[slot] = _DONE
        self._spend[s] -= 1
        self._srec[s] -= cnt
        self.depth -= 1
        self.pending_records -= cnt
        self._trim()
        return OK

    def _write_ack(self, s, eid):
        """Persist the ack record of entry eid in segment s."""
        sno = self._sno[s]
        f = self._af.f if self._af.sno == sno else self._af.open(self._ack_path(sno), "ab", sno)
        idx = eid - self._sfirst[s]
        struct.pack_into("<HH", self._ackbuf, 0, idx, idx ^ 0xFFFF)
        f.write(self._ackbuf)
        f.flush()

    def _corrupt(self, s, eid):
        self._damage("read", eid, eid + 1, self._cnt[eid % self._cap])
        self._discard(s, eid, True)
        return CORRUPT

    # ---- opening -----------------------------------------------------------------

    def _mkdir(self):
        try:
            os.stat(self.root)
        except OSError as e:
            if e.args[0] != _ENOENT:
                raise
            os.mkdir(self.root)

    def _check_capacity(self):
        st = os.statvfs(self.root)
        total = st[1] * st[2]   # fragment size x blocks
        need = self.max_segments * self.segment_size
        if need > total:
            raise ValueError("outbox of %d x %d bytes cannot fit a %d-byte filesystem"
                             % (self.max_segments, self.segment_size, total))

    def _damage(self, reason, first, end, records):
        """Note what was found damaged (the last 8 findings are kept)."""
        if len(self.damage) >= 8:
            self.damage.pop(0)
        self.damage.append((reason, first, end, records))

    def _load(self):
        """Rebuild the index from the files: drop torn tails, apply acks, count what
        damage made unreadable, clean up. Never refuses to open because of what a
        segment holds (docs/outbox.md "Reading a segment on open")."""
        segs = []
        acks = []
        for name in os.listdir(self.root):
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
        self._p = [-1, -1]   # boot and last seq of the last readable header (the lower neighbour of a run)
        tail = None    # the newest segment so far ends in something unreadable: (est, offset)
        unknown = -1   # segment number of an unreadable oldest segment whose ids cannot be known
        for sno in segs:
            self._next_sno = max(self._next_sno, sno + 1)
            path = self._seg_path(sno)
            first = self._seg_first(sno)
            prev_end = -1
            lo = 0
            hi = 1 << 30
            if self._nseg:
                nw = self._newest()
                prev_end = self._sfirst[nw] + self._sn[nw]
                lo = self._sfirst[self._tail]
                hi = lo + self._cap
                if not lo <= first < hi:
                    first = -1            # a header that survived its CRC with a foreign id: use the entries'
            items = self._scan(path, first, lo, hi, scratch)
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
            if e0 is None and self._nseg and first <= prev_end and not (items and items[-1][7] == _UNREADABLE):
                self._next_id = max(self._next_id, first)
                os.remove(path)                  # holds no returned append (nor anything lost)
                continue
            if self._nseg:
                if first < prev_end:
                    self._supersede(first, damaged, runs)
                elif first > prev_end:
                    est, off = tail if tail is not None else (-1, self._ssize[self._newest()])
                    self._lose(self._newest(), prev_end, first, est, off, runs)
            if self._nseg == self.max_segments:
                raise ValueError("outbox %s holds more than max_segments=%d segments: open it with a larger "
                                 "max_segments to drain it" % (self.root, self.max_segments))
            s = (self._tail + self._nseg) % self.max_segments
            self._nseg += 1
            self._sno[s] = sno
            self._sfirst[s] = first
            self._sn[s] = 0
            self._spend[s] = 0
            self._srec[s] = 0
            self._ssize[s] = SEG_HEADER_SIZE
            self.bytes_used += SEG_HEADER_SIZE
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
                if eid - first >= self.max_entries and not resynced:
                    raise ValueError("outbox %s: segment %s holds more than max_entries=%d entries: open it with "
                                     "a larger max_entries" % (self.root, path, self.max_entries))
                if eid > expect:
                    est, roff = tail if tail is not None else (-1, off)
                    self._lose(s, expect, eid, est, roff, runs)
                tail = None
                for r in runs:                   # the upper neighbour of the runs before it
                    if r[4] < 0:
                        r[4] = boot
                        r[5] = fseq
                slot = eid % self._cap
                self._off[slot] = off
                self._cnt[slot] = rec
                self._state[slot] = _PENDING
                self._sn[s] = eid - first + 1
                self._spend[s] += 1
                self._srec[s] += rec
                self.depth += 1
                self.pending_records += rec
                size = end - self._ssize[s]
                self._ssize[s] = end
                self.bytes_used += size
                self._p[0] = boot
                self._p[1] = lseq
                if kind != _GOOD:
                    damaged.append(eid)
                    clean = False
                short = kind == _SHORT
                expect = eid + 1
            if items and items[-1][7] == _BLANK:
                tail = None                      # a torn tail: nothing to count if nothing follows
                clean = False
            self._sealed = not clean
        if self._nseg:
            s = self._newest()
            end = self._sfirst[s] + self._sn[s]
            if tail is not None:
                # unreadable bytes end the newest segment: not a torn append (that leaves a
                # good header, or bytes never written); count one entry lost there
                self._lose(s, end, end + 1, tail[0], tail[1], runs)
            elif short:
                damaged.pop()                    # the newest append, torn: it never returned
                self._unindex_from(s, end - 1)
            self._next_id = self._sfirst[s] + self._sn[s]
            if self._sn[s] == 0:                 # holds no returned append
                self._delete_oldest() if self._nseg == 1 else self._drop_newest()
        if unknown >= 0 and self._nseg:
            self._damage("segment", unknown, -1, -1)   # its entries are lost, uncounted (ids unknown)
        for sno in acks:
            s = self._seg_index(sno)
            if s < 0:
                _remove(self._ack_path(sno))     # its segment is gone
            else:
                self._apply_acks(s)
        self._count_runs(runs)
        for eid in damaged:   # not acked before: count once, persist as done
            s = self._find(eid)
            if s >= 0:
                self._damage("payload", eid, eid + 1, self._cnt[eid % self._cap])
                self._discard(s, eid, True)
        self._p = None
        self._trim()

    def _drop_newest(self):
        """Forget the newest segment (it holds nothing) and delete its file."""
        s = self._newest()
        self._seal()
        os.remove(self._seg_path(self._sno[s]))
        self.bytes_used -= self._ssize[s]
        self._nseg -= 1
        self._sealed = True

    def _lose(self, s, start, end, est, off, runs):
        """Entries start..end-1 of segment s cannot be read back: mark them lost."""
        for e in range(start, end):
            slot = e % self._cap
            self._state[slot] = _LOST
            self._off[slot] = off
            self._cnt[slot] = 0
        self._sn[s] = end - self._sfirst[s]
        if runs and runs[-1][1] == start and runs[-1][4] < 0:
            runs[-1][1] = end          # no readable header between: one run, the same neighbours
            runs[-1][6] = -1
        else:
            runs.append([start, end, self._p[0], self._p[1], -1, -1, est])

    def _count_runs(self, runs):
        """Count the records of lost entries that no ack record covers: all of them
        first (persisted), then an ack record each so no later open counts them again."""
        total = 0
        for r in runs:
            start, end, pboot, plast, nboot, nfirst, est = r
            k = 0
            for e in range(start, end):
                if self._state[e % self._cap] == _LOST:
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
            self._damage("unreadable", start, end, rec)
        self.count_dropped(total)
        for r in runs:
            for e in range(r[0], r[1]):
                if self._state[e % self._cap] == _LOST:
                    s = self._seg_of(e)
                    if s >= 0:
                        self._write_ack(s, e)
                    self._state[e % self._cap] = _DONE

    def _seg_of(self, eid):
        for i in range(self._nseg):
            s = (self._tail + i) % self.max_segments
            if self._sfirst[s] <= eid < self._sfirst[s] + self._sn[s]:
                return s
        return -1

    def _supersede(self, first, damaged, runs):
        """A segment starts at entry `first`, below where the segments before end:
        those entries' append() never returned (a torn last write, or a write error
        after the data got there) and the ids were given out again: forget the old
        copies."""
        for i in range(self._nseg - 1, -1, -1):
            s = (self._tail + i) % self.max_segments
            if self._sfirst[s] + self._sn[s] <= first:
                break
            self._unindex_from(s, max(first, self._sfirst[s]))
        damaged[:] = [d for d in damaged if d < first]
        runs[:] = [r for r in runs if r[0] < first]
        for r in runs:
            if r[1] > first:
                r[1] = first
        self._p[0] = -1        # the lower neighbour is no longer known

    def _unindex_from(self, s, eid):
        """Forget the entries eid.. of segment s (appends that never returned)."""
        end = self._sfirst[s] + self._sn[s]
        if eid >= end:
            return
        for e in range(eid, end):
            slot = e % self._cap
            if self._state[slot] == _PENDING:
                cnt = self._cnt[slot]
                self._spend[s] -= 1
                self._srec[s] -= cnt
                self.depth -= 1
                self.pending_records -= cnt
            self._state[slot] = _FREE
        self._sn[s] -= end - eid
        cut = self._ssize[s] - self._off[eid % self._cap]
        if cut > 0:
            self._ssize[s] -= cut
            self.bytes_used -= cut

    def _seg_index(self, sno):
        for i in range(self._nseg):
            s = (self._tail + i) % self.max_segments
            if self._sno[s] == sno:
                return s
        return -1

    def _seg_first(self, sno):
        """The first entry id in a segment's header (one flipped bit corrected), or
        -1 if the header cannot be read."""
        hv = memoryview(self._hdr)[:SEG_HEADER_SIZE]
        with open(self._seg_path(sno), "rb") as f:
            if f.readinto(hv) != SEG_HEADER_SIZE:
                return -1
        if not _fix(self._hdr, 16):
            return -1
        magic, version, hsno, first = struct.unpack_from(_SEG_FMT, self._hdr, 0)
        if magic != _SEG_MAGIC or version != _FORMAT_VERSION or hsno != sno:
            return -1
        return first

    def _header_at(self, f, off, size, expect, lo, hi):
        """The entry header at off, read into self._hdr (one flipped bit corrected):
        its id if it is good (flags 0, id == expect, or lo <= id < hi when expect < 0),
        else -1."""
        f.seek(off)
        if f.readinto(self._hdr) != ENTRY_HEADER_SIZE or not _fix(self._hdr, 28):
            return -1
        hdr = self._hdr
        eid = _u32(hdr, 4)
        if hdr[22] or hdr[23] or (eid != expect if expect >= 0 else not lo <= eid < hi):
            return -1
        return eid

    def _resync(self, f, p, size, lo, hi, win):
        """The offset of the first entry header at p or after whose CRC matches
        exactly, with flags 0, an id in lo..hi-1 and a payload that fits the file;
        or -1. Reads the file a window (a scratch buffer) at a time."""
        while p + ENTRY_HEADER_SIZE <= size:
            f.seek(p)
            k = f.readinto(win)
            for q in range(k - ENTRY_HEADER_SIZE + 1):
                if win[q + 22] or win[q + 23] or p + q + ENTRY_HEADER_SIZE + _u32(win, q) > size:
                    continue
                if lo <= _u32(win, q + 4) < hi and crc32(memoryview(win)[q:q + 28]) == _u32(win, q + 28):
                    return p + q
            p += k - ENTRY_HEADER_SIZE + 1
        return -1

    def _scan(self, path, first, lo, hi, scratch):
        """What a segment holds, in file order: a list of items [id, offset, end,
        records, boot, first seq, last seq, kind]. Entries (kind _GOOD, _BAD, _SHORT)
        have a good header (one flipped bit corrected); the first must have id
        `first` when first >= 0, each next one the following id. Where no good
        header is, the scan resynchronises at the next offset holding a header
        with an exact CRC and a plausible id, and notes the bytes in between as an
        item [-1, offset, end, est, 0, 0, 0, _UNREADABLE]: est is the record count
        the damaged header there names if its length field spans exactly that
        region, else -1. A tail too short for a header, or a header of bytes never
        written (all 0x00 or 0xFF), is _BLANK (a torn tail)."""
        items = []
        hdr = self._hdr
        sv = memoryview(scratch)
        with open(path, "rb") as f:
            size = f.seek(0, 2)
            off = SEG_HEADER_SIZE
            expect = first
            while off < size:
                eid = -1
                if size - off >= ENTRY_HEADER_SIZE:
                    eid = self._header_at(f, off, size, expect, lo, hi)
                if eid < 0:
                    blank = size - off < ENTRY_HEADER_SIZE or hdr[0] in (0, 0xFF) and hdr == bytes([hdr[0]]) * len(hdr)
                    length = _u32(hdr, 0)
                    rec = hdr[20] | hdr[21] << 8
                    nxt = self._resync(f, off + 1, size, expect + 1 if expect >= 0 else lo, hi, scratch)
                    if nxt < 0 and blank:        # nothing readable follows: a torn tail
                        items.append([-1, off, size, -1, 0, 0, 0, _BLANK])
                        break
                    stop = size if nxt < 0 else nxt
                    items.append([-1, off, stop, rec if stop - off == ENTRY_HEADER_SIZE + length else -1,
                                  0, 0, 0, _UNREADABLE])
                    if nxt < 0:
                        break
                    off = nxt
                    f.seek(off)
                    f.readinto(hdr)
                    eid = _u32(hdr, 4)
                length = _u32(hdr, 0)
                end = off + ENTRY_HEADER_SIZE + length
                it = [eid, off, end, hdr[20] | hdr[21] << 8, _u32(hdr, 8), _u32(hdr, 12), _u32(hdr, 16), _GOOD]
                items.append(it)
                if end > size:
                    it[7] = _SHORT
                    break
                f.seek(off + ENTRY_HEADER_SIZE)
                crc = 0
                left = length
                while left:
                    k = min(left, len(scratch))
                    if f.readinto(sv[:k]) != k:
                        break
                    crc = crc32(sv[:k], crc)
                    left -= k
                if left or crc != _u32(hdr, 24):
                    it[7] = _BAD
                off = end
                expect = eid + 1
        return items

    def _apply_acks(self, s):
        with open(self._ack_path(self._sno[s]), "rb") as f:
            data = f.read()
        first = self._sfirst[s]
        for p in range(0, len(data) - _ACK_SIZE + 1, _ACK_SIZE):
            idx = data[p] | data[p + 1] << 8
            if (data[p + 2] | data[p + 3] << 8) != idx ^ 0xFFFF or idx >= self._sn[s]:
                continue   # torn or stray record: the entry stays pending (at-least-once)
            slot = (first + idx) % self._cap
            st = self._state[slot]
            if st == _LOST:
                self._state[slot] = _DONE   # counted (or acked) when an earlier open found it
            elif st == _PENDING:
                self._state[slot] = _DONE
                cnt = self._cnt[slot]
                self._spend[s] -= 1
                self._srec[s] -= cnt
                self.depth -= 1
                self.pending_records -= cnt
