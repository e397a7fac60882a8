"""A TCP relay on loopback that can cut the network and counts what crosses it.

Devices connect to the relay instead of the broker. `cut()` drops every open
connection (as a lost Wi-Fi link does) and refuses new ones until `restore()`;
`bytes_up` / `bytes_down` count every byte relayed (TLS records included: the
true cost on the wire above TCP).

    relay = Relay("127.0.0.1", broker.port).start()
    relay.port             # what devices connect to
    relay.cut(); ...; relay.restore()
"""
from __future__ import annotations

import socket
import threading

from mqbatch.broker import free_port


class Relay:
    def __init__(self, target_host: str, target_port: int, host: str = "127.0.0.1", port: int | None = None):
        self.target = (target_host, target_port)
        self.host = host
        self.port = port or free_port(host)
        self.bytes_up = 0        # client -> target
        self.bytes_down = 0      # target -> client
        self.connections = 0
        self.cuts = 0
        self._lock = threading.Lock()
        self._socks: set[socket.socket] = set()
        self._pumps: list[threading.Thread] = []
        self._listener: socket.socket | None = None
        self._thread: threading.Thread | None = None
        self._closing = False

    # -- life cycle ---------------------------------------------------------------

    def start(self) -> "Relay":
        ls = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        ls.bind((self.host, self.port))
        ls.listen(64)
        self._listener = ls
        self._thread = threading.Thread(target=self._accept_loop, args=(ls,), name="relay-accept", daemon=True)
        self._thread.start()
        return self

    def cut(self) -> None:
        """Drop every connection and refuse new ones (connect: ECONNREFUSED)."""
        self.cuts += 1
        self._close_listener()
        self._drop_all()

    def restore(self) -> None:
        if self._listener is None:
            self.start()

    def stop(self) -> None:
        self._closing = True
        self._close_listener()
        if self._thread is not None:
            self._thread.join(5)
        self._drop_all()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()

    # -- internals ----------------------------------------------------------------

    def _close_listener(self) -> None:
        ls, self._listener = self._listener, None
        if ls is not None:
            try:
                ls.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass            # not connected: a listening socket may refuse shutdown; close() below ends it
            ls.close()

    def _drop_all(self) -> None:
        """Reset both ends of every relayed connection at once. shutdown() wakes the
        pump threads blocked in recv() (close() alone does not on Linux), and
        SO_LINGER 0 makes the close an RST, as a dead link looks to each side."""
        with self._lock:
            socks, self._socks = self._socks, set()
            pumps, self._pumps = self._pumps, []
        for s in socks:
            try:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass            # already shut by its pump: nothing left to reset
            s.close()
        for t in pumps:
            t.join(5)

    def _accept_loop(self, ls: socket.socket) -> None:
        while True:
            try:
                client, _ = ls.accept()
            except OSError:
                return          # listener closed by cut()/stop()
            try:
                upstream = socket.create_connection(self.target, timeout=5)
            except OSError:
                client.close()  # the broker is down: the device sees the connection close
                continue
            upstream.settimeout(None)
            pumps = [threading.Thread(target=self._pump, args=(src, dst, up), daemon=True)
                     for src, dst, up in ((client, upstream, True), (upstream, client, False))]
            with self._lock:
                self._socks.update((client, upstream))
                self._pumps = [t for t in self._pumps if t.is_alive()] + pumps
                self.connections += 1
            for t in pumps:
                t.start()

    def _pump(self, src: socket.socket, dst: socket.socket, up: bool) -> None:
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                dst.sendall(data)
                with self._lock:
                    if up:
                        self.bytes_up += len(data)
                    else:
                        self.bytes_down += len(data)
        except OSError:
            pass                # either side went away (or cut() reset it): end this direction
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass        # already closed
                s.close()
            with self._lock:
                self._socks.discard(src)
                self._socks.discard(dst)
