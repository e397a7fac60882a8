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
# record (or deletes the segment when that was its last pending entry): acks never
# rewrite a segment. docs/outbox.md: which duplicates a power cut can cause (never losses).
# Flash rot: opening never fails on what a segment holds (mqb_outbox_recover).
# This module is the queue and its counters; the bytes on flash are mqb_outbox_format's,
# opening (index, recovery) mqb_outbox_recover's, imported by the constructor only.
import os
from array import array
from mqb_boot import SlotCounter
import mqb_outbox_format as F   # the on-flash format (one global: each name costs heap)

# Results (entry ids are >= 0)
OK = 0
FULL = -1       # append: policy "stop" and no room; nothing was written
UNKNOWN = -2    # no pending entry with this id (never appended, acked, or dropped)
CORRUPT = -3    # read: the entry failed its check on flash; discarded, records counted dropped
TOO_SMALL = -4  # read: the entry is larger than the caller's buffer (its size: entry_bytes); nothing changed

DROP_OLDEST = "drop_oldest"
STOP = "stop"

_FREE = const(0)
_PENDING = const(1)
_DONE = const(2)
_LOST = const(3)       # on open: an entry that cannot be read back (counted dropped, then acked)


class Outbox:
    """Bounded, power-cut-safe FIFO of batch payloads on flash (docs/outbox.md).

    root: directory (created if missing). segment_size: bytes per segment file,
    including its 20-byte header. max_segments (>= 2) x segment_size bounds the
    flash used. max_entries: entries per segment (bounds the RAM index:
    max_segments x max_entries x 7 bytes). policy: DROP_OLDEST (when full, delete
    the oldest segment and count its pending records as dropped) or STOP (append
    returns FULL; the caller stops sampling until acks free room).
    held: None, or the mqb_e2e.E2E: held.held(first, end) -> records of entries first..end-1
    the broker accepted, awaiting their e2e ack; making room, they leave by held.release(n)
    (released_unconfirmed), not dropped; with STOP a segment of only those makes room too.
    """
    held = None     # a class attribute: one more instance attribute can grow the dict (heap)

    def __init__(self, root, segment_size=16384, max_segments=8, max_entries=32, policy=DROP_OLDEST):
        if policy not in (DROP_OLDEST, STOP):
            raise ValueError("policy %r: must be %r or %r" % (policy, DROP_OLDEST, STOP))
        self.root = root
        self.max_segments = max_segments
        self.max_entries = max_entries
        self.policy = policy
        self.max_payload = segment_size - F.SEG_HEADER_SIZE - F.ENTRY_HEADER_SIZE
        F._mkdir(root)
        F._check_capacity(root, max_segments, segment_size, max_entries)   # ValueError: what and why
        cap = max_segments * max_entries
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
        self._hf = F._OpenFile()                # the newest segment, "a+b"
        self._rf = F._OpenFile()                # reader of an older segment
        self._af = F._OpenFile()                # appender of an ack file
        self._hdr = bytearray(F.ENTRY_HEADER_SIZE)
        F._native_check(self._hdr)
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
        import mqb_outbox_recover      # opening only (the layer below the queue)
        mqb_outbox_recover.load(self)
        import sys
        sys.modules.pop("mqb_outbox_recover", None)   # not needed once open: its heap back

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
        """Start the dropped_report() count (and held's) again from what was reported: call
        it when the boot number changes without a reboot (RecordWriter.renew_boot)."""
        self._base = self._reported.value
        if self.held:
            self.held.rebase()

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
                             % (n, self.max_payload + F.SEG_HEADER_SIZE + F.ENTRY_HEADER_SIZE, self.max_payload))
        if not 0 <= records <= 0xFFFF:
            raise ValueError("records %d: must be 0..65535" % records)
        if reported > self._dropped.value - self._base:
            raise ValueError("reported %d is more than dropped_report() = %d"
                             % (reported, self._dropped.value - self._base))
        h = self._newest()
        if (self._sealed or self._sn[h] >= self.max_entries
                or self._ssize[h] + n > self.max_payload + F.SEG_HEADER_SIZE):
            if self._roll() == FULL:
                return FULL
            h = self._newest()
        eid = self._next_id
        f = self._head_file()
        try:
            F._write_entry(f, self._hdr, payload, n, eid, boot, first_seq, last_seq, records)
        except OSError:
            self._seal()  # what reached the file is unknown (or the flash is full): never append behind it
            raise
        slot = eid % len(self._state)
        self._off[slot] = self._ssize[h]
        self._cnt[slot] = records
        self._state[slot] = _PENDING
        self._sn[h] += 1
        self._spend[h] += 1
        self._srec[h] += records
        self._ssize[h] += F.ENTRY_HEADER_SIZE + n
        self.bytes_used += F.ENTRY_HEADER_SIZE + n
        self.depth += 1
        self.pending_records += records
        self._next_id = eid + 1
        if reported >= 0 and self._base + reported > self._reported.value:
            self._reported.store(self._base + reported)
        if reported >= 0 and self.held:
            self.held.reported()          # the same batch carries released_unconfirmed
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
                if self._state[eid % len(self._state)] == _PENDING:
                    out[k] = eid
                    k += 1
                eid += 1
        return k

    def records(self, eid):
        """Records in a pending entry (for batch-size), or UNKNOWN."""
        if self._find(eid) < 0:
            return UNKNOWN
        return self._cnt[eid % len(self._state)]

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
        hdr = self._hdr
        if F._header_at(hdr, f, self._off[eid % len(self._state)], 0, eid, 0, 0) < 0:   # checked, one flipped bit fixed
            return self._corrupt(s, eid)
        n = F._u32(hdr, 0)
        if n > len(dest):
            self.entry_bytes = n
            return TOO_SMALL
        if f.readinto(dest, n) != n:
            return self._corrupt(s, eid)
        if verify and not F._crc(dest, n, hdr, 24, False):
            return self._corrupt(s, eid)
        self.entry_boot = F._u32(hdr, 8)
        self.entry_first_seq = F._u32(hdr, 12)
        self.entry_last_seq = F._u32(hdr, 16)
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
        """Close the files (all on flash already): all are closed, the first error raised after."""
        err = None
        for h in (self._hf, self._rf, self._af):
            try:
                h.close()
            except OSError as e:
                err = err or e
        if err is not None:
            raise err

    # ---- segments ----------------------------------------------------------------

    def _newest(self):
        return (self._tail + self._nseg - 1) % self.max_segments

    def _find(self, eid):
        """Ring index of the segment holding pending entry eid, or -1."""
        for i in range(self._nseg):
            s = (self._tail + i) % self.max_segments
            first = self._sfirst[s]
            if first <= eid < first + self._sn[s]:
                return s if self._state[eid % len(self._state)] == _PENDING else -1
        return -1

    def _head_file(self):
        if self._hf.f is None:
            sno = self._sno[self._newest()]
            if self._rf.sno == sno:
                self._rf.close()
            self._hf.open(F._seg_path(self.root, sno), "a+b", sno)
        return self._hf.f

    def _reader(self, s):
        if s == self._newest() and not self._sealed:
            return self._head_file()   # one handle sees its own appends (littlefs)
        sno = self._sno[s]
        if self._rf.sno != sno:
            self._rf.open(F._seg_path(self.root, sno), "rb", sno)
        return self._rf.f

    def _seal(self):
        self._sealed = True
        self._hf.close()

    def _roll(self):
        """Start a new newest segment, making room first. OK or FULL."""
        if self._nseg == self.max_segments:
            t = self._tail
            if self._spend[t]:
                held = self.held.held(self._sfirst[t], self._sfirst[t] + self._sn[t]) if self.held else 0
                if self.policy == STOP and held < self._srec[t]:
                    return FULL
                if held:
                    self.held.release(held)          # counted before the data goes
                self.count_dropped(self._srec[t] - held)
            self._delete_oldest()
        self._seal()
        sno = self._next_sno    # no file is numbered >= _next_sno (load() made it so): no stranger
        s = (self._tail + self._nseg) % self.max_segments
        self._sno[s] = sno
        self._sfirst[s] = self._next_id
        self._sn[s] = 0
        self._spend[s] = 0
        self._srec[s] = 0
        self._ssize[s] = F.SEG_HEADER_SIZE
        self._nseg += 1
        self._next_sno = sno + 1
        self._sealed = False
        f = self._head_file()
        try:
            F._write_seg_header(f, self._hdr, sno, self._next_id)
        except OSError:
            self._seal()
            raise
        self.bytes_used += F.SEG_HEADER_SIZE   # flushed together with the first entry
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
        os.remove(F._seg_path(self.root, sno))      # the segment first: an orphan ack file is harmless
        F._remove(F._seg_path(self.root, sno, "a"))
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
        slot = eid % len(self._state)
        cnt = self._cnt[slot]
        if dropped:                   # counted before the entry goes
            held = self.held.held(eid, eid + 1) if self.held else 0
            if held:
                self.held.release(held)
            self.count_dropped(cnt - held)
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
        sno = self._sno[s]
        f = self._af.f if self._af.sno == sno else self._af.open(F._seg_path(self.root, sno, "a"), "ab", sno)
        F._write_ack(f, self._hdr, eid - self._sfirst[s])   # _hdr: scratch

    def _corrupt(self, s, eid):
        self._damage("read", eid, eid + 1, self._cnt[eid % len(self._state)])
        self._discard(s, eid, True)
        return CORRUPT

    def _damage(self, reason, first, end, records):
        """Note what was found damaged (the last 8 findings are kept)."""
        if len(self.damage) >= 8:
            self.damage.pop(0)
        self.damage.append((reason, first, end, records))

