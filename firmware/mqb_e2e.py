# mqb_e2e: end-to-end acknowledgements on the device (docs/e2e-ack.md, section 3).
#
# With e2e acks on, a batch leaves the outbox only when a recorder says it is
# durable in the landing zone: every batch PUBLISH carries batch-seq "B:F-L"
# (mqb_packet_e2e.BatchSeq), the client subscribes to mqbatch/<device>/ack (this
# E2E is its mqb_sub.Subscriber), and an ack range covering an outbox entry
# removes it (an outbox ack record: acks never rewrite a segment). An entry
# PUBACKed by the broker waits for its e2e ack; without one within
# resend_after_s it is published again (a new PUBLISH, DUP 0).
#
# Flow control is the outbox's (issue 22): every entry sent and not yet acknowledged
# end to end has a slot in a RAM table as large as the outbox's index (slot = entry
# id modulo its capacity: entry id, boot, first and last seq, state, deadline), so an
# ack is matched without reading flash and the device publishes its whole backlog
# while the broker accepts it. A PUBACKed entry stays in the outbox until its e2e ack
# or until the outbox needs room: then (Outbox.held is this E2E) it leaves counted
# released_unconfirmed (release(), persisted), not dropped. Resends are paced (pop): an entry is published
# again at once only when acks came back for entries PUBACKed resend_after_s after it
# (it was overtaken: its ack is not coming); otherwise, with no ack for resend_after_s,
# only the oldest overdue entry is, as a probe, the pause doubling with each probe that
# brings no ack (up to 16 x resend_after_s). So an outage of the recorder adds a few
# copies to the broker's queue, not the backlog again every resend_after_s. After a
# reboot the table is empty and every entry in the outbox is sent again.
#
# Imported by mqb_app only when e2e_ack.enabled. Heap is per function and per
# new name (mqb_packet_e2e): the methods and attributes reuse names the firmware
# has (find, add, ack, discard, pop; count, values, delay, _eid, _p, _order,
# _state), the counters are one array, the constants private.
# Checking an ack's ranges against the table allocates nothing (values below
# 2**30 on a 32-bit port; tests/mpy/mp_test_e2e.py); removing an entry it covers
# writes the outbox's ack record, the same file write as a PUBACK's without e2e.
import time
from array import array
from mqb_boot import SlotCounter
from mqb_packet_e2e import BatchSeq
from mqb_sub import Subscriber

_SENT = const(1)            # PUBLISH sent, its PUBACK not yet in
_WAIT = const(2)            # PUBACKed: awaiting the e2e ack (deadline: PUBACK + resend_after_s)
_RESENT = const(3)          # PUBACKed before, published again: its new PUBACK not yet in
_MAX_SHIFT = const(4)       # probes: resend_after_s << 4 apart at most
_MAX_RANGES = const(64)
# mqb_app's App.count indexes (_ACKED_BATCHES, _ACKED_RECORDS)
_ACKED_BATCHES = const(3)
_ACKED_RECORDS = const(4)
# E2E.values
_RESENDS = const(0)         # entries published again for want of an e2e ack (mqb_app counts them)
_BAD_ACKS = const(1)        # ack payloads breaking docs/e2e-ack.md section 2
_COVERED = const(2)         # outbox entries an ack range removed
_NEXT = const(3)            # ticks_ms: no probe before
_TRIES = const(4)           # probes since the last ack
_LATEST = const(5)          # the latest deadline of a PUBACKed entry an ack covered
_HEARD = const(6)           # 1: _LATEST is set
_DIRTY = const(7)           # 1: pop() looks again before _NEXT (an ack moved _LATEST)
_BASE = const(8)            # released_report() counts from this total (the mark at boot)
_LAST = const(9)            # what released_report() returned last (-1: never)


def make_config(cfg, error):
    """mqb_app.make_config's part for cfg["e2e_ack"] (present): its defaults
    (enabled false, resend_after_s 30) and checks, in mqb_app's style; error:
    mqb_app.ConfigError. When e2e acks are off this module is unloaded again."""
    e = cfg["e2e_ack"]
    if not isinstance(e, dict):
        raise error("e2e_ack must be an object, got %r" % (e,))
    e = cfg["e2e_ack"] = dict(e)       # the defaults below never change the caller's dict
    for k in e:
        if k != "enabled" and k != "resend_after_s":
            raise error("e2e_ack.%s: unknown setting (e2e_ack has enabled and resend_after_s)" % k)
    on = e.setdefault("enabled", False)
    r = e.setdefault("resend_after_s", 30)
    if on is not True and on is not False:
        raise error("e2e_ack.enabled must be a boolean, got %r" % (on,))
    if isinstance(r, bool) or not isinstance(r, (int, float)):
        raise error("e2e_ack.resend_after_s must be a number, got %r" % (r,))
    if not isinstance(r, int) or not 1 <= r <= 86400:
        raise error("e2e_ack.resend_after_s must be a whole number of seconds 1..86400, got %r" % (r,))
    if on and cfg["topic"].format(device_id=cfg["device_id"]) != "mqbatch/%s/telemetry" % cfg["device_id"]:
        raise error("e2e_ack.enabled needs topic mqbatch/{device_id}/telemetry (the recorder acks only "
                    "that topic, on mqbatch/<device_id>/ack), got topic %r" % cfg["topic"])
    if not on:
        del cfg["e2e_ack"]             # mqb_app: no e2e_ack, no e2e acks
        import sys
        for m in ("mqb_e2e", "mqb_sub", "mqb_packet_e2e"):
            sys.modules.pop(m, None)   # not used: give their heap back


def init(client, topic, cfg, outbox, count, log):
    """The E2E of an App (mqb_app calls this: one name fewer in its module)."""
    return E2E(client, topic, cfg["resend_after_s"] * 1000, outbox, count, log)


class E2E(Subscriber):
    """The device side of e2e acks for one App (mqb_app): the subscription to
    the ack topic of `topic` (the batch topic, its last level replaced by "ack")
    on client, the table of entries sent, the batch-seq property (self.seq, which mqb_app makes
    mqb_packet_build.batch_seq). delay: resend_after_s in
    ms; outbox: the App's Outbox (its held is this E2E); count: the App's counters
    (an entry an ack range covers counts as acked there); log: the App's log."""

    def __init__(self, client, topic, delay, outbox, count, log):
        Subscriber.__init__(self, client, topic[:topic.rfind(b"/") + 1] + b"ack")
        self.delay = delay
        self.outbox = outbox
        self.count = count
        self.values = array("i", bytes(40))     # _RESENDS .. _LAST
        self.log = log
        self.seq = BatchSeq()
        # slot i = entry id % the outbox's capacity: _eid[i] (-1: free), _p[3 i .. 3 i + 2] =
        # boot, first seq, last seq, _state[i] _SENT / _WAIT / _RESENT, _order[i] the ticks_ms
        # deadline (PUBACK + delay) of a PUBACKed entry. 21 bytes per outbox entry.
        n = outbox.max_segments * outbox.max_entries
        self._eid = array("i", b"\xff" * (4 * n))
        self._p = array("I", bytes(12 * n))
        self._order = array("i", bytes(4 * n))
        self._state = bytearray(n)
        # released_unconfirmed: the total, and the total a health record on flash carried (the
        # mark this boot's report counts from), two-slot counter files beside the outbox's dropped
        self._rel = SlotCounter(outbox.root + "/released", b"RELS")
        self._mark = SlotCounter(outbox.root + "/relrep", b"RPTR")
        self.values[_LAST] = -1
        self.rebase()
        outbox.held = self

    def connected(self, session_present):
        """After a CONNACK (mqb_sub), and before mqb_app computes the batch budget:
        batch-seq at its largest (46 bytes), so the budget holds for any batch."""
        Subscriber.connected(self, session_present)
        self.seq.set(0xFFFFFFFF, 0xFFFFFFFF, 0xFFFFFFFF)

    def find(self, eid):
        """The slot of an entry in the table (sent, awaiting its PUBACK or its e2e ack), or -1."""
        i = eid % len(self._state) if eid >= 0 else 0
        return i if eid >= 0 and self._eid[i] == eid else -1

    def add(self, eid):
        """The entry was just published with the values of self.seq."""
        i = self.find(eid)
        if i >= 0:
            self._state[i] = _RESENT if self._state[i] >= _WAIT else _SENT
            return
        i = eid % len(self._state)
        self._eid[i] = eid
        w = self._p
        s = self.seq
        w[3 * i] = s.boot
        w[3 * i + 1] = s.first_seq
        w[3 * i + 2] = s.last_seq
        self._state[i] = _SENT

    def discard(self, eid):
        """This PUBLISH of the entry was not delivered (refused, lost with a session) or
        cannot be sent (gone, re-stored split): it leaves the table, unless the broker
        accepted an earlier copy that is still in the outbox (it awaits its e2e ack again,
        from now)."""
        i = self.find(eid)
        if i >= 0:
            if self._state[i] == _RESENT and self.outbox.records(eid) >= 0:
                self._state[i] = _WAIT
                self._order[i] = time.ticks_add(time.ticks_ms(), self.delay)
            else:
                self._eid[i] = -1

    def ack(self, eid):
        """A success PUBACK (or a QoS 0 PINGRESP) for the entry: True if it now awaits
        its e2e ack (the caller keeps it), False if the caller removes it: it is not
        in the table (an ack range came first), or the ack subscription was refused
        on this connection (PUBACK ends the line there)."""
        i = self.find(eid)
        if i < 0:
            return False
        if self.code is not None and self.code >= 0x80:
            self._eid[i] = -1
            return False
        self._state[i] = _WAIT
        self._order[i] = time.ticks_add(time.ticks_ms(), self.delay)
        return True

    def held(self, first, end):
        """Outbox: records of the entries first..end-1 the broker accepted (PUBACK) that
        await their e2e ack."""
        n = 0
        ids = self._eid
        st = self._state
        for eid in range(first, end):
            i = eid % len(st)
            if ids[i] == eid and st[i] >= _WAIT:
                r = self.outbox.records(eid)
                if r > 0:
                    n += r
        return n

    def release(self, n):
        """Outbox: n records of entries the broker accepted leave unconfirmed (persisted first)."""
        self._rel.store(self._rel.value + n)

    def released_report(self):
        """The health record's released_unconfirmed (docs/records.md): since this boot, plus what
        earlier boots released after their last stored health record (like Outbox.dropped_report)."""
        v = self.values
        v[_LAST] = self._rel.value - v[_BASE]
        return v[_LAST]

    def reported(self):
        """Outbox.append: the batch carrying the last released_report() value is on flash."""
        v = self.values
        if v[_LAST] >= 0 and v[_BASE] + v[_LAST] > self._mark.value:
            self._mark.store(v[_BASE] + v[_LAST])

    def rebase(self):
        """Count released_report() from what was reported (at boot, and Outbox.rebase)."""
        self.values[_BASE] = self._mark.value

    def pop(self, now):
        """The entry to publish again (its slot becomes _RESENT; the caller publishes it and
        counts it), or -1: the oldest PUBACKed entry if acks came back for entries PUBACKed
        delay or more after it, else, once no ack came for delay, the oldest overdue one as
        a probe, the next probe after delay << probes (at most 16 delay) unless an ack comes."""
        v = self.values
        if not v[_DIRTY] and time.ticks_diff(now, v[_NEXT]) < 0:
            return -1
        v[_DIRTY] = 0
        ids = self._eid
        st = self._state
        b = -1
        for i in range(len(st)):
            if st[i] == _WAIT and ids[i] >= 0 and (b < 0 or ids[i] < ids[b]):
                b = i
        if b >= 0 and self.outbox.records(ids[b]) < 0:
            ids[b] = -1                  # gone from the outbox (released, re-stored split): look again
            v[_DIRTY] = 1
            return -1
        due = time.ticks_diff(now, v[_NEXT]) >= 0
        if b < 0:
            if due:
                v[_NEXT] = time.ticks_add(now, self.delay)
            return -1
        d = self._order[b]
        if not (v[_HEARD] and time.ticks_diff(v[_LATEST], d) >= self.delay):   # not overtaken
            if not due:
                return -1
            if time.ticks_diff(now, d) < 0:
                v[_NEXT] = d
                return -1
            v[_NEXT] = time.ticks_add(now, self.delay << min(v[_TRIES], _MAX_SHIFT))   # a probe
            v[_TRIES] += 1
        st[b] = _RESENT
        v[_DIRTY] = 1
        return ids[b]

    def summary(self, s):
        """Add the e2e counters to the App's summary dict s."""
        c = self.values
        s.update({"e2e_resends": c[_RESENDS], "e2e_bad_acks": c[_BAD_ACKS], "e2e_acked_batches": c[_COVERED],
                  "e2e_sub_refused": self.refused, "released_unconfirmed": self._rel.value})

    # -- the subscription (mqb_sub calls these) -------------------------------------

    def on_suback(self, code, reason):
        if code >= 0x80:
            from mqb_packet import reason_name
            self.log("e2e ack subscription refused: SUBACK 0x%02x %s (%s); on this connection a PUBACK ends "
                     "the line (%d refusals)" % (code, reason_name(code), reason, self.refused))

    def on_message(self, topic, buf, start, end):
        """An ack PUBLISH: check its payload (docs/e2e-ack.md section 2: version 1,
        length 1 + 12 N, 1 <= N <= 64, F <= L in each range), then remove every
        table entry of the same boot whose first..last a range covers."""
        if topic is not self.topic:
            self.log("PUBLISH on %r, not the ack topic: ignored" % (topic,))
            return
        n = end - start
        k = (n - 1) // 12
        bad = None
        if n < 1 or buf[start] != 1:
            bad = "not version 1"
        elif n < 13 or (n - 1) % 12 or k > _MAX_RANGES:
            bad = "length not 1 + 12 N with 1 <= N <= 64"
        else:
            for r in range(k):
                p = start + 1 + 12 * r
                if (buf[p + 4] | buf[p + 5] << 8 | buf[p + 6] << 16 | buf[p + 7] << 24
                        > buf[p + 8] | buf[p + 9] << 8 | buf[p + 10] << 16 | buf[p + 11] << 24):
                    bad = "a range with first > last"
        c = self.values
        if bad is not None:
            c[_BAD_ACKS] += 1
            if c[_BAD_ACKS] == 1 or c[_BAD_ACKS] % 100 == 0:
                self.log("bad e2e ack (%s, %d bytes): ignored (%d so far)" % (bad, n, c[_BAD_ACKS]))
            return
        ids = self._eid
        st = self._state
        w = self._p
        ob = self.outbox
        for r in range(k):
            p = start + 1 + 12 * r
            b = buf[p] | buf[p + 1] << 8 | buf[p + 2] << 16 | buf[p + 3] << 24
            f = buf[p + 4] | buf[p + 5] << 8 | buf[p + 6] << 16 | buf[p + 7] << 24
            last = buf[p + 8] | buf[p + 9] << 8 | buf[p + 10] << 16 | buf[p + 11] << 24
            for i in range(len(st)):
                eid = ids[i]
                if eid >= 0 and w[3 * i] == b and f <= w[3 * i + 1] and w[3 * i + 2] <= last:
                    ids[i] = -1
                    c[_COVERED] += 1
                    if st[i] >= _WAIT:          # PUBACKed: acks are coming back
                        if not c[_HEARD] or time.ticks_diff(self._order[i], c[_LATEST]) > 0:
                            c[_LATEST] = self._order[i]
                            c[_DIRTY] = 1
                        c[_HEARD] = 1
                        c[_TRIES] = 0
                        c[_NEXT] = time.ticks_add(time.ticks_ms(), self.delay)
                    recs = ob.records(eid)
                    if ob.ack(eid) == 0:        # else gone already (dropped): nothing to count
                        self.count[_ACKED_BATCHES] += 1
                        self.count[_ACKED_RECORDS] += recs
