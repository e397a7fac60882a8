# fuzz_packet: fuzz the device's MQTT packet parsers (firmware/mqb_packet.py, mqb_packet_e2e.py) and the
# client's receive path (mqb_client.Client._read_packet/_dispatch via service(), with an
# mqb_sub.Subscriber attached so SUBACK and PUBLISH reach it) inside
# the MicroPython Unix port. Inputs: valid server packets mutated (bytes replaced,
# flipped, inserted, deleted, truncated) and random bytes, from a seeded generator.
#
#   micropython fuzz_packet.py N [SEED]      (MICROPYPATH: firmware/ and this folder)
#
# A parser must return an int (a reason code or a negative E_* with a text), the client
# must end every input in a named MQTTError / TransportError or keep going: any other
# exception is a crash. Prints one line: FUZZ n=... crashes=... outcomes...
import sys
from array import array
import mqb_packet as P
import mqb_packet_e2e as E
from mqb_client import Client, MQTTError
from mqb_sub import Subscriber
from mqb_transport import TransportError

SEEDS = (
    (P.CONNACK, b"\x00\x00\x0b\x21\x00\x05\x27\x00\x00\x03\x84\x22\x00\x02"),
    (P.CONNACK, b"\x00\x87\x0c\x1f\x00\x06denied\x1c\x00\x01x"),
    (P.PUBACK, b"\x00\x01"),
    (P.PUBACK, b"\x00\x07\x10\x00"),
    (P.PUBREC, b"\x00\x02\x87\x09\x1f\x00\x02no\x26\x00\x01k\x00\x01v"),
    (P.PUBCOMP, b"\x00\x03\x92\x00"),
    (P.DISCONNECT, b"\x8e\x0e\x1f\x00\x03bye\x1c\x00\x05other"),
    (P.DISCONNECT, b""),
    (P.PINGRESP, b""),
    (9, b"\x00\x01\x00\x01"),        # SUBACK
    (9, b"\x00\x01\x0a\x1f\x00\x02no\x26\x00\x00\x00\x00\x87"),
    # e2e ack PUBLISH (QoS 1): topic, packet id, Message Expiry + Topic Alias, one range
    (P.PUBLISH, b"\x00\x0dmqbatch/f/ack\x00\x05\x08\x02\x00\x00\x0e\x10\x23\x00\x01"
                b"\x01\x01\x00\x00\x00\x00\x00\x00\x00\x09\x00\x00\x00"),
    (P.PUBLISH, b"\x00\x00\x00\x06\x03\x23\x00\x01\x01"),   # empty name + alias
)
_OUT = array("i", [0] * 5)


class Rng:
    def __init__(self, seed):
        self.x = seed & 0x7FFFFFFF or 1

    def next(self, n):
        self.x = (self.x * 1103515245 + 12345) & 0x7FFFFFFF
        return (self.x >> 8) % n


def mutate(r, body):
    b = bytearray(body)
    for _ in range(1 + r.next(4)):
        op = r.next(5)
        if op == 0 and b:
            b[r.next(len(b))] = r.next(256)
        elif op == 1 and b:
            b[r.next(len(b))] ^= 1 << r.next(8)
        elif op == 2:
            k = r.next(len(b) + 1)
            b = b[:k] + bytes((r.next(256),)) + b[k:]
        elif op == 3 and b:
            k = r.next(len(b))
            b = b[:k] + b[k + 1:]
        elif op == 4 and b:
            b = b[:r.next(len(b) + 1)]
    return b


def vbi(n):
    out = bytearray()
    while True:
        c = n & 0x7F
        n >>= 7
        out.append(c | (0x80 if n else 0))
        if not n:
            return out


class StreamTransport:
    """Hands the client one byte string, then reports the link closed."""

    def __init__(self):
        self.data = b""
        self.pos = 0

    def recv(self, buf, off, n):
        if self.pos >= len(self.data):
            raise TransportError("connection closed by the broker (end of fuzz input)")
        k = min(n, len(self.data) - self.pos)
        buf[off:off + k] = self.data[self.pos:self.pos + k]
        self.pos += k
        return k

    def send(self, buf, off, n):
        pass

    def wait(self, ms):
        pass

    def close(self):
        pass

    def open(self):
        pass


def parse_one(ptype, b, c):
    n = len(b)
    if ptype == P.CONNACK:
        r = P.parse_connack(b, 0, n, c)
    elif ptype == P.DISCONNECT:
        r = P.parse_disconnect(b, 0, n)
    elif ptype == P.PINGRESP:
        r = 0 if n == 0 else P.E_TRAILING
    elif ptype == 9:       # SUBACK
        r = E.parse_suback(b, 0, n)
        if r >= 0:
            P.prop_string(b, 3 if b[2] < 0x80 else 4, n - 1, P.P_REASON_STRING)
        return r
    elif ptype == P.PUBLISH:
        return E.parse_publish(0x32, b, 0, n, _OUT)
    else:
        r = P.parse_ack(ptype, b, 0, n)
    if not isinstance(r, int):
        raise TypeError("parser returned %r" % (r,))
    if r < 0:
        P.error_text(r)
    elif ptype != P.CONNACK and ptype != P.PINGRESP:
        p = P.ack_props_start(ptype, b, 0, n)
        P.prop_string(b, p, n, P.P_REASON_STRING)
    return r


def main():
    total = int(sys.argv[1]) if len(sys.argv) > 1 else 10000
    r = Rng(int(sys.argv[2]) if len(sys.argv) > 2 else 1)
    tr = StreamTransport()
    client = Client(tr, b"fuzz", keepalive=0)
    got = [0]

    def on_message(topic, buf, start, end):   # reads the payload where it lies
        got[0] += sum(buf[i] for i in range(start, end)) & 1

    sub = Subscriber(client, b"mqbatch/f/ack", on_message)
    c = P.Connack()
    crashes = 0
    out = {"ok": 0, "malformed": 0, "mqtt_error": 0, "closed": 0}
    for i in range(total):
        ptype, body = SEEDS[r.next(len(SEEDS))]
        if r.next(10) == 0:
            ptype, b = 1 + r.next(15), bytearray(r.next(256) for _ in range(r.next(12)))
        else:
            b = mutate(r, body)
        try:
            res = parse_one(ptype, b, c)
            out["ok" if res >= 0 else "malformed"] += 1
        except Exception as e:
            crashes += 1
            print("CRASH parser type", ptype, bytes(b), repr(e))
        # the same bytes as a packet on the wire (first byte sometimes with bad flags, length sometimes wrong)
        first = (ptype << 4) | (2 if ptype == P.PUBREL else 0)
        if r.next(8) == 0:
            first = r.next(256)
        n = len(b) + (r.next(5) - 2 if r.next(6) == 0 else 0)
        tr.data = bytes([first]) + vbi(max(0, n)) + bytes(b)
        tr.pos = 0
        client.connected = True
        client._rs[0] = 0          # mqb_client._RX_STATE: before a packet
        sub.code = -1             # mqb_sub's PENDING: a SUBACK for packet id 1 is awaited
        sub.pid = 1
        sub._aliases = None
        try:
            client.service()
            client.service()
        except MQTTError:
            out["mqtt_error"] += 1
        except TransportError:
            out["closed"] += 1
        except Exception as e:
            crashes += 1
            print("CRASH client", tr.data, repr(e))
    print("FUZZ n=%d crashes=%d parser_ok=%d parser_malformed=%d client_mqtt_error=%d client_closed=%d"
          % (total, crashes, out["ok"], out["malformed"], out["mqtt_error"], out["closed"]))


main()
