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
from mqb_boot import crc32

_FORMAT_VERSION = const(1)
_SEG_MAGIC = const(b"MQBS")
SEG_HEADER_SIZE = 20
ENTRY_HEADER_SIZE = 32
_SEG_FMT = const("<4sB3xII")        # magic, version, 3 zero bytes, segment number, first entry id (+ u32 CRC)
# an entry header (ENTRY_HEADER_SIZE bytes): length, id, boot, first_seq, last_seq,
# records, flags, payload CRC, then the u32 CRC of those 28 bytes (_write_entry)
_ENTRY_FMT = const("<IIIIIHH")

_ENOENT = const(2)
_ENOSPC = const(28)
# what _scan finds at a place in a segment (item[7])
_GOOD = const(0)       # an entry, header and payload good
_BAD = const(1)        # an entry with a good header whose payload fails its CRC
_SHORT = const(2)      # an entry with a good header whose payload the file ends inside
_UNREADABLE = const(3) # a region with no readable entry header (rot, truncation)
_BLANK = const(4)      # the file ends inside a header, or in bytes never written: a torn tail


# CRC-32 (binascii.crc32's: IEEE 802.3, reflected, init and final xor 0xFFFFFFFF)
# of every entry and header, computed by _crc without allocating: binascii.crc32
# returns a long int on the heap for 3 CRCs in 4 on a 32-bit port (ints of 2**30 and
# more), so append() and read() would allocate per batch (docs/outbox.md,
# "Allocation and speed"). Where the port has a native emitter (ESP32, RP2040, the
# Unix port) _C, mqb_native's machine code, computes it with machine words;
# elsewhere (the WebAssembly port) _crc does, in two 16-bit halves (~250x slower).
# Both use these tables. Table entry i is the CRC register after one byte i: _CRC_LO
# its low 16 bits, _CRC_HI its high 16 bits, little-endian u16 each (2 x 512 bytes of
# constants: flash, not heap, in .mpy).
_CRC_LO = const(
    b"\x00\x00\x96\x30\x2c\x61\xba\x51\x19\xc4\x8f\xf4\x35\xa5\xa3\x95\x32\x88\xa4\xb8\x1e\xe9\x88\xd9"
    b"\x2b\x4c\xbd\x7c\x07\x2d\x91\x1d\x64\x10\xf2\x20\x48\x71\xde\x41\x7d\xd4\xeb\xe4\x51\xb5\xc7\x85"
    b"\x56\x98\xc0\xa8\x7a\xf9\xec\xc9\x4f\x5c\xd9\x6c\x63\x3d\xf5\x0d\xc8\x20\x5e\x10\xe4\x41\x72\x71"
    b"\xd1\xe4\x47\xd4\xfd\x85\x6b\xb5\xfa\xa8\x6c\x98\xd6\xc9\x40\xf9\xe3\x6c\x75\x5c\xcf\x0d\x59\x3d"
    b"\xac\x30\x3a\x00\x80\x51\x16\x61\xb5\xf4\x23\xc4\x99\x95\x0f\xa5\x9e\xb8\x08\x88\xb2\xd9\x24\xe9"
    b"\x87\x7c\x11\x4c\xab\x1d\x3d\x2d\x90\x41\x06\x71\xbc\x20\x2a\x10\x89\x85\x1f\xb5\xa5\xe4\x33\xd4"
    b"\xa2\xc9\x34\xf9\x8e\xa8\x18\x98\xbb\x0d\x2d\x3d\x97\x6c\x01\x5c\xf4\x51\x62\x61\xd8\x30\x4e\x00"
    b"\xed\x95\x7b\xa5\xc1\xf4\x57\xc4\xc6\xd9\x50\xe9\xea\xb8\x7c\x88\xdf\x1d\x49\x2d\xf3\x7c\x65\x4c"
    b"\x58\x61\xce\x51\x74\x00\xe2\x30\x41\xa5\xd7\x95\x6d\xc4\xfb\xf4\x6a\xe9\xfc\xd9\x46\x88\xd0\xb8"
    b"\x73\x2d\xe5\x1d\x5f\x4c\xc9\x7c\x3c\x71\xaa\x41\x10\x10\x86\x20\x25\xb5\xb3\x85\x09\xd4\x9f\xe4"
    b"\x0e\xf9\x98\xc9\x22\x98\xb4\xa8\x17\x3d\x81\x0d\x3b\x5c\xad\x6c\x20\x83\xb6\xb3\x0c\xe2\x9a\xd2"
    b"\x39\x47\xaf\x77\x15\x26\x83\x16\x12\x0b\x84\x3b\x3e\x6a\xa8\x5a\x0b\xcf\x9d\xff\x27\xae\xb1\x9e"
    b"\x44\x93\xd2\xa3\x68\xf2\xfe\xc2\x5d\x57\xcb\x67\x71\x36\xe7\x06\x76\x1b\xe0\x2b\x5a\x7a\xcc\x4a"
    b"\x6f\xdf\xf9\xef\x43\xbe\xd5\x8e\xe8\xa3\x7e\x93\xc4\xc2\x52\xf2\xf1\x67\x67\x57\xdd\x06\x4b\x36"
    b"\xda\x2b\x4c\x1b\xf6\x4a\x60\x7a\xc3\xef\x55\xdf\xef\x8e\x79\xbe\x8c\xb3\x1a\x83\xa0\xd2\x36\xe2"
    b"\x95\x77\x03\x47\xb9\x16\x2f\x26\xbe\x3b\x28\x0b\x92\x5a\x04\x6a\xa7\xff\x31\xcf\x8b\x9e\x1d\xae"
    b"\xb0\xc2\x26\xf2\x9c\xa3\x0a\x93\xa9\x06\x3f\x36\x85\x67\x13\x57\x82\x4a\x14\x7a\xae\x2b\x38\x1b"
    b"\x9b\x8e\x0d\xbe\xb7\xef\x21\xdf\xd4\xd2\x42\xe2\xf8\xb3\x6e\x83\xcd\x16\x5b\x26\xe1\x77\x77\x47"
    b"\xe6\x5a\x70\x6a\xca\x3b\x5c\x0b\xff\x9e\x69\xae\xd3\xff\x45\xcf\x78\xe2\xee\xd2\x54\x83\xc2\xb3"
    b"\x61\x26\xf7\x16\x4d\x47\xdb\x77\x4a\x6a\xdc\x5a\x66\x0b\xf0\x3b\x53\xae\xc5\x9e\x7f\xcf\xe9\xff"
    b"\x1c\xf2\x8a\xc2\x30\x93\xa6\xa3\x05\x36\x93\x06\x29\x57\xbf\x67\x2e\x7a\xb8\x4a\x02\x1b\x94\x2b"
    b"\x37\xbe\xa1\x8e\x1b\xdf\x8d\xef")
_CRC_HI = const(
    b"\x00\x00\x07\x77\x0e\xee\x09\x99\x6d\x07\x6a\x70\x63\xe9\x64\x9e\xdb\x0e\xdc\x79\xd5\xe0\xd2\x97"
    b"\xb6\x09\xb1\x7e\xb8\xe7\xbf\x90\xb7\x1d\xb0\x6a\xb9\xf3\xbe\x84\xda\x1a\xdd\x6d\xd4\xf4\xd3\x83"
    b"\x6c\x13\x6b\x64\x62\xfd\x65\x8a\x01\x14\x06\x63\x0f\xfa\x08\x8d\x6e\x3b\x69\x4c\x60\xd5\x67\xa2"
    b"\x03\x3c\x04\x4b\x0d\xd2\x0a\xa5\xb5\x35\xb2\x42\xbb\xdb\xbc\xac\xd8\x32\xdf\x45\xd6\xdc\xd1\xab"
    b"\xd9\x26\xde\x51\xd7\xc8\xd0\xbf\xb4\x21\xb3\x56\xba\xcf\xbd\xb8\x02\x28\x05\x5f\x0c\xc6\x0b\xb1"
    b"\x6f\x2f\x68\x58\x61\xc1\x66\xb6\xdc\x76\xdb\x01\xd2\x98\xd5\xef\xb1\x71\xb6\x06\xbf\x9f\xb8\xe8"
    b"\x07\x78\x00\x0f\x09\x96\x0e\xe1\x6a\x7f\x6d\x08\x64\x91\x63\xe6\x6b\x6b\x6c\x1c\x65\x85\x62\xf2"
    b"\x06\x6c\x01\x1b\x08\x82\x0f\xf5\xb0\x65\xb7\x12\xbe\x8b\xb9\xfc\xdd\x62\xda\x15\xd3\x8c\xd4\xfb"
    b"\xb2\x4d\xb5\x3a\xbc\xa3\xbb\xd4\xdf\x4a\xd8\x3d\xd1\xa4\xd6\xd3\x69\x43\x6e\x34\x67\xad\x60\xda"
    b"\x04\x44\x03\x33\x0a\xaa\x0d\xdd\x05\x50\x02\x27\x0b\xbe\x0c\xc9\x68\x57\x6f\x20\x66\xb9\x61\xce"
    b"\xde\x5e\xd9\x29\xd0\xb0\xd7\xc7\xb3\x59\xb4\x2e\xbd\xb7\xba\xc0\xb8\xed\xbf\x9a\xb6\x03\xb1\x74"
    b"\xd5\xea\xd2\x9d\xdb\x04\xdc\x73\x63\xe3\x64\x94\x6d\x0d\x6a\x7a\x0e\xe4\x09\x93\x00\x0a\x07\x7d"
    b"\x0f\xf0\x08\x87\x01\x1e\x06\x69\x62\xf7\x65\x80\x6c\x19\x6b\x6e\xd4\xfe\xd3\x89\xda\x10\xdd\x67"
    b"\xb9\xf9\xbe\x8e\xb7\x17\xb0\x60\xd6\xd6\xd1\xa1\xd8\x38\xdf\x4f\xbb\xd1\xbc\xa6\xb5\x3f\xb2\x48"
    b"\x0d\xd8\x0a\xaf\x03\x36\x04\x41\x60\xdf\x67\xa8\x6e\x31\x69\x46\x61\xcb\x66\xbc\x6f\x25\x68\x52"
    b"\x0c\xcc\x0b\xbb\x02\x22\x05\x55\xba\xc5\xbd\xb2\xb4\x2b\xb3\x5c\xd7\xc2\xd0\xb5\xd9\x2c\xde\x5b"
    b"\x64\x9b\x63\xec\x6a\x75\x6d\x02\x09\x9c\x0e\xeb\x07\x72\x00\x05\xbf\x95\xb8\xe2\xb1\x7b\xb6\x0c"
    b"\xd2\x92\xd5\xe5\xdc\x7c\xdb\x0b\xd3\x86\xd4\xf1\xdd\x68\xda\x1f\xbe\x81\xb9\xf6\xb0\x6f\xb7\x18"
    b"\x08\x88\x0f\xff\x06\x66\x01\x11\x65\x8f\x62\xf8\x6b\x61\x6c\x16\x0a\xa0\x0d\xd7\x04\x4e\x03\x39"
    b"\x67\xa7\x60\xd0\x69\x49\x6e\x3e\xd1\xae\xd6\xd9\xdf\x40\xd8\x37\xbc\xa9\xbb\xde\xb2\x47\xb5\x30"
    b"\xbd\xbd\xba\xca\xb3\x53\xb4\x24\xd0\xba\xd7\xcd\xde\x54\xd9\x23\x66\xb3\x61\xc4\x68\x5d\x6f\x2a"
    b"\x0b\xb4\x0c\xc3\x05\x5a\x02\x2d")
_C = None                # the tables in Python (~250x slower), unless:
if __import__("sys").implementation._mpy >> 10:   # the port's native arch: it runs machine code
    try:
        from mqb_native import crc32 as _C         # checked by Outbox() (_native_check)
    except (ImportError, ValueError, MemoryError):   # not deployed, a .mpy of another arch or
        pass                                       # version: the tables (mqb_app logs it)
_RESIDUE = const(0x2144DF1C)   # crc32(data + its CRC-32, little-endian): the same for any data


def _crc(buf, n, out, p, store):
    """CRC-32 of buf[0:n]: store it at out[p:p+4] (little-endian) and return True;
    or (store False) return whether out[p:p+4] holds it. Allocates nothing."""
    if _C is not None:
        return _C(buf, n, out, p, store, _CRC_LO, _CRC_HI) == 1
    lo = hi = 0xFFFF
    for i in range(n):
        k = ((lo ^ buf[i]) & 0xFF) << 1
        lo = (lo >> 8 | (hi & 0xFF) << 8) ^ (_CRC_LO[k] | _CRC_LO[k + 1] << 8)
        hi = hi >> 8 ^ (_CRC_HI[k] | _CRC_HI[k + 1] << 8)
    lo ^= 0xFFFF
    hi ^= 0xFFFF
    if store:
        out[p] = lo & 0xFF
        out[p + 1] = lo >> 8
        out[p + 2] = hi & 0xFF
        out[p + 3] = hi >> 8
        return True
    return out[p] | out[p + 1] << 8 == lo and out[p + 2] | out[p + 3] << 8 == hi


def _native_check(scratch):
    """Check mqb_native's CRC-32 once per Outbox() against a known answer: that of _CRC_LO
    (512 bytes) is 0x186C6C46, a small int on every port, stored in scratch[0:4] (the
    outbox's header buffer), then compared there, and compared again one bit off: no
    allocation, no constant object among a 64 KB heap's imports. If it is wrong, the
    tables from now on, and one line says so."""
    global _C
    if _C is not None:
        _C(_CRC_LO, 512, scratch, 0, 1, _CRC_LO, _CRC_HI)          # store mode
        ok = _u32(scratch, 0) == 0x186C6C46 and _C(_CRC_LO, 512, scratch, 0, 0, _CRC_LO, _CRC_HI) == 1
        scratch[3] ^= 0x40                                          # compare mode, one bit off
        if not ok or _C(_CRC_LO, 512, scratch, 0, 0, _CRC_LO, _CRC_HI) != 0:
            _C = None
            print("mqb: outbox CRC-32: mqb_native's machine code failed its check on this port: Python tables")


def _u32(b, p):
    return b[p] | b[p + 1] << 8 | b[p + 2] << 16 | b[p + 3] << 24


def _fix(buf, n):
    """buf[0:n] and the u32 CRC-32 of it stored at buf[n:n+4]: True if they match,
    or once one flipped bit (in the data or in the CRC) is found and corrected in
    buf. CRC-32 has a Hamming distance of at least 4 over these short headers, so
    one bit is corrected without ambiguity and two are never miscorrected. Error
    path only (up to 8 n CRCs); a match allocates nothing: over exactly buf[0:n+4]
    (an entry header in its 32-byte buffer) binascii.crc32 gives the CRC-32 residue,
    a small int on every port, else _crc compares by halves."""
    if crc32(buf) == _RESIDUE if len(buf) == n + 4 else _crc(buf, n, buf, n, False):
        return True
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


def _check_capacity(root, segments, size, entries):
    """ValueError naming the first of an outbox's sizes that cannot work."""
    if not SEG_HEADER_SIZE + ENTRY_HEADER_SIZE + 1 <= size < (1 << 30):
        raise ValueError("segment_size %d: must be %d..%d bytes" % (
            size, SEG_HEADER_SIZE + ENTRY_HEADER_SIZE + 1, (1 << 30) - 1))
    if segments < 2:
        raise ValueError("max_segments %d: at least 2 (one to fill while the oldest drains)" % segments)
    if not 1 <= entries <= 0xFFFF:
        raise ValueError("max_entries %d: must be 1..65535 per segment" % entries)
    st = os.statvfs(root)
    total = st[1] * st[2]   # fragment size x blocks
    if segments * size > total:
        raise ValueError("outbox of %d x %d bytes cannot fit a %d-byte filesystem" % (segments, size, total))


def _seg_path(root, sno, kind="s"):
    """The file of segment sno ("s"), or of its acks (kind "a")."""
    return "%s/%s%08x" % (root, kind, sno)


def _write_seg_header(f, hdr, sno, first):
    """Write segment sno's header (its first entry id: first) through hdr (scratch);
    OSError(ENOSPC) if the file took less than the whole header."""
    struct.pack_into(_SEG_FMT, hdr, 0, _SEG_MAGIC, _FORMAT_VERSION, sno, first)
    _crc(hdr, 16, hdr, 16, True)
    if f.write(hdr, SEG_HEADER_SIZE) != SEG_HEADER_SIZE:   # (buf, max_len): no memoryview
        raise OSError(_ENOSPC)


def _write_entry(f, hdr, payload, n, eid, boot, first_seq, last_seq, records):
    """Append one entry (header through hdr, then payload[0:n]) and flush;
    OSError(ENOSPC) if the file took less than all of it."""
    struct.pack_into(_ENTRY_FMT, hdr, 0, n, eid, boot, first_seq, last_seq, records, 0)
    _crc(payload, n, hdr, 24, True)
    _crc(hdr, 28, hdr, 28, True)
    if f.write(hdr) != ENTRY_HEADER_SIZE or f.write(payload) != n:
        raise OSError(_ENOSPC)
    f.flush()


def _write_ack(f, buf, idx):
    """Append and flush the 4-byte ack record of a segment's entry idx (through buf[0:4])."""
    struct.pack_into("<HH", buf, 0, idx, idx ^ 0xFFFF)
    f.write(buf, 4)
    f.flush()




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
