# outbox_crash_worker: opens an outbox on the host filesystem (VfsPosix), reports
# what it holds, then appends and acks until it is killed. Run by
# tests/firmware/test_outbox_crash.py, which SIGKILLs it at random moments.
#
# Usage: micropython outbox_crash_worker.py DIR RUN
# Output, one line per write (so a line is in the output whole or not at all):
#   P <id> <len> <crc32 hex> <records>   an entry pending after reopen (read back)
#   BAD <id> <code>                      an entry read() refused (must never happen)
#   READY <depth> <dropped_total>
#   APPENDING <i>                        append() of payload i of this run called
#   APPENDED <id> <i> <len> <crc> <recs> ... and returned id
#   FULL <i>                             ... and returned FULL
#   ACKING <id> / ACKED <id>             ack() called / returned OK
import sys
from binascii import crc32
from mqb_outbox import Outbox, FULL, OK, STOP
from outbox_util import payload

SEGMENT, SEGMENTS, ENTRIES = 2048, 4, 8


def out(line):
    sys.stdout.write(line + "\n")


def payload_len(run, i):
    return 1 + (run * 131 + i * 37) % 400


def main():
    root, run = sys.argv[1], int(sys.argv[2])
    ob = Outbox(root, segment_size=SEGMENT, max_segments=SEGMENTS, max_entries=ENTRIES, policy=STOP)
    buf = bytearray(ob.max_payload)
    ids = [0] * (SEGMENTS * ENTRIES)
    for k in range(ob.peek(ids)):
        eid = ids[k]
        n = ob.read(eid, buf)
        if n < 0:
            out("BAD %d %d" % (eid, n))
        else:
            out("P %d %d %08x %d" % (eid, n, crc32(memoryview(buf)[:n]), ob.entry_records))
    out("READY %d %d" % (ob.depth, ob.dropped_total))
    one = [0]
    i = 0
    while True:
        data = payload(run * 100000 + i, payload_len(run, i))
        recs = 1 + i % 7
        out("APPENDING %d" % i)
        eid = ob.append(data, recs, run, i, i)
        if eid == FULL:
            out("FULL %d" % i)
        else:
            out("APPENDED %d %d %d %08x %d" % (eid, i, len(data), crc32(data), recs))
        if (i % 3 == 1 or ob.depth >= 16 or eid == FULL) and ob.peek(one, 1):
            out("ACKING %d" % one[0])
            if ob.ack(one[0]) != OK:
                out("BAD %d ack" % one[0])
            out("ACKED %d" % one[0])
        i += 1


main()
