"""Drive a publisher's batches onto the Maximum Packet Size exactly (the inspecting proxy's
`max_packet_probe`), whatever its record sizes.

A publisher that packs records up to a limit lands on it exactly only when its record sizes
happen to add up to it; a budget 1 byte too large then never shows. The probe learns the sizes
the publisher really produces: once a full batch is acknowledged and nothing is left open (no
resend on the next connection), the connection is cut; the
next CONNACK's Maximum Packet Size is rewritten (same 4 bytes, the broker's own limit stays
larger) to P - 1 and then P in turn, where P is the most frequent size of the full batch PUBLISHes (at
least half the broker's limit) of the run so far. At P - 1
a publisher that respects the limit must build a smaller batch, and one whose budget is a byte
too large builds P again: 1 byte over, caught on the wire. At P it may fill exactly.
"""

from __future__ import annotations

from mqbatch.conformance import packets as W


def _max_packet_offset(raw: bytes) -> int | None:
    """Offset of the 4-byte Maximum Packet Size value in a CONNACK, or None."""
    try:
        _, p = W.read_vbi(raw, 1)
        p += 2  # acknowledge flags, reason code
        n, p = W.read_vbi(raw, p)
        end = p + n
        while p < end:
            pid, p = W.read_vbi(raw, p)
            kind = W.PROPERTIES[pid][1]
            if pid == 0x27:
                return p
            if kind == "byte":
                p += 1
            elif kind == "u16":
                p += 2
            elif kind == "u32":
                p += 4
            elif kind == "vbi":
                _, p = W.read_vbi(raw, p)
            elif kind in ("str", "bin"):
                p += 2 + int.from_bytes(raw[p : p + 2], "big")
            else:  # a string pair
                p += 2 + int.from_bytes(raw[p : p + 2], "big")
                p += 2 + int.from_bytes(raw[p : p + 2], "big")
    except (W.Malformed, KeyError, IndexError):
        return None
    return None


class MaxPacketProbe:
    def __init__(self):
        self.base: int | None = None  # the broker's own Maximum Packet Size (the first CONNACK's)
        self.largest: dict[int, int] = {}  # connection -> largest PUBLISH
        self.sizes: dict[int, int] = {}  # full batch PUBLISH size -> how often
        self.queue: list[int] = []
        self.told: dict[int, int] = {}  # connection -> the Maximum Packet Size it was told
        self.published: set[int] = set()  # connections that sent a QoS > 0 PUBLISH

    def packet(self, conn: int, direction: str, raw: bytes) -> tuple[bytes, bool]:
        """(the packet to forward, cut the connection after it)."""
        kind = raw[0] >> 4 if raw else 0
        if direction == "c2s" and kind == W.PUBLISH and self.base and len(raw) >= self.base // 2:
            # a full batch (a status or health message alone is no measure of the packing)
            self.largest[conn] = max(self.largest.get(conn, 0), len(raw))
            self.sizes[len(raw)] = self.sizes.get(len(raw), 0) + 1
            if (raw[0] >> 1) & 3:
                self.published.add(conn)
            return raw, False
        if direction == "s2c" and kind == W.CONNACK:
            off = _max_packet_offset(raw)
            if off is None or len(raw) < off + 4:
                return raw, False
            if self.base is None:
                self.base = int.from_bytes(raw[off : off + 4], "big")
            if not self.queue and self.sizes:
                # the most frequent full batch size (the largest of equals): the record mix that recurs,
                # so a publisher one byte over budget builds it again; never below what was seen at first
                p = max(self.sizes, key=lambda k: (self.sizes[k], k))
                self.queue = [p - 1, p]
            if not self.queue:
                return raw, False
            limit = self.queue.pop(0)
            self.told[conn] = limit
            return raw[:off] + limit.to_bytes(4, "big") + raw[off + 4 :], False
        if direction == "s2c" and kind in (W.PUBACK, W.PUBREC) and conn in self.published:
            return raw, True
        return raw, False
