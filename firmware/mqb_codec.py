# mqb_codec: batch-format v1 on the device. Pure codec: bytes in, bytes out, no I/O.
#
# Variable Byte Integers (MQTT 5.0 section 1.5.5) and BatchEncoder, which packs
# sub-messages into a caller-owned buffer as  VBI(len) sub-payload  VBI(len) ...
# Nothing here allocates on the heap once the encoder exists: records are
# copied (or serialised with struct.pack_into) straight into the buffer.
#
# Buffer layout, so that a whole PUBLISH leaves with one socket write:
#   buf[0 : headroom]            room for fixed header, topic/alias, packet id, properties
#   buf[headroom : payload_end]  the batch payload
# The MQTT layer writes the header right-aligned into the headroom and sends
# buf[start : payload_end] with sock.write(buf, start, length).

VBI_MAX = 268435455

# vbi_read results that are not values (values are >= 0)
VBI_INCOMPLETE = -1  # the buffer ends inside the VBI
VBI_MALFORMED = -2   # 4th byte still has the continuation bit, or not minimal


def vbi_size(n):
    """Bytes needed to encode n as a Variable Byte Integer (1..4)."""
    if n < 0 or n > VBI_MAX:
        raise ValueError("VBI out of range 0..268435455: %d" % n)
    if n < 128:
        return 1
    if n < 16384:
        return 2
    if n < 2097152:
        return 3
    return 4


def vbi_write(buf, pos, n):
    """Write n as a VBI at buf[pos]; return the position after it."""
    if n < 0 or n > VBI_MAX:
        raise ValueError("VBI out of range 0..268435455: %d" % n)
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            buf[pos] = b | 0x80
            pos += 1
        else:
            buf[pos] = b
            return pos + 1


def vbi_read(buf, pos, end):
    """Decode a VBI from buf[pos:end].

    Returns the value (>= 0; it occupied vbi_size(value) bytes), or
    VBI_INCOMPLETE / VBI_MALFORMED. Allocation-free: no tuple is returned.
    """
    value = 0
    shift = 0
    i = 0
    while i < 4:
        if pos + i >= end:
            return VBI_INCOMPLETE
        b = buf[pos + i]
        value |= (b & 0x7F) << shift
        if not b & 0x80:
            if i and b == 0:
                return VBI_MALFORMED  # a multi-byte VBI must be minimal
            return value
        shift += 7
        i += 1
    return VBI_MALFORMED


# add()/reserve() results
FULL = -1  # does not fit in this batch: flush it, reset, and add again


class RecordTooLarge(ValueError):
    """A sub-message that can never fit in any batch of this encoder."""


class BatchEncoder:
    """Packs sub-messages into one preallocated buffer (batch-format v1).

    buf: a bytearray owned by the caller, used for header room + payload.
    headroom: bytes kept free in front of the payload for the PUBLISH header.
    max_count / max_payload_bytes: the publisher's limits (spec section 3.3).
    The packet budget (from the broker's Maximum Packet Size) is applied with
    set_budget(); the effective payload limit is the smallest of all.
    """

    def __init__(self, buf, headroom=0, max_count=100, max_payload_bytes=65536):
        if headroom < 0 or headroom >= len(buf):
            raise ValueError("headroom %d does not leave room in a %d-byte buffer" % (headroom, len(buf)))
        if max_count < 1:
            raise ValueError("max_count must be >= 1, got %d" % max_count)
        if max_payload_bytes < 1:
            raise ValueError("max_payload_bytes must be >= 1, got %d" % max_payload_bytes)
        self.buf = buf
        self.headroom = headroom
        self.max_count = max_count
        self.max_payload_bytes = max_payload_bytes
        self._budget = VBI_MAX
        self._limit = 0
        self._update_limit()
        self.count = 0
        self.end = headroom  # position after the last byte of payload

    def _update_limit(self):
        self._limit = min(len(self.buf) - self.headroom, self.max_payload_bytes, self._budget)

    def set_budget(self, max_payload):
        """Cap the payload size (the MQTT client derives it from Maximum Packet Size)."""
        if max_payload < 1:
            raise ValueError("packet budget leaves no room for payload (%d bytes)" % max_payload)
        self._budget = max_payload
        self._update_limit()

    @property
    def limit(self):
        """Largest payload, in bytes, this encoder will build."""
        return self._limit

    @property
    def payload_len(self):
        return self.end - self.headroom

    def reset(self):
        self.count = 0
        self.end = self.headroom

    def reserve(self, n):
        """Claim n bytes for one sub-message; return the offset in buf to write
        them at (e.g. with struct.pack_into), or FULL if the batch cannot take
        them. Raises RecordTooLarge if n bytes can never fit in a batch.
        The sub-message counts from now on: the caller must fill all n bytes."""
        if 0 <= n < 128 and self._limit > 128:   # a record's size: a 1-byte length, no VBI calls
            end = self.end
            if self.count >= self.max_count or end - self.headroom + n + 1 > self._limit:
                return FULL
            self.buf[end] = n
            self.end = end + 1 + n
            self.count += 1
            return end + 1
        need = vbi_size(n) + n
        if need > self._limit:
            raise RecordTooLarge(
                "sub-message of %d bytes (+%d length bytes) exceeds the batch payload limit of %d bytes"
                % (n, need - n, self._limit))
        if self.count >= self.max_count or self.end - self.headroom + need > self._limit:
            return FULL
        pos = vbi_write(self.buf, self.end, n)
        self.end = pos + n
        self.count += 1
        return pos

    def add(self, data):
        """Append one sub-message (bytes, bytearray or memoryview).
        Returns True, or False if the batch is full (flush, reset, add again)."""
        n = len(data)
        pos = self.reserve(n)
        if pos == FULL:
            return False
        self.buf[pos:pos + n] = data
        return True

    def load(self, n, count):
        """Adopt n payload bytes already placed at buf[headroom:] (e.g. a stored
        batch read back from the outbox) as a batch of count sub-messages."""
        if not 0 <= n <= len(self.buf) - self.headroom:
            raise ValueError("payload of %d bytes does not fit the %d-byte buffer after %d bytes of headroom"
                             % (n, len(self.buf), self.headroom))
        if count < 1:
            raise ValueError("a batch holds at least one sub-message, got count %d" % count)
        self.count = count
        self.end = self.headroom + n

    def count_digits(self):
        """Length of the decimal text of count (for the batch-size property)."""
        n = self.count
        d = 1
        while n >= 10:
            n //= 10
            d += 1
        return d

    def write_count(self, buf, pos):
        """Write count as ASCII decimal at buf[pos]; return the position after it."""
        d = self.count_digits()
        n = self.count
        i = pos + d - 1
        while i >= pos:
            buf[i] = 48 + n % 10
            n //= 10
            i -= 1
        return pos + d

    def payload(self):
        """The payload as a memoryview (allocates the view: not for the hot path)."""
        return memoryview(self.buf)[self.headroom:self.end]
