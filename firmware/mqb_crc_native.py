# mqb_crc_native: the outbox's CRC-32 in machine code (MicroPython's viper emitter).
#
# One function, mqb_outbox_format._crc's: the CRC-32 of every entry, payload and
# header the outbox writes or reads. Machine-word arithmetic, so it allocates
# nothing on any port (binascii.crc32 returns a long int on the heap for 3 CRCs in 4
# on a 32-bit port), and it is about as fast as binascii.crc32 (docs/outbox.md,
# "Allocation and speed").
#
# Ports with a native emitter compile it: ESP32 (xtensawin), RP2040 (armv6m), the
# Unix port (x64, arm). mpy-cross needs -march for the board (boards/*/deploy.json).
# A port without one (the WebAssembly port) raises SyntaxError importing this file;
# mqb_outbox_format then computes the same CRC with its tables in Python (~250x
# slower, also allocation-free).
#
# Heap: the machine code of one function (a few hundred bytes) when it is compiled
# from source or loaded from a .mpy on a filesystem; none when frozen.
# ruff: noqa: F821 (ptr8 and uint are the viper emitter's built-ins)
import micropython


@micropython.viper
def crc32(buf, n: int, out, p: int, store: int, lo, hi) -> int:
    """The CRC-32 (binascii.crc32's) of buf[0:n]: store it little-endian at
    out[p:p+4] and return 1; or (store 0) return 1 if out[p:p+4] holds it, else 0.
    lo, hi: mqb_outbox_format's tables (the CRC register after one byte i: its low
    and high 16 bits, little-endian u16 at 2i). Byte loads only: the tables need no
    alignment (an unaligned 16-bit load faults on the RP2040's Cortex-M0+)."""
    b = ptr8(buf)
    o = ptr8(out)
    tl = ptr8(lo)
    th = ptr8(hi)
    c = uint(0xFFFFFFFF)
    i = 0
    while i < n:
        k = ((c ^ uint(b[i])) & 0xFF) << 1
        c = (c >> 8) ^ (uint(tl[k]) | uint(tl[k + 1]) << 8 | uint(th[k]) << 16 | uint(th[k + 1]) << 24)
        i += 1
    c = c ^ uint(0xFFFFFFFF)
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
