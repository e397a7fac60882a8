"""Fuzz the inspecting proxy's parser and session checker: random and mutated byte streams,
cut into random chunks, framed the way the proxy frames them (packets.packet_len), each packet
parsed and fed to a session Connection in both directions; the end of each stream closes the
connection. Any exception is a crash (the proxy's forwarding thread would have died).

    python -m mqbatch.conformance.fuzz 1000000 7     # the long run (N inputs, seed)

Prints one line: FUZZ n=... crashes=... packets=... violations=... unframed=... seconds=...
"""

from __future__ import annotations

import random
import sys
import time
import traceback

from mqbatch.conformance import packets as W
from mqbatch.conformance.session import C2S, S2C, Checker

H = bytes.fromhex
_BATCH_PROPS = H("26 000c 62617463682d666f726d6174 0002 7631 26 000a 62617463682d73697a65 0001 32")
SEEDS = [
    H("10 12 0004 4d515454 05 02 003c 03 21 0014 0002 6331"),  # CONNECT v5
    H("10 0e 0004 4d515454 04 02 003c 0002 6331"),  # CONNECT 3.1.1 (umqtt.simple)
    H("20 0e 00 00 0b 21 0002 22 0002 27 00000064"),  # CONNACK with limits
    H("20 0e 01 00 0b 21 0002 22 0002 27 00000064"),  # Session Present
    H("20 06 00 00 03 13 0002"),  # Server Keep Alive
    bytes([0x32, 5 + 2 + 1 + len(_BATCH_PROPS) + 5])
    + H("0003 742f78 0001")
    + bytes([len(_BATCH_PROPS)])
    + _BATCH_PROPS
    + H("01 41 02 42 43"),  # batch PUBLISH QoS 1
    H("34 0b 0003 742f78 0002 03 23 0001 41"),  # QoS 2 with Topic Alias
    H("40 02 0001"),
    H("50 03 0002 00"),
    H("62 02 0002"),
    H("70 04 0002 92 00"),
    H("c0 00"),
    H("d0 00"),
    H("e0 01 8e"),
    H("82 09 0001 00 0003 612f62 01"),
    H("32 08 0003 742f78 0003 02 7f 00"),  # unknown property id 0x7f
]


def _mutate(rng: random.Random, b: bytes) -> bytes:
    b = bytearray(b)
    for _ in range(rng.randint(1, 4)):
        op = rng.randrange(6)
        if op == 0 and b:
            b[rng.randrange(len(b))] = rng.randrange(256)
        elif op == 1 and b:
            del b[rng.randrange(len(b)) :]
        elif op == 2:
            b.insert(rng.randint(0, len(b)), rng.randrange(256))
        elif op == 3 and len(b) > 1:
            b[1] = rng.choice([0x00, 0x7F, 0xFF, 0x80, b[1] ^ 0x01])
        elif op == 4:
            b += bytes(rng.randrange(256) for _ in range(rng.randint(0, 8)))
        elif op == 5 and b:
            i = rng.randrange(len(b))
            b[i] ^= 1 << rng.randrange(8)
    return bytes(b)


def stream(rng: random.Random) -> list[tuple[str, bytes]]:
    """One connection's traffic: (direction, bytes) chunks, mostly MQTT-shaped."""
    out = []
    for _ in range(rng.randint(1, 8)):
        r = rng.random()
        if r < 0.1:
            data = bytes(rng.randrange(256) for _ in range(rng.randint(0, 40)))
        elif r < 0.5:
            data = rng.choice(SEEDS)
        else:
            data = _mutate(rng, rng.choice(SEEDS))
        d = S2C if data[:1] and data[0] >> 4 in (2, 4, 5, 7, 9, 11, 13) and rng.random() < 0.8 else C2S
        out.append((d, data))
    return out


def run_one(chunks: list[tuple[str, bytes]], rng: random.Random, ck: Checker, n: int) -> tuple[int, int]:
    """Frame and check one stream as the proxy does; returns (packets, unframed directions)."""
    conn = ck.connection(n)
    bufs = {C2S: b"", S2C: b"", "dead": set()}
    packets = unframed = 0
    t = 0.0
    for d, data in chunks:
        if d in bufs["dead"]:
            continue
        while data:  # arrives in random pieces
            k = rng.randint(1, max(1, len(data)))
            bufs[d] += data[:k]
            data = data[k:]
            while bufs[d]:
                try:
                    size = W.packet_len(bufs[d])
                except W.Malformed:
                    bufs["dead"].add(d)
                    unframed += 1
                    bufs[d] = b""
                    break
                if size is None or len(bufs[d]) < size:
                    break
                raw, bufs[d] = bufs[d][:size], bufs[d][size:]
                t += rng.random() * 3
                conn.feed(d, raw, t)
                packets += 1
    conn.close(t + rng.random() * 5, by_client=rng.random() < 0.5)
    return packets, unframed


def fuzz(n: int, seed: int = 1) -> dict:
    rng = random.Random(seed)
    ck = Checker(["t/#"], 2, 100)
    crashes, packets, unframed, first = 0, 0, 0, None
    t0 = time.monotonic()
    for i in range(n):
        chunks = stream(rng)
        try:
            p, u = run_one(chunks, rng, ck, i)
            packets += p
            unframed += u
        except Exception:  # noqa: BLE001 - every exception is the finding
            crashes += 1
            if first is None:
                first = (chunks, traceback.format_exc())
        if i % 1000 == 999:  # bound the memory of a long run
            ck.violations.clear()
            ck.sessions.clear()
    return {
        "n": n,
        "crashes": crashes,
        "packets": packets,
        "violations": len(ck.violations),
        "unframed": unframed,
        "seconds": round(time.monotonic() - t0, 1),
        "first_crash": first,
    }


def main(argv: list[str]) -> int:
    n = int(argv[0]) if argv else 100_000
    seed = int(argv[1]) if len(argv) > 1 else 1
    r = fuzz(n, seed)
    print(
        f"FUZZ n={r['n']} crashes={r['crashes']} packets={r['packets']} unframed={r['unframed']} seconds={r['seconds']}"
    )
    if r["first_crash"]:
        print("first crash:", [(d, b.hex()) for d, b in r["first_crash"][0]], r["first_crash"][1], sep="\n")
    return 1 if r["crashes"] else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
