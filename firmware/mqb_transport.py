# mqb_transport: the network under the MQTT client. TCP or TLS; send / recv / wait / close.
#
# TLS is the default (port 8883). Plain TCP only with plain_tcp=True, for local
# development. The server certificate is always verified: MicroPython's
# SSLContext(PROTOCOL_TLS_CLIENT) defaults to CERT_NONE, so CERT_REQUIRED
# is set explicitly, and server_hostname is always passed.
#
# TLS comes from MicroPython's `tls` module (1.23+), the C module under
# micropython-lib's ssl.py: the same SSLContext without the Python wrapper,
# whose import alone costs ~1.2 KB of heap on a board.
#
# After open() the socket is non-blocking: recv() returns 0 when nothing is
# there, send() completes the whole write (waiting for room if it must), and
# wait() blocks on select.poll's allocation-free ipoll().
#
# wait() and send() poll the raw TCP socket, not the TLS object: the TLS object
# has no file descriptor, and select.poll on the Unix port then checks it
# every 1 ms, so a wait that just missed
# a PUBACK slept up to 1 ms (QoS 1 stop-and-wait ran at ~0.15 of a busy loop).
# The raw socket's fd is woken by the kernel at once. (Polling the TLS object
# costs ~1 ms even with timeout 0: it cannot be used to look for plaintext
# mbedTLS holds.) Bytes mbedTLS already decrypted do not show on the raw socket,
# so wait() is for after recv() returned 0: mbedTLS then holds no plaintext,
# and the rest of a partial record is still to come on the raw socket.
import socket
import select
import sys
import errno

try:
    import tls
except ImportError:  # a port built without TLS: only plain_tcp=True works
    tls = None

# TLSError.kind
TLS_UNTRUSTED = "untrusted"        # the server certificate is not signed by our CA (wrong CA)
TLS_HOSTNAME = "hostname"          # the certificate does not name server_hostname
TLS_EXPIRED = "expired"            # the certificate's validity has ended
TLS_NOT_YET_VALID = "not-yet-valid"  # its validity starts in the future (check the device clock)
TLS_REJECTED = "rejected"          # the broker ended the handshake (fatal alert, or closed while we wrote:
                                   # EPIPE): mostly it wants a client certificate we did not send. A reset
                                   # (e.g. a broker restarting) stays "handshake"
TLS_HANDSHAKE = "handshake"        # any other handshake failure (protocol, cipher suites)

# (mbedtls_x509_crt_verify_info text, kind, what it means), checked in this order
_TLS = (("not correctly signed by the trusted CA", TLS_UNTRUSTED,
         "server certificate not signed by the configured CA (wrong CA file?)"),
        ("validity has expired", TLS_EXPIRED, "server certificate has expired"),
        ("validity starts in the future", TLS_NOT_YET_VALID,
         "server certificate is not valid yet (is the device clock set?)"),
        ("does not match with the expected CN", TLS_HOSTNAME, "server certificate does not match the server name"),
        ("FATAL_ALERT_MESSAGE", TLS_REJECTED, None),
        ("", TLS_HANDSHAKE, "TLS handshake failed"))
_REJECTED = ("broker refused the TLS handshake (does it require a client certificate, and are certfile/keyfile "
             "set and signed by its CA? or no TLS version/cipher suite in common)")
_MBEDTLS_CERT_VERIFY_FAILED = const(-0x2700)
_EPIPE = const(32)  # MicroPython's errno module has no EPIPE
_POLL_EVENTS = const(0x0001 | 0x0008 | 0x0010)  # POLLIN | POLLERR | POLLHUP


class TransportError(Exception):
    """The network failed: connect refused, reset, closed, timed out. The
    message says what and where; .errno holds the OS/mbedTLS code if any."""

    def __init__(self, message, code=None):
        super().__init__(message)
        self.errno = code


class TLSError(TransportError):
    """The TLS handshake failed; .kind is one of the TLS_* names, chosen from the
    handshake exception `exc`. Nothing was sent."""

    def __init__(self, exc, where, code=None):
        text = str(exc).strip() or repr(exc)
        for needle, kind, meaning in _TLS:
            if needle in text:
                break
        if kind == TLS_HANDSHAKE and isinstance(exc, OSError) and exc.errno == _EPIPE:
            kind = TLS_REJECTED
        if kind == TLS_REJECTED:
            meaning = _REJECTED
        super().__init__("TLS: %s: %s (%s)" % (meaning, text, where), code)
        self.kind = kind


def read_der(path):
    """A certificate or key file as DER bytes. PEM files are converted here (the
    first block), so boards whose mbedTLS lacks PEM parsing can use them too."""
    with open(path, "rb") as f:
        data = f.read()
    if not data:
        raise ValueError("%s is empty" % path)
    begin = data.find(b"-----BEGIN ")
    if begin < 0:
        return data
    import binascii
    start = data.find(b"\n", begin)
    end = data.find(b"-----END ", start)
    if start < 0 or end < 0:
        raise ValueError("%s: PEM block without END line" % path)
    try:
        # a2b_base64 skips the line breaks; a memoryview slice copies nothing (small heaps)
        return binascii.a2b_base64(memoryview(data)[start:end])
    except ValueError as e:
        raise ValueError("%s: PEM body is not valid base64 (%s)" % (path, e))


class Transport:
    """One network connection to the broker, reopened by open() after a failure.

    host, port: the broker (port defaults to 8883, or 1883 with plain_tcp).
    cafile: CA certificate (DER or PEM) that signed the broker's certificate.
    certfile, keyfile: optional client certificate and key (mutual TLS).
    server_hostname: name checked against the certificate (default: host).
    plain_tcp: True for unencrypted TCP; must be asked for explicitly.
    timeout_ms: connect / handshake timeout and the longest a send may stall.
    ssl_context: a tls.SSLContext(tls.PROTOCOL_TLS_CLIENT) to configure and use
    instead of making one here: it is one block of ~3 KB, which a small heap
    (64 KB) has after boot but may no longer have once modules are imported
    (firmware/main.py makes it first).
    """

    def __init__(self, host, port=None, cafile=None, certfile=None, keyfile=None,
                 server_hostname=None, plain_tcp=False, timeout_ms=10000, ssl_context=None):
        self.host = host
        self.port = port if port is not None else (1883 if plain_tcp else 8883)
        self.plain_tcp = plain_tcp
        self.timeout_ms = timeout_ms
        self.server_hostname = server_hostname or host
        self.nodelay_error = None  # why TCP_NODELAY could not be set, if so
        self.close_error = None
        self._one = bytearray(1)
        self._sock = None
        self._raw = None
        self._poll = None      # polls the raw socket (an fd the kernel wakes us on)
        self._ctx = None
        if plain_tcp:
            if cafile or certfile or keyfile or ssl_context:
                raise ValueError("plain_tcp=True with TLS files: choose one")
            return
        if tls is None:
            raise ValueError("this MicroPython port has no tls module; TLS is impossible (plain_tcp=True for development only)")
        if not cafile:
            raise ValueError("TLS needs cafile (the CA that signed the broker certificate); "
                             "plain TCP must be requested with plain_tcp=True")
        if (certfile is None) != (keyfile is None):
            raise ValueError("mutual TLS needs both certfile and keyfile")
        ctx = ssl_context or tls.SSLContext(tls.PROTOCOL_TLS_CLIENT)
        ctx.verify_mode = tls.CERT_REQUIRED  # MicroPython's default is CERT_NONE
        try:
            ctx.load_verify_locations(read_der(cafile))
        except ValueError as e:
            raise ValueError("CA file %s not usable: %s" % (cafile, e))
        if certfile:
            try:
                ctx.load_cert_chain(read_der(certfile), read_der(keyfile))
            except ValueError as e:
                raise ValueError("client certificate %s / key %s not usable: %s" % (certfile, keyfile, e))
        self._ctx = ctx

    @property
    def is_open(self):
        return self._sock is not None

    def open(self):
        """Connect (and do the TLS handshake). Raises TransportError / TLSError."""
        self.close()
        where = "%s:%d" % (self.host, self.port)
        try:
            addr = socket.getaddrinfo(self.host, self.port, 0, socket.SOCK_STREAM)[0][-1]
        except OSError as e:
            raise TransportError("cannot resolve %s: %s" % (where, e), e.errno)
        raw = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        raw.settimeout(self.timeout_ms / 1000)
        try:
            raw.connect(addr)
        except OSError as e:
            raw.close()
            raise TransportError("cannot connect to %s: %s" % (where, e), e.errno)
        # Disable Nagle: the Unix port lacks the constants (Linux: IPPROTO_TCP 6, TCP_NODELAY 1)
        opt = getattr(socket, "TCP_NODELAY", 1 if sys.platform == "linux" else None)
        try:
            if opt is None:
                raise OSError("TCP_NODELAY not available on this port (%s)" % sys.platform)
            raw.setsockopt(getattr(socket, "IPPROTO_TCP", 6), opt, 1)
            self.nodelay_error = None
        except OSError as e:
            self.nodelay_error = "TCP_NODELAY not set: %s" % e
        sock = raw
        if self._ctx is not None:
            try:
                sock = self._ctx.wrap_socket(raw, server_hostname=self.server_hostname)
            except (OSError, ValueError) as e:
                raw.close()
                raise TLSError(e, "%s, server_hostname=%r" % (where, self.server_hostname),
                               e.errno if isinstance(e, OSError) else _MBEDTLS_CERT_VERIFY_FAILED)
        sock.setblocking(False)
        if sock is not raw:
            raw.setblocking(False)
        self._poll = select.poll()
        self._poll.register(raw, _POLL_EVENTS)
        self._raw = raw
        self._sock = sock
        # ipoll() allocates its result tuple at its first event and reuses it after:
        # take that one-time allocation now (a new socket is writable at once)
        self._wait_writable()

    def send(self, buf, off, n):
        """Write buf[off:off+n] completely (one write call when the socket has
        room, as it normally does). Raises TransportError and closes on failure."""
        sock = self._sock
        if sock is None:
            raise TransportError("send on a closed connection")
        while n > 0:
            try:
                w = sock.write(buf, off, n)
            except OSError as e:
                self.close()
                raise TransportError("send to %s:%d failed: %s" % (self.host, self.port, e), e.errno)
            if w:
                off += w
                n -= w
            elif not self._wait_writable():
                self.close()
                raise TransportError("send to %s:%d stalled for %d ms" % (self.host, self.port, self.timeout_ms))

    def _wait_writable(self):
        self._poll.modify(self._raw, 0x0004 | 0x0008 | 0x0010)  # POLLOUT | POLLERR | POLLHUP
        ready = False
        for _ in self._poll.ipoll(self.timeout_ms):
            ready = True
        self._poll.modify(self._raw, _POLL_EVENTS)
        return ready

    def recv(self, buf, off, n):
        """Read up to n bytes into buf[off:]; 0 if nothing is available now.
        Raises TransportError (and closes) when the broker closed the connection."""
        sock = self._sock
        if sock is None:
            raise TransportError("recv on a closed connection")
        try:
            if off:
                # rare: the rest of a packet split across reads. A memoryview slice would
                # allocate, so the rest comes one byte at a time through a scratch byte.
                one = self._one
                r = got = 0
                while got < n:
                    r = sock.readinto(one, 1)
                    if not r:
                        break
                    buf[off + got] = one[0]
                    got += 1
                if got:
                    return got
            else:
                r = sock.readinto(buf, n)
        except OSError as e:
            if e.errno == errno.EAGAIN:
                return 0
            self.close()
            raise TransportError("receive from %s:%d failed: %s" % (self.host, self.port, e), e.errno)
        if r is None:
            return 0
        if r == 0:
            self.close()
            raise TransportError("connection closed by the broker (%s:%d)" % (self.host, self.port))
        return r

    def wait(self, timeout_ms):
        """Block until data (or an error) is ready to read, at most timeout_ms; True if so.
        Call it when recv() has returned 0 (plaintext TLS already holds is not seen here)."""
        if self._sock is None:
            return False
        for _ in self._poll.ipoll(timeout_ms):
            return True
        return False

    def close(self):
        """Close the connection (idempotent). A failure to close a connection that is
        already broken is kept in .close_error rather than raised: it is gone either way."""
        sock = self._sock
        self._sock = self._raw = None  # closing the TLS object closes the raw socket
        if sock is not None:
            try:
                sock.close()
            except OSError as e:
                self.close_error = "close of %s:%d failed: %s" % (self.host, self.port, e)
