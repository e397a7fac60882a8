# mqb_native: the firmware's two hot loops in machine code (MicroPython's viper emitter).
#
#   crc32: the outbox's CRC-32 of every entry, payload and header it writes or reads
#     (mqb_outbox_format._crc). Machine-word arithmetic, so it allocates nothing on any
#     port (binascii.crc32 returns a long int on the heap for 3 CRCs in 4 on a 32-bit
#     port), and it is about as fast as binascii.crc32 (docs/outbox.md, "Allocation and
#     speed").
#   record: one binary record (docs/records.md), header and readings, packed in place
#     (mqb_record.RecordWriter, for values in an array("i")): ~0.3 us against ~2.8 for
#     the struct.pack_into calls it replaces (host CPU).
#
# Ports with a native arch compile it: ESP32 (xtensawin), RP2040 (armv6m), the Unix
# port (x64, arm). mpy-cross needs -march for the board (boards/*/deploy.json). A port
# without one (sys.implementation._mpy >> 10 == 0: the WebAssembly port) never imports
# it: mqb_outbox_format and mqb_record then do the same in Python. Their users check
# each function against a known answer (Outbox(): crc32; mqb_record at import: record)
# and fall back to Python if it is wrong (and say so): the tests run this machine code
# on the 64-bit Unix port only; the 32-bit builds compile with mpy-cross here but run
# only on a board.
#
# Heap: the machine code of two functions (the .mpy is about 2 KB for armv6m) when it
# is compiled from source or loaded from a .mpy on a filesystem; none when frozen.
# ruff: noqa: F821 (ptr8 and uint are the viper emitter's built-ins)
import micropython


@micropython.viper
def crc32(buf, n: int, out, p: int, store: int, lo, hi) -> int:
    """The CRC-32 (binascii.crc32's) of buf[0:n]: store it little-endian at
    out[p:p+4] and return 1; or (store 0) return 1 if out[p:p+4] holds it, else 0.
    lo, hi: mqb_outbox_format's tables (the CRC register after one byte i: its low
    and high 16 bits, little-endian u16 at 2i). Byte loads only: the tables need no
    alignment (an unaligned 16-bit load faults on the RP2040's Cortex-M0+). IndexError
    for a range outside buf or out (machine code does not check its loads and stores)."""
    if n < 0 or n > int(len(buf)) or p < 0 or p + 4 > int(len(out)):
        raise IndexError
    b = ptr8(buf)
    o = ptr8(out)
    tl = ptr8(lo)
    th = ptr8(hi)
    m = uint(0xFFFF) << 16 | uint(0xFFFF)   # 0xFFFFFFFF from small ints (a long int on 32-bit ports)
    c = m
    i = 0
    while i < n:
        k = ((c ^ uint(b[i])) & 0xFF) << 1
        c = (c >> 8) ^ (uint(tl[k]) | uint(tl[k + 1]) << 8 | uint(th[k]) << 16 | uint(th[k + 1]) << 24)
        i += 1
    c = c ^ m
    if store:
        o[p] = c
        o[p + 1] = c >> 8
        o[p + 2] = c >> 16
        o[p + 3] = c >> 24
        return 1
    if uint(o[p]) == (c & 0xFF) and uint(o[p + 1]) == ((c >> 8) & 0xFF) and \
            uint(o[p + 2]) == ((c >> 16) & 0xFF) and uint(o[p + 3]) == (c >> 24):
        return 1
    return 0


@micropython.viper
def record(buf, pos: int, head: int, boot: int, seq: int, s: int, ms: int, chans, vals, n: int):
    """Pack a binary record v1 at buf[pos:]: the header (version 1, kind = head & 0xFF,
    flags = head >> 8, n, boot, seq, time_s, time_ms) and n readings, channel chans[i]
    (bytes) with value vals[i] (an array of 4-byte ints), all little-endian. The caller
    reserved the 18 + 5 n bytes and checked what goes in (mqb_record: n within chans and
    vals); IndexError for a record outside buf (machine code does not check its stores)."""
    if pos < 0 or n < 0 or pos + 18 + 5 * n > int(len(buf)):
        raise IndexError
    b = ptr8(buf)
    c = ptr8(chans)
    v = ptr32(vals)
    b[pos] = 1
    b[pos + 1] = head
    b[pos + 2] = head >> 8
    b[pos + 3] = n
    k = 0
    while k < 12:                        # boot, seq, time_s: u32 each
        x = boot if k < 4 else (seq if k < 8 else s)
        b[pos + 4 + k] = x >> ((k & 3) << 3)
        k += 1
    b[pos + 16] = ms
    b[pos + 17] = ms >> 8
    p = pos + 18
    i = 0
    while i < n:                         # channel u8, value i32
        x = v[i]
        b[p] = c[i]
        k = 0
        while k < 4:
            b[p + 1 + k] = x >> (k << 3)
            k += 1
        p += 5
        i += 1
