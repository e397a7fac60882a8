"""`mqbatch demo`: the README's main command.

First stage: the device encoder (real MicroPython Unix port) packs sample
telemetry records into a batch and the host reference decoder checks it.
"""
from __future__ import annotations

import argparse
import json
import pathlib
import subprocess
import sys

from mqbatch import codec
from mqbatch.paths import ROOT, micropython_env, micropython_exe

_DEVICE_SCRIPT = r"""
import struct, json
from mqb_codec import BatchEncoder
enc = BatchEncoder(bytearray(1024), headroom=64, max_count=%(n)d)
for i in range(%(n)d):
    pos = enc.reserve(12)
    struct.pack_into("<IIhH", enc.buf, pos, 1, i, 2150 + i, 3300)
print(json.dumps({"count": enc.count, "payload_hex": bytes(enc.payload()).hex()}))
"""


def run(args: argparse.Namespace) -> int:
    script = _DEVICE_SCRIPT % {"n": args.records}
    proc = subprocess.run([str(micropython_exe()), "-c", script], env=micropython_env(), capture_output=True,
                          text=True, timeout=60)
    if proc.returncode != 0:
        print(f"demo: MicroPython encoder failed:\n{proc.stderr}", file=sys.stderr)
        return 1
    dev = json.loads(proc.stdout)
    payload = bytes.fromhex(dev["payload_hex"])
    res = codec.decode([("batch-format", "v1"), ("batch-size", str(dev["count"]))], payload, topic="demo/device-1")
    print(f"device (MicroPython {args.records} records) -> batch payload {len(payload)} bytes")
    print(f"host decoder: status={res.status} reason={res.reason} sub-messages={res.count}")
    return 0 if res.status == codec.OK and res.count == args.records else 1


def register(sub) -> None:
    p = sub.add_parser("demo", help="run the end-to-end demo")
    p.add_argument("--records", type=int, default=20)
    p.set_defaults(func=run)
