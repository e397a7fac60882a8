# MicroPython tests of firmware/mqb_e2e.py (end-to-end acks, docs/e2e-ack.md) with a
# real Outbox on the host filesystem: ack payload rules, the window (sent, PUBACKed,
# overdue, covered by a range), removal recorded durably on flash, bad acks counted
# and logged once, no allocation when an ack is matched, and the e2e_ack config checks.
import struct
import time
from array import array
import mqb_e2e as M
from mqb_client import Client
from mqb_outbox import Outbox, UNKNOWN
from outbox_util import TmpDir, assert_no_alloc, payload, raises

ACK = b"mqbatch/d/ack"
WINDOW = 8                      # mqb_e2e._WINDOW
ACKED_BATCHES, ACKED_RECORDS = 3, 4      # mqb_app's App.count indexes
RESENDS, BAD_ACKS, COVERED = 0, 1, 2     # E2E.values


def ack(*ranges, version=1):
    return bytes((version,)) + b"".join(struct.pack("<III", b, f, last) for b, f, last in ranges)


class Rig:
    """An outbox with entries of 10 records each (boot 3, seq 0.., 10 per entry) and
    an E2E over a client that is never connected."""

    def __init__(self, root, entries, resend_ms=1000):
        self.ob = Outbox(root, 4096, 4, 16)
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
            assert e.find(-1) >= 0
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
        assert e.pop(time.ticks_add(now, 1100)) == -1        # handed out once, back to "sent"
        assert e.find(r.eids[0]) >= 0
        e.code = 0x87                                        # refused on this connection
        assert e.ack(r.eids[1]) is False and e.find(r.eids[1]) < 0
        assert r.ob.depth == 2                               # the caller removes it (PUBACK ends the line)


def test_window_full_then_freed_by_entries_gone_from_the_outbox():
    with TmpDir("e2e") as d:
        r = Rig(d, WINDOW + 1)
        for eid in r.eids[:WINDOW]:
            r.send(eid)
        assert r.e.find(-1) < 0
        assert "window full" in str(raises(RuntimeError, r.send, r.eids[-1]))
        r.ob.discard(r.eids[3])                  # e.g. refused for good, counted dropped
        assert r.e.find(-1) >= 0 and r.e.find(r.eids[3]) < 0
        r.e.discard(r.eids[4])
        assert r.e.find(r.eids[4]) < 0


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
