"""What can be counted on a relayed stream without reading it: TLS records from their
5-byte headers, TCP segments from the kernel's TCP_INFO (used by mqbatch.conformance.proxy)."""

from __future__ import annotations

import socket


class TlsRecords:
    """Counts TLS records in one direction of a stream from their 5-byte headers
    (content type, version, 16-bit length), across any split of the bytes."""

    def __init__(self):
        self.records = 0
        self._head = b""
        self._skip = 0  # bytes left in the current record's body

    def feed(self, data: bytes) -> None:
        i = 0
        while i < len(data):
            if self._skip:
                take = min(self._skip, len(data) - i)
                self._skip -= take
                i += take
                continue
            need = 5 - len(self._head)
            self._head += data[i : i + need]
            i += need
            if len(self._head) == 5:
                self.records += 1
                self._skip = self._head[3] << 8 | self._head[4]
                self._head = b""


def tcp_segments(sock: socket.socket) -> tuple[int, int] | None:
    """(segments in, segments out) of a TCP socket from Linux TCP_INFO (tcpi_segs_out at
    byte 136, tcpi_segs_in at 140), or None where the kernel does not report them."""
    try:
        info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 256)
    except (OSError, AttributeError):
        return None
    if len(info) < 144:
        return None
    return int.from_bytes(info[140:144], "little"), int.from_bytes(info[136:140], "little")
