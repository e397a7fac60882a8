# MicroPython tests of firmware/mqb_e2e.py (end-to-end acks, docs/e2e-ack.md) with a
# real Outbox on the host filesystem: ack payload rules, the table of entries sent (as
# large as the outbox: sent, PUBACKed, overdue, covered by a range), removal recorded
# durably on flash, paced resends, an outbox that needs room releasing PUBACKed entries
# (released_unconfirmed) and dropping only what the broker never accepted (dropped_total),
# bad acks counted and logged once, no allocation when an ack is matched, the config checks.
import struct
import time
from array import array
import mqb_e2e as M
from mqb_client import Client
from mqb_outbox import Outbox, UNKNOWN, FULL, STOP
from outbox_util import TmpDir, assert_no_alloc, payload, raises

ACK = b"mqbatch/d/ack"
WINDOW = 8                      # entries in flight in the allocation test
ACKED_BATCHES, ACKED_RECORDS = 3, 4      # mqb_app's App.count indexes
RESENDS, BAD_ACKS, COVERED = 0, 1, 2     # E2E.values


def ack(*ranges, version=1):
    return bytes((version,)) + b"".join(struct.pack("<III", b, f, last) for b, f, last in ranges)


class Rig:
    """An outbox with entries of 10 records each (boot 3, seq 0.., 10 per entry) and
    an E2E over a client that is never connected."""

    def __init__(self, root, entries, resend_ms=1000, ob=(4096, 4, 16), policy="drop_oldest"):
        self.ob = Outbox(root, ob[0], ob[1], ob[2], policy)
        self.eids = [self.ob.append(payload(i, 50), 10, 3, 10 * i, 10 * i + 9) for i in range(entries)]
        self.logs = []
        self.count = array("i", bytes(4 * 17))
        self.client = Client(None, b"d")
        self.e = M.E2E(self.client, ACK, resend_ms, self.ob, self.count, self.logs.append)
        assert self.client.sub is self.e

    def send(self, eid):
        buf = bytearray(100)
        assert self.ob.read(eid, buf) == 50
        self.e.seq.set(self.ob.entry_boot, self.ob.entry_first_seq, self.ob.entry_last_seq)
        self.e.add(eid)

    def deliver(self, data):
        buf = bytearray(b"xx" + data + b"yy")      # the payload in place, inside a bigger buffer
        self.e.on_message(self.e.topic, buf, 2, 2 + len(data))

    def pending(self):
        out = array("i", [0] * 64)
        return list(out[:self.ob.peek(out)])


def test_ack_payload_rules():
    good = (ack((3, 0, 9)), ack(*[(3, i, i) for i in range(64)]), ack((0x3FFFFFFF, 0, 0x3FFFFFFF)))
    bad = (b"", ack((3, 0, 9), version=2), b"\x01", ack((3, 0, 9)) + b"\x00", ack((3, 0, 9))[:-1],
           ack(*[(3, i, i) for i in range(65)]), ack((3, 0, 9), (3, 5, 4)))
    with TmpDir("e2e") as d:
        r = Rig(d, 1)
        for data in good:
            r.deliver(data)
        assert r.e.values[BAD_ACKS] == 0
        for data in bad:
            r.deliver(data)
        assert r.e.values[BAD_ACKS] == len(bad)
        assert len(r.logs) == 1 and "not version 1" in r.logs[0], r.logs       # logged once


def test_pubacked_entries_wait_for_a_covering_range_then_leave_durably():
    with TmpDir("e2e") as d:
        r = Rig(d, 4)
        e = r.e
        for eid in r.eids:
            r.send(eid)
            assert e.find(eid) >= 0
        e.code = 1                             # SUBACK granted QoS 1
        assert all(e.ack(eid) for eid in r.eids)
        assert r.ob.depth == 4
        # one range covering entries 0 and 1 (seq 0..19), one of another boot, one partial
        r.deliver(ack((3, 0, 19), (4, 30, 39), (3, 30, 35)))
        assert r.pending() == r.eids[2:] and r.e.values[COVERED] == 2
        assert (r.count[ACKED_BATCHES], r.count[ACKED_RECORDS]) == (2, 20)
        assert e.find(r.eids[0]) < 0 and e.find(r.eids[3]) >= 0
        # a range over what was acked before changes nothing (idempotent)
        r.deliver(ack((3, 0, 39)))
        assert r.ob.depth == 0 and r.count[ACKED_BATCHES] == 4 and r.e.values[BAD_ACKS] == 0
        r.ob.close()
        assert Outbox(d, 4096, 4, 16).depth == 0     # the removal is on flash (ack records)


def test_an_ack_before_the_puback_removes_the_entry_and_the_puback_is_ignored():
    with TmpDir("e2e") as d:
        r = Rig(d, 1)
        r.send(r.eids[0])
        r.deliver(ack((3, 0, 9)))
        assert r.ob.records(r.eids[0]) == UNKNOWN and r.e.find(r.eids[0]) < 0
        assert r.e.ack(r.eids[0]) is False       # the caller's outbox ack then finds nothing


def test_overdue_entries_come_back_for_resend_and_a_refused_subscription_ends_the_line():
    with TmpDir("e2e") as d:
        r = Rig(d, 2, resend_ms=1000)
        e = r.e
        r.send(r.eids[0])
        r.send(r.eids[1])
        e.code = 1
        assert e.ack(r.eids[0])
        now = time.ticks_ms()
        assert e.pop(now) == -1                              # not yet
        assert e.pop(time.ticks_add(now, 1100)) == r.eids[0]  # after resend_after_s
        assert e.pop(time.ticks_add(now, 1100)) == -1        # handed out once, now "resent"
        assert e.find(r.eids[0]) >= 0
        e.code = 0x87                                        # refused on this connection
        assert e.ack(r.eids[1]) is False and e.find(r.eids[1]) < 0
        assert r.ob.depth == 2                               # the caller removes it (PUBACK ends the line)


def test_the_whole_outbox_may_await_e2e_acks_and_gone_entries_leave_the_table():
    """No window of 8 (issue 22): every entry of the outbox can be sent and PUBACKed."""
    with TmpDir("e2e") as d:
        r = Rig(d, 64)                           # the outbox holds 4 x 16 = 64 entries
        r.e.code = 1
        for eid in r.eids:
            r.send(eid)
            assert r.e.ack(eid)
        assert all(r.e.find(eid) >= 0 for eid in r.eids) and r.ob.depth == 64
        r.ob.discard(r.eids[3])                  # e.g. refused for good: the table skips it
        r.e.discard(r.eids[4])                   # PUBACKed, not resent: leaves the table
        assert r.e.find(r.eids[4]) < 0
        r.deliver(ack((3, 0, 639)))
        assert r.ob.depth == 1 and r.pending() == [r.eids[4]]   # it is sent again as new


def released(e):
    s = {}
    e.summary(s)
    return s["released_unconfirmed"]


def problems(e, ob, rel, dropped):
    """What is wrong with the two counters (the E2E's released_unconfirmed, the outbox's
    dropped_total) and their since-boot reports for the health record."""
    out = []
    if released(e) != rel:
        out.append("released_unconfirmed %d, expected %d" % (released(e), rel))
    if ob.dropped_total != dropped:
        out.append("dropped_total %d, expected %d" % (ob.dropped_total, dropped))
    if e.released_report() != rel or ob.dropped_report() != dropped:
        out.append("reports %d / %d" % (e.released_report(), ob.dropped_report()))
    return out


def fill_and_roll(d, broken=False):
    """Two segments of 4 entries of 10 records: in the oldest, 3 entries PUBACKed and
    awaiting their e2e ack and 1 sent without a PUBACK; in the newest, 2 PUBACKed and 2
    never sent. Two appends past full roll both segments out."""
    r = Rig(d, 8, ob=(1024, 2, 4))
    if broken:
        r.ob.held = None                         # the accounting before issue 22: all "dropped"
    r.e.code = 1
    for k in (0, 1, 2, 4, 5):
        r.send(r.eids[k])
        assert r.e.ack(r.eids[k])
    r.send(r.eids[3])
    first = problems(r.e, r.ob, 0, 0)
    assert r.ob.append(payload(8, 50), 10, 3, 80, 89) >= 0       # the oldest segment goes
    first += problems(r.e, r.ob, 30, 10)
    for k in range(9, 13):
        assert r.ob.append(payload(k, 50), 10, 3, 10 * k, 10 * k + 9) >= 0   # and the next one
    return r, first + problems(r.e, r.ob, 50, 30)


def reopen(d, logs):
    ob = Outbox(d, 1024, 2, 4)
    return ob, M.E2E(Client(None, b"d"), ACK, 1000, ob, array("i", bytes(4 * 17)), logs.append)


def test_outbox_needing_room_releases_pubacked_entries_and_drops_the_rest_counted_exactly():
    with TmpDir("e2e") as d:
        r, bad = fill_and_roll(d)
        assert bad == [], bad
        assert r.e.pop(time.ticks_add(time.ticks_ms(), 10 ** 6)) == -1   # released entries are not resent
        # both totals survive a reboot, and the next boot's reports carry what no health record carried
        r.ob.close()
        ob, e = reopen(d, r.logs)
        assert problems(e, ob, 50, 30) == []
        dr = ob.dropped_report()
        e.released_report()
        assert ob.append(b"health", 1, 4, 0, 0, dr) >= 0          # a batch carrying both reports
        ob.close()
        ob, e = reopen(d, r.logs)
        assert (released(e), ob.dropped_total, e.released_report(), ob.dropped_report()) == (50, 30, 0, 0)
        ob.rebase()                                                # renew_boot: both count from the mark
        assert (e.released_report(), ob.dropped_report()) == (0, 0)
    with TmpDir("e2e") as d:                       # the check fails on the old accounting
        bad = fill_and_roll(d, broken=True)[1]
        assert "released_unconfirmed 0, expected 30" in bad and "dropped_total 40, expected 10" in bad, bad


def test_policy_stop_releases_a_segment_of_pubacked_entries_but_never_drops():
    with TmpDir("e2e") as d:
        r = Rig(d, 8, ob=(1024, 2, 4), policy=STOP)
        r.e.code = 1
        for k in range(4):
            r.send(r.eids[k])
            assert r.e.ack(r.eids[k])
        r.send(r.eids[4])
        assert r.ob.append(payload(8, 50), 10, 3, 80, 89) >= 0   # the oldest: all PUBACKed, released
        assert problems(r.e, r.ob, 40, 0) == []
        for k in (9, 10, 11):
            assert r.ob.append(payload(k, 50), 10, 3, 10 * k, 10 * k + 9) >= 0
        assert r.ob.append(payload(12, 50), 10, 3, 120, 129) == FULL    # the next holds unsent data: stop
        assert problems(r.e, r.ob, 40, 0) == []


def test_resends_are_paced_while_no_ack_comes_back():
    """An outage of the recorder: 6 entries PUBACKed, no e2e ack for 300 s. Only the
    oldest is published again, the pauses doubling up to 16 x resend_after_s."""
    with TmpDir("e2e") as d:
        r = Rig(d, 6, resend_ms=1000)
        r.e.code = 1
        for eid in r.eids:
            r.send(eid)
            r.e.ack(eid)
        t0 = time.ticks_ms()
        at = []
        for k in range(0, 300000, 50):
            eid = r.e.pop(time.ticks_add(t0, k))
            if eid >= 0:
                assert eid == r.eids[0], (k, eid)
                at.append(k)
                assert r.e.ack(eid)              # the broker takes the copy
        gaps = [b - a for a, b in zip(at, at[1:])]
        assert gaps[:4] == [1000, 2000, 4000, 8000] and set(gaps[4:]) == {16000}, at
        assert len(at) == 22, at                 # the window of 8 sent every 10 s: 1,800 for 6 entries
        # an ack for the probe: the pauses start again from resend_after_s
        r.deliver(ack((3, 0, 9)))
        assert r.e.values[4] == 0                # _TRIES


def test_an_entry_overtaken_by_acks_is_resent_at_once():
    """Acks for entries PUBACKed resend_after_s after an entry came back: its ack is not coming
    (the broker lost it): it is published again without waiting for a probe."""
    with TmpDir("e2e") as d:
        r = Rig(d, 3, resend_ms=40)
        r.e.code = 1
        for eid in r.eids:
            r.send(eid)
        r.e.ack(r.eids[0])
        time.sleep_ms(50)
        r.e.ack(r.eids[1])
        r.e.ack(r.eids[2])
        r.deliver(ack((3, 10, 19)))              # entry 1, PUBACKed 50 ms after entry 0
        now = time.ticks_ms()
        assert r.e.pop(now) == r.eids[0]         # overtaken: at once
        assert r.e.pop(now) == -1                # entry 2 was PUBACKed with entry 1: not overtaken
        assert r.e.values[RESENDS] == 0          # (the caller counts the resend)


def test_pacing_and_release_allocate_nothing():
    with TmpDir("e2e") as d:
        r = Rig(d, WINDOW)
        r.e.code = 1
        for eid in r.eids:
            r.send(eid)
            r.e.ack(eid)
        st = (r.e, r.eids[0], r.eids[-1] + 1, time.ticks_ms())

        def one(i):
            e, first, end, now = st
            e.values[7] = 1                      # _DIRTY: a full scan
            e.pop(now)
            e.held(first, end)

        assert_no_alloc(one, 200, 50)


def test_other_topics_are_ignored():
    with TmpDir("e2e") as d:
        r = Rig(d, 1)
        r.send(r.eids[0])
        data = bytearray(ack((3, 0, 9)))
        r.e.on_message(b"mqbatch/other/ack", data, 0, len(data))
        assert r.ob.depth == 1 and "not the ack topic" in r.logs[-1]


def test_matching_an_ack_allocates_nothing():
    with TmpDir("e2e") as d:
        r = Rig(d, WINDOW)
        for eid in r.eids:
            r.send(eid)
        data = bytearray(ack(*[(3, 1000 + i, 1000 + i) for i in range(64)]))   # covers nothing: a full scan
        st = (r.e, data, len(data))

        def one(i):
            e, data, n = st
            e.on_message(e.topic, data, 0, n)

        assert_no_alloc(one, 200, 50)
        assert r.ob.depth == WINDOW


def test_config_e2e_ack_is_checked():
    import mqb_config
    base = {"device_id": "d", "broker": {"host": "127.0.0.1", "tls": False}}
    import sys
    assert "e2e_ack" not in mqb_config.make_config(dict(base))      # absent: off, nothing imported
    # disabled: checked, then the key and the modules are dropped (mqb_app reads "present" as "on")
    assert "e2e_ack" not in mqb_config.make_config(dict(base, e2e_ack={"enabled": False, "resend_after_s": 5}))
    assert "mqb_sub" not in sys.modules and "mqb_packet_e2e" not in sys.modules
    cfg = mqb_config.make_config(dict(base, e2e_ack={"enabled": True}))
    assert cfg["e2e_ack"] == {"enabled": True, "resend_after_s": 30}
    for bad, msg in (({"enabled": 1}, "e2e_ack.enabled must be a boolean"),
                     ({"resend_after_s": "30"}, "e2e_ack.resend_after_s must be a number"),
                     ({"resend_after_s": 0}, "1..86400"), ({"resend_after_s": 2.5}, "whole number"),
                     ({"resend_after_s": 100000}, "1..86400"), (True, "e2e_ack must be an object"),
                     ({"enabled": False, "resend": 3}, "e2e_ack.resend: unknown setting")):
        e = raises(mqb_config.ConfigError, mqb_config.make_config, dict(base, e2e_ack=bad))
        assert msg in str(e), (bad, str(e))
    for topic in ("x/{device_id}", "x/{device_id}/telemetry", "mqbatch/other/telemetry", "mqbatch/{device_id}/t"):
        # the recorder acks only mqbatch/<device_id>/telemetry: any other topic would resend forever
        e = raises(mqb_config.ConfigError, mqb_config.make_config, dict(base, e2e_ack={"enabled": True}, topic=topic))
        assert "needs topic mqbatch/{device_id}/telemetry" in str(e), (topic, str(e))
    assert mqb_config.make_config(dict(base, e2e_ack={"enabled": True}, topic="mqbatch/{device_id}/telemetry"))
