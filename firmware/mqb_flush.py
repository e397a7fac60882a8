# mqb_flush: sampling and flushing, a part of the App (mqb_app): a sample is a
# record in the open batch (mqb_record, mqb_codec), a full or old batch is sealed
# into the outbox (mqb_outbox); a stored batch is read back into the send
# buffer (split again if it is larger than this connection allows).
import gc
import time

import mqb_board as board
from mqb_codec import FULL, BatchEncoder, vbi_read, vbi_size
import mqb_outbox as O   # its results (one global: each name costs heap)

# (private const() copies of mqb_app's: folded into the bytecode, no global)
_HEALTH_CHANNELS = const(b"\x80\x81\x82\x83\x84\x85\x86\x87")
_SAMPLED = const(0)
_STORED_RECORDS = const(1)
_STORED_BATCHES = const(2)
_RECONNECTS = const(7)
_LAST_ERROR = const(9)
_PEAK_HEAP_LIVE = const(13)    # highest gc.mem_alloc() right after a gc.collect() (_measure_live)
_TOO_LARGE = const(17)
_AT_BATCH = const(2)
_HEALTH_SIZE = const(58)       # a health record: 18-byte header + 8 readings of 5 bytes (mqb_record)
_REFUSED_AT = const(18)


class Sampling:
    """The App's sampling and flush methods (mqb_app.App inherits them)."""

    def _fits(self, kind, size):
        """False (counted, logged once per payload limit) for a record that can never fit
        a batch of this connection: the broker's Maximum Packet Size leaves too little."""
        lim = self.enc.limit
        if vbi_size(size) + size <= lim:
            return True
        self.count[_TOO_LARGE] += 1
        if self.count[_REFUSED_AT] != lim:     # (in the counters: no new App attribute)
            self.count[_REFUSED_AT] = lim
            log("%s record of %d bytes can never fit a batch payload of %d bytes (the broker's Maximum "
                "Packet Size %d): refused, counted as too_large" % (kind, size, lim, self.client.max_send_size))
        return False

    def _sample(self):
        board.sample(self.values)
        if not self._fits("sample", self.record_size):
            return True
        seq = self.writer.sample(self.channels, self.values)
        if seq == FULL:
            if not self._seal():
                return False
            seq = self.writer.sample(self.channels, self.values)
        self._added(seq)
        self.count[_SAMPLED] += 1
        return True

    def _measure_live(self):
        """Collect, then note the heap in use: live objects only. Called once per
        health record and after each connect (never on the per-sample path)."""
        gc.collect()
        used = gc.mem_alloc()
        if used > self.count[_PEAK_HEAP_LIVE]:
            self.count[_PEAK_HEAP_LIVE] = used

    def _health(self):
        if not self._fits("health", _HEALTH_SIZE):
            return True
        v = self.health_values
        ob = self.outbox
        self._measure_live()
        v[0] = gc.mem_free()
        v[1] = ob.depth
        v[2] = ob.dropped_report()
        v[3] = self.count[_RECONNECTS]
        v[4] = self.count[_LAST_ERROR]
        v[5] = self.count[_SAMPLED]
        v[6] = ob.bytes_used
        v[7] = self.client.sub.released_report() if self.client.sub is not None else 0   # e2e acks only
        seq = self.writer.health(_HEALTH_CHANNELS, v)
        if seq == FULL:
            if not self._seal():
                return False
            seq = self.writer.health(_HEALTH_CHANNELS, v)
        self.batch_reported = v[2]     # this batch carries the report (before _added may seal it)
        self._added(seq)
        return True

    def _added(self, seq):
        enc = self.enc
        if enc.count == 1:
            self.at[_AT_BATCH] = time.ticks_ms()
            self.batch_first_seq = seq
        # seal as soon as the next record could not fit
        if enc.count >= enc.max_count or enc.limit - enc.payload_len < self.record_size + 2:
            self._seal()

    def _seal(self):
        """Move the open batch into the outbox. False if the outbox refused (policy stop)."""
        enc = self.enc
        if not enc.count:
            return True
        last = self.writer.seq - 1
        eid = self.outbox.append(enc.payload(), enc.count, self.writer.boot, self.batch_first_seq, last,
                                 self.batch_reported)
        if eid == O.FULL:
            if not self.paused:
                log("outbox full (policy stop): sampling paused")
            self.paused = True
            return False
        if self.paused:
            log("outbox has room again: sampling resumed")
        self.paused = False
        self.count[_STORED_RECORDS] += enc.count
        self.count[_STORED_BATCHES] += 1
        print("MQB-STORED %d %d %d %d" % (eid, self.writer.boot, self.batch_first_seq, last))
        enc.reset()
        self.batch_reported = -1
        return True

    def _load(self, eid, resend=False):
        """Read a stored batch into the send buffer; its length, or < 0 if it cannot be
        sent now (gone, corrupt, or re-stored in smaller batches). resend: an open message
        of a resumed session, kept whole above the budget (mqb_net._resend checks its
        exact size: the budget counts max_count's digits and a Topic Alias)."""
        n = self.outbox.read(eid, self.out_view)
        if n == O.CORRUPT:
            log("outbox entry %d failed its CRC: discarded, records counted dropped" % eid)
            return n
        if n == O.UNKNOWN:
            return n
        if n == O.TOO_SMALL:
            # stored with a larger flush.max_bytes than this boot's: read it into a
            # scratch buffer and store it again in batches that fit
            h = self.out.headroom
            try:
                scratch = bytearray(h + self.outbox.entry_bytes)
            except MemoryError:
                log("outbox entry %d is larger than the send buffer and no scratch buffer fits in RAM: "
                    "kept, tried again on the next connection" % eid)
                return O.TOO_SMALL
            return self._split(eid, self.outbox.read(eid, memoryview(scratch)[h:]), scratch)
        if n > self.out.limit and not resend:
            return self._split(eid, n, self.out.buf)
        self.out.load(n, self.outbox.entry_records)
        return n

    def _split(self, eid, n, buf):
        """A stored batch (its n payload bytes at buf[headroom:]) larger than this
        connection allows: store its sub-messages again as batches that fit, then
        remove the original. Nothing is dropped. If the outbox refuses a part (policy
        stop, outbox full), the original is kept and sent whole later; the parts
        already stored then arrive twice, which downstream de-duplication absorbs."""
        ob = self.outbox
        boot, seq = ob.entry_boot, ob.entry_first_seq
        h = self.out.headroom
        limit = min(self.out.limit, ob.max_payload)
        try:
            part = BatchEncoder(bytearray(h + limit), h, self.out.max_count, limit)
        except MemoryError:
            log("outbox entry %d (%d bytes) needs splitting but no buffer fits in RAM: kept" % (eid, n))
            return O.TOO_SMALL
        pos, end = h, h + n
        big = 0                      # records that can never fit this connection: dropped, counted
        while pos < end:
            k = vbi_read(buf, pos, end)
            if k < 0:
                ob.discard(eid)      # the entry passed its CRC, so this cannot happen unless RAM is corrupt
                log("outbox entry %d holds a malformed batch: discarded, records counted dropped" % eid)
                return O.CORRUPT
            start = pos + vbi_size(k)
            pos = start + k
            if vbi_size(k) + k > limit:
                if part.count:       # a part's seqs stay contiguous: store it before the gap
                    if ob.append(part.payload(), part.count, boot, seq, seq + part.count - 1) < 0:
                        log("outbox full while splitting entry %d: kept whole, sent again later" % eid)
                        return O.TOO_SMALL
                    seq += part.count
                    part.reset()
                seq += 1
                big += 1
                continue
            if not part.add(memoryview(buf)[start:start + k]):
                if ob.append(part.payload(), part.count, boot, seq, seq + part.count - 1) < 0:
                    log("outbox full while splitting entry %d: kept whole, sent again later" % eid)
                    return O.TOO_SMALL
                seq += part.count
                part.reset()
                part.add(memoryview(buf)[start:start + k])
        if part.count and ob.append(part.payload(), part.count, boot, seq, seq + part.count - 1) < 0:
            log("outbox full while splitting entry %d: kept whole, sent again later" % eid)
            return O.TOO_SMALL
        if big:                      # counted before the ack: a power cut between may count them twice, never 0 times
            ob.count_dropped(big)
            self.count[_TOO_LARGE] += big
            log("outbox entry %d: %d record(s) larger than this connection's batch payload limit (%d bytes) "
                "can never be sent: dropped, counted (too_large, dropped_total)" % (eid, big, limit))
        ob.ack(eid)
        log("outbox entry %d (%d bytes) exceeded this connection's limit (%d): re-stored in smaller batches"
            % (eid, n, limit))
        return -1


def log(msg):
    print("mqb:", msg)
