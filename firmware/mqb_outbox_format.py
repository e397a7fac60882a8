# mqb_outbox_format: the outbox's on-flash format (docs/outbox.md gives it byte
# by byte): the layout of segment headers, entry headers and ack records, their
# CRC-32 check (one flipped bit corrected), and reading a segment file back
# entry by entry, resynchronising past unreadable bytes. No index, no policy:
# mqb_outbox_recover rebuilds the outbox's index from what this reads, and
# mqb_outbox (the queue) writes what this describes.
#
# Layers (tests/test_firmware_layout.py): mqb_boot <- mqb_outbox_format <-
# mqb_outbox_recover <- mqb_outbox. The functions keep the names they had as
# Outbox methods (_scan, _seg_first...): a new name costs an interned string on
# a board (docs/application.md, Memory).
import os
import struct
from micropython import const
from mqb_boot import crc32

_FORMAT_VERSION = const(1)
_SEG_MAGIC = const(b"MQBS")
SEG_HEADER_SIZE = 20
ENTRY_HEADER_SIZE = 32
_SEG_FMT = const("<4sB3xII")        # magic, version, 3 zero bytes, segment number, first entry id (+ u32 CRC)
# an entry header (ENTRY_HEADER_SIZE bytes): "<IIIIIHHI" length, id, boot, first_seq, last_seq,
# records, flags, payload CRC, then the u32 CRC of those 28 bytes (mqb_outbox.append writes it)

_ENOENT = const(2)
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


def _mkdir(root):
    """Create the outbox directory if it is missing."""
    try:
        os.stat(root)
    except OSError as e:
        if e.args[0] != _ENOENT:
            raise
        os.mkdir(root)


def _check_capacity(root, segments, size):
    st = os.statvfs(root)
    total = st[1] * st[2]   # fragment size x blocks
    if segments * size > total:
        raise ValueError("outbox of %d x %d bytes cannot fit a %d-byte filesystem" % (segments, size, total))


def _write_seg_header(f, hdr, sno, first):
    """Write segment sno's header (its first entry id: first) through hdr (scratch);
    False if the file took less than the whole header."""
    struct.pack_into(_SEG_FMT, hdr, 0, _SEG_MAGIC, _FORMAT_VERSION, sno, first)
    struct.pack_into("<I", hdr, 16, crc32(memoryview(hdr)[:16]))
    return f.write(memoryview(hdr)[:SEG_HEADER_SIZE]) == SEG_HEADER_SIZE


def _seg_first(hdr, path, sno):
    """The first entry id in a segment's header (one flipped bit corrected), or
    -1 if the header cannot be read."""
    hv = memoryview(hdr)[:SEG_HEADER_SIZE]
    with open(path, "rb") as f:
        if f.readinto(hv) != SEG_HEADER_SIZE:
            return -1
    if not _fix(hdr, 16):
        return -1
    magic, version, hsno, first = struct.unpack_from(_SEG_FMT, hdr, 0)
    if magic != _SEG_MAGIC or version != _FORMAT_VERSION or hsno != sno:
        return -1
    return first


def _header_at(hdr, f, off, size, expect, lo, hi):
    """The entry header at off, read into hdr (one flipped bit corrected):
    its id if it is good (flags 0, id == expect, or lo <= id < hi when expect < 0),
    else -1."""
    f.seek(off)
    if f.readinto(hdr) != ENTRY_HEADER_SIZE or not _fix(hdr, 28):
        return -1
    eid = _u32(hdr, 4)
    if hdr[22] or hdr[23] or (eid != expect if expect >= 0 else not lo <= eid < hi):
        return -1
    return eid


def _resync(f, p, size, lo, hi, win):
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


def _scan(hdr, path, first, lo, hi, scratch):
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
    sv = memoryview(scratch)
    with open(path, "rb") as f:
        size = f.seek(0, 2)
        off = SEG_HEADER_SIZE
        expect = first
        while off < size:
            eid = -1
            if size - off >= ENTRY_HEADER_SIZE:
                eid = _header_at(hdr, f, off, size, expect, lo, hi)
            if eid < 0:
                blank = size - off < ENTRY_HEADER_SIZE or hdr[0] in (0, 0xFF) and hdr == bytes([hdr[0]]) * len(hdr)
                length = _u32(hdr, 0)
                rec = hdr[20] | hdr[21] << 8
                nxt = _resync(f, off + 1, size, expect + 1 if expect >= 0 else lo, hi, scratch)
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
