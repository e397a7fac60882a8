# mqb_hmac: HMAC-SHA256 (RFC 2104) of a batch PUBLISH, for the User Property
# batch-hmac (docs/format.md "Batch integrity: batch-hmac"). Pure: bytes in,
# bytes out, no I/O.
#
#   mac = BatchMac(key)                      # key: 16..64 bytes (config hmac_key, hex)
#   mac.sign(topic, count, payload)          # mac.hex: 64 lowercase hex digits
#
# The key's inner and outer pad blocks are computed once. Per batch, sign()
# allocates only what MicroPython's hashlib must (two sha256 objects and their
# two 32-byte digests: it has no copy()); never per record.
import hashlib


_LABEL = const(b"MQH1")   # first bytes of the MACed message: this layout, version 1


class BatchMac:
    """HMAC-SHA256 of batches under one key. hex: the last MAC as 64 lowercase
    hex digits (a bytearray the PUBLISH builder copies from).

    RAM (64 KB heaps): the inner and outer pads are two views of one 128-byte
    buffer; no module-level helpers (each global costs heap on a board)."""

    def __init__(self, key):
        if not 0 < len(key) <= 64:
            raise ValueError("HMAC key of %d bytes: must be 1..64 bytes" % len(key))
        pads = bytearray(128)              # [0:64] inner pad, [64:128] outer pad
        for i in range(64):
            b = key[i] if i < len(key) else 0
            pads[i] = b ^ 0x36
            pads[64 + i] = b ^ 0x5C
        self._ipad = memoryview(pads)[:64]
        self._opad = memoryview(pads)[64:]
        self.hex = bytearray(64)
        self._topic = None
        self._head = b""
        self._tail = bytearray(2 + 10 + 4)   # batch-size field (u16 length + digits) + u32 payload length

    def digest(self, *parts):
        """HMAC-SHA256 of the concatenated parts (bytes-like): 32 bytes."""
        h = hashlib.sha256(self._ipad)
        for p in parts:
            h.update(p)
        inner = h.digest()
        h = hashlib.sha256(self._opad)
        h.update(inner)
        return h.digest()

    def sign(self, topic, count, payload):
        """MAC one batch: topic (bytes, the full name even when an alias is sent),
        count (the batch-size, >= 1), payload (bytes-like). Writes mac.hex and
        returns it."""
        if topic is not self._topic:          # the message's head depends on the topic only
            n = len(topic)
            if n > 65535:
                raise ValueError("topic of %d bytes: at most 65535" % n)
            # label, topic, batch-format v1
            self._head = _LABEL + bytes((n >> 8, n & 0xFF)) + topic + b"\x00\x02v1"
            self._topic = topic
        t = self._tail
        d = 1
        n = count
        while n >= 10:
            n //= 10
            d += 1
        t[0] = 0
        t[1] = d
        n = count
        for i in range(d + 1, 1, -1):
            t[i] = 48 + n % 10
            n //= 10
        ln = len(payload)
        p = d + 2
        t[p] = ln >> 24 & 0xFF
        t[p + 1] = ln >> 16 & 0xFF
        t[p + 2] = ln >> 8 & 0xFF
        t[p + 3] = ln & 0xFF
        mac = self.digest(self._head, memoryview(t)[:p + 4], payload)
        out = self.hex
        for i in range(32):
            b = mac[i]
            out[2 * i] = b"0123456789abcdef"[b >> 4]
            out[2 * i + 1] = b"0123456789abcdef"[b & 15]
        return out

