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


def _u32(b, p):
    return b[p] | b[p + 1] << 8 | b[p + 2] << 16 | b[p + 3] << 24


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
        if (f.readinto(hdr) != ENTRY_HEADER_SIZE or _u32(hdr, 4) != eid
                or crc32(self._hdr28) != _u32(hdr, 28)):
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
            # the segment stays: persist the ack record (deleting it would be enough otherwise)
            sno = self._sno[s]
            f = self._af.f if self._af.sno == sno else self._af.open(self._ack_path(sno), "ab", sno)
            idx = eid - self._sfirst[s]
            struct.pack_into("<HH", self._ackbuf, 0, idx, idx ^ 0xFFFF)
            f.write(self._ackbuf)
            f.flush()
        self._state[slot] = _DONE
        self._spend[s] -= 1
        self._srec[s] -= cnt
        self.depth -= 1
        self.pending_records -= cnt
        self._trim()
        return OK

    def _corrupt(self, s, eid):
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

    def _load(self):
        """Rebuild the index from the files: drop torn tails, apply acks, clean up."""
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
        damaged = []  # ids of entries with a bad payload behind a good header
        tail = -1     # such an entry ending the newest segment so far: torn, or damaged?
        for sno in segs:
            self._next_sno = max(self._next_sno, sno + 1)
            first = self._seg_first(sno)
            if first < 0:
                os.remove(self._seg_path(sno))   # bad header: holds no returned append
                continue
            if self._nseg:
                self._supersede(sno, first, damaged)
                if 0 <= tail < first:
                    damaged.append(tail)         # ids went on after it: it was accepted, then damaged
            tail = -1
            found = []
            n, size, clean, at_eof = self._scan(sno, first, scratch, found)
            if n == 0:
                self._next_id = max(self._next_id, first)
                os.remove(self._seg_path(sno))   # holds no returned append
                continue
            if at_eof and not clean:
                tail = found.pop()               # decided by the next segment's first id
            damaged.extend(found)
            if self._nseg == self.max_segments:
                raise ValueError("outbox %s holds more than max_segments=%d segments: open it with a larger "
                                 "max_segments to drain it" % (self.root, self.max_segments))
            s = (self._tail + self._nseg) % self.max_segments
            self._nseg += 1
            self._sno[s] = sno
            self._sfirst[s] = first
            self._sn[s] = n
            self._spend[s] = n
            self._ssize[s] = size
            rec = 0
            for eid in range(first, first + n):
                rec += self._cnt[eid % self._cap]
            self._srec[s] = rec
            self.depth += n
            self.pending_records += rec
            self.bytes_used += size
            self._sealed = not clean
        if tail >= 0:
            self._unindex_from(self._newest(), tail)   # the newest segment's torn last write
        if self._nseg:
            s = self._newest()
            self._next_id = self._sfirst[s] + self._sn[s]
        for sno in acks:
            s = self._seg_index(sno)
            if s < 0:
                _remove(self._ack_path(sno))     # its segment is gone
            else:
                self._apply_acks(s)
        for eid in damaged:   # not acked before: count once, persist as done
            s = self._find(eid)
            if s >= 0:
                self._discard(s, eid, True)
        self._trim()

    def _supersede(self, sno, first, damaged):
        """Segment sno starts at entry `first`. Ids below what the segments before
        hold mean those entries' append() never returned (a torn last write, or
        a write error after the data got there) and the ids were given out again:
        forget the old copies. A gap or an overlap past them is corruption."""
        prev = self._newest()
        expected = self._sfirst[prev] + self._sn[prev]
        if first > expected or first < self._sfirst[self._tail]:
            raise ValueError("outbox %s: segment %s starts at entry %d, expected %d: flash corrupted, "
                             "or not written by this outbox" % (self.root, self._seg_path(sno), first, expected))
        if first == expected:
            return
        for i in range(self._nseg - 1, -1, -1):
            s = (self._tail + i) % self.max_segments
            if self._sfirst[s] + self._sn[s] <= first:
                break
            self._unindex_from(s, max(first, self._sfirst[s]))
        damaged[:] = [d for d in damaged if d < first]

    def _unindex_from(self, s, eid):
        """Forget the entries eid.. of segment s (appends that never returned)."""
        end = self._sfirst[s] + self._sn[s]
        if eid >= end:
            return
        cut = self._ssize[s] - self._off[eid % self._cap]
        for e in range(eid, end):
            slot = e % self._cap
            cnt = self._cnt[slot]
            self._state[slot] = _FREE
            self._spend[s] -= 1
            self._srec[s] -= cnt
            self.depth -= 1
            self.pending_records -= cnt
        self._sn[s] -= end - eid
        self._ssize[s] -= cut
        self.bytes_used -= cut

    def _seg_index(self, sno):
        for i in range(self._nseg):
            s = (self._tail + i) % self.max_segments
            if self._sno[s] == sno:
                return s
        return -1

    def _seg_first(self, sno):
        """The first entry id in a segment's header, or -1 if the header is bad."""
        hv = memoryview(self._hdr)[:SEG_HEADER_SIZE]
        with open(self._seg_path(sno), "rb") as f:
            if f.readinto(hv) != SEG_HEADER_SIZE:
                return -1
        magic, version, hsno, first = struct.unpack_from(_SEG_FMT, self._hdr, 0)
        if (magic != _SEG_MAGIC or version != _FORMAT_VERSION or hsno != sno
                or _u32(self._hdr, 16) != crc32(hv[:16])):
            return -1
        return first

    def _scan(self, sno, first, scratch, damaged):
        """Index the entries of a segment whose header is good. Returns (entries,
        valid bytes, clean, at_eof): at_eof, the entries end exactly at the end
        of the file; clean is False when a torn tail follows them (a bad entry
        header, a length past the end of the file) or when the last entry has a
        bad payload. An entry with a good header (own CRC) but a bad payload CRC
        is indexed and its id goes to `damaged`: behind other entries it was
        damaged on flash; as the last one of the file it may also be a torn
        write, which _load tells from the next segment's first id."""
        hdr = self._hdr
        with open(self._seg_path(sno), "rb") as f:
            size = f.seek(0, 2)
            f.seek(SEG_HEADER_SIZE)
            off = SEG_HEADER_SIZE
            n = 0
            sv = memoryview(scratch)
            while off < size:
                if size - off < ENTRY_HEADER_SIZE or f.readinto(hdr) != ENTRY_HEADER_SIZE:
                    return n, off, False, False
                length = _u32(hdr, 0)
                end = off + ENTRY_HEADER_SIZE + length
                if crc32(self._hdr28) != _u32(hdr, 28) or _u32(hdr, 4) != first + n or end > size:
                    return n, off, False, False
                crc = 0
                left = length
                while left:
                    k = min(left, len(scratch))
                    if f.readinto(sv[:k]) != k:
                        return n, off, False, False
                    crc = crc32(sv[:k], crc)
                    left -= k
                if crc != _u32(hdr, 24):
                    damaged.append(first + n)
                if n == self.max_entries:
                    raise ValueError("outbox %s: segment %s holds more than max_entries=%d entries: open it with "
                                     "a larger max_entries" % (self.root, self._seg_path(sno), self.max_entries))
                slot = (first + n) % self._cap
                self._off[slot] = off
                self._cnt[slot] = hdr[20] | hdr[21] << 8
                self._state[slot] = _PENDING
                n += 1
                off = end
            return n, off, not (damaged and damaged[-1] == first + n - 1), True

    def _apply_acks(self, s):
        with open(self._ack_path(self._sno[s]), "rb") as f:
            data = f.read()
        first = self._sfirst[s]
        for p in range(0, len(data) - _ACK_SIZE + 1, _ACK_SIZE):
            idx = data[p] | data[p + 1] << 8
            if (data[p + 2] | data[p + 3] << 8) != idx ^ 0xFFFF or idx >= self._sn[s]:
                continue   # torn or stray record: the entry stays pending (at-least-once)
            slot = (first + idx) % self._cap
            if self._state[slot] == _PENDING:
                self._state[slot] = _DONE
                cnt = self._cnt[slot]
                self._spend[s] -= 1
                self._srec[s] -= cnt
                self.depth -= 1
                self.pending_records -= cnt
