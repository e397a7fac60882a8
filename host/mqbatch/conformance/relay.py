"""The inspecting proxy's per-connection state (`Record`, `_Conn`) and the releaser of
withheld acknowledgements (mqbatch.conformance.proxy, `hold_acks`)."""

from __future__ import annotations

import dataclasses
import socket
import threading
import time

from mqbatch.conformance.netcount import TlsRecords
from mqbatch.conformance.packets import NAMES, parse
from mqbatch.conformance.session import C2S, S2C

HOLD_GRACE_S = 0.4  # hold_acks: how long a client at its Receive Maximum gets to send one too many
HOLD_MAX_S = 1.0  # hold_acks: the longest an acknowledgement is withheld
_ACKS = ("PUBACK", "PUBREC", "PUBCOMP")


@dataclasses.dataclass
class Record:
    t: float  # time.monotonic() when the whole packet had arrived
    conn: int
    direction: str  # "c2s" | "s2c"
    raw: bytes
    fault: str | None = None  # "drop" / "mid": the peer never got it (whole); "after": cut after it

    @property
    def name(self) -> str:
        return NAMES.get(self.raw[0] >> 4, "?") if self.raw else "?"

    def summary(self) -> str:
        return parse(self.raw).summary() + (f" [fault: {self.fault}]" if self.fault else "")


class _Conn:
    def __init__(self, number: int, client: socket.socket, upstream: socket.socket, check):
        self.number = number
        self.socks = (client, upstream)
        self.check = check  # conformance_session.Connection, or None (opaque: TLS)
        self.tls = False
        self.tls_framing = {C2S: TlsRecords(), S2C: TlsRecords()}
        self.segments_counted = False
        self.foreign = False  # not MQTT 5 (named once): packets framed and recorded, not checked
        self.broker_gone = False  # forwarding to the broker failed: the client's bytes are only checked
        self.client_done = threading.Event()  # the client -> broker pump has ended
        self.client_eof = False  # the client closed its side (not a reset, not the proxy)
        self.reset = False  # the proxy cut this connection (a fault, cut(), stop())
        self.held: list[bytes] = []  # acknowledgements withheld from the client (hold_acks)
        self.held_since = 0.0
        self.full_since: float | None = None  # since when the client's send quota is used up
        self.send_lock = threading.Lock()  # the s2c pump and the ack releaser both write to the client


def release_loop(proxy) -> None:
    """Release a connection's withheld PUBACK/PUBREC/PUBCOMP once the client has used up its
    send quota (Receive Maximum) and had HOLD_GRACE_S to send one PUBLISH too many, or after
    HOLD_MAX_S (it had nothing more to send)."""
    while not proxy._stopped.wait(0.01):
        now = time.monotonic()
        with proxy._lock:
            conns = list(proxy._conns.values())
        for c in conns:
            with proxy._lock:
                if not c.held or c.check is None:
                    c.full_since = None
                    continue
                side = c.check.side[C2S]
                full = len(side.inflight) >= side.receive_max
                if full and c.full_since is None:
                    c.full_since = now
                elif not full:
                    c.full_since = None
                due = (c.full_since is not None and now - c.full_since >= proxy.hold_grace_s) or (
                    now - c.held_since >= proxy.hold_max_s
                )
                if not due:
                    continue
                out, c.held, c.full_since = c.held, [], None
                for raw in out:
                    rec = Record(now, c.number, S2C, raw)
                    if len(proxy.records) < proxy.max_records:
                        proxy.records.append(rec)
                    proxy._feed(c, S2C, raw, now)
            try:
                with c.send_lock:
                    proxy._forward(c.socks[0], b"".join(out))
            except OSError:
                pass  # the client is gone: its pump ends the connection
